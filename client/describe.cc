#include "client/describe.h"

#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/checksum.h"
#include "common/dtype.h"
#include "common/status.h"
#include "common/tensor_key.h"

namespace tessera {
namespace {

// `name` as it may appear in a message and in ErrorDetail's string fields: C-escaped if it
// is not valid UTF-8 (proto3 strings must be, and Python decodes them).
std::string Printable(absl::string_view name) {
  return ValidateName(name).ok() ? std::string(name) : absl::CHexEscape(name);
}

// A MALFORMED_SHARD error naming tensor `index`.
absl::Status Malformed(size_t index, const TensorRef& t, absl::string_view why) {
  const std::string fqn = Printable(t.fqn);
  const std::string state_key = Printable(t.state_key);
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

bool MeshHas(const v1::Layout& layout, absl::string_view dim) {
  for (const v1::MeshDim& d : layout.dims()) {
    if (d.name() == dim) return true;
  }
  return false;
}

absl::StatusOr<v1::ShardDesc> Describe(const v1::Layout& layout, size_t index, const TensorRef& t) {
  auto malformed = [&](absl::string_view why) { return Malformed(index, t, why); };
  if (t.fqn.empty() || t.fqn.size() > kMaxFqnBytes) {
    return malformed(
        absl::StrCat("the fqn must be 1..", kMaxFqnBytes, " bytes, not ", t.fqn.size()));
  }
  if (absl::Status st = ValidateName(t.fqn); !st.ok()) {
    return malformed(absl::StrCat("bad fqn: ", st.message(),
                                  " (an fqn is printable UTF-8 without '#' or '@')"));
  }
  if (t.kind == v1::SHARD_KIND_UNSPECIFIED || !v1::ShardKind_IsValid(t.kind)) {
    return malformed(absl::StrCat("kind ", static_cast<int>(t.kind), " is not a shard kind"));
  }
  if (!IsKnownDType(t.dtype)) {
    return malformed(absl::StrCat("dtype ", static_cast<int>(t.dtype), " is not known"));
  }
  if (t.global_shape.size() > kMaxTensorAxes) {
    return malformed(absl::StrCat("the tensor has ", t.global_shape.size(), " axes; at most ",
                                  kMaxTensorAxes, " are supported"));
  }
  const Box box = BoxOf(t);
  if (absl::Status st = ValidateBoxInShape(box, t.global_shape); !st.ok()) {
    return malformed(st.message());
  }
  absl::StatusOr<int64_t> box_elements = Volume(box);
  if (!box_elements.ok()) return malformed(box_elements.status().message());
  int64_t elements = *box_elements;
  if (t.flat_range.has_value()) {
    const auto [begin, end] = *t.flat_range;
    if (begin < 0 || begin > end || end > *box_elements) {
      return malformed(absl::StrCat("flat range [", begin, ", ", end, ") is not within the ",
                                    *box_elements, " elements of box ", BoxToString(box)));
    }
    elements = end - begin;
  }

  const bool optimizer = t.kind == v1::SHARD_KIND_OPTIMIZER;
  if (!optimizer && (t.state_absent || !t.state_key.empty())) {
    return malformed("only optimizer shards have a state_key or state_absent");
  }
  if (optimizer && t.state_absent && !t.state_key.empty()) {
    return malformed("absent optimizer state has an empty state_key");
  }
  if (optimizer && !t.state_absent && t.state_key.empty()) {
    return malformed("optimizer shards need a state_key (or state_absent)");
  }
  if (optimizer && !t.state_absent) {
    if (absl::Status st = ValidateName(t.state_key); !st.ok()) {
      return malformed(absl::StrCat("bad state_key: ", st.message(),
                                    " (a state key is printable UTF-8 without '#' or '@')"));
    }
  }
  if (t.kind == v1::SHARD_KIND_EXTRA &&
      (t.dtype != v1::DTYPE_U8 || t.global_shape.size() != 1 || box != FullBox(t.global_shape) ||
       t.flat_range.has_value())) {
    return malformed("extra shards must be U8, 1-d, and hold their whole tensor (no flat range)");
  }

  uint64_t expected = 0;
  if (!t.state_absent &&
      __builtin_mul_overflow(static_cast<uint64_t>(elements), DTypeSize(t.dtype), &expected)) {
    return malformed("its byte size overflows");
  }
  if (t.nbytes != expected) {
    return malformed(absl::StrCat("nbytes is ", t.nbytes, " but ",
                                  t.state_absent ? std::string("absent state stages nothing (0)")
                                                 : absl::StrCat(elements, " ", DTypeName(t.dtype),
                                                                " elements are ", expected)));
  }
  if (t.nbytes > 0 && t.data == nullptr) return malformed("data is null");

  v1::ShardDesc s;
  s.set_fqn(t.fqn);
  s.set_kind(t.kind);
  s.set_dtype(t.dtype);
  s.mutable_global_shape()->Add(t.global_shape.begin(), t.global_shape.end());
  *s.mutable_box() = BoxToProto(box);
  if (t.flat_range.has_value()) {
    s.mutable_flat_range()->set_begin(t.flat_range->first);
    s.mutable_flat_range()->set_end(t.flat_range->second);
  }
  if (t.kind != v1::SHARD_KIND_EXTRA) {
    if (t.replicated_over.has_value()) {
      for (const std::string& dim : *t.replicated_over) {
        if (!MeshHas(layout, dim)) {
          std::vector<std::string> names;
          for (const v1::MeshDim& d : layout.dims()) names.push_back(d.name());
          return malformed(absl::StrCat("replicated_over names \"", dim,
                                        "\", which is not a dim of the mesh {",
                                        absl::StrJoin(names, ", "), "}"));
        }
        s.add_replicated_over(dim);
      }
    } else if (t.kind == v1::SHARD_KIND_PARAM && MeshHas(layout, "dp")) {
      s.add_replicated_over("dp");
    }
  }
  s.set_state_key(t.state_key);
  s.set_state_absent(t.state_absent);
  s.set_nbytes(t.nbytes);
  return s;
}

}  // namespace

Box BoxOf(const TensorRef& t) {
  const bool default_box = t.box.offsets.empty() && t.box.lengths.empty();
  return default_box ? FullBox(t.global_shape) : t.box;
}

absl::StatusOr<std::vector<v1::ShardDesc>> DescribeShards(const v1::Layout& layout,
                                                          absl::Span<const TensorRef> tensors) {
  std::vector<v1::ShardDesc> shards;
  shards.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    ASSIGN_OR_RETURN(v1::ShardDesc s, Describe(layout, i, tensors[i]));
    shards.push_back(std::move(s));
  }
  return shards;
}

uint64_t PlanFingerprint(absl::Span<const v1::ShardDesc> shards) {
  StreamingHasher hasher;
  std::string buffer;  // reused: SerializeToString keeps its capacity
  for (const v1::ShardDesc& s : shards) {
    s.SerializeToString(&buffer);
    const uint64_t size = buffer.size();
    hasher.Update(&size, sizeof(size));
    hasher.Update(buffer.data(), buffer.size());
  }
  return hasher.Digest();
}

}  // namespace tessera
