// Client: the library a trainer rank links to save and load checkpoints through the Tessera
// agent beside it (DESIGN.md "Processes"). It talks to the agent's Agent service
// (proto/tessera/v1/agent.proto) over a unix socket and copies tensor bytes through the
// agent's POSIX shared-memory staging region, which it maps by name.
//
// A save, as the trainer sees it (DESIGN.md "Save protocol"):
//   Save(step, tensors)
//     1. describe the tensors as ShardDescs and check them locally (a bad piece fails here);
//     2. BeginSave: blocks until every rank's plan is validated and staging is pinned. A
//        rejected plan (DUPLICATE_FQN, INCOMPLETE_COVERAGE, ...) returns here, before any copy;
//     3. copy each tensor into its staging slot (host memcpy, threads for large totals;
//        cudaMemcpyAsync device->host for CUDA tensors);
//     4. Staged: the agent records STAGED; Save returns and training resumes. Persisting and
//        committing continue in the agent, which outlives a crashed trainer.
//   WaitCommitted(step) optionally blocks until the checkpoint is COMMITTED or ABORTED.
// If step 3 fails after BeginSave succeeded, Save returns the error without calling Staged;
// the session then aborts on the coordinator's COPYING timeout.
//
// A memory-only save (SaveOptions::memory_only; DESIGN.md "Memory-only saves") commits once
// every rank's bytes are staged, checksummed and kept in the agents' memory: nothing is written
// to disk, it never becomes the latest on disk, and it is lost with the agents that hold it
// (and their buddies). Load it by its step, or as kNewestStep.
//
// An overlapped save (SaveOptions::overlap; docs/design/overlapped-save.md) returns once the
// tensors are described (step 1); steps 2-4 run on a save thread of the client, and the
// trainer's only duty is not to change the tensors until it calls Fence():
//
//   Save(step, tensors, {.overlap = true})   describe, check; hand over; return (microseconds)
//     save thread:  [wait for the previous overlapped save to end] BeginSave, copy ── COPIED
//   ... forward, backward (read the state only) ...
//   Fence()          waits for COPIED (usually long past), says the state stayed intact
//     save thread:  Staged (the agent persists and commits), then WaitCommitted
//   optimizer.step() may now change the state
//
// The states of one such save, their edges and what each failure leaves are drawn in
// client/overlapped_save.h. The save is staged only after a fence vouched for it: a trainer
// killed, or a client destroyed, before its fence leaves no committed step (its session
// aborts; the destructor refuses it at once). A write into the tensors before Fence is a
// breach of the caller's contract that this library cannot see in C++; the Python package
// sees it (tensor version counters) and says so at the fence, which then refuses the step.
// Every other call that saves, loads, reserves or waits fences a pending save first (as if
// the state were intact).
//
// A load: Load(step | -1 for latest, tensors) sends the pieces wanted in the current layout;
// the agent reads, reshards and verifies them into staging — or, restarting in the layout that
// saved, hands out its resident copy of the step, verified where it lies (DESIGN.md "Memory
// tier"); the client reads the region through the mapping Connect made of the agent's
// resident checkpoint if it is that one, else through its cached save mapping if it is one,
// else maps it read-only (faulted in by the copy threads, not in advance), copies the pieces out
// into each TensorRef (host memcpy on the copy threads, or cudaMemcpy host->device), unmaps a
// load-only mapping and only then releases the region: the agent frees a load region off the
// trainer's path, whereas an unmap after the release would be the last reference and pay for
// freeing its pages inside Load.
//
// Lifecycle: Connect() once per trainer process (after the agent registered), as early as the
// trainer can: where the agent holds a resident checkpoint, Connect maps it and faults its
// pages in on a background thread while the trainer builds its model (ClientOptions::
// prefetch_resident), which a load served in place then reads through. The Client is kept for
// the whole run. The staging mappings of the last two saves are cached and reused while
// the agent hands out the same region (the common case), and replaced when it hands out another.
//
// Thread-safety: all methods may be called from any thread. Save and Load are serialised by
// an internal mutex (they share the staging mapping); WaitCommitted, Fence, identity() and
// stats() run concurrently with them.
#ifndef TESSERA_CLIENT_CLIENT_H_
#define TESSERA_CLIENT_CLIENT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/describe.h"
#include "client/device_copy.h"
#include "client/overlapped_save.h"
#include "client/parallel_copy.h"
#include "client/resident_prefetch.h"
#include "shm/mapped_region.h"
#include "tessera/v1/agent.grpc.pb.h"

