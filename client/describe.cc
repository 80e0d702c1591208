#include "client/describe.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/layout.h"
#include "common/shard_rules.h"
#include "common/status.h"
#include "common/tensor_key.h"

namespace tessera {
namespace {

// A MALFORMED_SHARD error naming tensor `index`.
absl::Status Malformed(size_t index, const TensorRef& t, absl::string_view why) {
  const std::string fqn = PrintableName(t.fqn);
  const std::string state_key = PrintableName(t.state_key);
  v1::ErrorDetail detail;
  detail.set_code(v1::ERROR_CODE_MALFORMED_SHARD);
  detail.set_message(
      absl::StrCat("Tensor ", index, " (\"", fqn, "\"",
                   t.state_key.empty() ? "" : absl::StrCat(", state \"", state_key, "\""),
                   ") is malformed: ", why));
  detail.add_fqns(fqn);
  if (!t.state_key.empty()) detail.set_state_key(state_key);
  return MakeError(absl::StatusCode::kInvalidArgument, detail);
}

// `t` on the wire, its defaults filled in; checked by the shard rules (common/shard_rules.h)
// and for its memory.
absl::StatusOr<v1::ShardDesc> Describe(const MeshLayout& layout, size_t index, const TensorRef& t) {
  v1::ShardDesc s;
  s.set_fqn(t.fqn);
  s.set_kind(t.kind);
  s.set_dtype(t.dtype);
  s.mutable_global_shape()->Add(t.global_shape.begin(), t.global_shape.end());
  *s.mutable_box() = BoxToProto(BoxOf(t));
  if (t.flat_range.has_value()) {
    s.mutable_flat_range()->set_begin(t.flat_range->first);
    s.mutable_flat_range()->set_end(t.flat_range->second);
  }
  if (t.kind != v1::SHARD_KIND_EXTRA) {
    if (t.replicated_over.has_value()) {
      for (const std::string& dim : *t.replicated_over) s.add_replicated_over(dim);
    } else if (t.kind == v1::SHARD_KIND_PARAM && layout.DimIndex("dp").has_value()) {
      s.add_replicated_over("dp");
    }
  }
  s.set_state_key(t.state_key);
  s.set_state_absent(t.state_absent);
  s.set_nbytes(t.nbytes);

  ShardExtent extent;
  if (absl::Status why = CheckShardForm(layout, s, &extent); !why.ok()) {
    return Malformed(index, t, why.message());
  }
  if (t.nbytes > 0 && t.data == nullptr) return Malformed(index, t, "data is null");
  return s;
}

}  // namespace

Box BoxOf(const TensorRef& t) {
  const bool default_box = t.box.offsets.empty() && t.box.lengths.empty();
  return default_box ? FullBox(t.global_shape) : t.box;
}

absl::StatusOr<std::vector<v1::ShardDesc>> DescribeShards(const v1::Layout& layout,
                                                          absl::Span<const TensorRef> tensors) {
  absl::StatusOr<MeshLayout> mesh = MeshLayout::FromProto(layout);
  if (!mesh.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the job's layout is not a mesh: ", mesh.status().message()));
  }
  std::vector<v1::ShardDesc> shards;
  shards.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    ASSIGN_OR_RETURN(v1::ShardDesc s, Describe(*mesh, i, tensors[i]));
    shards.push_back(std::move(s));
  }
  return shards;
}

}  // namespace tessera
