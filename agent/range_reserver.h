// RangeReserver: reserves a region's bytes in order on a thread of its own, ahead of writers
// that wait only for the ranges they write.
//
// A load region of several GiB took 0.45-0.84 s to reserve in one posix_fallocate on the
// H100 machine, all of it before the load's first read; its reads then ran at the disk's
// speed, several times slower than reserving. Reserved in chunks ahead of them, the reads start
// after the first chunk and never catch up (docs/benchmarks/reference-h100-x1.md).
//
//   chunk:    [0, c) [c, 2c) ... [.., total)      reserved in this order, one at a time
//   WaitFor(end): returns once [0, end) is reserved, or the first failure
//
// `reserve(offset, length)` does the work (StagingPool::ReserveBytes for a region). After a
// failure nothing more is reserved and every WaitFor past what was reserved returns that
// error. The destructor stops after the chunk in progress and joins: destroy the reserver
// before the region.
//
// Thread-safety: WaitFor and reserved() from any thread.
#ifndef TESSERA_AGENT_RANGE_RESERVER_H_
#define TESSERA_AGENT_RANGE_RESERVER_H_

#include <cstdint>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace tessera {

class RangeReserver {
 public:
  using ReserveFn = std::function<absl::Status(uint64_t offset, uint64_t length)>;

  // Starts reserving [0, total) in chunks of `chunk` bytes (> 0).
  RangeReserver(uint64_t total, uint64_t chunk, ReserveFn reserve);
  ~RangeReserver();
  RangeReserver(const RangeReserver&) = delete;
  RangeReserver& operator=(const RangeReserver&) = delete;

  // Blocks until bytes [0, end) are reserved (end is capped at total). Errors: the failure of
  // `reserve` that ended the reservation before `end`.
  absl::Status WaitFor(uint64_t end);

  // Bytes reserved so far, from 0.
  uint64_t reserved() const;

 private:
  void Run();

  const uint64_t total_;
  const uint64_t chunk_;
  const ReserveFn reserve_;
  mutable absl::Mutex mu_;
  uint64_t reserved_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::CondVar changed_;  // reserved_ or failure_ changed
  std::thread thread_;  // last: starts once the members above exist
};

}  // namespace tessera

#endif  // TESSERA_AGENT_RANGE_RESERVER_H_
