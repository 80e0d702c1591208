// The form of one shard: the rules every piece of a local plan obeys on its own, before any
// rule between pieces (DESIGN.md "Global planning rules", rule 1). Written once, here: the
// coordinator's planner enforces them; the C++ client (client/describe.h) and, through its
// native module, the Python package check them before any RPC, so that a mistake names the
// tensor on the trainer — in the same words the coordinator would use.
//
// A reason is returned alone ("flat range [0, 9) is not within the 8 elements of box [0:8]");
// each caller says whose shard it was (the planner: "Shard 3 of rank 1 (pp=0, dp=1)"; the
// client: "Tensor 3 (\"w\")"), and tags it MALFORMED_SHARD.
//
// Thread-safety: pure functions.
#ifndef TESSERA_COMMON_SHARD_RULES_H_
#define TESSERA_COMMON_SHARD_RULES_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/box.h"
#include "common/layout.h"
#include "tessera/v1/types.pb.h"

namespace tessera {

// Most axes a tensor may have.
inline constexpr size_t kMaxTensorAxes = 64;

// What the rules establish about a well-formed shard.
struct ShardExtent {
  int64_t box_elements = 0;      // the box's volume (1 for a 0-d box)
  int64_t begin = 0;             // the elements held, row-major within the box: the flat
  int64_t end = 0;               // range, else [0, box_elements)
  uint64_t replicated_mask = 0;  // replicated_over as a MeshLayout::DimMask; 0 for extras
};

// OK if `s` is well formed for a job whose mesh is `layout`, and `extent` is filled:
//  1. fqn a valid name (common/tensor_key.h ValidateName); kind a shard kind; dtype known;
//  2. at most kMaxTensorAxes axes; box inside global_shape; flat range inside the box;
//  3. state_key and state_absent on optimizer shards only; an optimizer shard has a valid
//     state_key, or is absent with an empty one;
//  4. extra shards are U8, 1-d, and hold their whole tensor (no flat range);
//  5. nbytes == elements held x dtype size (0 for absent state);
//  6. replicated_over names dims of the mesh (ignored for extras).
// Allocation-free when OK (the planner runs it over a million shards).
// Errors: InvalidArgument whose message is the reason alone (see the header comment).
absl::Status CheckShardForm(const MeshLayout& layout, const v1::ShardDesc& s,
                            ShardExtent* extent);

// Rule 2 alone, for a description that is not a ShardDesc yet (the Python package's Shard
// and Absent). `flat_range` is [begin, end) of the box flattened row-major. Returns the box's
// volume. Errors: InvalidArgument with CheckShardForm's reasons.
absl::StatusOr<int64_t> CheckBoxAndRange(absl::Span<const int64_t> global_shape,
                                         absl::Span<const int64_t> offsets,
                                         absl::Span<const int64_t> lengths,
                                         std::optional<std::pair<int64_t, int64_t>> flat_range);

}  // namespace tessera

#endif  // TESSERA_COMMON_SHARD_RULES_H_
