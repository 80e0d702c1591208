// A job's device mesh: validation, rank <-> coordinates, and replica groups.
//
// Ranks are numbered row-major over the dims (the first dim outermost), as torch's
// DeviceMesh does for a mesh built from a contiguous range. The replica group of a piece
// claimed by rank r with `replicated_over` dims D is the set of ranks whose coordinates equal
// r's on every dim not in D; ReplicaGroupKey names that set.
//
// Thread-safety: an immutable value once built.
#ifndef TESSERA_COMMON_LAYOUT_H_
#define TESSERA_COMMON_LAYOUT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "tessera/v1/types.pb.h"

namespace tessera {

class MeshLayout {
 public:
  // Errors: InvalidArgument if there are no dims, a dim's degree is 0, a name is empty or
  // repeated, or the world size exceeds 2^24 ranks.
  static absl::StatusOr<MeshLayout> FromProto(const v1::Layout& proto);

  const v1::Layout& proto() const { return proto_; }
  size_t dim_count() const { return names_.size(); }
  const std::string& dim_name(size_t i) const { return names_[i]; }
  uint32_t degree(size_t i) const { return degrees_[i]; }
  uint32_t world_size() const { return world_size_; }

  // Index of the dim called `name`, or nullopt.
  std::optional<size_t> DimIndex(absl::string_view name) const;

  // Coordinates of `rank` (< world_size()).
  std::vector<uint32_t> Coords(uint32_t rank) const;
  // Inverse of Coords. Errors: InvalidArgument if the coordinates are out of the mesh.
  absl::StatusOr<uint32_t> Rank(absl::Span<const uint32_t> coords) const;

  // "pp=1,tp=0,dp=1".
  std::string CoordString(uint32_t rank) const;

  // Bit i set if dim i is in `dims`. Errors: InvalidArgument naming an unknown dim.
  absl::StatusOr<uint64_t> DimMask(absl::Span<const std::string> dims) const;

  // A number shared exactly by the ranks of `rank`'s replica group over `replicated_mask`:
  // the rank with every replicated coordinate set to 0.
  uint32_t ReplicaGroupKey(uint32_t rank, uint64_t replicated_mask) const;

  // Every rank of that group, ascending.
  std::vector<uint32_t> ReplicaGroupMembers(uint32_t rank, uint64_t replicated_mask) const;

  bool SameMesh(const v1::Layout& other) const;

 private:
  v1::Layout proto_;
  std::vector<std::string> names_;
  std::vector<uint32_t> degrees_;
  std::vector<uint32_t> strides_;  // rank = sum(coord[i] * strides_[i])
  uint32_t world_size_ = 1;
};

// Parses "pp=2,tp=2,dp=2" (dims outermost first) into a Layout. Errors: InvalidArgument
// naming the bad part.
absl::StatusOr<v1::Layout> ParseLayoutSpec(absl::string_view spec);

// The inverse: "pp=2,tp=2,dp=2".
std::string LayoutSpec(const v1::Layout& layout);

}  // namespace tessera

#endif  // TESSERA_COMMON_LAYOUT_H_
