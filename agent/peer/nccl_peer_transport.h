// NcclPeerTransport: PeerTransport over NCCL between the agents' GPUs (DESIGN.md: the path
// taken where a GPU is present).
//
// Per Exchange() the transport obtains the session's gather group (an ncclUniqueId and the
// members in communicator order) from a broker — in production the coordinator's
// ExchangePeerId, where the group's leader posts the id — and builds a communicator for it
// (non-blocking, so deadlines and cancellation apply to its creation too). It then runs the
// NcclSchedule: a header round that checks every pair agrees on what moves (an ncclAllReduce
// makes every member reach the same verdict), then data rounds. In each round a sender copies
// its pieces from (pinned) staging to a device bounce buffer (cudaMemcpyAsync) and ncclSends
// them; a receiver ncclRecvs into a device bounce buffer and copies each piece to its
// destination in pinned staging. Bounce buffers hold one round: at most chunk_bytes per peer
// and direction. Rounds are not overlapped (one stream); the communicator is destroyed at the
// end of the call.
//
// Every member of the group must call Exchange() for the session, even with nothing to move,
// with the same chunk_bytes: the header round is collective.
//
// Availability is decided at run time: without a GPU (cudaGetDeviceCount fails) NcclAvailable()
// is false and Exchange() fails with FailedPrecondition, so callers pick GrpcPeerTransport.
//
// Thread-safety: thread-safe; concurrent Exchange() calls use separate communicators.
#ifndef TESSERA_AGENT_PEER_NCCL_PEER_TRANSPORT_H_
#define TESSERA_AGENT_PEER_NCCL_PEER_TRANSPORT_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/peer/peer_transport.h"

namespace tessera {

// True if a CUDA device is usable (probed once per process, then cached) and NCCL loads.
bool NcclAvailable();

// A session's gather group.
struct NcclGroup {
  std::string unique_id;               // an ncclUniqueId's bytes (NCCL_UNIQUE_ID_BYTES)
  std::vector<uint32_t> member_ranks;  // communicator order; includes this rank
};

// Creates a fresh ncclUniqueId (as bytes). Errors: Internal from NCCL.
using NcclUniqueIdFactory = std::function<absl::StatusOr<std::string>()>;

// Returns the session's gather group, blocking until it is known or `deadline`. The broker
// calls `new_unique_id` only on the rank that posts the id (the group's leader).
// Errors: whatever the broker's transport returns (DeadlineExceeded, Aborted, Unavailable).
using NcclGroupBroker = std::function<absl::StatusOr<NcclGroup>(
    const std::string& session_id, const NcclUniqueIdFactory& new_unique_id,
    absl::Time deadline)>;

struct NcclPeerTransportOptions {
  // This agent's rank. Default: 0.
  uint32_t rank = 0;

  // The CUDA device this agent's NCCL communicators use. Default: 0.
  int device = 0;

  // Resolves each session's gather group. Required.
  NcclGroupBroker broker;

  // Bytes per piece (per peer and direction in one round); equal on every member.
  // Default: 8 MiB.
  uint64_t chunk_bytes = uint64_t{8} << 20;

  // How often a waiting Exchange() checks the GPU, NCCL, its deadline and cancellation.
  // Default: 100 us.
  absl::Duration poll_interval = absl::Microseconds(100);
};

class NcclPeerTransport : public PeerTransport {
 public:
  explicit NcclPeerTransport(NcclPeerTransportOptions options);
  ~NcclPeerTransport() override = default;

  NcclPeerTransport(const NcclPeerTransport&) = delete;
  NcclPeerTransport& operator=(const NcclPeerTransport&) = delete;

  // See PeerTransport. Errors: FailedPrecondition if NcclAvailable() is false or there is no
  // broker; InvalidArgument if the group does not contain this rank or a peer, or a pair of
  // members disagrees on what moves between them (checked before any data moves, on every
  // member); Aborted on CancelSession (the communicator is aborted); DeadlineExceeded;
  // Internal/Unavailable for CUDA and NCCL failures; the broker's errors.
  absl::Status Exchange(const std::string& session_id, absl::Span<const SliceSend> sends,
                        absl::Span<const SliceRecv> recvs, absl::Time deadline) override
      ABSL_LOCKS_EXCLUDED(mu_);

  void CancelSession(const std::string& session_id) override ABSL_LOCKS_EXCLUDED(mu_);

 private:
  class Run;

  bool Cancelled(const std::string& session_id) const ABSL_LOCKS_EXCLUDED(mu_);
  // Waits `poll_interval` or until `session_id` is cancelled.
  void Pause(const std::string& session_id) const ABSL_LOCKS_EXCLUDED(mu_);

  const NcclPeerTransportOptions options_;

  mutable absl::Mutex mu_;
  std::set<std::string> cancelled_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> cancelled_order_ ABSL_GUARDED_BY(mu_);  // bounded memory
};

}  // namespace tessera

#endif  // TESSERA_AGENT_PEER_NCCL_PEER_TRANSPORT_H_
