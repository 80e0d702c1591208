// Exponential backoff with jitter for reconnects: the delay starts at `initial`, multiplies by
// `multiplier` per failure up to `max`, and each delay is drawn uniformly from
// [delay * (1 - jitter), delay], so agents restarted together do not reconnect in lockstep.
// The jitter comes from a seeded generator: a Backoff given a seed draws the same delays every
// run (what a pure state machine and its deterministic simulation need); one without draws a
// random seed.
//
// Thread-safety: not thread-safe; one per retry loop.
#ifndef TESSERA_AGENT_BACKOFF_H_
#define TESSERA_AGENT_BACKOFF_H_

#include <algorithm>
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
  explicit Backoff(BackoffOptions options = {})
      : Backoff(options, absl::Uniform<uint64_t>(absl::BitGen())) {}
  Backoff(BackoffOptions options, uint64_t seed)
      : options_(options), next_(options.initial), state_(seed) {}

  // The delay before the next attempt; grows the following one.
  absl::Duration Next() {
    absl::Duration delay = next_;
    next_ = std::min(options_.max, next_ * options_.multiplier);
    // 53 random bits as a fraction in [0, 1).
    const double unit = static_cast<double>(NextRandom() >> 11) * 0x1.0p-53;
    return delay * (1.0 - options_.jitter * unit);
  }

  // Call after a success: the next failure starts from `initial` again.
  void Reset() { next_ = options_.initial; }

 private:
  // splitmix64: small, fast, and the same sequence for the same seed on every platform.
  uint64_t NextRandom() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }

  BackoffOptions options_;
  absl::Duration next_;
  uint64_t state_;
};

}  // namespace tessera

#endif  // TESSERA_AGENT_BACKOFF_H_
