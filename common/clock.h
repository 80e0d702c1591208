// Time source for leases, timeouts and phase timings, so that core libraries can be tested
// with a FakeClock instead of sleeps (STYLE.md 13).
//
// Thread-safety: both implementations are safe for concurrent use.
#ifndef TESSERA_COMMON_CLOCK_H_
#define TESSERA_COMMON_CLOCK_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace tessera {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
};

// Wall-clock time (absl::Now). A process-wide instance: RealClock::Get().
class RealClock : public Clock {
 public:
  static RealClock* Get();
  absl::Time Now() const override { return absl::Now(); }
};

// A clock that moves only when told to. Starts at the Unix epoch plus one day unless given.
class FakeClock : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::UnixEpoch() + absl::Hours(24)) : now_(start) {}

  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }
  void Set(absl::Time t) {
    absl::MutexLock lock(&mu_);
    now_ = t;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_COMMON_CLOCK_H_
