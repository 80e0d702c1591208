// Names of tensors and chunks in manifests and data files, and fqn validation.
//
// A parameter's key is its fqn; optimizer state is "<fqn>#<state_key>"; an extra piece is
// "<fqn>#rank<R>". A chunk is stored in a data file under "<key>@<offsets joined by ','>".
// fqns are keys, never paths: well-formed UTF-8, no control characters (C0, DEL, C1), no '#'
// or '@', 1..kMaxFqnBytes bytes.
//
// Thread-safety: free functions.
#ifndef TESSERA_COMMON_TENSOR_KEY_H_
#define TESSERA_COMMON_TENSOR_KEY_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/box.h"
#include "tessera/v1/types.pb.h"

namespace tessera {

inline constexpr size_t kMaxFqnBytes = 1024;

// OK if `name` is usable as an fqn or optimizer state key. Errors: InvalidArgument saying
// what is wrong (empty, too long, invalid UTF-8, control character, reserved '#' or '@').
absl::Status ValidateName(absl::string_view name);

// `name` as it may appear in a message and in ErrorDetail's string fields: itself if it is a
// valid name, else C-escaped ("\\xff"; proto3 strings must be UTF-8, and Python decodes them).
std::string PrintableName(absl::string_view name);

// The tensor key of a shard (see the header comment).
std::string TensorKey(v1::ShardKind kind, absl::string_view fqn, absl::string_view state_key,
                      uint32_t rank);
std::string TensorKeyOf(const v1::ShardDesc& shard, uint32_t rank);

// "<key>@<o0>,<o1>,..." — the safetensors entry name of a chunk.
std::string ChunkName(absl::string_view key, const Box& box);

// Splits a ChunkName back into its key and offsets. Errors: InvalidArgument if malformed.
struct ParsedChunkName {
  std::string key;
  std::vector<int64_t> offsets;
};
absl::StatusOr<ParsedChunkName> ParseChunkName(absl::string_view name);

}  // namespace tessera

#endif  // TESSERA_COMMON_TENSOR_KEY_H_
