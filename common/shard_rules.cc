#include "common/shard_rules.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/dtype.h"
#include "common/tensor_key.h"

namespace tessera {
namespace {

using Int64s = google::protobuf::RepeatedField<int64_t>;

absl::Span<const int64_t> SpanOf(const Int64s& field) {
  return absl::Span<const int64_t>(field.data(), field.size());
}

absl::Status Reason(absl::string_view why) { return absl::InvalidArgumentError(why); }

// ValidateBoxInShape's test without building a Box (the planner's hot path); on failure,
// ValidateBoxInShape says what is wrong.
absl::Status CheckBoxInShape(absl::Span<const int64_t> shape, absl::Span<const int64_t> offsets,
                             absl::Span<const int64_t> lengths) {
  bool fits = offsets.size() == shape.size() && lengths.size() == shape.size() &&
              CheckedVolume(shape).ok();
  for (size_t d = 0; fits && d < shape.size(); ++d) {
    // off <= dim - len is the overflow-free form of off + len <= dim.
    fits = offsets[d] >= 0 && lengths[d] >= 0 && offsets[d] <= shape[d] &&
           lengths[d] <= shape[d] - offsets[d];
  }
  if (fits) return absl::OkStatus();
  Box box{std::vector<int64_t>(offsets.begin(), offsets.end()),
          std::vector<int64_t>(lengths.begin(), lengths.end())};
  absl::Status st = ValidateBoxInShape(box, shape);
  return st.ok() ? Reason("the box does not fit the tensor") : st;
}

std::string BoxString(absl::Span<const int64_t> offsets, absl::Span<const int64_t> lengths) {
  return BoxToString(Box{std::vector<int64_t>(offsets.begin(), offsets.end()),
                         std::vector<int64_t>(lengths.begin(), lengths.end())});
}

}  // namespace

absl::StatusOr<int64_t> CheckBoxAndRange(absl::Span<const int64_t> global_shape,
                                         absl::Span<const int64_t> offsets,
                                         absl::Span<const int64_t> lengths,
                                         std::optional<std::pair<int64_t, int64_t>> flat_range) {
  if (global_shape.size() > kMaxTensorAxes) {
    return Reason(absl::StrCat("the tensor has ", global_shape.size(), " axes; at most ",
                               kMaxTensorAxes, " are supported"));
  }
  if (absl::Status st = CheckBoxInShape(global_shape, offsets, lengths); !st.ok()) return st;
  absl::StatusOr<int64_t> box_elements = CheckedVolume(lengths);
  if (!box_elements.ok()) return box_elements.status();
  if (flat_range.has_value()) {
    const auto [begin, end] = *flat_range;
    if (begin < 0 || begin > end || end > *box_elements) {
      return Reason(absl::StrCat("flat range [", begin, ", ", end, ") is not within the ",
                                 *box_elements, " elements of box ", BoxString(offsets, lengths)));
    }
  }
  return box_elements;
}

absl::Status CheckShardForm(const MeshLayout& layout, const v1::ShardDesc& s,
                            ShardExtent* extent) {
  // 1. Names, kind, dtype.
  if (absl::Status st = ValidateName(s.fqn()); !st.ok()) {
    return Reason(absl::StrCat("bad fqn: ", st.message(),
                               " (an fqn is 1..", kMaxFqnBytes,
                               " bytes of printable UTF-8 without '#' or '@')"));
  }
  if (s.kind() == v1::SHARD_KIND_UNSPECIFIED || !v1::ShardKind_IsValid(s.kind())) {
    return Reason(absl::StrCat("kind ", static_cast<int>(s.kind()), " is not a shard kind"));
  }
  if (!IsKnownDType(s.dtype())) {
    return Reason(absl::StrCat("dtype ", static_cast<int>(s.dtype()), " is not known"));
  }

  // 2. Geometry.
  std::optional<std::pair<int64_t, int64_t>> range;
  if (s.has_flat_range()) range.emplace(s.flat_range().begin(), s.flat_range().end());
  absl::StatusOr<int64_t> box_elements = CheckBoxAndRange(
      SpanOf(s.global_shape()), SpanOf(s.box().offsets()), SpanOf(s.box().lengths()), range);
  if (!box_elements.ok()) return box_elements.status();
  extent->box_elements = *box_elements;
  extent->begin = range.has_value() ? range->first : 0;
  extent->end = range.has_value() ? range->second : *box_elements;

  // 3. Optimizer state.
  const bool optimizer = s.kind() == v1::SHARD_KIND_OPTIMIZER;
  if (!optimizer && (s.state_absent() || !s.state_key().empty())) {
    return Reason("only optimizer shards have a state_key or state_absent");
  }
  if (optimizer && s.state_absent() && !s.state_key().empty()) {
    return Reason("absent optimizer state has an empty state_key");
  }
  if (optimizer && !s.state_absent() && s.state_key().empty()) {
    return Reason("optimizer shards need a state_key (or state_absent)");
  }
  if (optimizer && !s.state_absent()) {
    if (absl::Status st = ValidateName(s.state_key()); !st.ok()) {
      return Reason(absl::StrCat("bad state_key: ", st.message(),
                                 " (a state key is printable UTF-8 without '#' or '@')"));
    }
  }

  // 4. Extras.
  if (s.kind() == v1::SHARD_KIND_EXTRA &&
      (s.dtype() != v1::DTYPE_U8 || s.global_shape_size() != 1 || s.box().offsets(0) != 0 ||
       s.box().lengths(0) != s.global_shape(0) || range.has_value())) {
    return Reason("extra shards must be U8, 1-d, and hold their whole tensor (no flat range)");
  }

  // 5. Bytes.
  const int64_t elements = extent->end - extent->begin;
  uint64_t expected = 0;
  if (!s.state_absent() && __builtin_mul_overflow(static_cast<uint64_t>(elements),
                                                  DTypeSize(s.dtype()), &expected)) {
    return Reason("its byte size overflows");
  }
  if (s.nbytes() != expected) {
    return Reason(absl::StrCat("nbytes is ", s.nbytes(), " but ",
                               s.state_absent()
                                   ? std::string("absent state stages nothing (0)")
                                   : absl::StrCat(elements, " ", DTypeName(s.dtype()),
                                                  " elements are ", expected)));
  }

  // 6. Replicas.
  extent->replicated_mask = 0;
  if (s.kind() != v1::SHARD_KIND_EXTRA) {  // extras belong to their rank; the field is ignored
    for (const std::string& dim : s.replicated_over()) {
      std::optional<size_t> i = layout.DimIndex(dim);
      if (!i.has_value()) {
        std::vector<std::string> names;
        for (size_t d = 0; d < layout.dim_count(); ++d) names.push_back(layout.dim_name(d));
        return Reason(absl::StrCat("replicated_over names \"", dim,
                                   "\", which is not a dim of the mesh {",
                                   absl::StrJoin(names, ", "), "}"));
      }
      extent->replicated_mask |= uint64_t{1} << *i;
    }
  }
  return absl::OkStatus();
}

}  // namespace tessera
