// Loader: serves the trainer's Load. Resolves the step (LoadRequest.step: -1 the latest disk
// checkpoint, -2 the newest commit, a memory-only one included; a step with no disk
// checkpoint is looked up among memory-only commits), reads
// every requested piece with resharding (format/checkpoint_reader.h: only the byte runs it
// needs, checksums verified) into a staging region the trainer maps, and keeps the region
// until ReleaseLoad. One load is staged at a time: a new Load releases the previous one.
// What this agent still holds of the checkpoint in memory (agent/memory_tier.h), or agents on
// its node, or — for files the load reads that no agent here holds — agents on other nodes
// (read whole over the network), is copied from there, verified the same way; the response
// says how many bytes came from where.
//
// In place (DESIGN.md "Memory tier"): when every requested shard is one contiguous byte run
// of the file this agent holds resident (a restart in the layout that saved) and every
// checksum block those runs touch matches the manifest where it lies — or, for a trainer that
// checks them itself as it copies them out (LoadRequest.client_verifies), is listed for it
// unread (LoadResponse.unverified_blocks) — no region is made and nothing is copied: the
// response names the resident region itself, its slots where the shards lie in it, and the
// load holds the region until ReleaseLoad (no save writes a held region). Likewise on a node
// that replaced a lost one: when that file is held by an agent on another node only (a
// buddy), it is read whole into a new load region and served there, verified where it lies
// (or listed, as above) — or, for a trainer that reads it itself (LoadRequest.client_fetches),
// not read here at all: the response names the copy and its holder (LoadResponse.fetch) and
// lists its blocks for the trainer to check as it receives them. Otherwise — another layout,
// other files, a block that does not match — the load takes the copying path above.
//
// Memory-only checkpoints (DESIGN.md "Memory-only saves"): the manifest comes from the
// coordinator (LoaderOptions::memory_manifest), and every byte from memory copies — in place or
// copied, verified block by block the same way — since there is no file: a data file no live
// agent holds fails the load before anything is read (NotFound + MEMORY_COPY_LOST naming the
// files and their writers), a block that does not match fails it (DataLoss +
// CHECKSUM_MISMATCH). Never an older step instead, never an unverified byte.
//
// Thread-safety: all methods are safe for concurrent use (loads are serialized).
#ifndef TESSERA_AGENT_LOADER_H_
#define TESSERA_AGENT_LOADER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/memory_tier.h"
#include "agent/staging_pool.h"
#include "common/peer_auth.h"
#include "format/checkpoint_reader.h"
#include "storage/storage.h"
#include "tessera/v1/agent.pb.h"

namespace tessera {

struct LoaderOptions {
  // This agent's memory tier; null: none. Must outlive the loader. Default: null.
  const MemoryTier* memory = nullptr;
  // The copies this agent holds as other ranks' memory buddy; null: none. Likewise.
  const BuddyStore* buddies = nullptr;
  // The memory copies of checkpoint (step, session id) that the job's agents hold, of the
  // data files `files` (Coordinator.FindMemoryCopies; the load passes the files its reads
  // touch, sorted, and whether the checkpoint is memory-only); those on `node_id` are read
  // from memory too. An error only costs reads — for a memory-only checkpoint, the load.
  // Default: none (this agent's own tier alone).
  std::function<absl::StatusOr<std::vector<v1::MemoryCopy>>(
      int64_t step, const std::string& session_id, const std::vector<std::string>& files,
      bool memory_only)>
      find_copies;
  // This agent's node (RegisterAgentRequest.node_id). Default: "".
  std::string node_id;
  // Reads a copy that an agent on another node holds (a buddy's, after this node replaced a
  // lost one); only files the load needs are read. Default: none (copies on this node only).
  FetchMemoryCopy fetch_copy;
  // The manifest of the job's memory-only commit of `step` (-1: whatever its step), from the
  // coordinator (Coordinator.GetMemoryCheckpoint); NotFound if it has none of that step.
  // Default: none (memory-only checkpoints cannot be loaded).
  std::function<absl::StatusOr<v1::Manifest>(int64_t step)> memory_manifest;
  // Most bytes one load reads from other nodes' copies (they sit in this agent's heap until
  // the load's reads are done). Default: 0, meaning the load staging pool's budget.
  uint64_t max_fetch_bytes = 0;
  // The job whose checkpoints this agent loads, as a holder's bulk port is asked for its
  // copies by a trainer that fetches them itself (LoadResponse.fetch). Default: "".
  std::string job_id;
  // The job's secret, which such a trainer proves to the holder (ClientFetch.peer_secret; its
  // unix socket is its user's alone); must outlive the loader. Default: null (none sent).
  const PeerKeyring* peer_keyring = nullptr;
  // A load region is reserved in chunks of this many bytes, on a thread of its own, ahead of
  // its reads (agent/reserved_reads.h): small enough that the reads start soon, large enough
  // that each posix_fallocate is worth its call. Default: 64 MiB.
  uint64_t reserve_chunk_bytes = uint64_t{64} << 20;
};

class Loader {
 public:
  // `storage` and `staging` must outlive the loader; `staging` serves loads only.
  Loader(Storage* storage, StagingPool* staging, uint32_t rank, LoaderOptions options = {});
  // Waits for a background release.
  ~Loader();

