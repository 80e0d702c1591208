// StalledCallCanceller: ends callback-API server calls whose peer stopped moving bytes.
//
// A reactor that writes a stream waits on each write until the peer's HTTP/2 flow control takes
// it; one that reads a stream waits on each read until the peer sends. A peer that stops
// reading — or stops sending without closing — leaves that operation pending for good: no
// callback of the reactor's own runs again, so the reactor can never end the call, and whatever
// it holds (a copy's memory, the room reserved for a put) is held for good. A client deadline
// would bound it, but the server cannot rely on its peers to set one.
//
// A reactor takes a Watch when it starts serving, calls Progress() each time an operation of
// its own completed, and destroys the Watch in OnDone (before the call's context goes). One
// thread checks every watch each `check_every` while any is watched; a call with no progress
// for its limit is cancelled (ServerContextBase::TryCancel, once) within one `check_every`
// after: its pending operation completes with ok=false and the reactor ends as it does for a
// peer that went away. The cancellation is logged, naming the call.
//
// Lifecycle: the canceller outlives every Watch it gave (destroy the gRPC server first).
//
// Thread-safety: thread-safe. Progress() is one atomic store, for any thread. The checking
// thread cancels without holding the canceller's lock; a Watch's destructor waits for a
// cancel being made on its call, so the context outlives it. (gRPC 1.51 runs no callback of
// the reactor itself inline in TryCancel's caller — they go to its executor — so OnDone never
// waits on its own call's cancel.) Limits count on a monotonic clock.
#ifndef TESSERA_COMMON_STALLED_CALLS_H_
#define TESSERA_COMMON_STALLED_CALLS_H_

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/server_context.h"

namespace tessera {

class StalledCallCanceller {
 public:
  // `check_every` (> 0): how far past its limit a stalled call may go before it is cancelled;
  // its owner's shortest limit over a few (PeerMemoryService: a quarter).
  explicit StalledCallCanceller(absl::Duration check_every) : check_every_(check_every) {}
  // Stops the checking thread. Every Watch must be gone.
  ~StalledCallCanceller();
  StalledCallCanceller(const StalledCallCanceller&) = delete;
  StalledCallCanceller& operator=(const StalledCallCanceller&) = delete;

  class Watch {
   public:
    ~Watch();
    Watch(const Watch&) = delete;
    Watch& operator=(const Watch&) = delete;

    // An operation of the call completed: its stall limit counts again from now.
    void Progress();

   private:
    friend class StalledCallCanceller;
    struct Call;
    Watch(StalledCallCanceller* owner, std::list<Call>::iterator call)
        : owner_(owner), call_(call) {}

    StalledCallCanceller* const owner_;
    const std::list<Call>::iterator call_;
  };

  // Watches the call of `context` from now: cancelled once it made no progress for `limit`
  // (> 0). `what` names it in the log line ("read of data-00003 of step 7"). The Watch must be
  // destroyed before `context` is (in the reactor's OnDone).
  std::unique_ptr<Watch> Add(grpc::ServerContextBase* context, absl::Duration limit,
                             std::string what) ABSL_LOCKS_EXCLUDED(mu_);

  // True once no call is watched (every reactor that took a Watch is done), false if that did
  // not happen within `timeout`.
  bool AwaitNoneWatched(absl::Duration timeout) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void CheckLoop() ABSL_LOCKS_EXCLUDED(mu_);

  const absl::Duration check_every_;
  mutable absl::Mutex mu_;
  std::list<Watch::Call> calls_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread checker_;  // started by the first Add; joined by the destructor
};

struct StalledCallCanceller::Watch::Call {
  grpc::ServerContextBase* context = nullptr;
  absl::Duration limit;
  std::string what;
  std::atomic<int64_t> last_progress_ns{0};  // steady_clock of the last progress
  bool cancelled = false;                    // guarded by the owner's mu_
  bool cancelling = false;                   // guarded by the owner's mu_: TryCancel running
};

}  // namespace tessera

#endif  // TESSERA_COMMON_STALLED_CALLS_H_
