#include "agent/peer/slice_inbox.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace tessera {
namespace {

SliceInbox::Admission Reject(absl::Status status) {
  SliceInbox::Admission admission;
  admission.kind = SliceInbox::Admission::Kind::kRejected;
  admission.status = std::move(status);
  return admission;
}

std::string Describe(const IncomingChunk& c) {
  return absl::StrCat("slice ", DescribeSlice(c.key, c.box, c.begin, c.end, c.from_rank),
                      " of session ", c.session_id);
}

}  // namespace

SliceInbox::SliceInbox(SliceInboxOptions options) : options_(std::move(options)) {}

SliceInbox::~SliceInbox() = default;

absl::Status SliceInbox::Expect(const std::string& session_id,
                                absl::Span<const SliceRecv> recvs) {
  std::vector<std::function<void()>> wake;
  {
    absl::MutexLock lock(&mu_);
    if (active_.count(session_id) > 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("session ", session_id, " is already receiving"));
    }
    auto ended = ended_.find(session_id);
    if (ended != ended_.end()) {
      if (ended->second.cancelled) {
        return absl::AbortedError(absl::StrCat("session ", session_id, " was cancelled"));
      }
      return absl::FailedPreconditionError(
          absl::StrCat("session ", session_id, " already received its slices"));
    }
    auto session = std::make_unique<Session>();
    for (const SliceRecv& r : recvs) {
      SliceState state;
      state.dest = static_cast<char*>(r.dest);
      state.nbytes = r.nbytes;
      state.end = r.end;
      if (r.nbytes > 0) ++session->incomplete;
      session->slices.emplace(SliceId(r.key, r.box.offsets, r.box.lengths, r.from_rank, r.begin),
                              state);
    }
    active_.emplace(session_id, std::move(session));
    wake = TakeParkedLocked(session_id);
  }
  for (auto& on_ready : wake) on_ready();
  return absl::OkStatus();
}

SliceInbox::Admission SliceInbox::Admit(const IncomingChunk& chunk, const void* park_token,
                                        std::function<void()> on_ready) {
  bool parked = false;
  Admission admission;
  {
    absl::MutexLock lock(&mu_);
    auto active = active_.find(chunk.session_id);
    if (active == active_.end()) {
      auto ended = ended_.find(chunk.session_id);
      if (ended != ended_.end()) {
        if (ended->second.result.ok()) {
          admission.kind = Admission::Kind::kSessionDone;
          return admission;
        }
        return Reject(absl::AbortedError(
            absl::StrCat("the leader ended session ", chunk.session_id,
                         ended->second.cancelled ? ": cancelled"
                                                 : absl::StrCat(": ", ended->second.result.ToString()))));
      }
      parked_[park_token] = Parked{chunk.session_id, std::move(on_ready)};
      admission.kind = Admission::Kind::kParked;
      parked = true;
    } else {
      Session& session = *active->second;
      if (!session.failure.ok()) {
        return Reject(absl::AbortedError(absl::StrCat("the leader stopped receiving session ",
                                                      chunk.session_id, ": ",
                                                      session.failure.ToString())));
      }
      auto it = session.slices.find(SliceId(chunk.key, chunk.box.offsets, chunk.box.lengths,
                                            chunk.from_rank, chunk.begin));
      if (it == session.slices.end()) {
        return Reject(absl::InvalidArgumentError(
            absl::StrCat(Describe(chunk), " is not expected by this leader")));
      }
      SliceState& slice = it->second;
      if (chunk.end != slice.end || chunk.slice_nbytes != slice.nbytes) {
        absl::Status mismatch = absl::InvalidArgumentError(absl::StrCat(
            Describe(chunk), " has ", chunk.slice_nbytes, " bytes ending at element ", chunk.end,
            "; the leader expects ", slice.nbytes, " bytes ending at element ", slice.end));
        // That slice can never arrive as expected: fail the session rather than time out.
        session.failure = mismatch;
        return Reject(std::move(mismatch));
      }
      if (chunk.offset > slice.received || chunk.length > slice.nbytes - chunk.offset) {
        return Reject(absl::InvalidArgumentError(
            absl::StrCat(Describe(chunk), ": chunk [", chunk.offset, ", +", chunk.length,
                         ") leaves a gap or runs past ", slice.nbytes, " bytes (", slice.received,
                         " received)")));
      }
      if (slice.busy) {
        return Reject(absl::FailedPreconditionError(
            absl::StrCat(Describe(chunk), " is being received by another stream")));
      }
      const uint64_t chunk_end = chunk.offset + chunk.length;
      admission.kind = Admission::Kind::kWrite;
      admission.skip_bytes = slice.received - chunk.offset;
      if (chunk_end <= slice.received) {
        // Only bytes already received: nothing to write, nothing to commit.
        admission.skip_bytes = chunk.length;
        admission.write_bytes = 0;
        return admission;
      }
      admission.write_bytes = chunk_end - slice.received;
      admission.dest = slice.dest + slice.received;
      admission.session = &session;
      admission.slice = &slice;
      admission.received_after = chunk_end;
      slice.busy = true;
      ++session.inflight;
    }
  }
  if (parked && options_.on_parked) options_.on_parked(chunk.session_id);
  return admission;
}