  // Where the job's checkpoints are (<storage_root>/<job>); known after registration. Never
  // waits for a load (a registration must not hold up the heartbeats after it); a load in
  // progress keeps the directory it began with.
  void SetJobDir(std::string job_dir) ABSL_LOCKS_EXCLUDED(dir_mu_);

  // Reads the requested shards. Blocks for the reads.
  // Errors: FailedPrecondition before SetJobDir; NotFound + CHECKPOINT_NOT_FOUND if the step
  // (or any checkpoint, for -1 and -2) is not committed; InvalidArgument for a step below -2;
  // NotFound + MEMORY_COPY_LOST if the step is memory-only and a data file it needs is in no
  // live agent's memory; Unavailable if the coordinator cannot say which memory-only commit
  // there is (-2, or a step with no disk checkpoint); InvalidArgument if a shard is malformed, a
  // key is missing or its dtype/shape differs (SHAPE_MISMATCH); DataLoss + CHECKSUM_MISMATCH
  // naming tensor, chunk, file and block; ResourceExhausted if staging does not fit.
  absl::StatusOr<v1::LoadResponse> Load(const v1::LoadRequest& request) ABSL_LOCKS_EXCLUDED(mu_);

  // The checksum blocks of this agent's resident checkpoint (MemoryTier::Current), from its
  // manifest: what a load of it served in place would list for the trainer to check, for a
  // client that checks the copy ahead (Agent.ListResidentBlocks). Reads the manifest only.
  // Errors: FailedPrecondition before SetJobDir; NotFound if nothing is resident (no memory
  // tier, or its region was dropped) or the step was saved again by another session since;
  // the manifest's, as Load's.
  absl::StatusOr<v1::ListResidentBlocksResponse> ResidentBlocks() ABSL_LOCKS_EXCLUDED(mu_);

  // Releases the staging of `load_id`. Idempotent; unknown ids are ignored. Returns at once:
  // unmapping and freeing the region (a few hundred ms per GiB) runs on a background thread,
  // off the trainer's Load and the RPC thread; the next Load waits for it.
  void Release(const std::string& load_id) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // The checkpoint `step` (LoadRequest.step) resolves to: on disk, or memory-only.
  // Errors: as Load's for resolving the step.
  absl::StatusOr<std::unique_ptr<CheckpointReader>> OpenLocked(const std::string& job_dir,
                                                               int64_t step)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job directory SetJobDir set; empty before.
  std::string JobDir() const ABSL_LOCKS_EXCLUDED(dir_mu_);

  // Waits for a background release to finish.
  void JoinReleaserLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Releases the current load's region or hold at once (a new Load replaces it).
  void ReleaseCurrentLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // A load's bytes, staged for the trainer to map.
  struct Staged {
    std::string shm_name;
    uint64_t shm_size = 0;
    std::vector<uint64_t> offsets;    // of each read in the region
    std::vector<ReadResult> results;  // of each read
    ReadStats stats;
    uint64_t fetched_from_peers = 0;   // bytes read from other nodes' memory
    std::shared_ptr<const void> hold;  // this agent's resident region, served in place; or null
    bool in_place = false;             // the region holds a data file's bytes, not a copy of reads
    // In place for a client that verifies (LoadRequest.client_verifies): the blocks it must
    // check, none read here. Empty: every byte was verified here.
    std::vector<BlockCheck> unverified;
    // Making the region, finding and fetching copies (none for this agent's resident region).
    // A copy's region is reserved ahead of its reads, on another thread: not counted here.
    absl::Duration staging_time;
    // A copy's reads, in batches of the requests reserved when each began (ReadAsReserved).
    int read_batches = 0;
    // Of staging_time, a fetch in place's transfer alone (after its load region was made).
    absl::Duration fetch_time;
    // Fetched by the trainer (LoadRequest.client_fetches): the copy on another node it reads
    // the load's bytes from; no region, offsets and `unverified` from the copy's first byte.
    std::optional<v1::MemoryCopy> client_fetch;
  };

  // The job's memory copies of a load's checkpoint (LoaderOptions::find_copies), or why not.
  using MemoryCopies = absl::StatusOr<std::vector<v1::MemoryCopy>>;

  // Most bytes one load reads from other agents (LoaderOptions::max_fetch_bytes).
  uint64_t MaxFetchBytes() const;

