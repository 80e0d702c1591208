#include "common/layout.h"

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace tessera {

inline constexpr uint32_t kMaxWorldSize = 1u << 24;

absl::StatusOr<MeshLayout> MeshLayout::FromProto(const v1::Layout& proto) {
  if (proto.dims().empty()) return absl::InvalidArgumentError("layout has no dims");
  if (proto.dims_size() > 63) return absl::InvalidArgumentError("layout has over 63 dims");
  MeshLayout layout;
  layout.proto_ = proto;
  absl::flat_hash_set<std::string> seen;
  uint64_t world = 1;
  for (const v1::MeshDim& dim : proto.dims()) {
    if (dim.name().empty()) return absl::InvalidArgumentError("layout has an unnamed dim");
    if (!seen.insert(dim.name()).second) {
      return absl::InvalidArgumentError(absl::StrCat("layout repeats dim \"", dim.name(), "\""));
    }
    if (dim.degree() == 0) {
      return absl::InvalidArgumentError(absl::StrCat("dim \"", dim.name(), "\" has degree 0"));
    }
    world *= dim.degree();
    if (world > kMaxWorldSize) {
      return absl::InvalidArgumentError(
          absl::StrCat("layout has more than ", kMaxWorldSize, " ranks"));
    }
    layout.names_.push_back(dim.name());
    layout.degrees_.push_back(dim.degree());
  }
  layout.world_size_ = static_cast<uint32_t>(world);
  layout.strides_.assign(layout.degrees_.size(), 1);
  for (size_t i = layout.degrees_.size(); i-- > 1;) {
    layout.strides_[i - 1] = layout.strides_[i] * layout.degrees_[i];
  }
  return layout;
}

std::optional<size_t> MeshLayout::DimIndex(absl::string_view name) const {
  for (size_t i = 0; i < names_.size(); ++i) {
    if (names_[i] == name) return i;
  }
  return std::nullopt;
}

std::vector<uint32_t> MeshLayout::Coords(uint32_t rank) const {
  std::vector<uint32_t> coords(degrees_.size());
  for (size_t i = 0; i < degrees_.size(); ++i) coords[i] = (rank / strides_[i]) % degrees_[i];
  return coords;
}

absl::StatusOr<uint32_t> MeshLayout::Rank(absl::Span<const uint32_t> coords) const {
  if (coords.size() != degrees_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("coordinates have ", coords.size(),
                                                   " entries but the mesh has ",
                                                   degrees_.size(), " dims"));
  }
  uint32_t rank = 0;
  for (size_t i = 0; i < coords.size(); ++i) {
    if (coords[i] >= degrees_[i]) {
      return absl::InvalidArgumentError(absl::StrCat("coordinate ", names_[i], "=", coords[i],
                                                     " is outside degree ", degrees_[i]));
    }
    rank += coords[i] * strides_[i];
  }
  return rank;
}

std::string MeshLayout::CoordString(uint32_t rank) const {
  std::vector<uint32_t> coords = Coords(rank);
  std::vector<std::string> parts;
  for (size_t i = 0; i < coords.size(); ++i) parts.push_back(absl::StrCat(names_[i], "=", coords[i]));
  return absl::StrJoin(parts, ",");
}

absl::StatusOr<uint64_t> MeshLayout::DimMask(absl::Span<const std::string> dims) const {
  uint64_t mask = 0;
  for (const std::string& name : dims) {
    std::optional<size_t> i = DimIndex(name);
    if (!i.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown mesh dim \"", name,
                                                     "\" (the mesh has ",
                                                     absl::StrJoin(names_, ", "), ")"));
    }
    mask |= uint64_t{1} << *i;
  }
  return mask;
}

uint32_t MeshLayout::ReplicaGroupKey(uint32_t rank, uint64_t replicated_mask) const {
  uint32_t key = 0;
  for (size_t i = 0; i < degrees_.size(); ++i) {
    if ((replicated_mask >> i) & 1) continue;
    key += ((rank / strides_[i]) % degrees_[i]) * strides_[i];
  }
  return key;
}

std::vector<uint32_t> MeshLayout::ReplicaGroupMembers(uint32_t rank,
                                                      uint64_t replicated_mask) const {
  std::vector<uint32_t> members;
  uint32_t key = ReplicaGroupKey(rank, replicated_mask);
  for (uint32_t r = 0; r < world_size_; ++r) {
    if (ReplicaGroupKey(r, replicated_mask) == key) members.push_back(r);
  }
  return members;
}

bool MeshLayout::SameMesh(const v1::Layout& other) const {
  if (other.dims_size() != static_cast<int>(names_.size())) return false;
  for (size_t i = 0; i < names_.size(); ++i) {
    if (other.dims(i).name() != names_[i] || other.dims(i).degree() != degrees_[i]) return false;
  }
  return true;
}

absl::StatusOr<v1::Layout> ParseLayoutSpec(absl::string_view spec) {
  v1::Layout layout;
  for (absl::string_view part : absl::StrSplit(spec, ',', absl::SkipWhitespace())) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(part, '=');
    uint32_t degree = 0;
    if (kv.first.empty() || !absl::SimpleAtoi(kv.second, &degree)) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad layout part \"", part, "\" in \"", spec, "\"; want name=degree"));
    }
    v1::MeshDim* dim = layout.add_dims();
    dim->set_name(std::string(kv.first));
    dim->set_degree(degree);
  }
  if (absl::StatusOr<MeshLayout> checked = MeshLayout::FromProto(layout); !checked.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("layout \"", spec, "\": ", checked.status().message()));
  }
  return layout;
}

std::string LayoutSpec(const v1::Layout& layout) {
  std::vector<std::string> parts;
  for (const v1::MeshDim& dim : layout.dims()) {
    parts.push_back(absl::StrCat(dim.name(), "=", dim.degree()));
  }
  return absl::StrJoin(parts, ",");
}

}  // namespace tessera
