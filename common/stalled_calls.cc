#include "common/stalled_calls.h"

#include <algorithm>
#include <utility>

#include "absl/time/clock.h"
#include "common/log.h"

namespace tessera {

StalledCallCanceller::~StalledCallCanceller() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (checker_.joinable()) checker_.join();
}

StalledCallCanceller::Watch::~Watch() {
  absl::MutexLock lock(&owner_->mu_);
  owner_->calls_.erase(call_);
}

void StalledCallCanceller::Watch::Progress() {
  call_->last_progress_ns.store(absl::GetCurrentTimeNanos(), std::memory_order_relaxed);
}

std::unique_ptr<StalledCallCanceller::Watch> StalledCallCanceller::Add(
    grpc::ServerContextBase* context, absl::Duration limit, std::string what) {
  absl::MutexLock lock(&mu_);
  Watch::Call& call = calls_.emplace_back();
  call.context = context;
  call.limit = limit;
  call.what = std::move(what);
  call.last_progress_ns.store(absl::GetCurrentTimeNanos(), std::memory_order_relaxed);
  added_ = true;
  if (!checker_.joinable()) checker_ = std::thread([this] { CheckLoop(); });
  return std::unique_ptr<Watch>(new Watch(this, std::prev(calls_.end())));
}

bool StalledCallCanceller::AwaitNoneWatched(absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto none = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return calls_.empty(); };
  return mu_.AwaitWithTimeout(absl::Condition(&none), timeout);
}

uint64_t StalledCallCanceller::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

absl::Duration StalledCallCanceller::CheckIntervalLocked() const {
  absl::Duration shortest = absl::InfiniteDuration();
  for (const Watch::Call& call : calls_) shortest = std::min(shortest, call.limit);
  return shortest / 4;
}

void StalledCallCanceller::CheckLoop() {
  absl::MutexLock lock(&mu_);
  auto watching_or_stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || !calls_.empty();
  };
  // A call added meanwhile may have a shorter limit: the interval is taken again.
  auto added_or_stopping = [this]()
                               ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || added_; };
  while (!stopping_) {
    // With nothing watched, wait for the next Add (or the destructor) alone.
    mu_.Await(absl::Condition(&watching_or_stopping));
    if (stopping_) return;
    added_ = false;
    mu_.AwaitWithTimeout(absl::Condition(&added_or_stopping), CheckIntervalLocked());
    if (stopping_) return;
    const int64_t now = absl::GetCurrentTimeNanos();
    for (Watch::Call& call : calls_) {
      const absl::Duration idle =
          absl::Nanoseconds(now - call.last_progress_ns.load(std::memory_order_relaxed));
      if (call.cancelled || idle < call.limit) continue;
      call.cancelled = true;
      ++cancelled_;
      LogWarning(call.what, ": nothing moved for ", absl::FormatDuration(idle), " (limit ",
                 absl::FormatDuration(call.limit), "): call cancelled");
      call.context->TryCancel();
    }
  }
}

}  // namespace tessera