namespace tessera {

// Largest BeginSave or Load request one rank may send, in serialized bytes. The agent and the
// coordinator accept messages of up to 256 MiB, and the agent wraps the plan in its own
// SubmitLocalPlan request, so a rank's plan must stay a little below that. A larger plan is
// refused before any RPC with PLAN_TOO_LARGE rather than failing in the transport.
inline constexpr size_t kMaxPlanRequestBytes = (size_t{256} << 20) - (size_t{64} << 10);

struct ClientOptions {
  // Deadline of GetInfo (in Connect). Default: 10 s.
  absl::Duration get_info_timeout = absl::Seconds(10);

  // Deadline of RefuseSave (Save's refusal of this rank's own tensors, passed on to the other
  // ranks). Default: 10 s.
  absl::Duration refuse_timeout = absl::Seconds(10);

  // Deadline of BeginSave, which blocks until every rank of the job has submitted its plan and
  // pinned its staging (a slow rank delays all). Default: 10 min.
  absl::Duration begin_save_timeout = absl::Minutes(10);

  // Deadline of Staged (the agent records STAGED with the coordinator). Default: 60 s.
  absl::Duration staged_timeout = absl::Seconds(60);

  // Deadline of Load, which reads and verifies the rank's share of a checkpoint.
  // Default: 30 min.
  absl::Duration load_timeout = absl::Minutes(30);

  // Deadline of ReserveStaging (creating and faulting in the regions). Default: 10 min.
  absl::Duration reserve_staging_timeout = absl::Minutes(10);

  // Deadline of ReleaseLoad. Default: 10 s.
  absl::Duration release_load_timeout = absl::Seconds(10);

  // Added to WaitCommitted's own timeout for the RPC deadline, so that the agent's
  // DEADLINE_EXCEEDED (sent at the timeout) arrives before the transport gives up.
  // Default: 5 s.
  absl::Duration wait_committed_grace = absl::Seconds(5);

  // Most threads that copy host tensors into (or out of) staging, and a load's bytes into
  // device memory (each through 16 MiB of page-locked buffers of its own, allocated for the
  // load), the calling thread included; capped at the CPUs this process may run on
  // (UsableCpus()). Default: 4.
  int copy_threads = 4;

  // Copies totalling more bytes than this are split across the copy threads (starting
  // the extra threads costs tens of microseconds; one core copies 1 MiB in about 100).
  // Default: 4 MiB.
  uint64_t parallel_copy_min_bytes = uint64_t{4} << 20;

  // Page-lock the staging mapping in this process (cudaHostRegister) when a save has CUDA
  // tensors, so device->host copies run at full bandwidth. Pinning is per process: the
  // agent's own pinning does not make the trainer's mapping DMA-capable. Default: true.
  bool pin_staging = true;

  // With CUDA tensors, Save and Load first wait for all work queued on their GPUs
  // (cudaDeviceSynchronize): the client copies on its own streams, which are not ordered after
  // the trainer's. So a save right after the optimizer step sees its results whatever stream
  // computed them (waited for before BeginSave, so a failed kernel fails Save before a session
  // starts), and a load right after the model's or optimizer's initialisation is not
  // overwritten by kernels still queued (waited for once the agent staged the checkpoint,
  // before the first copy into the tensors). Set false only if the caller has synchronised the
  // streams that write the tensors. Default: true.
  bool synchronize_devices = true;

  // Map the agent's resident checkpoint at Connect, if it has one, fault its pages in and check
  // its blocks against the manifest (Agent.ListResidentBlocks) on a background thread while
  // the trainer builds its model (client/resident_prefetch.h), for loads that read it in
  // place: they copy the blocks checked ahead without hashing them again. It ends at the first
  // Load the agent serves from another region, Save or ReserveStaging.
  // Default: true.
  bool prefetch_resident = true;

  // Largest reply accepted from the agent (a Load reply carries a slot per shard).
  // Default: 256 MiB.
  int max_receive_message_bytes = 256 << 20;

