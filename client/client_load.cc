// Client, part 2: load. Load and its steps: the request, one attempt (LoadOnceLocked), the
// region's mapping, the copy out of it (verified here or not) or the fetch from another node,
// and the bounce copies into device memory. Part 1 (client/client.cc) holds the connection,
// save, wait and the plumbing both share (client/client_internal.h).
#include "client/client.h"

#include <algorithm>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "client/bounce_copy.h"
#include "client/client_internal.h"
#include "client/parallel_copy.h"
#include "client/peer_fetch.h"
#include "common/bulk_wire.h"
#include "client/verified_copy.h"
#include "common/grpc_status.h"
#include "common/status.h"
#include "grpcpp/client_context.h"

namespace tessera {

namespace {

// Each of a load's copy threads bounces its copies into device memory through two page-locked
// buffers of this size: large enough that a part's transfer outlasts its queuing, small
// enough that the threads' buffers (2 x 8 MiB each) cost little to allocate per load.
constexpr size_t kBounceBufferBytes = size_t{8} << 20;

// `mapping` is of region `name` and covers its first `size` bytes (region names are never
// reused: a region that must grow gets a new one).
bool Maps(const MappedStaging& mapping, const std::string& name, uint64_t size) {
  return mapping.name() == name && mapping.size() >= size;
}

// The Load request for `into`, checked here first: what the agent would refuse only after
// staging, or the transport without naming a tensor, fails before any RPC.
absl::StatusOr<v1::LoadRequest> LoadRequestFor(const v1::Layout& layout, int64_t step,
                                               absl::Span<const TensorRef> into,
                                               size_t max_request_bytes) {
  if (step < kNewestStep) {
    return MakeError(absl::StatusCode::kInvalidArgument, v1::ERROR_CODE_MALFORMED_SHARD,
                     absl::StrCat("step must be >= 0, or -1 for the latest on disk, or -2 for "
                                  "the newest (a memory-only commit included), not ",
                                  step));
  }
  for (size_t i = 0; i < into.size(); ++i) {
    if (into[i].state_absent) {
      v1::ErrorDetail detail;
      detail.set_code(v1::ERROR_CODE_MALFORMED_SHARD);
      detail.set_message(absl::StrCat("Tensor ", i, " (\"", into[i].fqn,
                                      "\") sets state_absent, which only a save declares; "
                                      "ask for the state_key to load"));
      detail.add_fqns(into[i].fqn);
      return MakeError(absl::StatusCode::kInvalidArgument, detail);
    }
  }
  ASSIGN_OR_RETURN(std::vector<v1::ShardDesc> shards, DescribeShards(layout, into));
  if (client_internal::AnyCuda(into)) RETURN_IF_ERROR(client_internal::CheckCudaTensors(into));

  v1::LoadRequest request;
  request.set_step(step);
  request.mutable_shards()->Reserve(static_cast<int>(shards.size()));
  for (v1::ShardDesc& s : shards) *request.add_shards() = std::move(s);
  shards.clear();
  // Device copies read the region on the GPU's time: only host destinations are checked (and
  // fetched from other nodes) here.
  request.set_client_verifies(!client_internal::AnyCuda(into));
  request.set_client_fetches(!client_internal::AnyCuda(into));
  RETURN_IF_ERROR(client_internal::CheckRequestSize("load", request.ByteSizeLong(),
                                                    request.shards_size(), max_request_bytes));
  return request;
}

// Which of the `n` requested shards the agent's reply marks absent, checked: only a distinct
// optimizer or extra shard may be (the trainer then keeps that memory as it is).
absl::StatusOr<std::vector<bool>> AbsentShards(const v1::LoadRequest& request,
                                               const v1::LoadResponse& response, size_t n) {
  std::vector<bool> absent(n, false);
  for (uint32_t index : response.absent()) {
    if (index >= n || absent[index] ||
        request.shards(static_cast<int>(index)).kind() == v1::SHARD_KIND_PARAM) {
      return absl::InternalError(absl::StrCat(
          "the agent's Load reply marks shard ", index,
          " absent, which is not a distinct optimizer or extra shard of the ", n, " requested"));
    }
    absent[index] = true;
  }
  return absent;
}

// What the agent's reply tells the caller as it is: the step, where the bytes came from, and
// the shards marked `absent`. The copy's own counts are added as the load goes on.
LoadResult ResultOf(const v1::LoadResponse& response, const std::vector<bool>& absent) {
  LoadResult result;
  result.step = response.step();
  result.bytes_from_memory = response.bytes_from_memory();
  result.bytes_from_disk = response.bytes_from_disk();
  result.memory_blocks_rejected = response.memory_blocks_rejected();
  result.bytes_fetched_from_peers = response.bytes_fetched_from_peers();
  result.memory_only = response.memory_only();
  for (size_t i = 0; i < absent.size(); ++i) {
    if (absent[i]) result.absent.push_back(i);
  }
  return result;
}

// The blocks the agent left for this client to check (LoadResponse.unverified_blocks), in the
// form VerifiedCopy and FetchVerified take.
std::vector<BlockCheck> BlocksToCheck(const v1::LoadResponse& response) {
  std::vector<BlockCheck> blocks;
  blocks.reserve(response.unverified_blocks_size());
  for (const v1::BlockCheck& block : response.unverified_blocks()) {
    blocks.push_back(BlockCheck{block.offset(), block.length(), block.xxh3()});
  }
  return blocks;
}

}  // namespace

// Where a load's bytes lie in this process: the region the agent staged them in, as
// MapLoadRegionLocked found or mapped it.
struct Client::LoadRegion {
  // Each requested shard's slot in the region; null where absent, or where nothing was mapped.
  std::vector<char*> slot_data;
  // The region's first byte; null where no shard has bytes (nothing was mapped).
  const char* base = nullptr;
  bool pinned = false;    // page-locked in this process (a save mapping of CUDA saves)
  bool resident = false;  // read through resident_.mapping
  // A load region other than a cached save region is mapped only for this load: loads are
  // rare, and the agent frees that region after ReleaseLoad. A region served in place (the
  // agent's resident copy) is often one of the cached save mappings: it is only read here, as
  // every load region is.
  std::unique_ptr<MappedStaging> temporary;
};

absl::StatusOr<LoadResult> Client::Load(int64_t step, absl::Span<const TensorRef> into) {
  ASSIGN_OR_RETURN(v1::LoadRequest request,
                   LoadRequestFor(identity_.layout(), step, into, options_.max_plan_request_bytes));

  // One deadline for the load, its retries and its fetch included.
  const absl::Time deadline = absl::Now() + options_.load_timeout;
  FenceImplicitly();  // a load writes into tensors a pending overlapped save may still read
  absl::MutexLock lock(&mu_);
  uint64_t rejected = 0;
  for (;;) {
    LoadRetry retry;
    absl::StatusOr<LoadResult> result = LoadOnceLocked(request, into, deadline, &retry);
    if (!result.ok()) return result;
    if (request.step() >= 0 && result->step != request.step()) {
      return absl::InternalError(absl::StrCat("the agent loaded step ", result->step,
                                              " when asked for step ", request.step()));
    }
    if (retry.mismatched == 0 && retry.fetch_error.ok()) {
      result->memory_blocks_rejected = std::max(result->memory_blocks_rejected, rejected);
      return result;
    }
    // Again, the same step even if -1 or -2 would resolve to a newer one by now; each time
    // with one thing less done here, so at most twice. A copy that could not be read from its
    // holder: the agent reads it, from another holder or the file (from that holder again
    // only for a memory-only step). A block that did not match: the agent verifies (it reads
    // that block from the file, or fails the load if there is none).
    request.set_step(result->step);
    request.set_client_fetches(false);
    if (!retry.fetch_error.ok()) *request.add_unreadable_holders() = retry.fetch_holder;
    if (retry.mismatched > 0) {
      request.set_client_verifies(false);
      rejected = std::max(rejected, retry.mismatched);
    }
  }
}

absl::StatusOr<LoadResult> Client::LoadOnceLocked(const v1::LoadRequest& request,
                                                  absl::Span<const TensorRef> into,
                                                  absl::Time deadline, LoadRetry* retry) {
  JoinReleaserLocked();  // the last load's release, before the agent stages this one
  *retry = LoadRetry();
  v1::LoadResponse response;
  {
    grpc::ClientContext context;
    if (deadline != absl::InfiniteFuture()) context.set_deadline(absl::ToChronoTime(deadline));
    grpc::Status status = stub_->Load(&context, request, &response);
    if (!status.ok()) return FromGrpcStatus(status);
  }

  // From here the agent holds staging for us: release it on every path (in the background,
  // as a successful load does; an error return unmaps the region's `temporary`, below, first).
  absl::Cleanup release_on_exit = [&] { ReleaseInBackgroundLocked(response.load_id(), nullptr); };

  ASSIGN_OR_RETURN(const std::vector<bool> absent, AbsentShards(request, response, into.size()));
  LoadResult result = ResultOf(response, absent);
  ASSIGN_OR_RETURN(const uint64_t total,
                   client_internal::CheckSlots("Load", response.slots(), request.shards(), absent,
                                               response.shm_size()));

  // A load of no tensors only asks which step (the Python client's latest()): the mapping made
  // at Connect goes on being faulted in and checked for the load that follows.
  if (into.empty()) return result;

  TakeResidentMappingLocked(response.shm_name(), response.shm_size());

  if (response.has_fetch()) {
    RETURN_IF_ERROR(FetchFromHolder(request, response, into, absent, deadline, &result, retry));
    return result;  // the release runs in the background (release_on_exit)
  }

  const absl::Time copy_start = absl::Now();
  // Declared after release_on_exit: on an error return its `temporary` is unmapped first.
  ASSIGN_OR_RETURN(LoadRegion region, MapLoadRegionLocked(response, absent, total, &result));
  if (response.unverified_blocks_size() > 0) {
    RETURN_IF_ERROR(CopyVerifiedLocked(request, response, into, region, &result, retry));
  } else {
    // Kernels the trainer queued that write these tensors (their initialisation) end before
    // the copies into them begin, on streams not ordered after the trainer's.
    if (options_.synchronize_devices && client_internal::AnyCuda(into)) {
      RETURN_IF_ERROR(client_internal::WaitForDevices(into));
    }
    RETURN_IF_ERROR(CopyLocked(into, region.slot_data, /*to_staging=*/false, region.pinned));
  }
  result.copy_time = absl::Now() - copy_start;
  // `into` is filled: unmapping and the release need not hold the trainer.
  std::move(release_on_exit).Cancel();
  ReleaseInBackgroundLocked(response.load_id(), std::move(region.temporary));
  return result;
}

void Client::TakeResidentMappingLocked(const std::string& shm_name, uint64_t shm_size) {
  // The mapping made at Connect serves every load the agent serves from that region (the
  // Python client's objects take three); the first load served from another ends it. Taken
  // here, its check stops: a listing still awaited would be of no use (and the agent answers
  // it only after this load), so it is cancelled, not waited for.
  if (resident_.mapping == nullptr && prefetch_ != nullptr) {
    CancelListing();
    resident_ = prefetch_->Take();
  }
  if (resident_.mapping != nullptr && !Maps(*resident_.mapping, shm_name, shm_size)) {
    EndResidentMappingLocked();
  }
}

absl::Status Client::FetchFromHolder(const v1::LoadRequest& request,
                                     const v1::LoadResponse& response,
                                     absl::Span<const TensorRef> into,
                                     const std::vector<bool>& absent, absl::Time deadline,
                                     LoadResult* result, LoadRetry* retry) {
  if (!request.client_fetches() || response.unverified_blocks_size() == 0 ||
      !response.shm_name().empty()) {
    return absl::InternalError(absl::StrCat(
        "the agent's Load reply names a memory copy of ", response.fetch().copy().file(),
        " to read from ", response.fetch().copy().bulk_address(),
        request.client_fetches() ? " but no blocks to check, or a region too"
                                 : ", which this client did not offer to (CUDA destinations)"));
  }
  std::vector<SlotCopy> slots;
  for (size_t i = 0; i < into.size(); ++i) {
    if (absent[i] || into[i].nbytes == 0) continue;
    slots.push_back(
        SlotCopy{into[i].data, response.slots(static_cast<int>(i)).offset(), into[i].nbytes});
  }
  const std::vector<BlockCheck> blocks = BlocksToCheck(response);
  // The agent's reply is checked here, so that every error of the fetch below is the
  // holder's or the network's, which the agent may not meet (it loads again).
  if (absl::Status bad = SlotsByBlock(response.shm_size(), slots, blocks).status(); !bad.ok()) {
    return absl::InternalError(absl::StrCat("the agent's Load reply: ", bad.message()));
  }
  if (response.fetch().copy().nbytes() != response.shm_size()) {
    return absl::InternalError(
        absl::StrCat("the agent's Load reply names a copy of ", response.fetch().copy().nbytes(),
                     " bytes but places its slots in ", response.shm_size()));
  }
  const absl::Time fetch_start = absl::Now();
  absl::StatusOr<VerifiedCopyResult> fetched =
      FetchVerified(PeerCredential{response.fetch().job_id(), response.fetch().peer_secret()},
                    response.fetch().copy(), slots, blocks,
                    kMemoryCopyReadStreams, TimeLimit(deadline, kMemoryCopyReadStall));
  if (!fetched.ok()) {
    retry->fetch_error = fetched.status();
    retry->fetch_holder = response.fetch().copy().bulk_address();
    return absl::OkStatus();
  }
  result->fetch_time = absl::Now() - fetch_start;
  retry->mismatched = fetched->mismatched.size();
  for (const BlockCheck& block : blocks) result->bytes_verified_by_client += block.length;
  result->bytes_fetched_by_client = result->bytes_verified_by_client;  // the blocks it read
  return absl::OkStatus();
}

absl::StatusOr<Client::LoadRegion> Client::MapLoadRegionLocked(const v1::LoadResponse& response,
                                                               const std::vector<bool>& absent,
                                                               uint64_t total, LoadResult* result) {
  LoadRegion region;
  region.slot_data.assign(absent.size(), nullptr);
  if (total == 0) return region;
  char* base = nullptr;
  auto cached = std::find_if(staging_.begin(), staging_.end(), [&](const auto& m) {
    return Maps(*m, response.shm_name(), response.shm_size());
  });
  if (cached != staging_.end()) {
    base = static_cast<char*>((*cached)->data());
    region.pinned = (*cached)->pinned();
  } else if (resident_.mapping != nullptr) {
    base = static_cast<char*>(resident_.mapping->data());
    region.resident = true;
    // Final: the first load's Take stopped it.
    result->prefetched_bytes = prefetch_->progress().populated_bytes;
    absl::MutexLock lock(&stats_mu_);
    ++stats_.prefetched_loads;
  } else {
    // Read-only, not pre-faulted: the copy threads fault the pages in as they read them,
    // in parallel and overlapped with the copy, instead of one serial pass before it.
    MapStagingOptions map_options;
    map_options.read_only = true;
    map_options.populate = false;
    ASSIGN_OR_RETURN(region.temporary,
                     MappedStaging::Map(response.shm_name(), response.shm_size(), map_options));
    CountMap();
    // Only read (CopyLocked with to_staging = false copies out of the slots).
    base = static_cast<char*>(region.temporary->data());
  }
  for (size_t i = 0; i < absent.size(); ++i) {
    if (!absent[i]) region.slot_data[i] = base + response.slots(static_cast<int>(i)).offset();
  }
  region.base = base;
  return region;
}

absl::Status Client::CopyVerifiedLocked(const v1::LoadRequest& request,
                                        const v1::LoadResponse& response,
                                        absl::Span<const TensorRef> into, const LoadRegion& region,
                                        LoadResult* result, LoadRetry* retry) {
  if (!request.client_verifies()) {
    return absl::InternalError(absl::StrCat(
        "the agent's Load reply leaves ", response.unverified_blocks_size(),
        " blocks for this client to check, which it did not offer to (CUDA destinations)"));
  }
  if (region.base == nullptr) {
    return absl::InternalError(absl::StrCat("the agent's Load reply leaves ",
                                            response.unverified_blocks_size(),
                                            " blocks to check but no shard has bytes"));
  }
  std::vector<SlotCopy> slots;
  slots.reserve(into.size());
  for (size_t i = 0; i < into.size(); ++i) {
    if (region.slot_data[i] == nullptr || into[i].nbytes == 0) continue;
    slots.push_back(
        SlotCopy{into[i].data, response.slots(static_cast<int>(i)).offset(), into[i].nbytes});
  }
  const std::vector<BlockCheck> blocks = BlocksToCheck(response);
  for (const BlockCheck& block : blocks) result->bytes_verified_by_client += block.length;
  absl::StatusOr<VerifiedCopyResult> copied = VerifiedCopy(
      region.base, response.shm_size(), slots, blocks,
      region.resident ? absl::MakeConstSpan(resident_.checked) : absl::Span<const BlockCheck>(),
      copy_threads_, options_.parallel_copy_min_bytes);
  if (!copied.ok()) {
    return absl::InternalError(absl::StrCat("the agent's Load reply: ", copied.status().message()));
  }
  retry->mismatched = copied->mismatched.size();
  result->checked_ahead_bytes = copied->checked_ahead_bytes;
  return absl::OkStatus();
}

absl::Status Client::CopyToDevicesLocked(const std::vector<CopyItem>& items) {
  // A load region is not page-locked in this process. CUDA copies from such memory one at a
  // time, through its own staging, at one core's memcpy speed; each thread here copies its run
  // through page-locked buffers of its own instead (client/bounce_copy.h), and the threads'
  // memcpys run side by side.
  const std::vector<std::vector<CopyItem>> runs =
      SplitIntoRuns(items, copy_threads_, options_.parallel_copy_min_bytes);
  std::vector<absl::Status> results(runs.size());
  RunInParallel(runs, [&](const std::vector<CopyItem>& run) {
    absl::Status& result = results[&run - runs.data()];
    absl::StatusOr<std::unique_ptr<BounceCopier>> bounce = BounceCopier::Create(kBounceBufferBytes);
    if (bounce.ok()) {
      for (const CopyItem& piece : run) {
        result = (*bounce)->ToDevice(piece.dst, piece.src, piece.size);
        if (!result.ok()) break;
      }
      absl::Status finished = (*bounce)->Finish();
      if (result.ok()) result = finished;
      return;
    }
    // No page-locked memory to be had: copy from the region as it is.
    DeviceCopier copier;
    for (const CopyItem& piece : run) {
      result = copier.ToDevice(piece.dst, piece.src, piece.size);
      if (!result.ok()) break;
    }
    absl::Status synced = copier.Synchronize();
    if (result.ok()) result = synced;
  });
  for (const absl::Status& result : results) {
    if (!result.ok()) {
      return client_internal::Prefixed("copying a load into device memory: ", result);
    }
  }
  return absl::OkStatus();
}

}  // namespace tessera
