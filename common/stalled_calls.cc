#include "common/stalled_calls.h"

#include <chrono>
#include <utility>
#include <vector>

#include "common/log.h"

namespace tessera {
namespace {

// Monotonic: a step of the wall clock neither cancels calls that move nor hides ones that stall.
int64_t NowNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

StalledCallCanceller::~StalledCallCanceller() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (checker_.joinable()) checker_.join();
}

StalledCallCanceller::Watch::~Watch() {
  absl::MutexLock lock(&owner_->mu_);
  // The context must outlive a TryCancel the checker is making on it.
  Call* const call = &*call_;
  auto not_cancelling = [call] { return !call->cancelling; };
  owner_->mu_.Await(absl::Condition(&not_cancelling));
  owner_->calls_.erase(call_);
}

void StalledCallCanceller::Watch::Progress() {
  call_->last_progress_ns.store(NowNanos(), std::memory_order_relaxed);
}

std::unique_ptr<StalledCallCanceller::Watch> StalledCallCanceller::Add(
    grpc::ServerContextBase* context, absl::Duration limit, std::string what) {
  absl::MutexLock lock(&mu_);
  Watch::Call& call = calls_.emplace_back();
  call.context = context;
  call.limit = limit;
  call.what = std::move(what);
  call.last_progress_ns.store(NowNanos(), std::memory_order_relaxed);
  if (!checker_.joinable()) checker_ = std::thread([this] { CheckLoop(); });
  return std::unique_ptr<Watch>(new Watch(this, std::prev(calls_.end())));
}

bool StalledCallCanceller::AwaitNoneWatched(absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto none = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return calls_.empty(); };
  return mu_.AwaitWithTimeout(absl::Condition(&none), timeout);
}

void StalledCallCanceller::CheckLoop() {
  absl::MutexLock lock(&mu_);
  auto watching_or_stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || !calls_.empty();
  };
  while (!stopping_) {
    // With nothing watched, wait for the next Add (or the destructor) alone.
    mu_.Await(absl::Condition(&watching_or_stopping));
    if (stopping_) return;
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), check_every_);
    if (stopping_) return;
    const int64_t now = NowNanos();
    std::vector<Watch::Call*> stalled;
    for (Watch::Call& call : calls_) {
      const absl::Duration idle =
          absl::Nanoseconds(now - call.last_progress_ns.load(std::memory_order_relaxed));
      if (call.cancelled || idle < call.limit) continue;
      call.cancelled = true;
      call.cancelling = true;  // its Watch, and so its context, stays until this is cleared
      LogWarning(call.what, ": nothing moved for ", absl::FormatDuration(idle), " (limit ",
                 absl::FormatDuration(call.limit), "): call cancelled");
      stalled.push_back(&call);
    }
    if (stalled.empty()) continue;
    // Not under the lock: callbacks gRPC runs on this thread as the cancel ends (a new call's
    // method handler, which Adds a watch) must not find it held.
    mu_.Unlock();
    for (Watch::Call* call : stalled) call->context->TryCancel();
    mu_.Lock();
    for (Watch::Call* call : stalled) call->cancelling = false;
  }
}

}  // namespace tessera
