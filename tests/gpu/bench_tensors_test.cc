#include "tests/gpu/bench_tensors.h"

#include <vector>

#include "gtest/gtest.h"

namespace tessera::gpubench {
namespace {

// Saved by 4 ranks, loaded by 2: the loader's expected values are exactly the saved bytes of
// the rows it covers, assembled from the savers' pieces.
TEST(BenchTensors, ReshardedLoad_ExpectedEqualsSavedBytes) {
  constexpr int64_t kStep = 3;
  std::vector<std::vector<int32_t>> global;  // per tensor, all rows
  for (int r = 0; r < 4; ++r) {
    absl::StatusOr<std::vector<Piece>> saved = Pieces(/*mib=*/1, 4, 4, r, /*tensor_mib=*/1);
    ASSERT_TRUE(saved.ok()) << saved.status();
    ASSERT_EQ(saved->size(), 1u);
    const Piece& p = saved->front();
    EXPECT_EQ(p.row0, r * p.rows);
    if (global.empty()) global.assign(1, std::vector<int32_t>(p.global_rows * kCols));
    Fill(p, kStep, global[0].data() + p.row0 * kCols, 2);
  }
  for (int r = 0; r < 2; ++r) {
    absl::StatusOr<std::vector<Piece>> loaded = Pieces(1, 4, 2, r, 1);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    const Piece& p = loaded->front();
    EXPECT_EQ(p.rows, 2 * 256);  // 1 MiB of 4 KiB rows per saved rank, two of them
    const int32_t* mine = global[0].data() + p.row0 * kCols;
    EXPECT_EQ(CountMismatches(p, kStep, mine, 2), 0u);
    // The stamped rows (one per saved rank) tell this step from the one before.
    EXPECT_EQ(CountMismatches(p, kStep - 1, mine, 2), 2u * kCols);
  }
}

TEST(BenchTensors, FillStampRow_IsTheFirstRowOfFill) {
  absl::StatusOr<std::vector<Piece>> pieces = Pieces(1, 2, 2, 1, 1);
  ASSERT_TRUE(pieces.ok());
  const Piece& p = pieces->front();
  std::vector<int32_t> all(p.nbytes() / 4), row(kCols);
  Fill(p, 7, all.data(), 1);
  FillStampRow(p, 7, row.data());
  EXPECT_EQ(std::vector<int32_t>(all.begin(), all.begin() + kCols), row);
  EXPECT_NE(Stamp(p.index, 7, p.row0, 0), Base(p.index, p.row0, 0));
}

TEST(BenchTensors, Pieces_SizesSplitIntoTensorsOfAtMostTensorMib) {
  absl::StatusOr<std::vector<Piece>> pieces = Pieces(/*mib=*/5, 1, 1, 0, /*tensor_mib=*/2);
  ASSERT_TRUE(pieces.ok());
  ASSERT_EQ(pieces->size(), 3u);
  EXPECT_EQ((*pieces)[0].nbytes(), 2u << 20);
  EXPECT_EQ((*pieces)[2].nbytes(), 1u << 20);
  EXPECT_EQ((*pieces)[2].fqn, "gpubench.w002");
}

TEST(BenchTensors, Pieces_BadArguments_InvalidArgument) {
  EXPECT_EQ(Pieces(0, 1, 1, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Pieces(1, 1, 2, 2).status().code(), absl::StatusCode::kInvalidArgument);
  // 256 rows per saved rank, one saved rank: 256 rows do not split across 3 loaders.
  EXPECT_EQ(Pieces(1, 1, 3, 0, 1).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tessera::gpubench
