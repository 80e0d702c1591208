// GatedReserve: a RangeReserver::ReserveFn for tests that records its calls and holds each
// one until the test lets it go, so tests order reservations and reads by events.
#ifndef TESSERA_AGENT_GATED_RESERVE_H_
#define TESSERA_AGENT_GATED_RESERVE_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace tessera {

class GatedReserve {
 public:
  // Lets the next `n` calls return `status`.
  void Allow(int n, absl::Status status = absl::OkStatus()) {
    absl::MutexLock lock(&mu_);
    for (int i = 0; i < n; ++i) allowed_.push_back(status);
  }
  absl::Status operator()(uint64_t offset, uint64_t length) {
    absl::MutexLock lock(&mu_);
    calls_.emplace_back(offset, length);
    mu_.Await(absl::Condition(
        +[](GatedReserve* g) ABSL_EXCLUSIVE_LOCKS_REQUIRED(g->mu_) {
          return g->next_ < g->allowed_.size() || g->closed_;
        },
        this));
    if (next_ >= allowed_.size()) return absl::CancelledError("closed");
    return allowed_[next_++];
  }
  // Lets every waiting and later call return (Cancelled), so the reserver can be destroyed.
  void Close() {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }
  std::vector<std::pair<uint64_t, uint64_t>> calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }

 private:
  absl::Mutex mu_;
  std::vector<absl::Status> allowed_ ABSL_GUARDED_BY(mu_);
  size_t next_ ABSL_GUARDED_BY(mu_) = 0;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::pair<uint64_t, uint64_t>> calls_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_AGENT_GATED_RESERVE_H_
