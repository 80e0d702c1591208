#include "agent/range_reserver.h"

#include <algorithm>
#include <utility>

namespace tessera {

RangeReserver::RangeReserver(uint64_t total, uint64_t chunk, ReserveFn reserve)
    : total_(total), chunk_(std::max<uint64_t>(chunk, 1)), reserve_(std::move(reserve)),
      thread_([this] { Run(); }) {}

RangeReserver::~RangeReserver() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void RangeReserver::Run() {
  uint64_t offset = 0;
  while (offset < total_) {
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
    }
    const uint64_t length = std::min(chunk_, total_ - offset);
    absl::Status status = reserve_(offset, length);
    absl::MutexLock lock(&mu_);
    changed_.SignalAll();
    if (!status.ok()) {
      failure_ = std::move(status);
      return;
    }
    offset += length;
    reserved_ = offset;
  }
}

absl::Status RangeReserver::WaitFor(uint64_t end) {
  end = std::min(end, total_);
  absl::MutexLock lock(&mu_);
  while (failure_.ok() && reserved_ < end) changed_.Wait(&mu_);
  // A failure after `end` was reserved is no concern of this writer's.
  return reserved_ >= end ? absl::OkStatus() : failure_;
}

uint64_t RangeReserver::reserved() const {
  absl::MutexLock lock(&mu_);
  return reserved_;
}

}  // namespace tessera
