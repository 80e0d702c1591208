#include "common/box.h"

#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tessera {
namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

Box MakeBox(std::vector<int64_t> offsets, std::vector<int64_t> lengths) {
  Box box;
  box.offsets = std::move(offsets);
  box.lengths = std::move(lengths);
  return box;
}

std::vector<ElementRun> Runs(const Box& outer, const Box& inner) {
  absl::StatusOr<std::vector<ElementRun>> runs = RowMajorRuns(outer, inner);
  EXPECT_TRUE(runs.ok()) << runs.status();
  return runs.ok() ? *runs : std::vector<ElementRun>{};
}

std::string RunsToString(const std::vector<ElementRun>& runs) {
  std::string out;
  for (const ElementRun& r : runs) out += "[" + std::to_string(r.start) + "+" + std::to_string(r.count) + ")";
  return out;
}

// --- basics ------------------------------------------------------------------------------

TEST(Box, FullBox) {
  EXPECT_EQ(FullBox({4, 8}), MakeBox({0, 0}, {4, 8}));
  EXPECT_EQ(FullBox({}), MakeBox({}, {}));
  EXPECT_EQ(FullBox({0}).rank(), 1u);
}

TEST(Box, ProtoRoundTrip) {
  for (const Box& box : {MakeBox({}, {}), MakeBox({3}, {0}), MakeBox({1, 2, kMax}, {4, 5, 0})}) {
    v1::Box proto = BoxToProto(box);
    EXPECT_EQ(proto.offsets_size(), static_cast<int>(box.rank()));
    EXPECT_EQ(BoxFromProto(proto), box);
  }
}

TEST(Box, ToString) {
  EXPECT_EQ(BoxToString(MakeBox({0, 8}, {4, 8})), "[0:4, 8:16]");
  EXPECT_EQ(BoxToString(MakeBox({}, {})), "[]");
  EXPECT_EQ(BoxToString(MakeBox({5}, {0})), "[5:5]");
}

TEST(Box, ToString_OverflowingEnd_NoUndefinedBehaviour) {
  // Used in error messages about invalid boxes, so it must cope with them.
  std::string s = BoxToString(MakeBox({kMax - 1}, {10}));
  EXPECT_NE(s.find("9223372036854775806"), std::string::npos) << s;
}

TEST(Box, Ordering_LexicographicOffsetsThenLengths) {
  EXPECT_LT(MakeBox({0, 4}, {4, 4}), MakeBox({1, 0}, {1, 1}));
  EXPECT_LT(MakeBox({0, 4}, {2, 4}), MakeBox({0, 4}, {4, 4}));
  EXPECT_FALSE(MakeBox({0}, {4}) < MakeBox({0}, {4}));
  EXPECT_NE(MakeBox({0}, {4}), MakeBox({0}, {5}));
}

// --- volume ------------------------------------------------------------------------------

TEST(Volume, Basic) {
  EXPECT_EQ(*Volume(MakeBox({0, 0}, {4, 8})), 32);
  EXPECT_EQ(*Volume(MakeBox({0, 0, 0}, {4, 0, 8})), 0);
  EXPECT_EQ(*CheckedVolume({7}), 7);
}

TEST(Volume, ZeroD_IsOneElement) {
  EXPECT_EQ(*Volume(MakeBox({}, {})), 1);
  EXPECT_EQ(*CheckedVolume({}), 1);
  EXPECT_FALSE(IsEmpty(MakeBox({}, {})));
}

TEST(Volume, IsEmpty) {
  EXPECT_TRUE(IsEmpty(MakeBox({0}, {0})));
  EXPECT_TRUE(IsEmpty(MakeBox({1, 2}, {3, 0})));
  EXPECT_FALSE(IsEmpty(MakeBox({1, 2}, {3, 1})));
}

