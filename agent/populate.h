// PopulateForWrite: allocate and map every page of a shared mapping ahead of its use, on
// several threads.
//
// A load region is filled by the agent's reads and read by its trainer; its pages must exist
// before either, so that a full /dev/shm is an error from the agent and not a SIGBUS in the
// trainer. posix_fallocate does that serially: tmpfs holds the file's lock for the whole call,
// and zeroing pages is one core's work (0.6–0.84 s for a 4 GiB load region on the H100
// machine, before the load's first read). madvise(MADV_POPULATE_WRITE) on disjoint ranges
// runs the page faults in parallel, and leaves the pages mapped, so the reads that follow
// fault nothing. It fails where a write would have raised SIGBUS (EFAULT) or found no memory
// (ENOMEM), which is the reservation's contract.
//
// Thread-safety: a function over the caller's mapping; nothing else may unmap it meanwhile.
#ifndef TESSERA_AGENT_POPULATE_H_
#define TESSERA_AGENT_POPULATE_H_

#include <cstddef>

#include "absl/status/status.h"

namespace tessera {

// Populates [data, data + size) for writing (MADV_POPULATE_WRITE) on up to `threads` threads,
// each taking an equal page-aligned run (the calling thread the first). `data` must be
// page-aligned and mapped MAP_SHARED writable; `size` need not be a multiple of the page size.
// Errors: InvalidArgument for a null or unaligned `data`, or `threads` < 1; Unimplemented if
// the kernel has no MADV_POPULATE_WRITE (before Linux 5.14: the caller reserves another way);
// ResourceExhausted if the pages cannot be had (the backing file system is full: EFAULT, or
// ENOMEM); Internal for other errors. On an error some pages may be populated.
absl::Status PopulateForWrite(void* data, size_t size, int threads);

// Threads one agent reserves a new region with (StagingPoolOptions::reserve_threads): its share
// of the node's usable CPUs among the node's agents, at most kMaxReserveThreads (page zeroing
// is bound by memory bandwidth long before 8 cores), at least 1. An agent alone on a 2-core
// node gets 2; four agents on 16 cores get 4 each.
inline constexpr int kMaxReserveThreads = 8;
int ReserveThreads(int usable_cpus, int agents_per_node);

}  // namespace tessera

#endif  // TESSERA_AGENT_POPULATE_H_
