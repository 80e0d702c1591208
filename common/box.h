// N-d box geometry over row-major tensors: volume, intersection, containment, and the
// contiguous element runs a sub-box occupies inside an enclosing box.
//
// A Box is `offsets` and `lengths`, one entry per axis; a 0-d box (no axes) holds one element.
// All arithmetic is checked: element counts that overflow int64 are errors, never UB.
//
// Thread-safety: value type and free functions.
#ifndef TESSERA_COMMON_BOX_H_
#define TESSERA_COMMON_BOX_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "tessera/v1/types.pb.h"

namespace tessera {

struct Box {
  std::vector<int64_t> offsets;
  std::vector<int64_t> lengths;

  size_t rank() const { return lengths.size(); }
  bool operator==(const Box& other) const {
    return offsets == other.offsets && lengths == other.lengths;
  }
  bool operator!=(const Box& other) const { return !(*this == other); }
  // Lexicographic by offsets, then lengths: the planner's sort order.
  bool operator<(const Box& other) const {
    return offsets != other.offsets ? offsets < other.offsets : lengths < other.lengths;
  }
};

// The whole of a tensor of `shape`.
Box FullBox(absl::Span<const int64_t> shape);

Box BoxFromProto(const v1::Box& proto);
v1::Box BoxToProto(const Box& box);

// "[0:4, 8:16]" (half-open per axis); "[]" for 0-d.
std::string BoxToString(const Box& box);

// Product of `dims`. Errors: InvalidArgument if a dim is negative or the product overflows.
absl::StatusOr<int64_t> CheckedVolume(absl::Span<const int64_t> dims);

// Elements in `box` (1 for 0-d). Errors as CheckedVolume.
absl::StatusOr<int64_t> Volume(const Box& box);

// True if some length is zero (a 0-d box is never empty).
bool IsEmpty(const Box& box);

// OK if `box` has shape's rank, non-negative offsets and lengths, and lies within `shape`
// (checked without overflow). Errors: InvalidArgument saying which axis is wrong.
absl::Status ValidateBoxInShape(const Box& box, absl::Span<const int64_t> shape);

// The common region of two boxes of equal rank, or nullopt if it holds no element.
// For two 0-d boxes the result is the 0-d box. nullopt if either box is malformed (negative
// length, offsets and lengths of different sizes).
std::optional<Box> Intersect(const Box& a, const Box& b);

// True if `inner` lies inside `outer` (equal ranks). An empty inner box is inside any box
// whose per-axis ranges contain its offsets. False if either box is malformed (negative
// length, offsets and lengths of different sizes); ends past int64 are compared exactly.
bool Contains(const Box& outer, const Box& inner);

// A run of consecutive elements of a row-major buffer: [start, start + count).
struct ElementRun {
  int64_t start;
  int64_t count;
  bool operator==(const ElementRun& o) const { return start == o.start && count == o.count; }
};

// The runs `inner` occupies within the row-major layout of `outer`, in increasing order,
// adjacent runs merged (a sub-box that spans whole trailing axes is one run).
// Errors: InvalidArgument if `inner` is not inside `outer`.
absl::StatusOr<std::vector<ElementRun>> RowMajorRuns(const Box& outer, const Box& inner);

// Row-major flat index of `point` (absolute coordinates) within `box`.
int64_t FlatIndex(const Box& box, absl::Span<const int64_t> point);

}  // namespace tessera

#endif  // TESSERA_COMMON_BOX_H_
