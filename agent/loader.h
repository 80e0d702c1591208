// Loader: serves the trainer's Load. Resolves the step (-1: the newest committed one), reads
// every requested piece with resharding (format/checkpoint_reader.h: only the byte runs it
// needs, checksums verified) into a staging region the trainer maps, and keeps the region
// until ReleaseLoad. One load is staged at a time: a new Load releases the previous one.
// What this agent still holds of the checkpoint in memory (agent/memory_tier.h), or agents on
// its node, or — for files the load reads that no agent here holds — agents on other nodes
// (read whole over the network), is copied from there, verified the same way; the response
// says how many bytes came from where.
//
// Thread-safety: all methods are safe for concurrent use (loads are serialized).
#ifndef TESSERA_AGENT_LOADER_H_
#define TESSERA_AGENT_LOADER_H_

#include <cstdint>
#include <functional>
#include <vector>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "agent/memory_tier.h"
#include "agent/staging_pool.h"
#include "format/checkpoint_reader.h"
#include "storage/storage.h"
#include "tessera/v1/agent.pb.h"

namespace tessera {

struct LoaderOptions {
  // This agent's memory tier; null: none. Must outlive the loader. Default: null.
  const MemoryTier* memory = nullptr;
  // The copies this agent holds as other ranks' memory buddy; null: none. Likewise.
  const BuddyStore* buddies = nullptr;
  // The memory copies of checkpoint (step, session id) that the job's agents hold
  // (Coordinator.FindMemoryCopies); those on `node_id` are read from memory too. An error
  // only costs reads. Default: none (this agent's own tier alone).
  std::function<absl::StatusOr<std::vector<v1::MemoryCopy>>(int64_t step,
                                                             const std::string& session_id)>
      find_copies;
  // This agent's node (RegisterAgentRequest.node_id). Default: "".
  std::string node_id;
  // Reads a copy that an agent on another node holds (a buddy's, after this node replaced a
  // lost one); only files the load needs are read. Default: none (copies on this node only).
  FetchMemoryCopy fetch_copy;
  // Most bytes one load reads from other nodes' copies (they sit in this agent's heap until
  // the load's reads are done). Default: 0, meaning the load staging pool's budget.
  uint64_t max_fetch_bytes = 0;
};

class Loader {
 public:
  // `storage` and `staging` must outlive the loader; `staging` serves loads only.
  Loader(Storage* storage, StagingPool* staging, uint32_t rank, LoaderOptions options = {});
  // Waits for a background release.
  ~Loader();

  // Where the job's checkpoints are (<storage_root>/<job>); known after registration.
  void SetJobDir(std::string job_dir) ABSL_LOCKS_EXCLUDED(mu_);

  // Reads the requested shards. Blocks for the reads.
  // Errors: FailedPrecondition before SetJobDir; NotFound + CHECKPOINT_NOT_FOUND if the step
  // (or any checkpoint, for -1) is not committed; InvalidArgument if a shard is malformed, a
  // key is missing or its dtype/shape differs (SHAPE_MISMATCH); DataLoss + CHECKSUM_MISMATCH
  // naming tensor, chunk, file and block; ResourceExhausted if staging does not fit.
  absl::StatusOr<v1::LoadResponse> Load(const v1::LoadRequest& request) ABSL_LOCKS_EXCLUDED(mu_);

  // Releases the staging of `load_id`. Idempotent; unknown ids are ignored. Returns at once:
  // unmapping and freeing the region (a few hundred ms per GiB) runs on a background thread,
  // off the trainer's Load and the RPC thread; the next Load waits for it.
  void Release(const std::string& load_id) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Waits for a background release to finish.
  void JoinReleaserLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Reads into `view` the copies held on other nodes of the files `reads` need and `view`
  // lacks (options_.fetch_copy). Returns the bytes read.
  uint64_t FetchNeeded(const CheckpointReader& reader, const std::vector<ReadRequest>& reads,
                       const std::vector<v1::MemoryCopy>& copies, ResidentView& view);

  Storage* const storage_;
  StagingPool* const staging_;
  const uint32_t rank_;
  const LoaderOptions options_;
  absl::Mutex mu_;
  std::string job_dir_ ABSL_GUARDED_BY(mu_);
  std::string current_load_ ABSL_GUARDED_BY(mu_);
  uint64_t loads_ ABSL_GUARDED_BY(mu_) = 0;
  // The thread running the last Release's staging_->ReleaseAll(), if not yet joined.
  std::thread releaser_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_AGENT_LOADER_H_
