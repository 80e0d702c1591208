#include "server/trainer_window.h"

namespace tessera {

void TrainerWindow::Set(bool trainers_blocked) {
  absl::MutexLock lock(&mu_);
  blocked_ = trainers_blocked;
}

bool TrainerWindow::AwaitClosed(absl::Duration grace, absl::Duration max_wait) {
  if (grace > absl::ZeroDuration()) {
    absl::MutexLock lock(&mu_);
    auto released = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return released_; };
    mu_.AwaitWithTimeout(absl::Condition(&released), grace);
  }
  absl::MutexLock lock(&mu_);
  ++waiters_;
  auto closed = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !blocked_ || released_; };
  const bool waited = mu_.AwaitWithTimeout(absl::Condition(&closed), max_wait);
  --waiters_;
  return waited && !released_;
}

void TrainerWindow::Release() {
  absl::MutexLock lock(&mu_);
  released_ = true;
}

void TrainerWindow::AwaitWaitersForTesting(int n) {
  absl::MutexLock lock(&mu_);
  auto there = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return waiters_ >= n; };
  mu_.Await(absl::Condition(&there));
}

}  // namespace tessera
