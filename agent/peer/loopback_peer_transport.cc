#include "agent/peer/loopback_peer_transport.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tessera {
namespace {
constexpr size_t kMaxCancelledRemembered = 1024;
}  // namespace

LoopbackPeerTransport* LoopbackHub::Find(uint32_t rank) const {
  absl::MutexLock lock(&mu_);
  auto it = transports_.find(rank);
  return it == transports_.end() ? nullptr : it->second;
}

absl::Status LoopbackHub::Register(uint32_t rank, LoopbackPeerTransport* transport) {
  absl::MutexLock lock(&mu_);
  if (!transports_.emplace(rank, transport).second) {
    return absl::AlreadyExistsError(absl::StrCat("rank ", rank, " is already in the hub"));
  }
  return absl::OkStatus();
}

void LoopbackHub::Unregister(uint32_t rank) {
  absl::MutexLock lock(&mu_);
  transports_.erase(rank);
}

LoopbackPeerTransport::LoopbackPeerTransport(LoopbackHub* hub, uint32_t rank,
                                             SliceInboxOptions inbox_options)
    : hub_(hub), rank_(rank), inbox_(std::move(inbox_options)) {
  registered_ = hub_->Register(rank_, this).ok();
}

LoopbackPeerTransport::~LoopbackPeerTransport() {
  if (registered_) hub_->Unregister(rank_);
}

absl::Status LoopbackPeerTransport::Exchange(const std::string& session_id,
                                             absl::Span<const SliceSend> sends,
                                             absl::Span<const SliceRecv> recvs,
                                             absl::Time deadline) {
  RETURN_IF_ERROR(ValidateExchange(rank_, sends, recvs));
  {
    absl::MutexLock lock(&mu_);
    if (cancelled_.count(session_id) > 0) {
      return absl::AbortedError(absl::StrCat("session ", session_id, " was cancelled"));
    }
  }
  RETURN_IF_ERROR(inbox_.Expect(session_id, recvs));
  absl::Status sent = absl::OkStatus();
  for (const SliceSend& send : sends) {
    if (send.nbytes == 0) continue;
    LoopbackPeerTransport* leader = hub_->Find(send.leader_rank);
    sent = leader == nullptr
               ? absl::UnavailableError(absl::StrCat("no loopback transport for rank ",
                                                     send.leader_rank))
               : Deliver(leader, session_id, send, deadline);
    if (!sent.ok()) break;
  }
  if (!sent.ok()) inbox_.Fail(session_id, sent);
  const absl::Status received = inbox_.Wait(session_id, deadline);
  return sent.ok() ? received : sent;
}

absl::Status LoopbackPeerTransport::Deliver(LoopbackPeerTransport* leader,
                                            const std::string& session_id,
                                            const SliceSend& send, absl::Time deadline) {
  IncomingChunk chunk;
  chunk.session_id = session_id;
  chunk.key = send.key;
  chunk.box = send.box;
  chunk.from_rank = rank_;
  chunk.begin = send.begin;
  chunk.end = send.end;
  chunk.slice_nbytes = send.nbytes;
  chunk.offset = 0;
  chunk.length = send.nbytes;
  while (true) {
    bool ready = false;  // guarded by mu_: set by the leader's inbox when the session appears
    SliceInbox::Admission admission = leader->inbox_.Admit(chunk, &ready, [this, &ready] {
      absl::MutexLock lock(&mu_);
      ready = true;
    });
    switch (admission.kind) {
      case SliceInbox::Admission::Kind::kWrite:
        if (admission.write_bytes > 0) {
          std::memcpy(admission.dest,
                      static_cast<const char*>(send.data) + admission.skip_bytes,
                      admission.write_bytes);
        }
        leader->inbox_.Commit(admission, true);
        return absl::OkStatus();
      case SliceInbox::Admission::Kind::kSessionDone:
        return absl::OkStatus();
      case SliceInbox::Admission::Kind::kRejected:
        return admission.status;
      case SliceInbox::Admission::Kind::kParked:
        break;
    }
    mu_.Lock();
    auto woken = [this, &ready, &session_id]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return ready || cancelled_.count(session_id) > 0;
    };
    mu_.AwaitWithDeadline(absl::Condition(&woken), deadline);
    if (ready) {
      mu_.Unlock();
      continue;  // the session appeared (or was cancelled there): admit again
    }
    mu_.Unlock();
    // Withdraw the parked chunk. If the leader's inbox already took it, its callback is about
    // to set `ready` (which lives on this stack): wait for that and admit again.
    if (!leader->inbox_.Unpark(&ready)) {
      mu_.Lock();
      mu_.Await(absl::Condition(&ready));
      mu_.Unlock();
      continue;
    }
    absl::MutexLock lock(&mu_);
    if (cancelled_.count(session_id) > 0) {
      return absl::AbortedError(absl::StrCat("session ", session_id, " was cancelled"));
    }
    return absl::DeadlineExceededError(absl::StrCat(
        "rank ", send.leader_rank, " did not start receiving session ", session_id, " in time"));
  }
}

void LoopbackPeerTransport::CancelSession(const std::string& session_id) {
  inbox_.Cancel(session_id);
  absl::MutexLock lock(&mu_);
  if (cancelled_.insert(session_id).second) {
    cancelled_order_.push_back(session_id);
    if (cancelled_order_.size() > kMaxCancelledRemembered) {
      cancelled_.erase(cancelled_order_.front());
      cancelled_order_.pop_front();
    }
  }
}

}  // namespace tessera
