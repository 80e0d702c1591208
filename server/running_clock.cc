#include "server/running_clock.h"

#include <algorithm>

namespace tessera {

RunningClock::RunningClock(const Clock* wall, absl::Duration max_step)
    : wall_(wall), max_step_(max_step) {
  last_wall_ = wall_->Now();
  running_ = last_wall_;
  paused_ = absl::ZeroDuration();
}

absl::Time RunningClock::Now() const {
  // The wall clock is read under the lock: two readers racing could otherwise count the same
  // wall time twice (running time must never run ahead of the wall).
  absl::MutexLock lock(&mu_);
  const absl::Time wall = wall_->Now();
  const absl::Duration step = std::max(absl::ZeroDuration(), wall - last_wall_);
  if (step > max_step_) paused_ += step - max_step_;
  running_ += std::min(step, max_step_);
  last_wall_ = wall;  // after a step back, counting resumes from there
  return running_;
}

absl::Duration RunningClock::paused() const {
  absl::MutexLock lock(&mu_);
  return paused_;
}

}  // namespace tessera
