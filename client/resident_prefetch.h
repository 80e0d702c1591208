// ResidentPrefetch: a restarted trainer's client maps its agent's resident checkpoint at
// Connect (AgentIdentity.resident_shm_name) and faults its pages in on a thread of its own,
// while the trainer builds its model, so that the load that later reads the region in place
// copies from pages already mapped (DESIGN.md "Memory tier", "Mapping the resident copy
// ahead").
//
// Why: a process that maps a /dev/shm region pays the kernel about 330 ns per 4 KiB page to
// map it (measured on the reference VM: 21 ms per 256 MiB populated, 28 ms faulted by touch),
// which is more than a 2-thread memcpy of the same bytes there (9-16 ms). No way of reading
// the region from a new process avoids it (pread, process_vm_readv measured slower); 2 MiB
// pages do, but need the operator's mount option. A trainer restarting takes seconds to
// minutes before its first load (imports, process group, model), so the page work can run
// beside that instead of inside the load.
//
//   Start ──> populating, chunk by chunk ──> done (every byte mapped, or an error)
//                 │ Take / destructor: stop after the chunk under way
//                 v
//              stopped (what is mapped stays mapped; the load's copy faults in the rest)
//
// Memory: the mapping keeps the region's pages alive even if the agent drops the region
// meanwhile, until it is unmapped. The client therefore ends it at its first Load (which uses
// it if the agent serves that region, else unmaps it), Save or ReserveStaging.
//
// Thread-safety: Take and progress may be called from any thread; Take at most once at a time.
#ifndef TESSERA_CLIENT_RESIDENT_PREFETCH_H_
#define TESSERA_CLIENT_RESIDENT_PREFETCH_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/staging_pool.h"

namespace tessera {

// Bytes faulted in per madvise call; Take waits for at most one such call.
inline constexpr uint64_t kPrefetchChunkBytes = uint64_t{16} << 20;

class ResidentPrefetch {
 public:
  struct Progress {
    std::string region;              // the region's name
    uint64_t bytes = 0;              // bytes to fault in (the checkpoint's, from the start)
    uint64_t populated_bytes = 0;    // faulted in so far
    bool done = false;               // it has ended: all mapped, stopped, or failed
    absl::Duration elapsed;          // from Start until it ended (or until now)
    absl::Status status;             // why it failed (mapping the region); OK otherwise
  };

  // Maps `size` bytes of region `name` read-only and faults in its first `bytes` (at most
  // `size`) on a thread of its own, `chunk_bytes` per call.
  static std::unique_ptr<ResidentPrefetch> Start(std::string name, uint64_t size, uint64_t bytes,
                                                 uint64_t chunk_bytes = kPrefetchChunkBytes);

  // Stops and unmaps whatever Take did not hand over.
  ~ResidentPrefetch();
  ResidentPrefetch(const ResidentPrefetch&) = delete;
  ResidentPrefetch& operator=(const ResidentPrefetch&) = delete;

  // Stops populating (after the chunk under way) and hands over the mapping if it is of
  // region `name` and maps at least `size` bytes; otherwise unmaps it and returns null, as
  // does every Take after the first, and a prefetch that failed to map.
  std::unique_ptr<MappedStaging> Take(const std::string& name, uint64_t size)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Stops populating and unmaps: for a client that will not load in place.
  void End() ABSL_LOCKS_EXCLUDED(mu_) { (void)Take(std::string(), 0); }

  Progress progress() const ABSL_LOCKS_EXCLUDED(mu_);

  // Blocks until it has ended or `timeout` passed; returns whether it has ended.
  bool Wait(absl::Duration timeout) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  ResidentPrefetch(std::string name, uint64_t size, uint64_t bytes, uint64_t chunk_bytes);
  void Run();
  void Finish(absl::Status status) ABSL_LOCKS_EXCLUDED(mu_);
  void Stop();

  const std::string name_;
  const uint64_t size_;
  const uint64_t bytes_;
  const uint64_t chunk_bytes_;
  const absl::Time start_;
  std::atomic<bool> stop_{false};

  mutable absl::Mutex mu_;
  std::unique_ptr<MappedStaging> mapping_ ABSL_GUARDED_BY(mu_);  // set once Run has mapped
  uint64_t populated_ ABSL_GUARDED_BY(mu_) = 0;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Duration elapsed_ ABSL_GUARDED_BY(mu_);
  absl::Status status_ ABSL_GUARDED_BY(mu_);

  std::thread thread_;  // last: started once the rest is initialised
};

// Faults in the pages of [data, data + len) of a readable mapping: madvise(MADV_POPULATE_READ)
// where the kernel has it (5.14+), else a read of one byte per page.
// Errors: Internal (with errno) if madvise fails otherwise.
absl::Status PopulateRead(const char* data, uint64_t len);

}  // namespace tessera

#endif  // TESSERA_CLIENT_RESIDENT_PREFETCH_H_
