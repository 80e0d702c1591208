#include "client/parallel_copy.h"

#include <atomic>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"

namespace tessera {
namespace {

uint64_t Bytes(const std::vector<CopyItem>& run) {
  uint64_t n = 0;
  for (const CopyItem& item : run) n += item.size;
  return n;
}

TEST(SplitIntoRunsTest, EqualRunsSplittingItems_EveryByteOnceInOrder) {
  std::vector<char> src(1000), dst(1000);
  // Items of 100, 0, 500 and 400 bytes: 1000 in all, into 3 runs of 334, 334, 332.
  std::vector<CopyItem> items = {{dst.data(), src.data(), 100},
                                 {dst.data() + 100, src.data() + 100, 0},
                                 {dst.data() + 100, src.data() + 100, 500},
                                 {dst.data() + 600, src.data() + 600, 400}};
  const std::vector<std::vector<CopyItem>> runs = SplitIntoRuns(items, 3, 0);
  ASSERT_EQ(runs.size(), 3u);
  EXPECT_EQ(Bytes(runs[0]), 334u);
  EXPECT_EQ(Bytes(runs[1]), 334u);
  EXPECT_EQ(Bytes(runs[2]), 332u);
  // Concatenated, the pieces cover [0, 1000) in order, destinations moving with sources.
  size_t next = 0;
  for (const auto& run : runs) {
    for (const CopyItem& piece : run) {
      EXPECT_GT(piece.size, 0u);
      EXPECT_EQ(static_cast<const char*>(piece.src) - src.data(), static_cast<ptrdiff_t>(next));
      EXPECT_EQ(static_cast<char*>(piece.dst) - dst.data(), static_cast<ptrdiff_t>(next));
      next += piece.size;
    }
  }
  EXPECT_EQ(next, 1000u);
}

TEST(SplitIntoRunsTest, SmallTotalOrOneThread_OneRunOfTheItems) {
  std::vector<char> src(64), dst(64);
  std::vector<CopyItem> items = {{dst.data(), src.data(), 0}, {dst.data(), src.data(), 64}};
  for (auto runs : {SplitIntoRuns(items, 4, 64), SplitIntoRuns(items, 1, 0)}) {
    ASSERT_EQ(runs.size(), 1u);
    ASSERT_EQ(runs[0].size(), 1u);  // the empty item left out
    EXPECT_EQ(runs[0][0].size, 64u);
  }
  EXPECT_TRUE(SplitIntoRuns({}, 4, 0).empty());
  // Fewer bytes than threads: no empty runs.
  std::vector<CopyItem> tiny = {{dst.data(), src.data(), 2}};
  EXPECT_EQ(SplitIntoRuns(tiny, 8, 0).size(), 2u);
}

TEST(RunInParallelTest, EveryRunOnceAndParallelCopyCopiesEveryByte) {
  std::vector<char> src(1 << 20), dst(1 << 20, 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<char>(i * 7);
  std::vector<CopyItem> items = {{dst.data(), src.data(), src.size()}};
  std::atomic<int> calls{0};
  const auto runs = SplitIntoRuns(items, 4, 0);
  EXPECT_EQ(RunInParallel(runs, [&](const std::vector<CopyItem>&) { ++calls; }), 4);
  EXPECT_EQ(calls.load(), 4);
  EXPECT_EQ(ParallelCopy(items, 4, 0), 4);
  EXPECT_EQ(std::memcmp(src.data(), dst.data(), src.size()), 0);
}

}  // namespace
}  // namespace tessera
