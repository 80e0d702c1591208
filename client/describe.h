// How a trainer names the tensors it saves or loads (TensorRef), and their translation into
// the wire's ShardDescs: defaults filled in, every piece checked locally so that a mistake is
// an InvalidArgument naming the tensor before any RPC.
//
// Thread-safety: value types and pure functions.
#ifndef TESSERA_CLIENT_DESCRIBE_H_
#define TESSERA_CLIENT_DESCRIBE_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/box.h"
#include "common/shard_rules.h"
#include "common/tensor_key.h"
#include "tessera/v1/types.pb.h"

namespace tessera {

// Where a TensorRef's bytes live.
enum class Memory {
  kHost,  // ordinary (or pinned) host memory of the trainer process
  kCuda,  // CUDA device memory; `data` is a device pointer
};

// One piece of one tensor this rank holds (Save) or wants (Load). The memory behind `data`
// must stay valid and unchanged for the duration of the call; it is never retained.
struct TensorRef {
  // Fully qualified name, e.g. "layers.3.attention.wq.weight". 1..1024 bytes.
  std::string fqn;
  // Default: parameters.
  v1::ShardKind kind = v1::SHARD_KIND_PARAM;
  v1::DType dtype = v1::DTYPE_UNSPECIFIED;
  // Shape of the whole tensor across the job; empty for a 0-d tensor.
  std::vector<int64_t> global_shape;
  // The region of the global tensor this rank holds. Default (no axes): the full tensor.
  Box box;
  // Distributed-optimizer slice: elements [first, second) of `box` flattened row-major.
  // Default: none (the whole box).
  std::optional<std::pair<int64_t, int64_t>> flat_range;
  // Mesh dims along which this piece is a replica (DESIGN.md "Data model").
  // Default (nullopt): {"dp"} for SHARD_KIND_PARAM when the job's mesh has a "dp" dim, else {}.
  // An explicit empty vector means "replicated nowhere". Ignored for SHARD_KIND_EXTRA.
  std::optional<std::vector<std::string>> replicated_over;
  // SHARD_KIND_OPTIMIZER only: the state, e.g. "exp_avg". Empty when `state_absent`.
  std::string state_key;
  // SHARD_KIND_OPTIMIZER only, Save only: this rank has no optimizer state for the parameter
  // yet; `state_key` is empty, `nbytes` is 0 and nothing is copied.
  bool state_absent = false;
  // The piece's bytes, row-major: elements x dtype size of them.
  void* data = nullptr;
  size_t nbytes = 0;
  Memory memory = Memory::kHost;
};

// Longest fqn accepted: kMaxFqnBytes (common/tensor_key.h); most axes: kMaxTensorAxes
// (common/shard_rules.h).

// The region of the global tensor `t` holds: its box, or the whole tensor when the box has no
// axes (TensorRef::box's default). Not checked against the shape (DescribeShards does that).
Box BoxOf(const TensorRef& t);

// The ShardDescs of `tensors`, in order, for a job whose mesh is `layout`: the default box and
// replicated_over filled in, nbytes copied; each checked by the shard rules the coordinator's
// planner applies (common/shard_rules.h CheckShardForm, in its words), and for data non-null
// when nbytes > 0. The memory kind is not checked here.
// Errors: InvalidArgument with an ErrorDetail MALFORMED_SHARD naming the fqn (and the
// tensor's index; a name that is not valid UTF-8 is shown C-escaped, "\\xff") for the first
// piece that breaks a rule; InvalidArgument if `layout` is not a mesh.
absl::StatusOr<std::vector<v1::ShardDesc>> DescribeShards(const v1::Layout& layout,
                                                          absl::Span<const TensorRef> tensors);

}  // namespace tessera

#endif  // TESSERA_CLIENT_DESCRIBE_H_
