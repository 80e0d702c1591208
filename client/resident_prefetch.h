// ResidentPrefetch: a restarted trainer's client maps its agent's resident checkpoint at
// Connect (AgentIdentity.resident_shm_name), faults its pages in and checks its blocks against
// the manifest's checksums on a thread of its own, while the trainer builds its model, so that
// the load that later reads the region in place only copies (DESIGN.md "Memory tier",
// "Mapping and checking the resident copy ahead").
//
// Why: a process that maps a /dev/shm region pays the kernel about 330 ns per 4 KiB page to
// map it (measured on the reference VM: 21 ms per 256 MiB populated, 28 ms faulted by touch),
// which is more than a 2-thread memcpy of the same bytes there (9-16 ms). No way of reading
// the region from a new process avoids it (pread, process_vm_readv measured slower); 2 MiB
// pages do, but need the operator's mount option. And hashing every byte as it is copied
// costs about as much as the copy again (client/verified_copy_benchmark.cc). A trainer
// restarting takes seconds to minutes before its first load (imports, process group, model),
// so both can run beside that instead of inside the load.
//
//   Start ──> populating, chunk by chunk ──> checking, block by block ──> done
//                 │                               │                   (or an error)
//                 │ Take / destructor: stop after the chunk or block under way
//                 v                               v
//              stopped (what is mapped stays mapped, what is checked stays checked; the
//                       load's copy faults in and checks the rest)
//
// What "checked ahead" means: block [offset, offset + length) of this region hashed to the
// XXH3 the manifest gives it (Agent.ListResidentBlocks) when this thread read it. The load
// copies such a block without hashing it again only if its reply lists the very same block
// (client/verified_copy.h): a region the agent rewrote meanwhile lists other XXH3s. What it
// does not cover is memory changed after the check by something other than the agent, which
// keeps the region unwritten until a save of this trainer replaces it.
//
// Memory: the mapping keeps the region's pages alive even if the agent drops the region
// meanwhile, until it is unmapped. The client (client/client.h) therefore keeps it only while
// the agent serves loads from that region, and lets it go at its first Save or ReserveStaging.
//
// Thread-safety: Take, progress and Wait may be called from any thread; Take at most once at a
// time.
#ifndef TESSERA_CLIENT_RESIDENT_PREFETCH_H_
#define TESSERA_CLIENT_RESIDENT_PREFETCH_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/status/statusor.h"
#include "common/checksum.h"
#include "shm/mapped_region.h"

namespace tessera {

// Bytes faulted in per madvise call by default.
inline constexpr uint64_t kPrefetchChunkBytes = uint64_t{16} << 20;

// The checksum blocks of the resident checkpoint, by increasing offset from the region's first
// byte (Agent.ListResidentBlocks), or why they cannot be had.
using ListResidentBlocks = std::function<absl::StatusOr<std::vector<BlockCheck>>()>;

struct ResidentPrefetchOptions {
  // Asked once the pages are faulted in; null: nothing is checked ahead.
  ListResidentBlocks list_blocks;
  // Bytes faulted in per call; Take waits for at most one such call (or one block's hash).
  uint64_t chunk_bytes = kPrefetchChunkBytes;
};

class ResidentPrefetch {
 public:
  struct Progress {
    uint64_t bytes = 0;              // bytes to fault in (the checkpoint's, from the start)
    uint64_t populated_bytes = 0;    // faulted in so far
    uint64_t checked_bytes = 0;      // of blocks checked so far that match the manifest
    uint64_t mismatched_blocks = 0;  // blocks checked so far that do not (the load reads them
                                     // again, and finds them bad)
    bool done = false;               // it has ended: all mapped and checked, stopped, or failed
    absl::Duration elapsed;          // from Start until it ended (or until now)
    absl::Status status;             // why it failed (mapping the region); OK otherwise
    absl::Status check_status;       // why nothing was checked (the listing failed); OK otherwise
  };

  // What Take hands over.
  struct Taken {
    std::unique_ptr<MappedStaging> mapping;  // null after a failure to map, or a second Take
    std::vector<BlockCheck> checked;         // the blocks checked ahead that match, by offset
  };

  // Maps `size` bytes of region `name` read-only, faults in its first `bytes` (at most
  // `size`), then checks the blocks options.list_blocks lists that lie in them, on a thread of
  // its own.
  static std::unique_ptr<ResidentPrefetch> Start(std::string name, uint64_t size, uint64_t bytes,
                                                 ResidentPrefetchOptions options = {});

  // Stops and unmaps whatever Take did not hand over.
  ~ResidentPrefetch();
  ResidentPrefetch(const ResidentPrefetch&) = delete;
  ResidentPrefetch& operator=(const ResidentPrefetch&) = delete;

  // Stops (after the chunk or block under way) and hands over the mapping and what was checked:
  // what is not faulted in yet faults as it is read, what is not checked is checked as it is
  // copied.
  Taken Take() ABSL_LOCKS_EXCLUDED(mu_);

  Progress progress() const ABSL_LOCKS_EXCLUDED(mu_);

  // Blocks until it has ended or `timeout` passed; returns whether it has ended.
  bool Wait(absl::Duration timeout) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  ResidentPrefetch(std::string name, uint64_t size, uint64_t bytes,
                   ResidentPrefetchOptions options);
  void Run();
  // Hashes the listed blocks that lie in [0, bytes_) of `data`, recording those that match.
  void Check(const char* data) ABSL_LOCKS_EXCLUDED(mu_);
  void Finish(absl::Status status) ABSL_LOCKS_EXCLUDED(mu_);
  void Stop();

  const std::string name_;
  const uint64_t size_;
  const uint64_t bytes_;
  const ResidentPrefetchOptions options_;
  const absl::Time start_;
  std::atomic<bool> stop_{false};

  mutable absl::Mutex mu_;
  std::unique_ptr<MappedStaging> mapping_ ABSL_GUARDED_BY(mu_);  // set once Run has mapped
  uint64_t populated_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<BlockCheck> checked_ ABSL_GUARDED_BY(mu_);
  uint64_t checked_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t mismatched_ ABSL_GUARDED_BY(mu_) = 0;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Duration elapsed_ ABSL_GUARDED_BY(mu_);
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  absl::Status check_status_ ABSL_GUARDED_BY(mu_);

  std::thread thread_;  // last: started once the rest is initialised
};

// Faults in the pages of [data, data + len) of a readable mapping: madvise(MADV_POPULATE_READ)
// where the kernel has it (5.14+), else a read of one byte per page.
// Errors: Internal (with errno) if madvise fails otherwise.
absl::Status PopulateRead(const char* data, uint64_t len);

}  // namespace tessera

#endif  // TESSERA_CLIENT_RESIDENT_PREFETCH_H_