  // Largest request Save or Load sends (see kMaxPlanRequestBytes); 1..kMaxPlanRequestBytes.
  // Default: kMaxPlanRequestBytes.
  size_t max_plan_request_bytes = kMaxPlanRequestBytes;
};

// The latest checkpoint on disk, for Load.
inline constexpr int64_t kLatestStep = -1;
// The newest commit, for Load: a memory-only one if it is newer than the latest on disk.
inline constexpr int64_t kNewestStep = -2;

struct SaveOptions {
  // Commit in the agents' memory only, not on disk (DESIGN.md "Memory-only saves"). Every rank
  // of the save must say the same, and every agent must run with its memory tier on.
  // Default: false.
  bool memory_only = false;

  // Return as soon as the tensors are described, and copy them into staging on the client's
  // save thread while the trainer goes on ("Overlapped saves" above). The tensors must stay
  // unchanged until Fence() (or Fence is implied by the next call); the save is staged only
  // after that fence. Default: false.
  bool overlap = false;

  // With overlap: what a save does that finds this client's previous overlapped save still
  // in flight (its session not yet ended: a job has one session at a time).
  enum class WhenBusy {
    kWait,  // begin once the previous one has ended (on the save thread: Save does not block,
            // a Fence before then does)
    kSkip,  // save nothing: SaveResult::skipped says why, ClientStats::overlap_skips counts it,
            // and the step is refused (RefuseSave, off the caller's thread) so that no other
            // rank's session of it waits for this one
  };
  // Default: kWait.
  WhenBusy when_busy = WhenBusy::kWait;

  // With overlap and CUDA tensors: the stream (a cudaStream_t) whose queued work must finish
  // before the copy reads the tensors, instead of synchronising the devices
  // (ClientOptions::synchronize_devices): an event is recorded on it at Save and the copy
  // streams wait for it. Default: null, the legacy default stream (PyTorch's unless told).
  void* cuda_stream = nullptr;
};

struct SaveResult {
  std::string session_id;
  // Wall time from Save()'s entry to its return: how long training was blocked.
  absl::Duration stall = absl::ZeroDuration();
  // The part of `stall` spent copying into staging; the rest waited for every rank's plan,
  // the global plan and pinning (a barrier across ranks), and for the Staged report.
  absl::Duration copy = absl::ZeroDuration();
  // The coordinator reused the job's last validated plan (unchanged tensors).
  bool plan_cached = false;
  // An overlapped save (SaveOptions::overlap): session_id, copy and plan_cached are not known
  // when Save returns (they are empty, zero and false); `stall` is what Save blocked.
  bool overlapped = false;
  // Non-empty if the save was skipped (SaveOptions::WhenBusy::kSkip): why.
  std::string skipped;
};

struct LoadResult {
  // The step loaded (what -1 resolved to).
  int64_t step = -1;
  // Indices into Load's `into` of optimizer shards whose state the checkpoint records as
  // absent; their memory was not written. Ascending.
  std::vector<size_t> absent;
  // Where the agent found the bytes (DESIGN.md "Memory tier"; whole checksum blocks): its
  // memory tier, verified; data files; blocks of the memory copy that failed verification
  // (by the agent, or by this client as it copied them: the load is then served again,
  // verified by the agent) and were read from the file instead.
  uint64_t bytes_from_memory = 0;
  uint64_t bytes_from_disk = 0;
  uint64_t memory_blocks_rejected = 0;
  // Of bytes_from_memory: checked by this client while it copied them (a load served in place
  // into host memory, LoadRequest.client_verifies); the agent verified the rest.
  uint64_t bytes_verified_by_client = 0;
  // Of bytes_from_memory: read over the network from other nodes' agents (buddy copies).
  uint64_t bytes_fetched_from_peers = 0;
  // Of bytes_verified_by_client: read by this client itself from another node's agent,
  // straight into `into` (LoadRequest.client_fetches; the checksum blocks its tensors touch),
  // not through the agent's load region.
  uint64_t bytes_fetched_by_client = 0;
  // The step loaded is a memory-only commit (every byte came from memory).
  bool memory_only = false;
  // Time this client spent mapping the load region and copying (and, where it verifies,
  // checking) its bytes into `into` after the agent's reply, in the attempt that succeeded;
  // zero where it fetched them from another node itself (bytes_fetched_by_client).
  absl::Duration copy_time;
  // Time this client spent fetching from another node into `into` and checking what arrived
  // (bytes_fetched_by_client; client/peer_fetch.h), in the attempt that succeeded; zero
  // where it fetched nothing.
  absl::Duration fetch_time;
  // The load read its region through the mapping made at Connect (ClientOptions::
  // prefetch_resident), of which this many bytes had been faulted in before the first load
  // took it; zero otherwise.
  uint64_t prefetched_bytes = 0;
  // Of bytes_verified_by_client: blocks that mapping had checked ahead, only copied here.
  uint64_t checked_ahead_bytes = 0;
};

// Counters for tests and metrics.
struct ClientStats {
  uint64_t saves = 0;         // saves that reached Staged successfully
  uint64_t staging_maps = 0;  // shared-memory regions mapped (reuse keeps this flat)
  int last_copy_threads = 0;  // threads of the last save's host copy (0: nothing to copy)
  // Loads whose ReleaseLoad failed after Load returned (the agent frees a load's staging at
  // the next Load anyway).
  uint64_t failed_releases = 0;
  // Overlapped saves (SaveOptions::overlap): begun; skipped because the previous one was
  // still in flight (WhenBusy::kSkip); refused at their fence because the state changed
  // before it, or because the client was destroyed unfenced (never staged, never committed).
  uint64_t overlapped_saves = 0;
  uint64_t overlap_skips = 0;
  uint64_t overlap_refused = 0;
  // The resident checkpoint's mapping made at Connect (ClientOptions::prefetch_resident):
  // bytes to fault in (0: none was started), faulted in so far, bytes of blocks checked ahead
  // that match the manifest and blocks that do not, whether it has ended, and how long it ran
  // (or has been running).
  uint64_t prefetch_bytes = 0;
  uint64_t prefetch_populated_bytes = 0;
  uint64_t prefetch_checked_bytes = 0;
  uint64_t prefetch_mismatched_blocks = 0;
  // Why nothing was checked ahead (the agent's listing failed or was cancelled); OK otherwise.
  absl::Status prefetch_check_status;
  bool prefetch_done = false;
  absl::Duration prefetch_time;
  // Loads that read their region through that mapping.
  uint64_t prefetched_loads = 0;
};

class Client {
 public:
  // Connects to the agent listening on `agent_socket` (a path, or "unix:<path>") and fetches
  // its identity (GetInfo). Connecting is cheap; a trainer that starts before its agent
  // retries on Unavailable.
  // Errors: InvalidArgument if `agent_socket` is empty or longer than a unix socket path can
  // be (107 bytes), or if `options` are out of range;
  // Unavailable if the socket is unreachable or the agent has not registered yet (retry), or
  // if the coordinator refused the agent's registration (with its ErrorDetail, e.g.
  // LAYOUT_MISMATCH: the agent was started with another layout than the job's);
  // DeadlineExceeded after options.get_info_timeout; Internal if the agent reports an
  // invalid mesh.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const std::string& agent_socket,
                                                         ClientOptions options = {});

  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // The agent's identity: job, this rank and its mesh coordinates, the job's layout.
  const v1::AgentIdentity& identity() const { return identity_; }

