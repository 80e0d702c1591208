// StagingPool: the agent's host-memory staging regions, shared with its trainer.
//
// A region is a POSIX shared-memory object ("/tessera-<job>-r<rank>-<incarnation hex>-<n>",
// shm/region_names.h; shm_open + ftruncate + mmap) that the agent creates, owns and unlinks;
// the trainer maps the same object by name (MapStaging, shm/mapped_region.h) and copies its
// tensors into it, and the agent writes data files straight from it. Memory is page-aligned
// (mmap), so a region can be the source of O_DIRECT writes and, when a GPU is present at run
// time, is page-locked (cudaHostRegister) for full-bandwidth device copies and NCCL.
//
// Lifecycle: the pool is created at agent start and lives as long as the agent. Each save
// calls Acquire() with the sizes it needs; regions are reused across saves and only grow (a
// region too small for a save is replaced by a larger one under a new name, so a trainer
// never sees a stale mapping change size under it). Everything the pool holds is bounded by
// a host-RAM budget. Destruction unpins, unmaps and unlinks every region; mappings the
// trainer still holds stay valid until it unmaps them (POSIX shm semantics).
//
// The first save (DESIGN.md "The first save"): Reserve() makes a declared size's regions (both
// sets with the memory tier) before any save, so no save creates a region on the trainer's
// time unless its layout outgrew them.
//
// Memory tier (DESIGN.md "Memory tier"): Retain() sets the regions of a committed save aside
// as the resident set, readable by loads, and the next save stages into the other set — the
// one retained before, kept mapped for reuse — so saves alternate between two sets of regions
// and the trainer maps each once. Both sets count against the budget; an Acquire that does not
// fit with the resident set kept drops it first (resident bytes are a cache, a save is not) and
// stages in the dropped regions that no load holds, so with a budget of one set every save
// reuses the one region the trainer has mapped rather than making a new one on its time.
// Loads hold a resident set through ResidentRegion::hold: a dropped set stays mapped until the
// last load holding it ends (its memory then outlives the budget while it is read; the last
// holder's thread unpins, unmaps and unlinks it), and Acquire never hands out a region that
// anyone holds — it stages in a new one instead — so no save writes under a reader in this
// process. Other processes map regions by name and verify every block they copy.
//
// Thread-safety: StagingPool is thread-safe. The StagingSlot pointers returned by Acquire()
// stay valid until the next Acquire(), ReleaseAll() or the pool's destruction; the caller
// must not call those while slots are in use.
#ifndef TESSERA_AGENT_STAGING_POOL_H_
#define TESSERA_AGENT_STAGING_POOL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace tessera {

struct StagingPoolOptions {
  // Job id, part of region names (characters outside [A-Za-z0-9._-] become '_', at most
  // 64 kept: shm/region_names.h). Default: "".
  std::string job_id;

  // The agent's rank, part of region names. Default: 0.
  uint32_t rank = 0;

  // The agent's incarnation, part of region names so a restarted agent never collides with
  // (or maps) its previous life's regions. Default: 0.
  uint64_t incarnation = 0;

  // Most bytes the pool may hold mapped at once (the sum of region capacities). The
  // coordinator admits pinning per node; this is the agent's own hard stop. Required: at
  // least one page (the agent's default is ResolveMemoryBudgets', agent/memory_budgets.h).
  uint64_t budget_bytes = 0;

  // Page-lock regions (cudaHostRegister) when a GPU is present at run time. A registration
  // failure is an error rather than a silent fallback: unpinned staging halves D2H bandwidth.
  // Default: true.
  bool pin = true;

  // Allocate every region's pages when it is created (posix_fallocate), so a full /dev/shm
  // is a ResourceExhausted error from Acquire() rather than a SIGBUS in the trainer later.
  // Default: true.
  bool reserve = true;

  // Fault every page of a new region in when it is created (MAP_POPULATE), so a save's first
  // copy into staging takes no page faults. A pool filled by O_DIRECT reads (loads) turns it
  // off: the reads fault the pages in themselves, overlapped with the device's transfers,
  // instead of a serial pass that zeroes the whole region first. Default: true.
  bool populate = true;

  // Which of an agent's two pools this is. Its regions' names say it ("...-<n>" for saves,
  // "...-load<n>" for loads), so the two never share a name: names keep only the first 64
  // characters of the job id, which may have 128. Default: kSave.
  enum class Kind { kSave, kLoad };
  Kind kind = Kind::kSave;
};

