#include "common/box.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tessera {
namespace {

// offsets[d] + lengths[d] without overflow (boxes under test may be invalid).
__int128 End(const Box& box, size_t d) {
  return static_cast<__int128>(box.offsets[d]) + box.lengths[d];
}

bool WellFormed(const Box& box) {
  if (box.offsets.size() != box.lengths.size()) return false;
  for (int64_t len : box.lengths) {
    if (len < 0) return false;
  }
  return true;
}

}  // namespace

Box FullBox(absl::Span<const int64_t> shape) {
  Box box;
  box.offsets.assign(shape.size(), 0);
  box.lengths.assign(shape.begin(), shape.end());
  return box;
}

Box BoxFromProto(const v1::Box& proto) {
  Box box;
  box.offsets.assign(proto.offsets().begin(), proto.offsets().end());
  box.lengths.assign(proto.lengths().begin(), proto.lengths().end());
  return box;
}

v1::Box BoxToProto(const Box& box) {
  v1::Box proto;
  proto.mutable_offsets()->Add(box.offsets.begin(), box.offsets.end());
  proto.mutable_lengths()->Add(box.lengths.begin(), box.lengths.end());
  return proto;
}

std::string BoxToString(const Box& box) {
  std::vector<std::string> axes;
  for (size_t d = 0; d < box.rank(); ++d) {
    int64_t begin = d < box.offsets.size() ? box.offsets[d] : 0;
    int64_t end = 0;
    // Called on invalid boxes for error messages: an end past int64 is shown as a sum.
    axes.push_back(__builtin_add_overflow(begin, box.lengths[d], &end)
                       ? absl::StrCat(begin, ":", begin, "+", box.lengths[d])
                       : absl::StrCat(begin, ":", end));
  }
  return absl::StrCat("[", absl::StrJoin(axes, ", "), "]");
}

absl::StatusOr<int64_t> CheckedVolume(absl::Span<const int64_t> dims) {
  int64_t volume = 1;
  for (size_t d = 0; d < dims.size(); ++d) {
    if (dims[d] < 0) {
      return absl::InvalidArgumentError(absl::StrCat("axis ", d, " has negative size ", dims[d]));
    }
    if (__builtin_mul_overflow(volume, dims[d], &volume)) {
      return absl::InvalidArgumentError(
          absl::StrCat("element count of [", absl::StrJoin(dims, ", "), "] overflows int64"));
    }
  }
  return volume;
}

absl::StatusOr<int64_t> Volume(const Box& box) { return CheckedVolume(box.lengths); }

bool IsEmpty(const Box& box) {
  for (int64_t len : box.lengths) {
    if (len == 0) return true;
  }
  return false;
}

absl::Status ValidateBoxInShape(const Box& box, absl::Span<const int64_t> shape) {
  if (box.offsets.size() != box.lengths.size()) {
    return absl::InvalidArgumentError(absl::StrCat("box has ", box.offsets.size(),
                                                   " offsets but ", box.lengths.size(),
                                                   " lengths"));
  }
  if (box.rank() != shape.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("box has rank ", box.rank(), " but the tensor has rank ", shape.size()));
  }
  if (absl::StatusOr<int64_t> v = CheckedVolume(shape); !v.ok()) return v.status();
  for (size_t d = 0; d < shape.size(); ++d) {
    int64_t off = box.offsets[d], len = box.lengths[d];
    // off <= shape - len is the overflow-free form of off + len <= shape.
    if (off < 0 || len < 0 || off > shape[d] || len > shape[d] - off) {
      return absl::InvalidArgumentError(absl::StrCat("box ", BoxToString(box),
                                                     " is outside the tensor on axis ", d,
                                                     " (size ", shape[d], ")"));
    }
  }
  return absl::OkStatus();
}

std::optional<Box> Intersect(const Box& a, const Box& b) {
  if (a.rank() != b.rank() || !WellFormed(a) || !WellFormed(b)) return std::nullopt;
  Box out;
  out.offsets.resize(a.rank());
  out.lengths.resize(a.rank());
  for (size_t d = 0; d < a.rank(); ++d) {
    int64_t begin = std::max(a.offsets[d], b.offsets[d]);
    __int128 end = std::min(End(a, d), End(b, d));
    if (end <= begin) return std::nullopt;
    out.offsets[d] = begin;
    out.lengths[d] = static_cast<int64_t>(end - begin);  // <= both lengths
  }
  return out;
}

bool Contains(const Box& outer, const Box& inner) {
  if (outer.rank() != inner.rank() || !WellFormed(outer) || !WellFormed(inner)) return false;
  for (size_t d = 0; d < outer.rank(); ++d) {
    if (inner.offsets[d] < outer.offsets[d]) return false;
    if (End(inner, d) > End(outer, d)) return false;
  }
  return true;
}

int64_t FlatIndex(const Box& box, absl::Span<const int64_t> point) {
  int64_t index = 0;
  for (size_t d = 0; d < box.rank(); ++d) {
    index = index * box.lengths[d] + (point[d] - box.offsets[d]);
  }
  return index;
}

absl::StatusOr<std::vector<ElementRun>> RowMajorRuns(const Box& outer, const Box& inner) {
  if (!Contains(outer, inner)) {
    return absl::InvalidArgumentError(absl::StrCat("box ", BoxToString(inner),
                                                   " is not inside ", BoxToString(outer)));
  }
  if (absl::StatusOr<int64_t> v = Volume(outer); !v.ok()) return v.status();
  std::vector<ElementRun> runs;
  const size_t rank = outer.rank();
  if (rank == 0) {
    runs.push_back({0, 1});
    return runs;
  }
  if (IsEmpty(inner)) return runs;

  // Axes after `split` are spanned whole by `inner`, so each run covers axis `split` and
  // everything after it; we iterate over the axes before `split`.
  size_t split = rank - 1;
  while (split > 0 && inner.lengths[split] == outer.lengths[split]) --split;
  std::vector<int64_t> stride(rank, 1);
  for (size_t d = rank - 1; d > 0; --d) stride[d - 1] = stride[d] * outer.lengths[d];
  const int64_t run_count = inner.lengths[split] * stride[split];

  std::vector<int64_t> index(split, 0);  // position within inner along axes [0, split)
  while (true) {
    int64_t start = (inner.offsets[split] - outer.offsets[split]) * stride[split];
    for (size_t d = 0; d < split; ++d) {
      start += (inner.offsets[d] - outer.offsets[d] + index[d]) * stride[d];
    }
    if (!runs.empty() && runs.back().start + runs.back().count == start) {
      runs.back().count += run_count;
    } else {
      runs.push_back({start, run_count});
    }
    // Advance the odometer over axes [0, split).
    size_t d = split;
    while (d > 0) {
      --d;
      if (++index[d] < inner.lengths[d]) break;
      index[d] = 0;
      if (d == 0) return runs;
    }
    if (split == 0) return runs;
  }
}

}  // namespace tessera