  // Saves this rank's pieces of checkpoint `step` (see the header comment); returns once the
  // bytes are staged. `tensors` is the whole of what this rank holds; their memory may change
  // again as soon as Save returns.
  // Errors: InvalidArgument + MALFORMED_SHARD naming the fqn for a piece that fails the local
  // checks (DescribeShards), or if `step` is negative; InvalidArgument + PLAN_TOO_LARGE if
  // the request would exceed options.max_plan_request_bytes; FailedPrecondition for a CUDA tensor
  // without a GPU, InvalidArgument if its pointer is not device memory, or a device's queued
  // work failing — all before BeginSave. Such a refusal of this rank's own tensors is passed
  // to the agent (RefuseSave; best effort, bounded by options.refuse_timeout), so that the
  // coordinator ends the step's save for every other rank at once with its reason instead of
  // them waiting for this rank until the planning timeout.
  // From BeginSave, before any copy: InvalidArgument with the plan's ErrorDetail
  // (DUPLICATE_FQN, INCOMPLETE_COVERAGE, OVERLAPPING_SHARDS, ...); FailedPrecondition
  // (STEP_EXISTS, SESSION_IN_PROGRESS); Aborted (AGENT_LOST, TIMEOUT, ADMISSION_DENIED);
  // Unavailable if the agent (or its coordinator) is unreachable; DeadlineExceeded after
  // options.begin_save_timeout. Internal if the agent's slots do not match the request.
  // With save_options.memory_only: FailedPrecondition + MEMORY_ONLY_REFUSED if ranks disagree
  // on it or an agent's memory tier is off (before any copy; nothing committed is touched).
  // While copying: errors of MapStaging (NotFound if the region is gone; ResourceExhausted
  // if it cannot be pinned); Internal for a failed CUDA copy or an earlier failed kernel. From
  // Staged: Aborted if the session aborted meanwhile; NotFound for a session the agent does not
  // know; Unavailable / DeadlineExceeded.
  absl::StatusOr<SaveResult> Save(int64_t step, absl::Span<const TensorRef> tensors,
                                  SaveOptions save_options = {});
  // With save_options.overlap, Save returns the errors it finds before any RPC (the local
  // checks, PLAN_TOO_LARGE, CUDA tensors without a GPU; FailedPrecondition if cuda_stream's
  // event cannot be recorded) and otherwise OK at once: the rest of the errors above end the
  // save on its thread and are returned by Fence (up to the copy) or WaitCommitted (after).

