// LoopbackPeerTransport: PeerTransport between transports of one process, for unit tests of
// callers (the gather phase, the agent) without sockets or GPUs.
//
// Transports find each other by rank through a LoopbackHub. A send is one memcpy from the
// sender's buffer into the leader's registered destination, through the same SliceInbox
// (validation, parking of early slices, cancellation) as GrpcPeerTransport, so callers see the
// same semantics and errors.
//
// Lifecycle: create the hub first; each transport registers itself on construction and
// unregisters on destruction; every transport must outlive the Exchange() calls that reach it.
//
// Thread-safety: LoopbackHub and LoopbackPeerTransport are thread-safe.
#ifndef TESSERA_AGENT_PEER_LOOPBACK_PEER_TRANSPORT_H_
#define TESSERA_AGENT_PEER_LOOPBACK_PEER_TRANSPORT_H_

#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/peer/peer_transport.h"
#include "agent/peer/slice_inbox.h"

namespace tessera {

class LoopbackPeerTransport;

class LoopbackHub {
 public:
  // nullptr if no transport has `rank`.
  LoopbackPeerTransport* Find(uint32_t rank) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  friend class LoopbackPeerTransport;
  // Errors: AlreadyExists if `rank` is taken.
  absl::Status Register(uint32_t rank, LoopbackPeerTransport* transport) ABSL_LOCKS_EXCLUDED(mu_);
  void Unregister(uint32_t rank) ABSL_LOCKS_EXCLUDED(mu_);

  mutable absl::Mutex mu_;
  std::map<uint32_t, LoopbackPeerTransport*> transports_ ABSL_GUARDED_BY(mu_);
};

class LoopbackPeerTransport : public PeerTransport {
 public:
  // Registers as `rank` in `hub` (which must outlive this). A rank registered twice is a
  // programming error: the second transport is unreachable and registered() is false.
  LoopbackPeerTransport(LoopbackHub* hub, uint32_t rank, SliceInboxOptions inbox_options = {});
  ~LoopbackPeerTransport() override;

  LoopbackPeerTransport(const LoopbackPeerTransport&) = delete;
  LoopbackPeerTransport& operator=(const LoopbackPeerTransport&) = delete;

  bool registered() const { return registered_; }

  // See PeerTransport. Sends run one after another on the calling thread, each waiting while
  // its leader has not expected the session yet. Errors: as PeerTransport; Unavailable if no
  // transport has the leader's rank.
  absl::Status Exchange(const std::string& session_id, absl::Span<const SliceSend> sends,
                        absl::Span<const SliceRecv> recvs, absl::Time deadline) override
      ABSL_LOCKS_EXCLUDED(mu_);

  void CancelSession(const std::string& session_id) override ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Copies `send` into `leader`'s inbox. Errors: the leader's rejection; Aborted if the
  // session is cancelled here meanwhile; DeadlineExceeded while parked past `deadline`.
  absl::Status Deliver(LoopbackPeerTransport* leader, const std::string& session_id,
                       const SliceSend& send, absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);

  LoopbackHub* const hub_;
  const uint32_t rank_;
  SliceInbox inbox_;
  bool registered_ = false;

  absl::Mutex mu_;
  // Sessions cancelled here (bounded like the inbox's memory of ended sessions).
  std::set<std::string> cancelled_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> cancelled_order_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_AGENT_PEER_LOOPBACK_PEER_TRANSPORT_H_
