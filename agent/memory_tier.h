// MemoryTier: which committed checkpoint this agent's staging still holds, and the view a load
// reads it through (DESIGN.md "Memory tier").
//
// An agent outlives its trainer. When a save commits, the agent's staging region begins with
// the body of the data file it wrote (agent/save/staging_layout.h), so the shell keeps that region
// resident (StagingPool::Retain) and publishes it here. A trainer restarted on the same node
// then loads that checkpoint from memory: Find gives the loader the file's bytes as
// format/checkpoint_reader.h ResidentFiles — which the reader verifies block by block against
// the manifest, reading from disk whatever does not match — and holds that keep the region
// mapped for the load even if the pool drops it meanwhile.
//
// A checkpoint is named by its step and its session id (the manifest's), so a step saved
// again by another session never matches an older resident copy. The agent states its
// resident checkpoint in every heartbeat (CurrentCopy), so the coordinator can tell a loading
// agent which of its node's peers hold the rest of a checkpoint (AddNodeCopies).
//
// Thread-safety: all methods are safe for concurrent use.
#ifndef TESSERA_AGENT_MEMORY_TIER_H_
#define TESSERA_AGENT_MEMORY_TIER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "agent/buddy_store.h"
#include "agent/staging_pool.h"
#include "format/checkpoint_reader.h"
#include "tessera/v1/types.pb.h"

namespace tessera {

// One committed checkpoint's data file, resident in a staging region.
struct ResidentCheckpoint {
  int64_t step = 0;
  std::string session_id;
  std::string file;          // data file name (ChunkEntry.file)
  uint64_t file_offset = 0;  // where the region's bytes begin in the file (its data section)
  uint64_t nbytes = 0;       // bytes of the file held, from the region's start
  ResidentRegion region;
};

// The resident checkpoint and a hold that keeps its region mapped — and, while a load holds
// it, out of every save's hands (StagingPool::Acquire) — until released.
struct HeldCheckpoint {
  ResidentCheckpoint checkpoint;
  std::shared_ptr<const void> hold;
};

// What a load may read from memory, and the holds that keep it mapped while it does.
struct ResidentView {
  ResidentFiles files;
  std::vector<std::shared_ptr<const void>> holds;

  // Adds `file`'s bytes [file_offset, file_offset + size) at `data`, kept alive by `hold`.
  void Add(const std::string& file, uint64_t file_offset, const char* data, uint64_t size,
           std::shared_ptr<const void> hold) {
    files[file] = ResidentBytes{file_offset, data, size};
    if (hold != nullptr) holds.push_back(std::move(hold));
  }
};

class MemoryTier {
 public:
  // `on_publish`, if set, is called after every Publish (with no lock held): the agent's
  // heartbeat then tells the coordinator at once.
  explicit MemoryTier(std::function<void()> on_publish = nullptr)
      : on_publish_(std::move(on_publish)) {}

  // Makes `checkpoint` the resident one, replacing any other.
  void Publish(ResidentCheckpoint checkpoint) ABSL_LOCKS_EXCLUDED(mu_);

  // The resident bytes of the checkpoint of `step` saved by `session_id`; empty if this agent
  // holds none of it, or its region has been dropped.
  ResidentView Find(int64_t step, absl::string_view session_id) const ABSL_LOCKS_EXCLUDED(mu_);

  // The same checkpoint with its region, for a load that hands the region itself to its
  // trainer; nullopt where Find is empty.
  std::optional<HeldCheckpoint> Hold(int64_t step, absl::string_view session_id) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // The resident checkpoint, if its region is still held (for listings and metrics).
  std::optional<ResidentCheckpoint> Current() const ABSL_LOCKS_EXCLUDED(mu_);

  // Current() as the heartbeat states it (rank and node_id left to the coordinator).
  std::optional<v1::MemoryCopy> CurrentCopy() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const std::function<void()> on_publish_;
  mutable absl::Mutex mu_;
  std::optional<ResidentCheckpoint> current_ ABSL_GUARDED_BY(mu_);
};

// Adds to `view` the copies of other agents on this node (`node_id`) that the coordinator
// listed for the checkpoint (Coordinator.FindMemoryCopies), each region mapped read-only by
// name and held by the view. Skips this agent's own (`self_rank`: its tier serves it), copies
// on other nodes, copies in no shared region (a buddy's, in its holder's heap), files the
// view already has, and regions that are gone or smaller than the
// copy claims (the agent holding it dropped or replaced it). Returns how many it added.
int AddNodeCopies(const std::vector<v1::MemoryCopy>& copies, uint32_t self_rank,
                  absl::string_view node_id, ResidentView& view);

// Adds to `view` the copies of `copies` that this agent (`self_rank`) holds in `store` as
// other ranks' buddy, held by the view. Returns how many it added.
int AddHeldCopies(const std::vector<v1::MemoryCopy>& copies, uint32_t self_rank,
                  const BuddyStore& store, ResidentView& view);

// Reads a memory copy from the agent holding it (PeerMemory.ReadMemoryCopy) into `dest`, which
// has room for copy.nbytes() bytes.
using FetchMemoryCopy = std::function<absl::Status(const v1::MemoryCopy& copy, char* dest)>;

// Where a copy read from another agent goes: room for `nbytes` bytes, or why not.
using CopyDestination = std::function<absl::StatusOr<char*>(uint64_t nbytes)>;

// Whether the sizes `copy` claims (not trusted) fit a data file of `file_size` bytes as the
// manifest implies it, and `max_bytes` a load may still read from other agents.
// Errors: InvalidArgument naming the sizes.
absl::Status CheckRemoteCopySize(const v1::MemoryCopy& copy, uint64_t file_size,
                                 uint64_t max_bytes = UINT64_MAX);

// Reads `copy`, held by another agent, with `fetch` into the memory `destination` gives — once
// its sizes (not trusted) fit a data file of `file_size` bytes as the manifest implies it and
// the `max_bytes` a load may still read from other agents, so nothing is allocated for a size
// that does not. The one path by which loads read remote copies (AddRemoteCopies, the loader's
// fetch in place). Errors, each logged naming the file, holder and node: InvalidArgument naming
// the sizes; `destination`'s; `fetch`'s.
absl::Status ReadRemoteCopy(const v1::MemoryCopy& copy, uint64_t file_size, uint64_t max_bytes,
                            const CopyDestination& destination, const FetchMemoryCopy& fetch);

// Adds to `view` each file of `needed` (file name -> the file's size as the manifest implies
// it: its last chunk's end, rounded up to 4 KiB) that it lacks and that an agent of `copies`
// other than `self_rank` holds (on another node: a buddy, or the writer itself), read whole
// with `fetch` into this process. A copy that claims bytes beyond its file's size, or that
// would take the bytes read past `max_bytes`, is not read; one that cannot be read is skipped
// for the next holder of the file. Returns the bytes read.
uint64_t AddRemoteCopies(const std::vector<v1::MemoryCopy>& copies, uint32_t self_rank,
                         const absl::flat_hash_map<std::string, uint64_t>& needed,
                         uint64_t max_bytes, const FetchMemoryCopy& fetch, ResidentView& view);

}  // namespace tessera

#endif  // TESSERA_AGENT_MEMORY_TIER_H_