// The options of an agent's pool of load regions, given its save pool's: Kind::kLoad (named
// apart from the save pool's regions), filled by O_DIRECT reads that fault the pages in as
// they go (no populate), and never page-locked: the agent never copies a load's bytes to a
// GPU, and page-locking is per process (a trainer's copies to its GPU see only its own
// mapping), so a registration here would only fault every page in first, serially, before
// the load's first read.
StagingPoolOptions LoadPoolOptions(StagingPoolOptions save);

// One staging region as handed to a save.
struct StagingSlot {
  std::string name;       // shared-memory name for MapStaging ("/tessera-...")
  void* data = nullptr;   // page-aligned, `capacity` bytes mapped read-write
  uint64_t size = 0;      // bytes requested for this save
  uint64_t capacity = 0;  // bytes mapped: >= size, a whole number of pages, >= 1 page
  bool pinned = false;    // page-locked for the GPU
  uint64_t acquisition = 0;  // which Acquire handed it out (1, 2, ...): Retain names it
};

// A region of the resident set (memory tier), read-only for loads.
struct ResidentRegion {
  std::string name;
  const char* data = nullptr;
  uint64_t capacity = 0;
  // Expires when the set stops being resident (the pool drops it, or a Retain makes it the
  // next save's set) and no load holds it; lock it to keep the mapping while reading.
  std::weak_ptr<const void> hold;
};

class StagingPool {
 public:
  // Errors: InvalidArgument if the budget is smaller than one page.
  static absl::StatusOr<std::unique_ptr<StagingPool>> Create(StagingPoolOptions options);

  ~StagingPool();
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  // Makes slot i a region of at least sizes[i] bytes for every i: an existing region i that
  // is large enough is reused as is (its contents are whatever the last save left), a smaller
  // one is replaced by a new region with a new name, and regions beyond sizes.size() are
  // released. Returns the slots in order.
  // Errors: ResourceExhausted + ADMISSION_DENIED if the resulting regions would exceed the
  // budget (the pool is then unchanged); ResourceExhausted + IO_ERROR naming the region if
  // shared memory cannot be created or reserved (/dev/shm full); errors of RegisterHost when
  // pinning fails. After a creation error the failed slot holds no region; the next Acquire()
  // retries it.
  //
  // With Reservation::kByCaller a region made for this call is not reserved (the pool's
  // `reserve` is ignored for it): the caller reserves each range with ReserveBytes before
  // anything writes there, e.g. on another thread ahead of the writes (a load's reads). A
  // region so made and reused by a later Acquire with Reservation::kNow is reserved then.
  enum class Reservation { kNow, kByCaller };
  absl::StatusOr<std::vector<StagingSlot>> Acquire(const std::vector<uint64_t>& sizes,
                                                   Reservation reservation = Reservation::kNow);

  // Allocates the pages of bytes [offset, offset + length) of `slot`'s region
  // (posix_fallocate of its shared-memory object), so that writing there cannot raise SIGBUS.
  // Errors: ResourceExhausted naming the region if /dev/shm is full; NotFound if the region
  // is gone; other errors of shm_open and posix_fallocate.
  static absl::Status ReserveBytes(const StagingSlot& slot, uint64_t offset, uint64_t length);

  // Unpins, unmaps and unlinks every region (e.g. when the agent goes idle), the resident set
  // too. Errors: none reported; an unpin failure is ignored because the memory is unmapped
  // anyway.
  void ReleaseAll();

  // Makes the regions handed out by Acquire number `acquisition` the resident set (the one
  // before it is dropped from the tier and becomes the next save's set) and returns them.
  // Returns nothing, changing nothing, if a later Acquire has handed them out again or the
  // pool released them since: their bytes are no longer that save's.
  std::vector<ResidentRegion> Retain(uint64_t acquisition);

  // Memory tier: creates (and faults in) the next save's regions for `sizes` ahead of time,
  // as Acquire would, so a save after a Retain does not pay for new regions on the trainer's
  // time — only if the next save's set has no region yet (one that exists is never
  // replaced: a save may be using it), and only if they fit beside the resident set (it is
  // never dropped here). Returns whether the next save's set now holds regions of `sizes`;
  // hands nothing out.
  bool Prepare(const std::vector<uint64_t>& sizes);

