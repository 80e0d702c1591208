// Box geometry the planner needs beyond common/box.h: does a set of boxes tile a tensor
// exactly, and if not, which two boxes overlap or which region nobody covers.
//
// Exact tiling is decided by signed corner counts. The coverage function f = sum of the
// boxes' indicators minus the tensor's indicator is zero iff the boxes tile the tensor; its
// mixed finite difference (one difference per axis) is a signed sum of point masses at box
// corners (sign (-1)^(number of "end" coordinates)), and since f has finite support the
// difference is zero iff f is. So the boxes tile exactly iff every corner's signed count,
// with the tensor's own corners subtracted, is zero. Axes that every box spans whole are
// dropped first; with `a` axes left and c boxes the test costs O(c * 2^a log(c * 2^a)), and no
// pair of boxes is ever compared. More than kMaxCornerAxes sharded axes (no real tensor has
// them) fall back to a sweep for overlaps plus a volume sum.
//
// Thread-safety: pure functions.
#ifndef TESSERA_SERVER_PLAN_PLAN_TILING_H_
#define TESSERA_SERVER_PLAN_PLAN_TILING_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>

#include "absl/types/span.h"
#include "common/box.h"

namespace tessera {

// A box whose coordinates live elsewhere (e.g. in a ShardDesc), so the planner never copies
// them. offsets and lengths have the same size.
struct BoxView {
  absl::Span<const int64_t> offsets;
  absl::Span<const int64_t> lengths;
};

inline constexpr size_t kMaxCornerAxes = 12;

// True iff every element of a tensor of `shape` lies in exactly one of `boxes`. Boxes must have
// shape's rank and non-negative lengths; empty boxes cover nothing and are allowed. A 0-d
// tensor is tiled by exactly one 0-d box.
bool TilesExactly(absl::Span<const int64_t> shape, absl::Span<const BoxView> boxes);

// Indices (i < j) of two boxes that share an element, or nullopt if they are pairwise
// disjoint. A sweep along the axis with the most distinct offsets; pairwise only among boxes
// that are open at the same point of that axis (meant for the error path and the fallback).
std::optional<std::pair<size_t, size_t>> FindOverlap(absl::Span<const BoxView> boxes);

// A region of a tensor of `shape` that no box covers, or nullopt if the boxes cover it all.
// Boxes must be pairwise disjoint (check FindOverlap first). Splits the tensor at the median
// box boundary until a part has no box in it.
std::optional<Box> FindUncovered(absl::Span<const int64_t> shape, absl::Span<const BoxView> boxes);

}  // namespace tessera

#endif  // TESSERA_SERVER_PLAN_PLAN_TILING_H_
