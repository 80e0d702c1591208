// Exponential backoff with jitter for reconnects: the delay starts at `initial`, multiplies by
// `multiplier` per failure up to `max`, and each delay is drawn uniformly from
// [delay * (1 - jitter), delay], so agents restarted together do not reconnect in lockstep.
//
// Thread-safety: not thread-safe; one per retry loop.
#ifndef TESSERA_AGENT_BACKOFF_H_
#define TESSERA_AGENT_BACKOFF_H_

#include <cstdint>

#include "absl/random/random.h"
#include "absl/time/time.h"

namespace tessera {

struct BackoffOptions {
  absl::Duration initial = absl::Milliseconds(100);  // Default: 100 ms.
  absl::Duration max = absl::Seconds(5);             // Default: 5 s.
  double multiplier = 2.0;                           // Default: 2.
  double jitter = 0.5;                               // Default: 0.5 (fraction, 0..1).
};

class Backoff {
 public:
  explicit Backoff(BackoffOptions options = {}) : options_(options), next_(options.initial) {}

  // The delay before the next attempt; grows the following one.
  absl::Duration Next() {
    absl::Duration delay = next_;
    next_ = std::min(options_.max, next_ * options_.multiplier);
    double factor = 1.0 - options_.jitter * absl::Uniform(gen_, 0.0, 1.0);
    return delay * factor;
  }

  // Call after a success: the next failure starts from `initial` again.
  void Reset() { next_ = options_.initial; }

 private:
  BackoffOptions options_;
  absl::Duration next_;
  absl::BitGen gen_;
};

}  // namespace tessera

#endif  // TESSERA_AGENT_BACKOFF_H_
