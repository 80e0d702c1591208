#include "tests/gpu/bench_tensors.h"

#include <algorithm>
#include <atomic>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tessera::gpubench {
namespace {

uint32_t Mix(uint64_t x) {
  // splitmix64's finaliser: every input bit moves every output bit.
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return static_cast<uint32_t>(x ^ (x >> 31));
}

// Runs body(first_row, end_row) over [0, rows) on up to `threads` threads.
template <typename Body>
void ForRows(int64_t rows, int threads, Body body) {
  threads = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, rows / 256 + 1)));
  if (threads == 1) {
    body(int64_t{0}, rows);
    return;
  }
  std::vector<std::thread> workers;
  const int64_t share = (rows + threads - 1) / threads;
  for (int t = 0; t < threads; ++t) {
    const int64_t begin = std::min(rows, t * share);
    const int64_t end = std::min(rows, begin + share);
    workers.emplace_back([=] { body(begin, end); });
  }
  for (std::thread& w : workers) w.join();
}

}  // namespace

absl::StatusOr<std::vector<Piece>> Pieces(uint64_t mib_per_saved_rank, int saved_world,
                                          int world, int rank, uint64_t tensor_mib) {
  if (mib_per_saved_rank == 0 || tensor_mib == 0 || saved_world < 1 || world < 1) {
    return absl::InvalidArgumentError("sizes and worlds must be positive");
  }
  if (rank < 0 || rank >= world) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " is outside [0, ", world, ")"));
  }
  std::vector<Piece> pieces;
  uint64_t left = mib_per_saved_rank << 20;
  const uint64_t per_tensor = tensor_mib << 20;
  for (int index = 0; left > 0; ++index) {
    const uint64_t bytes = std::min(per_tensor, left);
    left -= bytes;
    if (bytes % kRowBytes != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", index, " would have ", bytes, " bytes per rank, not whole rows"));
    }
    Piece p;
    p.index = index;
    p.fqn = absl::StrFormat("gpubench.w%03d", index);
    p.rows_per_saved_rank = static_cast<int64_t>(bytes / kRowBytes);
    p.global_rows = p.rows_per_saved_rank * saved_world;
    if (p.global_rows % world != 0) {
      return absl::InvalidArgumentError(absl::StrCat(p.global_rows, " rows of tensor ", index,
                                                     " do not split across ", world, " ranks"));
    }
    p.rows = p.global_rows / world;
    p.row0 = p.rows * rank;
    pieces.push_back(std::move(p));
  }
  return pieces;
}

int32_t Base(int index, int64_t row, int64_t col) {
  return static_cast<int32_t>(
      Mix((static_cast<uint64_t>(index) << 48) ^ (static_cast<uint64_t>(row) << 12) ^
          static_cast<uint64_t>(col)));
}

int32_t Stamp(int index, int64_t step, int64_t row, int64_t col) {
  return static_cast<int32_t>(Mix(0x5354414D50000000ull ^ (static_cast<uint64_t>(step) << 40) ^
                                  (static_cast<uint64_t>(index) << 28) ^
                                  (static_cast<uint64_t>(row) << 10) ^ static_cast<uint64_t>(col)));
}

int32_t Expected(int index, int64_t step, int64_t rows_per_saved_rank, int64_t row, int64_t col) {
  return row % rows_per_saved_rank == 0 ? Stamp(index, step, row, col) : Base(index, row, col);
}

void Fill(const Piece& piece, int64_t step, int32_t* dst, int threads) {
  ForRows(piece.rows, threads, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t g = piece.row0 + r;
      int32_t* row = dst + r * kCols;
      for (int64_t c = 0; c < kCols; ++c) {
        row[c] = Expected(piece.index, step, piece.rows_per_saved_rank, g, c);
      }
    }
  });
}

void FillStampRow(const Piece& piece, int64_t step, int32_t* row) {
  for (int64_t c = 0; c < kCols; ++c) {
    row[c] = Expected(piece.index, step, piece.rows_per_saved_rank, piece.row0, c);
  }
}

uint64_t CountMismatches(const Piece& piece, int64_t step, const int32_t* data, int threads) {
  std::atomic<uint64_t> bad{0};
  ForRows(piece.rows, threads, [&](int64_t begin, int64_t end) {
    uint64_t local = 0;
    for (int64_t r = begin; r < end; ++r) {
      const int64_t g = piece.row0 + r;
      const int32_t* row = data + r * kCols;
      for (int64_t c = 0; c < kCols; ++c) {
        local += row[c] != Expected(piece.index, step, piece.rows_per_saved_rank, g, c);
      }
    }
    bad += local;
  });
  return bad.load();
}

}  // namespace tessera::gpubench
