// TrainerWindow: whether a job's trainers are blocked in a save right now, and a wait for the
// coordinator's background disk work (retention, removing an aborted save's directory) to
// start outside that window.
//
// Why: unlinking a retired multi-GiB checkpoint holds the file system's journal for tens of
// milliseconds, and the coordinator's state store syncs on the next save's blocking path (the
// session's open, PINNING). Where both share a file system (one node: the quickstart, the
// benchmarks), a retention that ran as the next save started added 105-145 ms to an H100
// trainer's 20 ms stall (docs/benchmarks/reference-h100-x1.md). Deferring the disk work a
// little costs nothing: it only frees space.
//
// The job's strand publishes Set() after every step of the job's core (JobCore::
// trainers_blocked()); the janitor calls AwaitClosed() before each piece of disk work.
//
// Thread-safety: thread-safe.
#ifndef TESSERA_SERVER_TRAINER_WINDOW_H_
#define TESSERA_SERVER_TRAINER_WINDOW_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace tessera {

class TrainerWindow {
 public:
  // Whether the job's trainers are blocked in a save (its session is PLANNING, PINNING or
  // COPYING).
  void Set(bool trainers_blocked) ABSL_LOCKS_EXCLUDED(mu_);

  // Waits `grace` first (a save that follows its predecessor's commit at once has opened by
  // then), then until no trainer of the job is blocked, at most `max_wait` (a trainer that
  // died mid-save holds the window until the session's deadline; disk work must not wait for
  // that). Returns false if it stopped waiting at `max_wait`, or at Release().
  bool AwaitClosed(absl::Duration grace, absl::Duration max_wait) ABSL_LOCKS_EXCLUDED(mu_);

  // Ends every wait now and lets later ones through at once (the coordinator is stopping).
  void Release() ABSL_LOCKS_EXCLUDED(mu_);

  // Testing: blocks until `n` callers are waiting for the window to close.
  void AwaitWaitersForTesting(int n) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::Mutex mu_;
  bool blocked_ ABSL_GUARDED_BY(mu_) = false;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  int waiters_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_TRAINER_WINDOW_H_
