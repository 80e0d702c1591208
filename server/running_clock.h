// RunningClock: time that passes only while this process runs to see it pass — the clock a
// judge of leases must use (DESIGN.md "Liveness", docs/decisions/0037-running-time-leases.md).
//
// A lease says "this agent was heard from within the last L of the coordinator's time". If the
// coordinator itself stops (SIGSTOP, a VM freeze or live migration, a long stall of the whole
// process) for longer than L, the wall clock moves on while nobody could have been heard: the
// agents' heartbeats wait in the coordinator's socket buffers. Judged by the wall clock, every
// agent's lease has expired the moment it resumes, and the first tick declares them all lost
// before their queued heartbeats are read. A pause of the judge is not a death of the judged.
//
// RunningClock reads a wall Clock at every Now() and advances its own time by the elapsed wall
// time, but by at most `max_step` per reading. The process reads it at least every tick (the
// coordinator's ticker, every 200 ms, and every RPC), so while it runs each step is a tick or
// less and running time keeps pace with the wall; across a pause the one long step counts as
// `max_step`. Leases judged in running time therefore expire only after L of time the process
// was running to hear heartbeats (give or take one `max_step`). A wall clock that goes back
// advances nothing.
//
//   wall:     |--tick--|--tick--|-------------- paused 13 s --------------|--tick--|
//   running:  |--tick--|--tick--|max_step|--tick--|
//
// The cost: a coordinator starved of CPU for more than `max_step` between readings (not paused
// — just slow) also counts less time, so an agent that died meanwhile is found lost that much
// later. That is the safe side: a late verdict, never a false one.
//
// Thread-safety: safe for concurrent use.
#ifndef TESSERA_SERVER_RUNNING_CLOCK_H_
#define TESSERA_SERVER_RUNNING_CLOCK_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace tessera {

class RunningClock : public Clock {
 public:
  // `wall` must outlive this. Running time starts at wall->Now(). `max_step` > 0.
  RunningClock(const Clock* wall, absl::Duration max_step);

  // Running time now; advances it (see above). Never goes back.
  absl::Time Now() const override ABSL_LOCKS_EXCLUDED(mu_);

  // Wall time not counted so far: the sum of every step's excess over max_step (a pause's
  // length, less max_step). For logs and metrics.
  absl::Duration paused() const ABSL_LOCKS_EXCLUDED(mu_);

  absl::Duration max_step() const { return max_step_; }

 private:
  const Clock* const wall_;
  const absl::Duration max_step_;
  mutable absl::Mutex mu_;
  mutable absl::Time last_wall_ ABSL_GUARDED_BY(mu_);
  mutable absl::Time running_ ABSL_GUARDED_BY(mu_);
  mutable absl::Duration paused_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_SERVER_RUNNING_CLOCK_H_