  // Waits until this client's latest overlapped save has copied its tensors, then gives its
  // verdict: OK if the tensors were not changed since Save (the save is then staged and
  // commits in the background), an error saying what changed otherwise (the step is then
  // refused for every rank; returned unchanged). Returns at once if there is no such save or
  // it was fenced already. The trainer calls it before it next changes the tensors (the
  // optimizer step); Python's Checkpointer installs it as an optimizer step pre-hook.
  // Errors: what ended the save before its copy completed — BeginSave's errors (Save's list)
  // and the copy's (MapStaging, CUDA) — or `verdict` if it is not OK.
  absl::Status Fence(absl::Status verdict = absl::OkStatus());

  // Tells the agent this rank will not save `step`, for `refusal`'s reason (a code, e.g.
  // MALFORMED_SHARD, and a message naming what is wrong): the coordinator aborts the step's
  // save for every rank with it (agent.proto RefuseSave). Save does this itself for what it
  // refuses; a framework that refuses a rank's state before calling Save (the Python
  // package's own checks) calls this. Returns `refusal` unchanged, so that a caller can
  // `return client.RefuseSave(step, error);`; how the agent took it is logged, not returned.
  absl::Status RefuseSave(int64_t step, absl::Status refusal);

  // Makes the agent create the staging of saves of `tensors` now (ReserveStaging) and maps it
  // here, so the first save — and with the memory tier the second, which stages in the other
  // region — stalls for its copy alone, not for creating and faulting in gigabytes of shared
  // memory. Call it once the model and optimizer state exist, e.g. right after a load;
  // optional. Blocks for the creation (about as long as the first save would have stalled
  // longer). A DP leader's save also stages its peers' optimizer slices, which only the plan
  // tells: its first save still makes a larger region.
  // Errors: InvalidArgument if `tensors` holds no bytes; from the agent ResourceExhausted +
  // ADMISSION_DENIED over its staging budget, + IO_ERROR if /dev/shm is full; Unavailable;
  // errors of MapStaging.
  absl::Status ReserveStaging(absl::Span<const TensorRef> tensors);

  // Blocks until the save of `step` is COMMITTED and returns the checkpoint directory (empty
  // for a memory-only save, which has none), or until `timeout` (InfiniteDuration: no limit).
  // Errors: InvalidArgument if `timeout` is not positive; Aborted with the session's
  // ErrorDetail (AGENT_LOST, REPLICA_DIVERGED, IO_ERROR, ...) if it aborted;
  // DeadlineExceeded after `timeout`; NotFound if the agent knows no save of `step`;
  // Unavailable if the agent is unreachable.
  absl::StatusOr<std::string> WaitCommitted(int64_t step,
                                            absl::Duration timeout = absl::InfiniteDuration());