  // Load's steps once its reads are planned, in the order it takes them (agent/loader.cc).
  // Stages `reads` by the first way that serves them: this agent's resident copy in place
  // (`held`), else a copy on another node fetched in place, else copying — the in-place ways
  // copy the least, and any error of theirs falls back to copying. The job's memory copies
  // are asked of the coordinator at most once, and only where a way needs them.
  // Errors: StageCopy's.
  absl::StatusOr<Staged> Stage(const CheckpointReader& reader, const v1::LoadRequest& request,
                               std::vector<ReadRequest>& reads, std::optional<HeldCheckpoint> held,
                               const std::string& load_id);
  // Tells the trainer where `staged` put each requested shard (reads[k] serves shard
  // read_index[k]; none where `absent` or the checkpoint records it absent), where the bytes
  // came from, and what it must check or fetch itself: all it needs to copy them out.
  void FillResponse(const v1::LoadRequest& request, const CheckpointReader& reader,
                    const Staged& staged, std::vector<bool> absent,
                    const std::vector<int>& read_index, v1::LoadResponse* response) const;
  // Logs one line per load, split where its time went (`setup`: opening; `reading`: staging
  // and reading), so that an operator can tell what made a load slow.
  static void LogLoad(const v1::LoadResponse& response, int shards, const Staged& staged,
                      absl::Duration setup, absl::Duration reading);

  // In place: the resident region of `held` itself, its hold taken, if every read lies in it
  // as LocateInMemory serves; verified here, or its blocks listed for the client
  // (`client_verifies`). Errors: LocateInMemory's (the load then copies).
  absl::StatusOr<Staged> StageInPlace(const CheckpointReader& reader,
                                      const std::vector<ReadRequest>& reads, HeldCheckpoint& held,
                                      bool client_verifies);

  // Where `reads` lie in `resident`, a copy of data file `file`: a load served in place
  // (LocateInMemory), verified here or its blocks listed for the client; the caller names the
  // region and holds it. With `writable` (resident.data, a copy only this load uses) and
  // verifying here, a block that does not match is read from the file over it
  // (RepairInMemory). Errors: LocateInMemory's, or RepairInMemory's.
  absl::StatusOr<Staged> Locate(const CheckpointReader& reader,
                                const std::vector<ReadRequest>& reads, const std::string& file,
                                const ResidentBytes& resident, bool client_verifies,
                                char* writable = nullptr);

  // Copying: a new load region (this load's), each read's destination set in it, filled by
  // CheckpointReader::Read from disk and what memory holds (`held`: this agent's own copy).
  // Errors: as Acquire and Read (the region is then released); for a memory-only checkpoint
  // with files this agent could not get, NotFound + MEMORY_COPY_LOST if no copy in `copies`
  // is of them — else Unavailable: `copies` is the coordinator's error (where the copies are
  // is not known), or another agent holds one that could not be read.
  absl::StatusOr<Staged> StageCopy(const CheckpointReader& reader, int64_t step,
                                   std::vector<ReadRequest>& reads,
                                   std::optional<HeldCheckpoint> held, const MemoryCopies& copies);

  // Fetched in place: when every read lies in one data file (ContiguousFile) that no agent on
  // this node holds and an agent on another node does (`copies`), that file's copy is read
  // into a new load region (LoaderOptions::fetch_copy) and served there as a resident copy is
  // (LocateInMemory): one copy into the region, verified where it lies, a block that does not
  // match read from the file over it (RepairInMemory). Errors:
  // FailedPrecondition if it does not apply or no holder could send it (for a checkpoint on
  // disk, each holder that could not is dropped from `copies`, so the copying path does not
  // read it again);
  // LocateInMemory's (the region is then released and the copying path serves the load,
  // fetching again); Acquire's.
  // With `client_fetches` (the trainer reads it itself; implies `client_verifies`), a holder
  // with a bulk port is not read here: the copy is located (LocateInMemory, listing its
  // blocks, reading nothing) and named (Staged::client_fetch), no region made.
  absl::StatusOr<Staged> StageFetched(const CheckpointReader& reader,
                                      const std::vector<ReadRequest>& reads, MemoryCopies& copies,
                                      bool client_verifies, bool client_fetches);

  // Reads into `view` the copies held on other nodes of the files `reads` need and `view`
  // lacks (options_.fetch_copy). Returns the bytes read.
  uint64_t FetchNeeded(const CheckpointReader& reader, const std::vector<ReadRequest>& reads,
                       const std::vector<v1::MemoryCopy>& copies, ResidentView& view);

  Storage* const storage_;
  StagingPool* const staging_;
  const uint32_t rank_;
  const LoaderOptions options_;
  mutable absl::Mutex dir_mu_;
  std::string job_dir_ ABSL_GUARDED_BY(dir_mu_);
  absl::Mutex mu_;  // held for a whole load
  std::string current_load_ ABSL_GUARDED_BY(mu_);
  // The resident region the current load hands out in place; null if none.
  std::shared_ptr<const void> current_hold_ ABSL_GUARDED_BY(mu_);
  uint64_t loads_ ABSL_GUARDED_BY(mu_) = 0;
  // The thread running the last Release's staging_->ReleaseAll(), if not yet joined.
  std::thread releaser_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_AGENT_LOADER_H_
