#include "server/plan/plan_tiling.h"

#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace tessera {
namespace {

// Owns the coordinates BoxViews point at.
struct Boxes {
  std::vector<Box> boxes;
  std::vector<BoxView> views() const {
    std::vector<BoxView> out;
    for (const Box& b : boxes) out.push_back(BoxView{b.offsets, b.lengths});
    return out;
  }
  Boxes& Add(std::vector<int64_t> offsets, std::vector<int64_t> lengths) {
    boxes.push_back(Box{std::move(offsets), std::move(lengths)});
    return *this;
  }
};

// Per element of `shape`, how many boxes hold it (row-major).
std::vector<int> CoverCounts(const std::vector<int64_t>& shape, const std::vector<Box>& boxes) {
  int64_t volume = 1;
  for (int64_t d : shape) volume *= d;
  std::vector<int> counts(volume, 0);
  std::vector<int64_t> point(shape.size());
  for (int64_t flat = 0; flat < volume; ++flat) {
    int64_t rest = flat;
    for (size_t d = shape.size(); d-- > 0;) {
      point[d] = rest % shape[d];
      rest /= shape[d];
    }
    for (const Box& b : boxes) {
      bool inside = true;
      for (size_t d = 0; d < shape.size(); ++d) {
        inside &= point[d] >= b.offsets[d] && point[d] < b.offsets[d] + b.lengths[d];
      }
      counts[flat] += inside;
    }
  }
  return counts;
}

TEST(PlanTiling, Tiles_OneDimensional_ExactAndNot) {
  const std::vector<int64_t> shape = {10};
  EXPECT_TRUE(TilesExactly(shape, Boxes().Add({0}, {4}).Add({4}, {6}).views()));
  EXPECT_TRUE(TilesExactly(shape, Boxes().Add({4}, {6}).Add({0}, {4}).Add({3}, {0}).views()));
  EXPECT_FALSE(TilesExactly(shape, Boxes().Add({0}, {4}).Add({5}, {5}).views()));    // gap
  EXPECT_FALSE(TilesExactly(shape, Boxes().Add({0}, {5}).Add({4}, {6}).views()));    // overlap
  EXPECT_FALSE(TilesExactly(shape, Boxes().Add({0}, {10}).Add({0}, {10}).views()));  // twice
  EXPECT_FALSE(TilesExactly(shape, Boxes().views()));
}

TEST(PlanTiling, Tiles_OverlapAndGapWithMatchingVolume_Rejected) {
  // Volumes sum to 8, but [2:4, 0:2] is covered twice and [2:4, 2:4] not at all.
  Boxes b;
  b.Add({0, 0}, {2, 4}).Add({2, 0}, {2, 2}).Add({1, 0}, {2, 1}).Add({3, 0}, {1, 1});
  EXPECT_FALSE(TilesExactly({4, 4}, b.views()));
  EXPECT_TRUE(FindOverlap(b.views()).has_value());
}

TEST(PlanTiling, Tiles_GridAndIrregular2d_Accepted) {
  Boxes grid;
  for (int64_t r : {0, 3, 5}) {
    for (int64_t c : {0, 2}) grid.Add({r, c}, {r == 0 ? 3 : r == 3 ? 2 : 1, c == 0 ? 2 : 6});
  }
  EXPECT_TRUE(TilesExactly({6, 8}, grid.views()));
  // A pinwheel: no guillotine cut separates it, yet it tiles.
  Boxes pinwheel;
  pinwheel.Add({0, 0}, {2, 1})
      .Add({0, 1}, {1, 2})
      .Add({1, 2}, {2, 1})
      .Add({2, 0}, {1, 2})
      .Add({1, 1}, {1, 1});
  EXPECT_TRUE(TilesExactly({3, 3}, pinwheel.views()));
  EXPECT_FALSE(FindOverlap(pinwheel.views()).has_value());
  EXPECT_FALSE(FindUncovered({3, 3}, pinwheel.views()).has_value());
}

TEST(PlanTiling, Tiles_ZeroDimAndZeroSize) {
  EXPECT_TRUE(TilesExactly({}, Boxes().Add({}, {}).views()));
  EXPECT_FALSE(TilesExactly({}, Boxes().views()));
  EXPECT_FALSE(TilesExactly({}, Boxes().Add({}, {}).Add({}, {}).views()));
  EXPECT_TRUE(TilesExactly({0, 4}, Boxes().views()));
  EXPECT_TRUE(TilesExactly({0, 4}, Boxes().Add({0, 0}, {0, 4}).views()));
  std::optional<Box> gap = FindUncovered({}, Boxes().views());
  ASSERT_TRUE(gap.has_value());
  EXPECT_EQ(gap->rank(), 0u);
  EXPECT_FALSE(FindUncovered({0, 3}, Boxes().views()).has_value());
}

// 13 sharded axes: over kMaxCornerAxes, so the sweep fallback decides.
TEST(PlanTiling, Tiles_ManyShardedAxes_FallbackIsExact) {
  const size_t n = kMaxCornerAxes + 1;
  std::vector<int64_t> shape(n, 2);
  Boxes staircase;  // box k: axes < k at [1:2], axis k at [0:1], the rest whole
  for (size_t k = 0; k <= n; ++k) {
    std::vector<int64_t> off(n, 0), len(n, 2);
    for (size_t d = 0; d < k && d < n; ++d) off[d] = 1, len[d] = 1;
    if (k < n) off[k] = 0, len[k] = 1;
    staircase.Add(off, len);
  }
  EXPECT_TRUE(TilesExactly(shape, staircase.views()));
  Boxes missing = staircase;
  missing.boxes.pop_back();
  EXPECT_FALSE(TilesExactly(shape, missing.views()));
  std::optional<Box> gap = FindUncovered(shape, missing.views());
  ASSERT_TRUE(gap.has_value());
  EXPECT_EQ(*gap, staircase.boxes.back());
  Boxes overlapping = staircase;
  overlapping.Add(std::vector<int64_t>(n, 0), std::vector<int64_t>(n, 1));  // inside box 0
  EXPECT_FALSE(TilesExactly(shape, overlapping.views()));
}

TEST(PlanTiling, FindUncovered_ReportsTheHole) {
  Boxes b;
  b.Add({0, 0}, {4, 2}).Add({0, 4}, {4, 2});
  std::optional<Box> gap = FindUncovered({4, 6}, b.views());
  ASSERT_TRUE(gap.has_value());
  EXPECT_EQ(*gap, (Box{{0, 2}, {4, 2}}));
}

// Random boxes against a brute-force element count.
TEST(PlanTiling, RandomBoxes_MatchBruteForce) {
  std::mt19937 rng(20240607);
  int tilings = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    const size_t rank = 1 + rng() % 3;
    std::vector<int64_t> shape(rank);
    for (auto& d : shape) d = 1 + rng() % 4;
    Boxes b;
    if (iter % 2 == 0) {
      // A random guillotine tiling, sometimes perturbed below.
      std::vector<Box> work = {FullBox(shape)};
      while (!work.empty()) {
        Box box = work.back();
        work.pop_back();
        size_t axis = rng() % rank;
        if (box.lengths[axis] >= 2 && rng() % 3 != 0) {
          int64_t cut = 1 + rng() % (box.lengths[axis] - 1);
          Box hi = box;
          box.lengths[axis] = cut;
          hi.offsets[axis] += cut;
          hi.lengths[axis] -= cut;
          work.push_back(box);
          work.push_back(hi);
        } else {
          b.boxes.push_back(box);
        }
      }
      if (rng() % 2 == 0 && !b.boxes.empty())
        b.boxes.erase(b.boxes.begin() + rng() % b.boxes.size());
      if (rng() % 3 == 0) b.boxes.push_back(b.boxes.empty() ? FullBox(shape) : b.boxes[0]);
    } else {
      const int count = 1 + rng() % 5;
      for (int i = 0; i < count; ++i) {
        Box box;
        for (size_t d = 0; d < rank; ++d) {
          int64_t off = rng() % shape[d];
          box.offsets.push_back(off);
          box.lengths.push_back(rng() % (shape[d] - off + 1));
        }
        b.boxes.push_back(box);
      }
    }
    std::vector<int> counts = CoverCounts(shape, b.boxes);
    bool exact = true, overlap = false, gap = false;
    for (int c : counts) {
      exact &= c == 1;
      overlap |= c > 1;
      gap |= c == 0;
    }
    tilings += exact;
    ASSERT_EQ(TilesExactly(shape, b.views()), exact) << "iteration " << iter;
    std::optional<std::pair<size_t, size_t>> pair = FindOverlap(b.views());
    ASSERT_EQ(pair.has_value(), overlap) << "iteration " << iter;
    if (pair.has_value()) {
      ASSERT_TRUE(Intersect(b.boxes[pair->first], b.boxes[pair->second]).has_value());
    } else {
      std::optional<Box> hole = FindUncovered(shape, b.views());
      ASSERT_EQ(hole.has_value(), gap) << "iteration " << iter;
      if (hole.has_value()) {
        ASSERT_FALSE(IsEmpty(*hole));
        for (const Box& box : b.boxes) ASSERT_FALSE(Intersect(*hole, box).has_value());
      }
    }
  }
  EXPECT_GT(tilings, 300);  // the generator does produce exact tilings
}

}  // namespace
}  // namespace tessera