  // Loads checkpoint `step` — a step (its disk checkpoint, else its memory-only commit),
  // kLatestStep (the latest on disk) or kNewestStep (the newest commit) — into `into`: each
  // TensorRef names a piece in the current layout and the memory to fill (nbytes = its size).
  // Optimizer shards the checkpoint records as absent are listed in LoadResult::absent and
  // left untouched. Every byte is verified against the manifest: when all of `into` is host
  // memory, a load the agent serves in place is checked here as it is copied
  // (client/verified_copy.h), and loaded again — the same step, verified by the agent, which
  // reads a mismatching block from the file — if a block does not match. Likewise a copy on
  // another node (a lost node's buddy's) is read from its holder here, straight into `into`,
  // and checked as it arrives (client/peer_fetch.h): a block that does not match sends the
  // load to the agent, verifying, as above; a holder that cannot be read from sends it to the
  // agent, which reads the copy itself (or the file). Everything, retries and reads from
  // holders included, within options.load_timeout. On an error, the contents of `into` are
  // unspecified (they may hold bytes that failed the check).
  // Errors: InvalidArgument + MALFORMED_SHARD for a piece that fails the local checks or has
  // state_absent set, or if `step` < -2; InvalidArgument + PLAN_TOO_LARGE over
  // options.max_plan_request_bytes; FailedPrecondition / InvalidArgument for CUDA
  // tensors as in Save. From the agent: NotFound + CHECKPOINT_NOT_FOUND; NotFound +
  // MEMORY_COPY_LOST for a memory-only step a data file of which no live agent holds; DataLoss +
  // CHECKSUM_MISMATCH naming tensor and file; InvalidArgument if a requested tensor is
  // missing from the checkpoint or its shape differs; Unavailable; DeadlineExceeded after
  // options.load_timeout. Internal if the agent's slots do not match the request or a CUDA
  // copy fails; errors of MapStaging.
  // Load returns once `into` is filled: unmapping the load region (~9 ms per 256 MiB of
  // page tables) and ReleaseLoad then run on a background thread, which the next Save, Load
  // or ReserveStaging (and the destructor) waits for; a failed release is counted in
  // ClientStats::failed_releases. With `into` empty, a load only resolves the step
  // (LoadResult::step): the resident copy's mapping made at Connect is left to go on.
  absl::StatusOr<LoadResult> Load(int64_t step, absl::Span<const TensorRef> into);

  ClientStats stats() const;

  // Blocks until the resident checkpoint's mapping started at Connect has ended (all of it
  // faulted in, stopped, or failed), or `timeout` passed; returns whether it has ended (true
  // if none was started). For tests and benchmarks, which must know when it no longer uses a
  // core; a trainer need not call it.
  bool AwaitPrefetch(absl::Duration timeout) const;

 private:
  Client(ClientOptions options, std::unique_ptr<v1::Agent::Stub> stub, v1::AgentIdentity identity);

  // The cached save mapping for (name, size), (re)mapping it if the agent handed out
  // another region or it must now be pinned. Errors: as MapStaging.
  absl::StatusOr<MappedStaging*> SaveMappingLocked(const std::string& name, uint64_t size, bool pin)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Unmaps `mapping` (may be null), then releases `load_id` (none if empty), on releaser_.
  void ReleaseInBackgroundLocked(std::string load_id, std::unique_ptr<MappedStaging> mapping)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits for the last load's background release.
  void JoinReleaserLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // What Load must do again after LoadOnceLocked succeeded: the result must then not be used
  // (`into` holds unverified bytes).
  struct LoadRetry {
    uint64_t mismatched = 0;   // blocks this client checked that did not match
    absl::Status fetch_error;  // reading the copy from its holder (LoadResponse.fetch) failed
    std::string fetch_holder;  // that holder's bulk port
  };

