// The PeerMemory service and its client calls (proto/tessera/v1/peer.proto; DESIGN.md
// "Memory tier"): agents copy committed data files held in memory between each other.
//
// PeerMemoryService serves, on the agent's Peer port, PutMemoryCopy (a sender's resident copy,
// received into the BuddyStore) and ReadMemoryCopy (this agent's own resident copy, or one it
// holds as a buddy). Both are callback reactors (STYLE.md 8): no thread waits on a peer.
//
// SendMemoryCopy and ReadMemoryCopy are the client side: blocking calls for the agent's
// background replication and for loads.
//
// Thread-safety: the service is thread-safe; the functions may run concurrently.
#ifndef TESSERA_AGENT_PEER_MEMORY_H_
#define TESSERA_AGENT_PEER_MEMORY_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "agent/buddy_store.h"
#include "agent/memory_tier.h"
#include "grpcpp/grpcpp.h"
#include "tessera/v1/peer.grpc.pb.h"

namespace tessera {

// Data bytes per MemoryCopyChunk: under gRPC's default 4 MiB message limit with room for the
// header, so neither side needs a larger limit configured.
inline constexpr uint64_t kMemoryCopyChunkBytes = uint64_t{1} << 20;

class PeerMemoryService final : public v1::PeerMemory::CallbackService {
 public:
  // `tier` and `store` must outlive the service; `job_id` is this agent's job.
  PeerMemoryService(std::string job_id, const MemoryTier* tier, BuddyStore* store)
      : job_id_(std::move(job_id)), tier_(tier), store_(store) {}

  grpc::ServerReadReactor<v1::MemoryCopyChunk>* PutMemoryCopy(
      grpc::CallbackServerContext* context, v1::PutMemoryCopyResponse* response) override;
  grpc::ServerWriteReactor<v1::MemoryCopyChunk>* ReadMemoryCopy(
      grpc::CallbackServerContext* context, const v1::ReadMemoryCopyRequest* request) override;

 private:
  const std::string job_id_;
  const MemoryTier* const tier_;
  BuddyStore* const store_;
};

// Streams copy.nbytes() bytes at `data` over `channel` as the buddy copy `copy` of job `job`.
// Stops between chunks once `*cancel` (if given) is true. `before_chunk` (if given) runs
// before each chunk is sent: it may block, e.g. while a trainer's save copy runs.
// Errors: the receiver's (PutMemoryCopy: InvalidArgument, ResourceExhausted,
// FailedPrecondition); Cancelled after `cancel`; Unavailable / DeadlineExceeded (`timeout`).
absl::Status SendMemoryCopy(const std::shared_ptr<grpc::Channel>& channel,
                            const std::string& job, const v1::MemoryCopy& copy, const char* data,
                            absl::Duration timeout, const std::atomic<bool>* cancel = nullptr,
                            const std::function<void()>& before_chunk = nullptr);

// Reads, over `channel`, the whole copy `copy` of checkpoint `job`. The caller bounds
// copy.nbytes() (it is allocated up front).
// Errors: NotFound if the agent no longer holds it; FailedPrecondition if it serves another
// job; DataLoss if it sent other than copy.nbytes() bytes in order; Unavailable /
// DeadlineExceeded / Cancelled.
absl::StatusOr<std::shared_ptr<const MemoryBuffer>> ReadMemoryCopy(
    const std::shared_ptr<grpc::Channel>& channel, const std::string& job,
    const v1::MemoryCopy& copy, absl::Duration timeout);

}  // namespace tessera

#endif  // TESSERA_AGENT_PEER_MEMORY_H_