TEST(Volume, Overflow_IsError) {
  EXPECT_EQ(CheckedVolume({int64_t{1} << 32, int64_t{1} << 32}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckedVolume({kMax, 2}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Volume(MakeBox({0, 0, 0}, {1 << 21, 1 << 21, 1 << 21})).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Largest exact fit is fine.
  EXPECT_EQ(*CheckedVolume({kMax, 1}), kMax);
  EXPECT_EQ(*CheckedVolume({int64_t{1} << 31, int64_t{1} << 31}), int64_t{1} << 62);
}

TEST(Volume, ZeroAfterHugeDims_StillRejectedOrZero) {
  // A zero anywhere makes the true product 0; an overflow before it is still reported,
  // never wrapped. Either way no UB; the result must not be a bogus non-zero count.
  absl::StatusOr<int64_t> v = CheckedVolume({kMax, kMax, 0});
  if (v.ok()) {
    EXPECT_EQ(*v, 0);
  }
  EXPECT_EQ(*CheckedVolume({0, kMax, kMax}), 0);
}

TEST(Volume, NegativeDim_IsError) {
  absl::StatusOr<int64_t> v = CheckedVolume({4, -1});
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(v.status().message().find("axis 1"), absl::string_view::npos) << v.status();
}

// --- ValidateBoxInShape ------------------------------------------------------------------

TEST(ValidateBoxInShape, Accepts) {
  EXPECT_TRUE(ValidateBoxInShape(MakeBox({0, 0}, {4, 8}), {4, 8}).ok());
  EXPECT_TRUE(ValidateBoxInShape(MakeBox({2, 4}, {2, 4}), {4, 8}).ok());
  EXPECT_TRUE(ValidateBoxInShape(MakeBox({}, {}), {}).ok());            // 0-d
  EXPECT_TRUE(ValidateBoxInShape(MakeBox({4}, {0}), {4}).ok());         // empty at the end
  EXPECT_TRUE(ValidateBoxInShape(MakeBox({0}, {0}), {0}).ok());         // zero-size tensor
  EXPECT_TRUE(ValidateBoxInShape(MakeBox({kMax - 1}, {1}), {kMax}).ok());
  EXPECT_TRUE(ValidateBoxInShape(MakeBox({0}, {kMax}), {kMax}).ok());
}

void ExpectOutside(const Box& box, std::vector<int64_t> shape, const std::string& axis_text) {
  absl::Status s = ValidateBoxInShape(box, shape);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << BoxToString(box);
  if (!axis_text.empty()) {
    EXPECT_NE(s.message().find(axis_text), absl::string_view::npos) << s;
  }
}

TEST(ValidateBoxInShape, EachAxisChecked) {
  ExpectOutside(MakeBox({0, 0, 0}, {5, 8, 2}), {4, 8, 2}, "axis 0");
  ExpectOutside(MakeBox({0, 1, 0}, {4, 8, 2}), {4, 8, 2}, "axis 1");
  ExpectOutside(MakeBox({0, 0, 2}, {4, 8, 1}), {4, 8, 2}, "axis 2");
  ExpectOutside(MakeBox({0, 0, 3}, {4, 8, 0}), {4, 8, 2}, "axis 2");  // empty but off the end
}

TEST(ValidateBoxInShape, NegativeOffsetsOrLengths_Rejected) {
  ExpectOutside(MakeBox({-1}, {2}), {4}, "axis 0");
  ExpectOutside(MakeBox({2}, {-1}), {4}, "axis 0");
  ExpectOutside(MakeBox({0, std::numeric_limits<int64_t>::min()}, {1, 1}), {4, 4}, "axis 1");
}

TEST(ValidateBoxInShape, OffsetPlusLengthOverflow_Rejected) {
  ExpectOutside(MakeBox({kMax - 1}, {10}), {kMax}, "axis 0");
  ExpectOutside(MakeBox({0, kMax}, {1, kMax}), {1, kMax}, "axis 1");
  ExpectOutside(MakeBox({kMax}, {1}), {kMax}, "axis 0");
}

TEST(ValidateBoxInShape, RankMismatch_Rejected) {
  EXPECT_FALSE(ValidateBoxInShape(MakeBox({0}, {4}), {4, 4}).ok());
  EXPECT_FALSE(ValidateBoxInShape(MakeBox({}, {}), {1}).ok());
  EXPECT_FALSE(ValidateBoxInShape(MakeBox({0, 0}, {4}), {4}).ok());  // offsets/lengths differ
  EXPECT_FALSE(ValidateBoxInShape(MakeBox({0}, {4, 4}), {4, 4}).ok());
}

TEST(ValidateBoxInShape, BadShape_Rejected) {
  EXPECT_FALSE(ValidateBoxInShape(MakeBox({0, 0}, {1, 1}), {4, -4}).ok());
  EXPECT_FALSE(ValidateBoxInShape(MakeBox({0, 0}, {1, 1}), {kMax, 2}).ok());  // overflows
}

// --- Intersect / Contains ----------------------------------------------------------------

TEST(Intersect, Overlapping) {
  std::optional<Box> i = Intersect(MakeBox({0, 0}, {4, 4}), MakeBox({2, 3}, {4, 4}));
  ASSERT_TRUE(i.has_value());
  EXPECT_EQ(*i, MakeBox({2, 3}, {2, 1}));
}

TEST(Intersect, Nested_IsInner) {
  Box outer = MakeBox({0, 0}, {8, 8}), inner = MakeBox({2, 3}, {1, 4});
  EXPECT_EQ(Intersect(outer, inner), std::optional<Box>(inner));
  EXPECT_EQ(Intersect(inner, outer), std::optional<Box>(inner));
  EXPECT_EQ(Intersect(outer, outer), std::optional<Box>(outer));
}

TEST(Intersect, TouchingButDisjoint_IsNullopt) {
  EXPECT_FALSE(Intersect(MakeBox({0}, {4}), MakeBox({4}, {4})).has_value());
  EXPECT_FALSE(Intersect(MakeBox({0, 0}, {4, 4}), MakeBox({0, 4}, {4, 4})).has_value());
  EXPECT_FALSE(Intersect(MakeBox({0, 0}, {4, 4}), MakeBox({4, 4}, {1, 1})).has_value());
  // Overlap on one axis only is no overlap.
  EXPECT_FALSE(Intersect(MakeBox({0, 0}, {4, 4}), MakeBox({1, 10}, {2, 2})).has_value());
}

TEST(Intersect, EmptyBoxes_IsNullopt) {
  EXPECT_FALSE(Intersect(MakeBox({2}, {0}), MakeBox({0}, {4})).has_value());
  EXPECT_FALSE(Intersect(MakeBox({0}, {4}), MakeBox({2}, {0})).has_value());
}

TEST(Intersect, ZeroD_IsZeroD) {
  std::optional<Box> i = Intersect(MakeBox({}, {}), MakeBox({}, {}));
  ASSERT_TRUE(i.has_value());
  EXPECT_EQ(i->rank(), 0u);
}

TEST(Intersect, RankMismatch_IsNullopt) {
  EXPECT_FALSE(Intersect(MakeBox({0}, {4}), MakeBox({0, 0}, {4, 4})).has_value());
}

TEST(Intersect, HugeCoordinates_NoOverflow) {
  std::optional<Box> i = Intersect(MakeBox({kMax - 10}, {10}), MakeBox({kMax - 5}, {kMax}));
  ASSERT_TRUE(i.has_value());
  EXPECT_EQ(*i, MakeBox({kMax - 5}, {5}));
  EXPECT_FALSE(Intersect(MakeBox({kMax - 1}, {10}), MakeBox({0}, {kMax - 1})).has_value());
}

TEST(Contains, Basic) {
  Box outer = MakeBox({2, 2}, {4, 4});
  EXPECT_TRUE(Contains(outer, outer));
  EXPECT_TRUE(Contains(outer, MakeBox({3, 2}, {3, 4})));
  EXPECT_FALSE(Contains(outer, MakeBox({1, 2}, {1, 1})));   // before on axis 0
  EXPECT_FALSE(Contains(outer, MakeBox({2, 5}, {1, 2})));   // past the end on axis 1
  EXPECT_FALSE(Contains(MakeBox({0}, {4}), MakeBox({4}, {1})));  // touching, disjoint
  EXPECT_FALSE(Contains(MakeBox({3, 2}, {3, 4}), outer));
}

TEST(Contains, EmptyInner) {
  Box outer = MakeBox({2}, {4});
  EXPECT_TRUE(Contains(outer, MakeBox({2}, {0})));
  EXPECT_TRUE(Contains(outer, MakeBox({6}, {0})));  // at the end: still within the range
  EXPECT_FALSE(Contains(outer, MakeBox({7}, {0})));
  EXPECT_FALSE(Contains(outer, MakeBox({1}, {0})));
}

TEST(Contains, ZeroDAndRankMismatch) {
  EXPECT_TRUE(Contains(MakeBox({}, {}), MakeBox({}, {})));
  EXPECT_FALSE(Contains(MakeBox({0}, {4}), MakeBox({}, {})));
  EXPECT_FALSE(Contains(MakeBox({}, {}), MakeBox({0}, {1})));
}

TEST(Contains, OverflowingInnerEnd_NotContained) {
  EXPECT_FALSE(Contains(MakeBox({0}, {kMax}), MakeBox({kMax - 1}, {10})));
  EXPECT_FALSE(Contains(MakeBox({0}, {kMax}), MakeBox({kMax}, {kMax})));
  EXPECT_TRUE(Contains(MakeBox({0}, {kMax}), MakeBox({kMax - 1}, {1})));
}

TEST(Contains, NegativeLengths_NotContained) {
  EXPECT_FALSE(Contains(MakeBox({0}, {4}), MakeBox({2}, {-1})));
  EXPECT_FALSE(Contains(MakeBox({0}, {-4}), MakeBox({0}, {0})));
}

// --- FlatIndex ---------------------------------------------------------------------------

TEST(FlatIndex, RowMajorWithinBox) {
  Box box = MakeBox({10, 20, 30}, {2, 3, 4});
  EXPECT_EQ(FlatIndex(box, std::vector<int64_t>{10, 20, 30}), 0);
  EXPECT_EQ(FlatIndex(box, std::vector<int64_t>{10, 20, 33}), 3);
  EXPECT_EQ(FlatIndex(box, std::vector<int64_t>{10, 21, 30}), 4);
  EXPECT_EQ(FlatIndex(box, std::vector<int64_t>{11, 22, 33}), 23);
  EXPECT_EQ(FlatIndex(MakeBox({}, {}), std::vector<int64_t>{}), 0);
}

// --- RowMajorRuns ------------------------------------------------------------------------

TEST(RowMajorRuns, FullBox_OneRun) {
  Box outer = MakeBox({0, 0, 0}, {3, 4, 5});
  EXPECT_EQ(Runs(outer, outer), (std::vector<ElementRun>{{0, 60}}));
  Box shifted = MakeBox({7, 8}, {3, 4});
  EXPECT_EQ(Runs(shifted, shifted), (std::vector<ElementRun>{{0, 12}}));
}

TEST(RowMajorRuns, ZeroD_OneElement) {
  EXPECT_EQ(Runs(MakeBox({}, {}), MakeBox({}, {})), (std::vector<ElementRun>{{0, 1}}));
}

TEST(RowMajorRuns, RowSlice_OneRun) {
  // Rows 2..4 of an 8x16 matrix.
  EXPECT_EQ(Runs(MakeBox({0, 0}, {8, 16}), MakeBox({2, 0}, {2, 16})),
            (std::vector<ElementRun>{{32, 32}}));
}

TEST(RowMajorRuns, ColumnSlice_OneRunPerRow) {
  // Columns 4..8 of a 3x16 matrix.
  EXPECT_EQ(Runs(MakeBox({0, 0}, {3, 16}), MakeBox({0, 4}, {3, 4})),
            (std::vector<ElementRun>{{4, 4}, {20, 4}, {36, 4}}));
}

TEST(RowMajorRuns, ThreeDSubBox) {
  // outer 3x4x5 (strides 20, 5, 1); inner [1:3, 1:3, 2:4].
  EXPECT_EQ(Runs(MakeBox({0, 0, 0}, {3, 4, 5}), MakeBox({1, 1, 2}, {2, 2, 2})),
            (std::vector<ElementRun>{{27, 2}, {32, 2}, {47, 2}, {52, 2}}));
}

TEST(RowMajorRuns, TrailingFullAxes_Merged) {
  // outer 4x3x5; inner [1:3, 0:3, 0:5] spans the two trailing axes: one run of 2*15.
  EXPECT_EQ(Runs(MakeBox({0, 0, 0}, {4, 3, 5}), MakeBox({1, 0, 0}, {2, 3, 5})),
            (std::vector<ElementRun>{{15, 30}}));
  // inner [0:4, 1:2, 0:5]: last axis full, axis 1 partial: 4 runs of 5.
  EXPECT_EQ(Runs(MakeBox({0, 0, 0}, {4, 3, 5}), MakeBox({0, 1, 0}, {4, 1, 5})),
            (std::vector<ElementRun>{{5, 5}, {20, 5}, {35, 5}, {50, 5}}));
}

TEST(RowMajorRuns, LengthOneLeadingAxes_Merged) {
  // A single row of a 1x1x8 box inside 1x1x8 is contiguous.
  EXPECT_EQ(Runs(MakeBox({0, 0, 0}, {2, 1, 8}), MakeBox({1, 0, 0}, {1, 1, 8})),
            (std::vector<ElementRun>{{8, 8}}));
}

TEST(RowMajorRuns, OuterWithOffsets_RunsRelativeToOuter) {
  EXPECT_EQ(Runs(MakeBox({100, 200}, {4, 10}), MakeBox({101, 203}, {2, 3})),
            (std::vector<ElementRun>{{13, 3}, {23, 3}}));
}

TEST(RowMajorRuns, EmptyInner_NoRuns) {
  EXPECT_TRUE(Runs(MakeBox({0, 0}, {4, 4}), MakeBox({1, 1}, {0, 3})).empty());
  EXPECT_TRUE(Runs(MakeBox({0, 0}, {4, 4}), MakeBox({1, 1}, {3, 0})).empty());
  EXPECT_TRUE(Runs(MakeBox({0, 0}, {0, 4}), MakeBox({0, 0}, {0, 4})).empty());
}

TEST(RowMajorRuns, InnerOutsideOuter_Rejected) {
  EXPECT_EQ(RowMajorRuns(MakeBox({0, 0}, {4, 4}), MakeBox({2, 2}, {3, 1})).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RowMajorRuns(MakeBox({1}, {4}), MakeBox({0}, {1})).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RowMajorRuns(MakeBox({0}, {4}), MakeBox({0, 0}, {1, 1})).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RowMajorRuns(MakeBox({0}, {kMax}), MakeBox({kMax - 1}, {10})).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RowMajorRuns(MakeBox({0}, {4}), MakeBox({2}, {-1})).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(RowMajorRuns, OuterVolumeOverflow_Rejected) {
  Box outer = MakeBox({0, 0, 0}, {1 << 22, 1 << 22, 1 << 22});
  EXPECT_EQ(RowMajorRuns(outer, MakeBox({0, 0, 0}, {1, 1, 1})).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(RowMajorRuns, HugeButValidOuter_SingleElement) {
  Box outer = MakeBox({0, 0}, {int64_t{1} << 31, int64_t{1} << 31});
  Box inner = MakeBox({(int64_t{1} << 31) - 1, (int64_t{1} << 31) - 1}, {1, 1});
  EXPECT_EQ(Runs(outer, inner), (std::vector<ElementRun>{{(int64_t{1} << 62) - 1, 1}}));
}

// Reference: walk every element of `outer` row-major and collect those inside `inner`.
std::vector<ElementRun> BruteForceRuns(const Box& outer, const Box& inner) {
  std::vector<ElementRun> runs;
  const size_t rank = outer.rank();
  int64_t total = 1;
  for (int64_t len : outer.lengths) total *= len;
  std::vector<int64_t> point(rank);
  for (int64_t flat = 0; flat < total; ++flat) {
    int64_t rest = flat;
    for (size_t d = rank; d-- > 0;) {
      point[d] = outer.offsets[d] + rest % outer.lengths[d];
      rest /= outer.lengths[d];
    }
    bool inside = true;
    for (size_t d = 0; d < rank; ++d) {
      if (point[d] < inner.offsets[d] || point[d] >= inner.offsets[d] + inner.lengths[d]) {
        inside = false;
      }
    }
    if (!inside) continue;
    EXPECT_EQ(FlatIndex(outer, point), flat);
    if (!runs.empty() && runs.back().start + runs.back().count == flat) {
      ++runs.back().count;
    } else {
      runs.push_back({flat, 1});
    }
  }
  return runs;
}

TEST(RowMajorRuns, MatchesBruteForceOnRandomBoxes) {
  std::mt19937 rng(20240611);
  auto uniform = [&rng](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  int nonempty = 0;
  for (int trial = 0; trial < 5000; ++trial) {
    const size_t rank = static_cast<size_t>(uniform(0, 4));
    Box outer, inner;
    for (size_t d = 0; d < rank; ++d) {
      int64_t len = uniform(0, 5);
      int64_t off = uniform(0, 3);
      outer.offsets.push_back(off);
      outer.lengths.push_back(len);
      // Bias towards full axes so that merging of trailing axes is exercised.
      int64_t ilen = uniform(0, 2) == 0 ? len : uniform(0, len);
      int64_t ioff = off + uniform(0, len - ilen);
      inner.offsets.push_back(ioff);
      inner.lengths.push_back(ilen);
    }
    SCOPED_TRACE("outer " + BoxToString(outer) + " inner " + BoxToString(inner));
    ASSERT_TRUE(Contains(outer, inner));
    std::vector<ElementRun> want = BruteForceRuns(outer, inner);
    std::vector<ElementRun> got = Runs(outer, inner);
    EXPECT_EQ(RunsToString(got), RunsToString(want));
    int64_t covered = 0;
    for (const ElementRun& r : got) covered += r.count;
    EXPECT_EQ(covered, *Volume(inner));
    if (!want.empty()) ++nonempty;
  }
  EXPECT_GT(nonempty, 1000);  // the generator is not degenerate
}

TEST(RowMajorRuns, RandomBoxesAreNeverContainedWhenPokingOut) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 1000; ++trial) {
    const size_t rank = 1 + rng() % 3;
    Box outer, inner;
    for (size_t d = 0; d < rank; ++d) {
      outer.offsets.push_back(rng() % 4);
      outer.lengths.push_back(1 + rng() % 4);
      inner.offsets.push_back(outer.offsets[d]);
      inner.lengths.push_back(outer.lengths[d]);
    }
    size_t axis = rng() % rank;
    if (rng() % 2) {
      --inner.offsets[axis];  // starts before
    } else {
      ++inner.lengths[axis];  // ends after
    }
    EXPECT_FALSE(Contains(outer, inner));
    EXPECT_FALSE(RowMajorRuns(outer, inner).ok());
  }
}

}  // namespace
}  // namespace tessera
