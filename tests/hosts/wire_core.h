// WireCore: the pure core of tessera-wire (tests/hosts/wire_main.cc), a lossy, slow link for
// the partition tests: IP packets go in at one end and come out of the other `delay` later,
// each dropped on the way with probability `loss` — what `tc netem delay D loss P` does on a
// kernel that has netem (tests/hosts/lib.sh says why netem is not used).
//
// The core reads no clock and does no I/O: the caller hands it each packet with the time it
// arrived (Offer) and asks which are due (TakeDue); the shell reads and writes TUN devices.
// Drops come from a seeded generator, so a seed replays the same drops for the same packets.
//
//   Offer(now, end, packet) --(drawn < loss, or the end's queue full)--> dropped
//            |
//            +--> queued until now + delay --TakeDue(t >= now + delay)--> out at the other end
//
// Each end's queue is FIFO and every packet waits the same delay, so packets leave in the order
// they came (netem with a fixed delay and no jitter keeps order too).
//
// Thread-safety: none; one thread drives a WireCore.
#ifndef TESSERA_TESTS_HOSTS_WIRE_CORE_H_
#define TESSERA_TESTS_HOSTS_WIRE_CORE_H_

#include <cstdint>
#include <deque>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace tessera {

struct WireOptions {
  // How long every packet travels. Default: 0.
  absl::Duration delay = absl::ZeroDuration();
  // Probability that a packet is dropped, in [0, 1]. Default: 0.
  double loss = 0.0;
  // Seed of the drops. Default: 1.
  uint64_t seed = 1;
  // Packets in flight per direction; more are dropped, as a full queue drops. Default: 100000.
  size_t queue_limit = 100000;
};

// Errors: InvalidArgument naming the field if delay < 0, loss is outside [0, 1] or
// queue_limit is 0.
absl::Status ValidateWireOptions(const WireOptions& options);

class WireCore {
 public:
  // The two ends of the wire; a packet offered at one comes out of the other.
  enum End { kA = 0, kB = 1 };

  struct Delivery {
    End to;  // the end it comes out of
    std::string packet;
  };

  // `options` must be valid (ValidateWireOptions).
  explicit WireCore(const WireOptions& options);

  // A packet that arrived at `from` at `now`. Returns false if it was dropped.
  bool Offer(absl::Time now, End from, std::string packet);

  // Every packet due by `now`, in the order each end's packets came; removed from the wire.
  std::vector<Delivery> TakeDue(absl::Time now);

  // When the next packet is due; nullopt when none is in flight.
  std::optional<absl::Time> NextDue() const;

  uint64_t dropped() const { return dropped_; }
  uint64_t delivered() const { return delivered_; }

 private:
  struct InFlight {
    absl::Time due;
    std::string packet;
  };
  WireOptions options_;
  std::mt19937_64 random_;
  std::uniform_real_distribution<double> draw_{0.0, 1.0};
  std::deque<InFlight> queue_[2];  // by the end the packets came in at
  uint64_t dropped_ = 0;
  uint64_t delivered_ = 0;
};

}  // namespace tessera

#endif  // TESSERA_TESTS_HOSTS_WIRE_CORE_H_
