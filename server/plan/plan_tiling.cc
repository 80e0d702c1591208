#include "server/plan/plan_tiling.h"

#include <algorithm>
#include <vector>

namespace tessera {
namespace {

bool HasZeroDim(absl::Span<const int64_t> shape) {
  return std::any_of(shape.begin(), shape.end(), [](int64_t d) { return d == 0; });
}

bool IsEmptyView(const BoxView& box) {
  return std::any_of(box.lengths.begin(), box.lengths.end(), [](int64_t l) { return l == 0; });
}

bool Overlaps(const BoxView& a, const BoxView& b) {
  for (size_t d = 0; d < a.offsets.size(); ++d) {
    int64_t begin = std::max(a.offsets[d], b.offsets[d]);
    int64_t end = std::min(a.offsets[d] + a.lengths[d], b.offsets[d] + b.lengths[d]);
    if (end <= begin) return false;
  }
  return true;
}

bool OverlapsRegion(const BoxView& a, const Box& region) {
  return Overlaps(a, BoxView{region.offsets, region.lengths});
}

bool ContainsRegion(const BoxView& outer, const Box& region) {
  for (size_t d = 0; d < region.rank(); ++d) {
    if (region.offsets[d] < outer.offsets[d]) return false;
    if (region.offsets[d] + region.lengths[d] > outer.offsets[d] + outer.lengths[d]) return false;
  }
  return true;
}

// Disjoint boxes inside the tensor whose volumes sum to the tensor's tile it.
bool SweepTiles(absl::Span<const int64_t> shape, absl::Span<const BoxView> boxes) {
  unsigned __int128 total = 1, covered = 0;
  for (int64_t d : shape) total *= static_cast<uint64_t>(d);
  for (const BoxView& box : boxes) {
    unsigned __int128 volume = 1;
    for (int64_t l : box.lengths) volume *= static_cast<uint64_t>(l);
    covered += volume;
  }
  return covered == total && !FindOverlap(boxes).has_value();
}

std::optional<Box> Uncovered(const Box& region, const std::vector<const BoxView*>& boxes) {
  if (boxes.empty()) return region;
  for (const BoxView* box : boxes) {
    if (ContainsRegion(*box, region)) return std::nullopt;
  }
  // Some box meets the region without containing it, so one of its boundaries lies strictly
  // inside the region. Split at the median such boundary of the axis that has the most.
  size_t best_axis = 0;
  std::vector<int64_t> best_cuts, cuts;
  for (size_t d = 0; d < region.rank(); ++d) {
    cuts.clear();
    const int64_t lo = region.offsets[d], hi = region.offsets[d] + region.lengths[d];
    for (const BoxView* box : boxes) {
      for (int64_t v : {box->offsets[d], box->offsets[d] + box->lengths[d]}) {
        if (v > lo && v < hi) cuts.push_back(v);
      }
    }
    if (cuts.size() > best_cuts.size()) {
      best_axis = d;
      best_cuts.swap(cuts);
    }
  }
  if (best_cuts.empty()) return std::nullopt;  // unreachable for valid input
  auto mid = best_cuts.begin() + best_cuts.size() / 2;
  std::nth_element(best_cuts.begin(), mid, best_cuts.end());
  const int64_t cut = *mid;

  Box halves[2] = {region, region};
  halves[0].lengths[best_axis] = cut - region.offsets[best_axis];
  halves[1].offsets[best_axis] = cut;
  halves[1].lengths[best_axis] = region.offsets[best_axis] + region.lengths[best_axis] - cut;
  for (const Box& half : halves) {
    std::vector<const BoxView*> inside;
    for (const BoxView* box : boxes) {
      if (OverlapsRegion(*box, half)) inside.push_back(box);
    }
    if (std::optional<Box> gap = Uncovered(half, inside); gap.has_value()) return gap;
  }
  return std::nullopt;
}

}  // namespace

bool TilesExactly(absl::Span<const int64_t> shape, absl::Span<const BoxView> boxes) {
  if (HasZeroDim(shape)) {
    return std::all_of(boxes.begin(), boxes.end(), IsEmptyView);
  }
  if (boxes.size() == 1) {  // the common case of an unsharded tensor, without allocating
    const BoxView& box = boxes[0];
    for (size_t d = 0; d < shape.size(); ++d) {
      if (box.offsets[d] != 0 || box.lengths[d] != shape[d]) return false;
    }
    return true;
  }
  // Axes some box does not span whole; the others factor out of the coverage function.
  std::vector<size_t> axes;
  for (size_t d = 0; d < shape.size(); ++d) {
    for (const BoxView& box : boxes) {
      if (box.offsets[d] != 0 || box.lengths[d] != shape[d]) {
        axes.push_back(d);
        break;
      }
    }
  }
  if (axes.size() > kMaxCornerAxes) return SweepTiles(shape, boxes);

  // Compress each sharded axis to the indices of its distinct boundaries, and number corners
  // in mixed radix over them.
  const size_t a_count = axes.size();
  std::vector<std::vector<int64_t>> coords(a_count);
  std::vector<uint64_t> stride(a_count);
  uint64_t radix = 1;
  for (size_t a = 0; a < a_count; ++a) {
    const size_t d = axes[a];
    std::vector<int64_t>& c = coords[a];
    c.reserve(2 * boxes.size() + 2);
    c.push_back(0);
    c.push_back(shape[d]);
    for (const BoxView& box : boxes) {
      c.push_back(box.offsets[d]);
      c.push_back(box.offsets[d] + box.lengths[d]);
    }
    std::sort(c.begin(), c.end());
    c.erase(std::unique(c.begin(), c.end()), c.end());
    stride[a] = radix;
    if (__builtin_mul_overflow(radix, static_cast<uint64_t>(c.size()), &radix)) {
      return SweepTiles(shape, boxes);
    }
  }

  std::vector<std::pair<uint64_t, int32_t>> corners;
  corners.reserve((boxes.size() + 1) << a_count);
  std::vector<uint64_t> lo(a_count), hi(a_count);
  auto add_corners = [&](int32_t sign) {
    for (uint64_t m = 0; m < (uint64_t{1} << a_count); ++m) {
      uint64_t code = 0;
      for (size_t a = 0; a < a_count; ++a) code += ((m >> a) & 1 ? hi[a] : lo[a]) * stride[a];
      corners.emplace_back(code, __builtin_popcountll(m) & 1 ? -sign : sign);
    }
  };
  auto index_of = [&](size_t a, int64_t v) {
    return static_cast<uint64_t>(std::lower_bound(coords[a].begin(), coords[a].end(), v) -
                                 coords[a].begin());
  };
  for (const BoxView& box : boxes) {
    if (IsEmptyView(box)) continue;  // its corners cancel
    for (size_t a = 0; a < a_count; ++a) {
      lo[a] = index_of(a, box.offsets[axes[a]]);
      hi[a] = index_of(a, box.offsets[axes[a]] + box.lengths[axes[a]]);
    }
    add_corners(+1);
  }
  for (size_t a = 0; a < a_count; ++a) {
    lo[a] = index_of(a, 0);
    hi[a] = index_of(a, shape[axes[a]]);
  }
  add_corners(-1);

  std::sort(corners.begin(), corners.end(),
            [](const auto& x, const auto& y) { return x.first < y.first; });
  for (size_t i = 0; i < corners.size();) {
    int64_t sum = 0;
    size_t j = i;
    for (; j < corners.size() && corners[j].first == corners[i].first; ++j) {
      sum += corners[j].second;
    }
    if (sum != 0) return false;
    i = j;
  }
  return true;
}

std::optional<std::pair<size_t, size_t>> FindOverlap(absl::Span<const BoxView> boxes) {
  std::vector<size_t> order;
  for (size_t i = 0; i < boxes.size(); ++i) {
    if (!IsEmptyView(boxes[i])) order.push_back(i);
  }
  if (order.size() < 2) return std::nullopt;
  const size_t rank = boxes[order[0]].offsets.size();
  if (rank == 0) return std::make_pair(order[0], order[1]);  // both are the one element

  size_t axis = 0, most = 0;
  for (size_t d = 0; d < rank; ++d) {
    std::vector<int64_t> offsets;
    offsets.reserve(order.size());
    for (size_t i : order) offsets.push_back(boxes[i].offsets[d]);
    std::sort(offsets.begin(), offsets.end());
    size_t distinct = std::unique(offsets.begin(), offsets.end()) - offsets.begin();
    if (distinct > most) {
      most = distinct;
      axis = d;
    }
  }
  std::sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    return boxes[x].offsets[axis] != boxes[y].offsets[axis]
               ? boxes[x].offsets[axis] < boxes[y].offsets[axis]
               : x < y;
  });
  std::vector<size_t> open;  // boxes whose extent on `axis` contains the sweep position
  for (size_t i : order) {
    const int64_t at = boxes[i].offsets[axis];
    open.erase(std::remove_if(
                   open.begin(), open.end(),
                   [&](size_t o) { return boxes[o].offsets[axis] + boxes[o].lengths[axis] <= at; }),
               open.end());
    for (size_t o : open) {
      if (Overlaps(boxes[o], boxes[i])) return std::make_pair(std::min(o, i), std::max(o, i));
    }
    open.push_back(i);
  }
  return std::nullopt;
}

std::optional<Box> FindUncovered(absl::Span<const int64_t> shape, absl::Span<const BoxView> boxes) {
  if (HasZeroDim(shape)) return std::nullopt;
  std::vector<const BoxView*> nonempty;
  for (const BoxView& box : boxes) {
    if (!IsEmptyView(box)) nonempty.push_back(&box);
  }
  return Uncovered(FullBox(shape), nonempty);
}

}  // namespace tessera
