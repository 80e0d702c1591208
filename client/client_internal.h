// Internals of Client (client/client.h) that its two parts share: client.cc (part 1:
// connection, save, wait, shared plumbing) defines them, and client_load.cc (part 2: load) uses
// them too — one copy of each check, so that a save and a load cannot drift apart. Not part of
// the client's API: only the client library's own sources include this header (it is among the
// target's srcs, not its hdrs).
//
// Thread-safety: plain functions of their arguments; safe to call from any thread.
#ifndef TESSERA_CLIENT_CLIENT_INTERNAL_H_
#define TESSERA_CLIENT_CLIENT_INTERNAL_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "client/describe.h"
#include "tessera/v1/agent.pb.h"

namespace tessera {
namespace client_internal {

// `status` with `prefix` before its message, payloads (the ErrorDetail) kept.
absl::Status Prefixed(absl::string_view prefix, const absl::Status& status);

bool AnyCuda(absl::Span<const TensorRef> tensors);

// Checks that every CUDA tensor with bytes is device memory of a usable GPU.
// Errors: those of DeviceCopier::DeviceOf, prefixed with the tensor's index and fqn.
absl::Status CheckCudaTensors(absl::Span<const TensorRef> tensors);

// Waits for the work queued on every GPU that holds one of `tensors` (with bytes).
// Errors: those of DeviceCopier::DeviceOf and DeviceCopier::WaitForDevice.
absl::Status WaitForDevices(absl::Span<const TensorRef> tensors);

// Checks the agent's slots against the request: one per shard, each of the shard's size
// (0 where `absent`), inside the region. Returns the total bytes.
// Errors: Internal naming `rpc` and the slot that does not fit.
absl::StatusOr<uint64_t> CheckSlots(
    absl::string_view rpc, const google::protobuf::RepeatedPtrField<v1::StagingSlot>& slots,
    const google::protobuf::RepeatedPtrField<v1::ShardDesc>& shards,
    const std::vector<bool>& absent, uint64_t shm_size);

// PLAN_TOO_LARGE if a request of `bytes` serialized bytes describing `shards` pieces is over
// `limit`: refused here, with a message, rather than by the transport of the agent or the
// coordinator (RESOURCE_EXHAUSTED naming no tensor).
// Errors: InvalidArgument + PLAN_TOO_LARGE over `limit`.
absl::Status CheckRequestSize(absl::string_view rpc, size_t bytes, int shards, size_t limit);

}  // namespace client_internal
}  // namespace tessera

#endif  // TESSERA_CLIENT_CLIENT_INTERNAL_H_