  // One Load request and its copy into `into`; with request.client_verifies, blocks left to
  // check are checked while copying, and with request.client_fetches, a copy on another node
  // the agent names is read from its holder here (client/peer_fetch.h), checked the same way;
  // `*retry` says what went wrong there. Errors: as Load.
  absl::StatusOr<LoadResult> LoadOnceLocked(const v1::LoadRequest& request,
                                            absl::Span<const TensorRef> into, absl::Time deadline,
                                            LoadRetry* retry)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // LoadOnceLocked's steps (client/client_load.cc), in the order it takes them.
  // Where a load's bytes lie in this process; defined in client_load.cc.
  struct LoadRegion;
  // Keeps the mapping made at Connect for a load the agent serves from its region `shm_name`
  // (of `shm_size` bytes), and ends it for one served from another: the agent may then reuse
  // or drop that region, which this mapping must not keep alive.
  void TakeResidentMappingLocked(const std::string& shm_name, uint64_t shm_size)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A reply naming a copy on another node (LoadResponse.fetch): reads it from its holder
  // straight into `into`, checked as it arrives, rather than through a region the agent would
  // fill first. A holder that fails, or blocks that do not match, are set in `*retry` (Load
  // then asks the agent to read or verify them itself), not returned.
  // Errors: Internal for a reply that does not fit the request.
  static absl::Status FetchFromHolder(const v1::LoadRequest& request,
                                      const v1::LoadResponse& response,
                                      absl::Span<const TensorRef> into,
                                      const std::vector<bool>& absent, absl::Time deadline,
                                      LoadResult* result, LoadRetry* retry);
  // Finds the reply's region among the mappings this process holds (a cached save mapping, or
  // the resident one), else maps it read-only for this load alone: loads are rare, and the
  // agent frees a load region after ReleaseLoad. Sets each present shard's slot, and
  // result->prefetched_bytes where it reads through the resident mapping.
  // Errors: MappedStaging::Map's.
  absl::StatusOr<LoadRegion> MapLoadRegionLocked(const v1::LoadResponse& response,
                                                 const std::vector<bool>& absent, uint64_t total,
                                                 LoadResult* result)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Copies the region's slots into host `into`, checking the blocks the agent left unverified
  // in the same pass (client/verified_copy.h): each byte is read once, not once by the agent
  // to verify and again here to copy. Blocks that do not match are counted in `*retry`, not
  // returned.
  // Errors: Internal for a reply that does not fit the request.
  absl::Status CopyVerifiedLocked(const v1::LoadRequest& request, const v1::LoadResponse& response,
                                  absl::Span<const TensorRef> into, const LoadRegion& region,
                                  LoadResult* result, LoadRetry* retry)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Copies between tensors and staging: `to_staging` for Save, else for Load. Host pieces
  // go through ParallelCopy; CUDA pieces through `device_` for a save, or for a load from
  // staging page-locked in this process (`staging_pinned`), else through
  // CopyToDevicesLocked; waits for all. Errors: Internal for a failed CUDA copy.
  absl::Status CopyLocked(absl::Span<const TensorRef> tensors, const std::vector<char*>& slot_data,
                          bool to_staging, bool staging_pinned)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Copies host -> device `items` (of a load region, not page-locked here) on up to
  // copy_threads_ threads, each through kBounceBufferBytes x 2 of page-locked memory of its
  // own (allocated for the load), and waits for them. Errors: Internal for a failed CUDA copy.
  absl::Status CopyToDevicesLocked(const std::vector<CopyItem>& items)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Save's checks before any RPC (describe, CUDA tensors, the request's size), the caller's
  // refusal passed on: the BeginSave request, and in `*cuda` whether any tensor is on a GPU.
  absl::StatusOr<v1::BeginSaveRequest> PrepareSave(int64_t step,
                                                   absl::Span<const TensorRef> tensors,
                                                   const SaveOptions& save_options, bool* cuda);
  // What BeginAndCopyLocked hands back: the session and the copy's time.
  struct Begun {
    std::string session_id;
    bool plan_cached = false;
    absl::Duration copy;
  };
  // BeginSave, map the staging, copy `tensors` into their slots (edges 1 and 2 of
  // client/overlapped_save.h, marked on `progress` unless null; `*context` is set while
  // BeginSave waits so that the destructor can cancel it). Errors: as Save from BeginSave on.
  absl::StatusOr<Begun> BeginAndCopyLocked(const v1::BeginSaveRequest& request,
                                           absl::Span<const TensorRef> tensors, bool cuda,
                                           OverlappedSave* progress)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The Staged report. Errors: as Save's from Staged.
  absl::Status ReportStaged(const std::string& session_id, absl::Duration stall);
  // The Staged call that withdraws the snapshot instead (StagedRequest.withdrawn), with
  // `why`'s ErrorDetail (STATE_CHANGED if it has none). Errors: as ReportStaged.
  absl::Status WithdrawStaged(const std::string& session_id, const absl::Status& why);
  // The save thread of an overlapped save (client/overlapped_save.h): waits for `previous`
  // to end, begins and copies, waits for the fence's verdict, reports or refuses, and waits
  // for the commit. Owns `cuda_event` (destroys it).
  void RunOverlapped(std::shared_ptr<OverlappedSave> save,
                     std::shared_ptr<OverlappedSave> previous, v1::BeginSaveRequest request,
                     std::vector<TensorRef> tensors, bool cuda, void* cuda_event);
  // Withdraws `save`'s snapshot from session `session_id` (none if empty) for `why`, and
  // waits (cancellably) until the agent has seen the session end.
  void AwaitWithdrawn(const OverlappedSave& save, const std::string& session_id,
                      const absl::Status& why);
  // Registers a save thread's call for the destructor to cancel; false once it has begun.
  bool TrackCall(grpc::ClientContext* context) ABSL_LOCKS_EXCLUDED(overlap_mu_);
  void UntrackCall(grpc::ClientContext* context) ABSL_LOCKS_EXCLUDED(overlap_mu_);
  // Fences the latest overlapped save if it is pending (as intact), before another call
  // uses the staging or the session.
  void FenceImplicitly() ABSL_LOCKS_EXCLUDED(overlap_mu_);

  // The prefetch's options: list_blocks asks the agent (Agent.ListResidentBlocks), and refuses
  // a listing of a region other than the one Connect was told of.
  ResidentPrefetchOptions PrefetchOptions();

  void CountMap();
  // Cancels the prefetch's ListResidentBlocks call in flight, and any it would make.
  void CancelListing() ABSL_LOCKS_EXCLUDED(listing_mu_);
  // Ends the mapping made at Connect (prefetch_, resident_), unmapping it on releaser_: the
  // agent may reuse or drop the region.
  void EndResidentMappingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ClientOptions options_;
  // options_.copy_threads capped at UsableCpus() (at Connect).
  const int copy_threads_;
  const std::unique_ptr<v1::Agent::Stub> stub_;  // thread-safe
  const v1::AgentIdentity identity_;

  // Serialises Save and Load.
  absl::Mutex mu_;
  // The staging regions of the last two saves, mapped into this process, the latest last: an
  // agent with the memory tier on alternates between two regions (agent/staging_pool.h).
  std::vector<std::unique_ptr<MappedStaging>> staging_ ABSL_GUARDED_BY(mu_);
  // Declared after staging_ so it is destroyed first: no copy is in flight at unmap.
  DeviceCopier device_ ABSL_GUARDED_BY(mu_);
  // The last load's unmapping and ReleaseLoad, if not yet joined.
  std::thread releaser_ ABSL_GUARDED_BY(mu_);
  // The prefetch thread's ListResidentBlocks call in flight, if any (declared before
  // prefetch_, whose thread uses them until it is joined): ending the mapping cancels it, so
  // that a Save does not wait in its stall for the agent's answer (a large manifest).
  absl::Mutex listing_mu_;
  grpc::ClientContext* listing_ ABSL_GUARDED_BY(listing_mu_) = nullptr;
  bool listing_cancelled_ ABSL_GUARDED_BY(listing_mu_) = false;
  // The resident checkpoint's mapping started at Connect, or null. The first Load takes its
  // mapping into resident_ if the agent serves it from that region; Save and ReserveStaging
  // end it. Its progress() is read by stats() without mu_.
  const std::unique_ptr<ResidentPrefetch> prefetch_;
  // That mapping, kept while the agent serves loads from its region: until a load is served
  // from another, or a Save or ReserveStaging (after which the agent may reuse or drop the
  // region, which this mapping must then not keep alive), with the blocks checked ahead.
  ResidentPrefetch::Taken resident_ ABSL_GUARDED_BY(mu_);

  mutable absl::Mutex stats_mu_;
  ClientStats stats_ ABSL_GUARDED_BY(stats_mu_);

  // Overlapped saves (client/overlapped_save.h). Never held across an RPC or a wait, so that
  // Fence does not queue behind the save thread, which holds mu_ while it copies.
  absl::Mutex overlap_mu_;
  // The latest overlapped save, or null.
  std::shared_ptr<OverlappedSave> overlapped_ ABSL_GUARDED_BY(overlap_mu_);
  // Save threads, joined once their save ended (at the next Save) or by the destructor.
  std::vector<std::pair<std::shared_ptr<OverlappedSave>, std::thread>> save_threads_
      ABSL_GUARDED_BY(overlap_mu_);
  // The calls of save threads in flight (BeginSave, WaitCommitted), cancelled by the
  // destructor, which must not wait for every rank's plan or for a commit.
  std::vector<grpc::ClientContext*> calls_ ABSL_GUARDED_BY(overlap_mu_);
  bool closing_ ABSL_GUARDED_BY(overlap_mu_) = false;
};

}  // namespace tessera

#endif  // TESSERA_CLIENT_CLIENT_H_
