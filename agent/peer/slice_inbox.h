// SliceInbox: a leader's bookkeeping of the slices it expects, shared by every PeerTransport
// implementation that receives chunk by chunk (gRPC, loopback).
//
// Lifecycle of a session, as seen by the inbox:
//
//   (unknown) ──Expect()──► ACTIVE ──Wait() returns──► ENDED (remembered, bounded)
//       │                     │ Fail() / Cancel() / a mismatched expected slice / deadline:
//       │                     └─ Wait() returns that error once in-flight copies drain
//       └──Cancel()──► ENDED (cancelled: a later Expect() fails with Aborted)
//
// A chunk is admitted in two steps so that the copy into staging runs without the lock:
// Admit() validates it and returns where its bytes go (kWrite), then the caller copies and
// calls Commit(). While a copy is in flight the session cannot end: Wait() returns only after
// every admitted chunk was committed, so no byte is written into `dest` after Wait() returns.
// A chunk for a session not yet expected is *parked*: Admit() keeps the caller's `on_ready`
// callback and runs it when the session is expected or cancelled; the caller then admits the
// chunk again. Nothing is buffered here.
//
// Chunk rules (each byte of dest is written at most once): a slice's chunks come in order;
// a chunk may repeat bytes already received (a resend), which are skipped, but may not leave
// a gap; at most one chunk of a slice is in flight at a time.
//
// Thread-safety: thread-safe. Callbacks run without the inbox's lock held.
#ifndef TESSERA_AGENT_PEER_SLICE_INBOX_H_
#define TESSERA_AGENT_PEER_SLICE_INBOX_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "agent/peer/peer_transport.h"
#include "common/box.h"

namespace tessera {

struct SliceInboxOptions {
  // Ended sessions remembered, so that a late chunk is answered at once (the session completed,
  // or Aborted) instead of being parked until its sender's deadline. Oldest forgotten first.
  // Default: 1024.
  size_t max_ended_sessions = 1024;

  // Called (without locks held) each time a chunk is parked, with its session id. For tests
  // and metrics. Default: none.
  std::function<void(const std::string& session_id)> on_parked;
};

// The header of one arriving chunk of a slice.
struct IncomingChunk {
  std::string session_id;
  std::string key;
  Box box;
  uint32_t from_rank = 0;
  int64_t begin = 0;
  int64_t end = 0;
  uint64_t slice_nbytes = 0;  // the whole slice's size, as the sender sees it
  uint64_t offset = 0;        // of this chunk's first byte within the slice
  uint64_t length = 0;        // bytes in this chunk
};

class SliceInbox {
 public:
  // What to do with one chunk.
  struct Admission {
    enum class Kind {
      kWrite,        // discard `skip_bytes` of the chunk, copy the next `write_bytes` to
                     // `dest`, discard the rest, then Commit()
      kParked,       // the session is not expected yet: `on_ready` will run; admit again then
      kSessionDone,  // the session already completed: the sender has nothing left to do
                     // (the chunk is acknowledged unchecked: every expected slice arrived)
      kRejected,     // refuse the chunk with `status`
    };
    Kind kind = Kind::kRejected;
    absl::Status status;
    char* dest = nullptr;
    uint64_t skip_bytes = 0;
    uint64_t write_bytes = 0;

   private:
    friend class SliceInbox;
    void* session = nullptr;
    void* slice = nullptr;
    uint64_t received_after = 0;
  };

  explicit SliceInbox(SliceInboxOptions options = {});
  ~SliceInbox();

  SliceInbox(const SliceInbox&) = delete;
  SliceInbox& operator=(const SliceInbox&) = delete;

  // Registers what `session_id` expects and wakes chunks parked for it. Empty slices are
  // complete at once. `recvs` must already be valid (ValidateExchange).
  // Errors: FailedPrecondition if the session is active or already ended; Aborted if it was
  // cancelled.
  absl::Status Expect(const std::string& session_id, absl::Span<const SliceRecv> recvs)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Validates one chunk. `park_token` identifies the caller for Unpark(); `on_ready` runs
  // once (on the thread that calls Expect() or Cancel()) if the chunk is parked.
  // Rejections: InvalidArgument if no expected slice of the session matches the chunk's
  // identity, if the chunk's slice size or range differs from the expected one (this also
  // fails the session), or if the chunk leaves a gap or runs past the slice; FailedPrecondition
  // if another chunk of the slice is in flight; Aborted if the session failed, was cancelled
  // or ended without completing.
  Admission Admit(const IncomingChunk& chunk, const void* park_token,
                  std::function<void()> on_ready) ABSL_LOCKS_EXCLUDED(mu_);

  // Finishes a kWrite admission: `written` says whether all `write_bytes` reached dest (a
  // failed copy leaves the slice's progress where it was, so the bytes can come again).
  void Commit(const Admission& admission, bool written) ABSL_LOCKS_EXCLUDED(mu_);

  // Withdraws the chunk parked under `park_token`. True if it was still parked (its
  // `on_ready` will never run); false if it was not parked or `on_ready` runs or ran.
  bool Unpark(const void* park_token) ABSL_LOCKS_EXCLUDED(mu_);

  // Blocks until every expected slice of `session_id` is complete, the session fails, or
  // `deadline`; then waits for in-flight copies, ends the session and returns its result.
  // Errors: DeadlineExceeded; the session's failure (InvalidArgument for a mismatched
  // expected slice, Aborted on Cancel(), or what Fail() was given); FailedPrecondition if the
  // session is not active.
  absl::Status Wait(const std::string& session_id, absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);

  // Fails an active session: Wait() returns `status` (not OK). No-op otherwise.
  void Fail(const std::string& session_id, const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);

  // Fails an active session with Aborted, or ends an unknown one as cancelled (waking its
  // parked chunks, which are then rejected with Aborted). No-op for an ended session.
  void Cancel(const std::string& session_id) ABSL_LOCKS_EXCLUDED(mu_);

  size_t parked() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  using SliceId =
      std::tuple<std::string, std::vector<int64_t>, std::vector<int64_t>, uint32_t, int64_t>;
  struct SliceState {
    char* dest = nullptr;
    uint64_t nbytes = 0;
    int64_t end = 0;
    uint64_t received = 0;  // bytes [0, received) are in dest
    bool busy = false;      // a chunk is being copied
  };
  struct Session {
    std::map<SliceId, SliceState> slices;
    size_t incomplete = 0;  // slices with received < nbytes
    int inflight = 0;       // admitted kWrite chunks not yet committed
    absl::Status failure;   // not OK once failed
  };
  struct Ended {
    absl::Status result;  // OK if the session completed
    bool cancelled = false;
  };
  struct Parked {
    std::string session_id;
    std::function<void()> on_ready;
  };

  // Moves the callbacks parked for `session_id` out of parked_.
  std::vector<std::function<void()>> TakeParkedLocked(const std::string& session_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RememberEndedLocked(const std::string& session_id, Ended ended)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const SliceInboxOptions options_;

  mutable absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<Session>> active_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Ended> ended_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> ended_order_ ABSL_GUARDED_BY(mu_);  // oldest first
  std::map<const void*, Parked> parked_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_AGENT_PEER_SLICE_INBOX_H_
