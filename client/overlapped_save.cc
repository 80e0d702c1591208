#include "client/overlapped_save.h"

#include <utility>

namespace tessera {

OverlappedSave::State OverlappedSave::state() const {
  absl::MutexLock lock(&mu_);
  return state_;
}

bool OverlappedSave::fenced() const {
  absl::MutexLock lock(&mu_);
  return verdict_.has_value();
}

bool OverlappedSave::ended() const {
  absl::MutexLock lock(&mu_);
  return state_ == State::kEnded;
}

bool OverlappedSave::began() const {
  absl::MutexLock lock(&mu_);
  return began_;
}

void OverlappedSave::Copying() {
  absl::MutexLock lock(&mu_);
  if (state_ == State::kDescribed) state_ = State::kCopying;
  began_ = true;
}

void OverlappedSave::Copied(absl::Status status, absl::Duration copy) {
  absl::MutexLock lock(&mu_);
  if (state_ == State::kEnded) return;
  copy_time_ = copy;
  copy_status_ = std::move(status);
  state_ = State::kCopied;
}

absl::Status OverlappedSave::Fence(absl::Status verdict) {
  const absl::Time start = absl::Now();
  absl::MutexLock lock(&mu_);
  auto copied = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return state_ != State::kDescribed && state_ != State::kCopying;
  };
  mu_.Await(absl::Condition(&copied));
  if (!verdict_.has_value()) blocked_ += absl::Now() - start;
  if (!verdict_.has_value()) verdict_ = std::move(verdict);
  if (!copy_status_.ok()) return copy_status_;
  return *verdict_;
}

absl::Status OverlappedSave::AwaitVerdict() {
  absl::MutexLock lock(&mu_);
  auto given = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return verdict_.has_value(); };
  mu_.Await(absl::Condition(&given));
  return *verdict_;
}

void OverlappedSave::Staged() {
  absl::MutexLock lock(&mu_);
  if (state_ == State::kCopied) state_ = State::kStaged;
}

void OverlappedSave::End(absl::Status outcome) {
  absl::MutexLock lock(&mu_);
  if (state_ == State::kEnded) return;
  outcome_ = std::move(outcome);
  state_ = State::kEnded;
}

absl::Status OverlappedSave::AwaitEnded() const {
  absl::MutexLock lock(&mu_);
  auto ended = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return state_ == State::kEnded; };
  mu_.Await(absl::Condition(&ended));
  return outcome_;
}

void OverlappedSave::AddBlocked(absl::Duration blocked) {
  absl::MutexLock lock(&mu_);
  blocked_ += blocked;
}

absl::Duration OverlappedSave::blocked() const {
  absl::MutexLock lock(&mu_);
  return blocked_;
}

absl::Duration OverlappedSave::copy_time() const {
  absl::MutexLock lock(&mu_);
  return copy_time_;
}

}  // namespace tessera