void SliceInbox::Commit(const Admission& admission, bool written) {
  if (admission.session == nullptr) return;  // nothing was written
  absl::MutexLock lock(&mu_);
  auto* session = static_cast<Session*>(admission.session);
  auto* slice = static_cast<SliceState*>(admission.slice);
  slice->busy = false;
  if (written) {
    const bool was_complete = slice->received >= slice->nbytes;
    slice->received = admission.received_after;
    if (!was_complete && slice->received >= slice->nbytes) --session->incomplete;
  }
  --session->inflight;
}

bool SliceInbox::Unpark(const void* park_token) {
  absl::MutexLock lock(&mu_);
  return parked_.erase(park_token) > 0;
}

absl::Status SliceInbox::Wait(const std::string& session_id, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto it = active_.find(session_id);
  if (it == active_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("session ", session_id, " is not receiving"));
  }
  Session* session = it->second.get();
  auto done = [session]() { return session->incomplete == 0 || !session->failure.ok(); };
  if (!mu_.AwaitWithDeadline(absl::Condition(&done), deadline) && session->failure.ok()) {
    session->failure = absl::DeadlineExceededError(absl::StrCat(
        "session ", session_id, ": ", session->incomplete, " slice(s) did not arrive in time"));
  }
  // No copy may land after we return: wait out the admitted ones (each is one bounded memcpy).
  auto drained = [session]() { return session->inflight == 0; };
  mu_.Await(absl::Condition(&drained));
  absl::Status result = session->failure;
  const bool cancelled = absl::IsAborted(result);
  active_.erase(it);
  RememberEndedLocked(session_id, Ended{result, cancelled});
  return result;
}

void SliceInbox::Fail(const std::string& session_id, const absl::Status& status) {
  if (status.ok()) return;
  absl::MutexLock lock(&mu_);
  auto it = active_.find(session_id);
  if (it != active_.end() && it->second->failure.ok()) it->second->failure = status;
}

void SliceInbox::Cancel(const std::string& session_id) {
  std::vector<std::function<void()>> wake;
  {
    absl::MutexLock lock(&mu_);
    auto it = active_.find(session_id);
    if (it != active_.end()) {
      if (it->second->failure.ok()) {
        it->second->failure =
            absl::AbortedError(absl::StrCat("session ", session_id, " was cancelled"));
      }
      return;
    }
    if (ended_.count(session_id) > 0) return;
    RememberEndedLocked(
        session_id,
        Ended{absl::AbortedError(absl::StrCat("session ", session_id, " was cancelled")), true});
    wake = TakeParkedLocked(session_id);
  }
  for (auto& on_ready : wake) on_ready();
}

size_t SliceInbox::parked() const {
  absl::MutexLock lock(&mu_);
  return parked_.size();
}

std::vector<std::function<void()>> SliceInbox::TakeParkedLocked(const std::string& session_id) {
  std::vector<std::function<void()>> wake;
  for (auto it = parked_.begin(); it != parked_.end();) {
    if (it->second.session_id == session_id) {
      wake.push_back(std::move(it->second.on_ready));
      it = parked_.erase(it);
    } else {
      ++it;
    }
  }
  return wake;
}

void SliceInbox::RememberEndedLocked(const std::string& session_id, Ended ended) {
  if (options_.max_ended_sessions == 0) return;
  if (ended_.insert_or_assign(session_id, std::move(ended)).second) {
    ended_order_.push_back(session_id);
  }
  while (ended_order_.size() > options_.max_ended_sessions) {
    ended_.erase(ended_order_.front());
    ended_order_.pop_front();
  }
}

}  // namespace tessera
