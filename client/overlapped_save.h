// OverlappedSave: the state of one save that returned to the trainer before its bytes were
// copied (SaveOptions::overlap; docs/design/overlapped-save.md). The client's save thread
// advances it as it begins the session, copies and reports; the trainer fences it (Fence),
// which is the one point where it learns that its state may change again.
//
//   DESCRIBED ─1─► COPYING ─2─► COPIED ─3─► STAGED ─4─► ENDED (committed, or aborted later)
//       │             │            │
//       └──────5──────┴──────5─────┴───6───► ENDED (aborted: never staged, never committed)
//
//   1  the previous overlapped save of this client has ended (a job has one session at a
//      time) and BeginSave answered with the staging slots: the copy starts.
//   2  every byte is in staging (host copies done, device copies synchronised). Fence
//      returns here, not before: until then the trainer must not change the tensors.
//   3  Fence said the state stayed as it was at save() (`verdict` OK): Staged is sent, and
//      the agent persists and commits as after a blocking save.
//   4  WaitCommitted answered (committed, or the session's reason it aborted).
//   5  BeginSave or the copy failed: the save ends with that error, never staged (Fence
//      returns it at once; a session that had begun is withdrawn, as in 6, and the save ends
//      once it has).
//   6  Fence said the state changed before the fence (a version counter moved), or the client
//      was destroyed unfenced (the trainer exits): the rank withdraws its snapshot (Staged
//      with `withdrawn`), which fails the session for every rank; the save ends once the
//      session has (so that the next one does not find it in progress). A save is staged only
//      after a fence vouched for it.
// ENDED always means the session is over, or never began: the next overlapped save of the
// client begins after it.
//
// Thread-safety: every method may be called from any thread.
#ifndef TESSERA_CLIENT_OVERLAPPED_SAVE_H_
#define TESSERA_CLIENT_OVERLAPPED_SAVE_H_

#include <cstdint>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace tessera {

class OverlappedSave {
 public:
  enum class State { kDescribed, kCopying, kCopied, kStaged, kEnded };

  explicit OverlappedSave(int64_t step) : step_(step) {}
  OverlappedSave(const OverlappedSave&) = delete;
  OverlappedSave& operator=(const OverlappedSave&) = delete;

  int64_t step() const { return step_; }
  State state() const ABSL_LOCKS_EXCLUDED(mu_);
  // Whether Fence has been called (the verdict is in).
  bool fenced() const ABSL_LOCKS_EXCLUDED(mu_);
  bool ended() const ABSL_LOCKS_EXCLUDED(mu_);
  // Whether BeginSave answered (edge 1 was taken): the session exists.
  bool began() const ABSL_LOCKS_EXCLUDED(mu_);

  // Edge 1, on the save thread.
  void Copying() ABSL_LOCKS_EXCLUDED(mu_);
  // Edge 2, on the save thread, with the copy's status (an error: edge 5 follows, by End);
  // `copy` is the time the copy took.
  void Copied(absl::Status status, absl::Duration copy) ABSL_LOCKS_EXCLUDED(mu_);

  // The trainer's fence: waits until the save is COPIED or ENDED, records `verdict` (OK: the
  // state stayed intact since save(); an error: why it did not) and returns at once, before
  // any report to the agent. A second Fence returns the first one's result.
  // Returns OK if the snapshot was taken and vouched for; else the error that ended the save:
  // BeginSave's or the copy's (then `verdict` is not used), or `verdict` itself.
  absl::Status Fence(absl::Status verdict) ABSL_LOCKS_EXCLUDED(mu_);

  // On the save thread after Copied(OK): blocks until Fence gave its verdict, and returns it.
  absl::Status AwaitVerdict() ABSL_LOCKS_EXCLUDED(mu_);
  // Edge 3, on the save thread.
  void Staged() ABSL_LOCKS_EXCLUDED(mu_);
  // Edges 4, 5 and 6: `outcome` is OK for a commit, else why the save did not commit.
  // The first End wins.
  void End(absl::Status outcome) ABSL_LOCKS_EXCLUDED(mu_);
  // Blocks until ENDED; returns the outcome.
  absl::Status AwaitEnded() const ABSL_LOCKS_EXCLUDED(mu_);
  // The copy's duration, once COPIED (zero before).
  absl::Duration copy_time() const ABSL_LOCKS_EXCLUDED(mu_);
  // How long the trainer was blocked by this save: Save's return and Fence's wait, summed
  // (reported to the agent as the save's stall).
  void AddBlocked(absl::Duration blocked) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Duration blocked() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const int64_t step_;
  mutable absl::Mutex mu_;
  State state_ ABSL_GUARDED_BY(mu_) = State::kDescribed;
  bool began_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status copy_status_ ABSL_GUARDED_BY(mu_);
  absl::Duration copy_time_ ABSL_GUARDED_BY(mu_);
  absl::Duration blocked_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Status> verdict_ ABSL_GUARDED_BY(mu_);
  absl::Status outcome_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_CLIENT_OVERLAPPED_SAVE_H_