  // The first save (a trainer's ReserveStaging): creates and faults in one region of at least
  // `bytes` for the next save and, with `sets` = 2 (the memory tier: saves alternate) where it
  // fits in the budget too, a spare one for the save after it, which the first Retain() makes
  // the next save's set. Like Prepare, it only fills a set that has no region, never replaces
  // one and never drops the resident set. Returns the regions of both sets (for the trainer to
  // map ahead), created now or before.
  // Errors: InvalidArgument if `bytes` is 0 or `sets` is not 1 or 2; ResourceExhausted +
  // ADMISSION_DENIED if the next save's region does not fit in the budget beside what is
  // mapped (nothing is then created); errors of region creation as Acquire (the set that
  // failed stays empty).
  absl::StatusOr<std::vector<StagingSlot>> Reserve(uint64_t bytes, int sets);

  // Bytes currently mapped (sum of capacities, the resident and spare sets included).
  uint64_t mapped_bytes() const;

  // Bytes of the resident set; 0 if none.
  uint64_t resident_bytes() const;

  // Resident sets dropped to make room for a save, since the pool was made.
  uint64_t resident_evictions() const;

  // options.budget_bytes.
  uint64_t budget_bytes() const { return budget_bytes_; }

  // Regions created since the pool was made: tells reuse from re-creation.
  uint64_t regions_created() const;

  // The name region number `n` of this pool gets: "/tessera-<job>-r<rank>-<incarnation as
  // 16 hex digits>-<n>" (StagingRegionName, shm/region_names.h).
  std::string RegionName(uint64_t n) const;

  // Unlinks shared-memory objects of (job_id, rank) left by other incarnations (an agent
  // that crashed cannot unlink its regions), of both pools. Returns how many were removed.
  // Mappings other processes still hold stay valid. Call it only while holding the
  // StagingOwnership of (job_id, rank) (shm/ownership.h): then every other incarnation is
  // dead. Errors: Internal if /dev/shm cannot be listed.
  static absl::StatusOr<int> RemoveStaleRegions(absl::string_view job_id, uint32_t rank,
                                                uint64_t keep_incarnation);

 private:
  class Region;

  StagingPool(StagingPoolOptions options, uint64_t budget_bytes);

  // `reserve`: posix_fallocate it now (options_.reserve, unless the caller reserves).
  absl::StatusOr<std::unique_ptr<Region>> CreateRegionLocked(uint64_t capacity, bool reserve)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t ResidentBytesLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t SpareBytesLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t MappedBytesLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // True if the next save's set has no region at all.
  bool NextSetEmptyLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Acquire, or with `prepare` Prepare: the slots, or none if preparing does not fit.
  absl::StatusOr<std::vector<StagingSlot>> FillLocked(const std::vector<uint64_t>& sizes,
                                                      bool prepare,
                                                      Reservation reservation = Reservation::kNow)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const StagingPoolOptions options_;
  const uint64_t budget_bytes_;
  const uint64_t page_size_;

  mutable absl::Mutex mu_;
  // Slot i's region; nullptr after a failed creation. Shared with loads of the resident set.
  std::vector<std::shared_ptr<Region>> regions_ ABSL_GUARDED_BY(mu_);
  // The resident set (memory tier); empty if none.
  std::vector<std::shared_ptr<Region>> resident_ ABSL_GUARDED_BY(mu_);
  // One token per resident region, owning a reference to it: ResidentRegion::hold points at
  // the token, not the region, so every hold expires the moment the set stops being resident
  // (dropped, or the next save's after a Retain) even where the pool keeps the region for a
  // save. A held (locked) token keeps its region's use count above one: no save stages in it.
  std::vector<std::shared_ptr<const void>> residency_ ABSL_GUARDED_BY(mu_);
  // Made by Reserve for the save after the next one; the first Retain makes it the next
  // save's set. The first to go when a save needs room. Empty if none.
  std::vector<std::shared_ptr<Region>> spare_ ABSL_GUARDED_BY(mu_);
  uint64_t next_region_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t acquisitions_ ABSL_GUARDED_BY(mu_) = 0;  // of regions_: the last Acquire's number
  uint64_t evictions_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tessera

#endif  // TESSERA_AGENT_STAGING_POOL_H_
