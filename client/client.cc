#include "client/client.h"

#include <sys/un.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/bounce_copy.h"
#include "client/parallel_copy.h"
#include "client/peer_fetch.h"
#include "client/staging_estimate.h"
#include "client/verified_copy.h"
#include "common/grpc_status.h"
#include "common/layout.h"
#include "common/log.h"
#include "common/status.h"
#include "common/threads.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace tessera {
namespace {

// Save regions kept mapped: the memory tier alternates between two.
constexpr size_t kMaxSaveMappings = 2;

// Each of a load's copy threads bounces its copies into device memory through two page-locked
// buffers of this size: large enough that a part's transfer outlasts its queuing, small
// enough that the threads' buffers (2 x 8 MiB each) cost little to allocate per load.
constexpr size_t kBounceBufferBytes = size_t{8} << 20;

// The agent lists its resident checkpoint's blocks from the manifest (a file read) on its
// load thread: long enough for a large manifest behind another load. (A Save, or the
// destructor, cancels the call rather than wait for it: Client::CancelListing.)
constexpr absl::Duration kListResidentBlocksTimeout = absl::Seconds(30);

void SetTimeout(grpc::ClientContext* context, absl::Duration timeout) {
  if (timeout != absl::InfiniteDuration()) {
    context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  }
}

// `status` with `prefix` before its message, payloads (the ErrorDetail) kept.
absl::Status Prefixed(absl::string_view prefix, const absl::Status& status) {
  absl::Status out(status.code(), absl::StrCat(prefix, status.message()));
  status.ForEachPayload(
      [&](absl::string_view url, const absl::Cord& payload) { out.SetPayload(url, payload); });
  return out;
}

// `mapping` is of region `name` and covers its first `size` bytes (region names are never
// reused: a region that must grow gets a new one).
bool Maps(const MappedStaging& mapping, const std::string& name, uint64_t size) {
  return mapping.name() == name && mapping.size() >= size;
}

bool AnyCuda(absl::Span<const TensorRef> tensors) {
  for (const TensorRef& t : tensors) {
    if (t.memory == Memory::kCuda) return true;
  }
  return false;
}

// Checks that every CUDA tensor with bytes is device memory of a usable GPU.
absl::Status CheckCudaTensors(absl::Span<const TensorRef> tensors) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorRef& t = tensors[i];
    if (t.memory != Memory::kCuda || t.nbytes == 0) continue;
    absl::StatusOr<int> device = DeviceCopier::DeviceOf(t.data);
    if (!device.ok()) {
      return Prefixed(absl::StrCat("Tensor ", i, " (\"", t.fqn, "\") has Memory::kCuda: "),
                      device.status());
    }
  }
  return absl::OkStatus();
}

// Waits for the work queued on every GPU that holds one of `tensors` (with bytes).
absl::Status WaitForDevices(absl::Span<const TensorRef> tensors) {
  std::vector<int> devices;
  for (const TensorRef& t : tensors) {
    if (t.memory != Memory::kCuda || t.nbytes == 0) continue;
    ASSIGN_OR_RETURN(const int device, DeviceCopier::DeviceOf(t.data));
    if (std::find(devices.begin(), devices.end(), device) == devices.end()) {
      devices.push_back(device);
      RETURN_IF_ERROR(DeviceCopier::WaitForDevice(device));
    }
  }
  return absl::OkStatus();
}

// Checks the agent's slots against the request: one per shard, each of the shard's size
// (0 where `absent`), inside the region. Returns the total bytes.
absl::StatusOr<uint64_t> CheckSlots(
    absl::string_view rpc, const google::protobuf::RepeatedPtrField<v1::StagingSlot>& slots,
    const google::protobuf::RepeatedPtrField<v1::ShardDesc>& shards,
    const std::vector<bool>& absent, uint64_t shm_size) {
  if (slots.size() != shards.size()) {
    return absl::InternalError(absl::StrCat("the agent's ", rpc, " reply has ", slots.size(),
                                            " staging slots for ", shards.size(), " shards"));
  }
  uint64_t total = 0;
  for (int i = 0; i < slots.size(); ++i) {
    const v1::StagingSlot& slot = slots[i];
    const uint64_t expected = absent[i] ? 0 : shards[i].nbytes();
    if (slot.nbytes() != expected) {
      return absl::InternalError(absl::StrCat("the agent's ", rpc, " reply gives \"",
                                              shards[i].fqn(), "\" (shard ", i, ") a slot of ",
                                              slot.nbytes(), " bytes; it needs ", expected));
    }
    if (slot.nbytes() > shm_size || slot.offset() > shm_size - slot.nbytes()) {
      return absl::InternalError(absl::StrCat(
          "the agent's ", rpc, " reply places \"", shards[i].fqn(), "\" (shard ", i, ") at [",
          slot.offset(), ", +", slot.nbytes(), ") outside the ", shm_size, "-byte region"));
    }
    total += slot.nbytes();
  }
  return total;
}

// PLAN_TOO_LARGE if a request of `bytes` serialized bytes describing `shards` pieces is over
// `limit`: refused here, with a message, rather than by the transport of the agent or the
// coordinator (RESOURCE_EXHAUSTED naming no tensor).
absl::Status CheckRequestSize(absl::string_view rpc, size_t bytes, int shards, size_t limit) {
  if (bytes <= limit) return absl::OkStatus();
  return MakeError(
      absl::StatusCode::kInvalidArgument, v1::ERROR_CODE_PLAN_TOO_LARGE,
      absl::StrCat("This rank's ", rpc, " request describes ", shards, " tensor pieces in ", bytes,
                   " bytes, over the limit of ", limit,
                   " bytes one request may carry (the agent and the coordinator accept 256 MiB "
                   "messages); merge small tensors into fewer, larger ones or shorten their "
                   "names."));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const std::string& agent_socket,
                                                        ClientOptions options) {
  const std::string path =
      absl::StartsWith(agent_socket, "unix:") ? agent_socket.substr(5) : agent_socket;
  if (path.empty()) return absl::InvalidArgumentError("the agent socket path is empty");
  constexpr size_t kMaxUnixPath = sizeof(sockaddr_un::sun_path) - 1;
  if (path.size() > kMaxUnixPath) {
    // gRPC alone would say only "Failed to create secure client channel".
    return absl::InvalidArgumentError(
        absl::StrCat("agent socket path '", path, "' is ", path.size(),
                     " bytes; a unix socket path holds at most ", kMaxUnixPath,
                     ": start the agent with a shorter --socket"));
  }
  if (options.copy_threads < 1 || options.max_receive_message_bytes < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ClientOptions: copy_threads (", options.copy_threads, ") and max_receive_message_bytes (",
        options.max_receive_message_bytes, ") must be positive"));
  }
  if (options.max_plan_request_bytes < 1 || options.max_plan_request_bytes > kMaxPlanRequestBytes) {
    return absl::InvalidArgumentError(absl::StrCat("ClientOptions: max_plan_request_bytes (",
                                                   options.max_plan_request_bytes, ") must be 1..",
                                                   kMaxPlanRequestBytes));
  }
  const std::string target = "unix:" + path;
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_receive_message_bytes);
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  std::unique_ptr<v1::Agent::Stub> stub = v1::Agent::NewStub(channel);

  grpc::ClientContext context;
  SetTimeout(&context, options.get_info_timeout);
  v1::AgentIdentity identity;
  grpc::Status status = stub->GetInfo(&context, v1::GetInfoRequest(), &identity);
  if (!status.ok()) {
    return Prefixed(absl::StrCat("GetInfo from the agent at ", target, ": "),
                    FromGrpcStatus(status));
  }
  if (absl::StatusOr<MeshLayout> layout = MeshLayout::FromProto(identity.layout()); !layout.ok()) {
    return absl::InternalError(absl::StrCat(
        "the agent at ", target, " reports an invalid mesh: ", layout.status().message()));
  }
  return std::unique_ptr<Client>(
      new Client(std::move(options), std::move(stub), std::move(identity)));
}

Client::Client(ClientOptions options, std::unique_ptr<v1::Agent::Stub> stub,
               v1::AgentIdentity identity)
    : options_(std::move(options)),
      copy_threads_(std::min(options_.copy_threads, UsableCpus())),
      stub_(std::move(stub)),
      identity_(std::move(identity)),
      prefetch_(options_.prefetch_resident && !identity_.resident_shm_name().empty()
                    ? ResidentPrefetch::Start(identity_.resident_shm_name(),
                                              identity_.resident_shm_size(),
                                              identity_.resident_bytes(), PrefetchOptions())
                    : nullptr) {}

ResidentPrefetchOptions Client::PrefetchOptions() {
  ResidentPrefetchOptions options;
  // On the prefetch thread, which the destructor joins before stub_ goes.
  options.list_blocks = [this]() -> absl::StatusOr<std::vector<BlockCheck>> {
    grpc::ClientContext context;
    SetTimeout(&context, kListResidentBlocksTimeout);
    {
      absl::MutexLock lock(&listing_mu_);
      if (listing_cancelled_) return absl::CancelledError("the resident mapping has ended");
      listing_ = &context;
    }
    v1::ListResidentBlocksResponse response;
    const grpc::Status status =
        stub_->ListResidentBlocks(&context, v1::ListResidentBlocksRequest(), &response);
    {
      absl::MutexLock lock(&listing_mu_);
      listing_ = nullptr;
    }
    RETURN_IF_ERROR(FromGrpcStatus(status));
    if (response.shm_name() != identity_.resident_shm_name()) {
      return absl::FailedPreconditionError(
          absl::StrCat("the agent's resident checkpoint is now in ", response.shm_name(),
                       ", not the region mapped at Connect, ", identity_.resident_shm_name()));
    }
    std::vector<BlockCheck> blocks;
    blocks.reserve(response.blocks_size());
    for (const v1::BlockCheck& block : response.blocks()) {
      blocks.push_back(BlockCheck{block.offset(), block.length(), block.xxh3()});
    }
    return blocks;
  };
  return options;
}

Client::~Client() {
  CancelListing();  // prefetch_'s thread is joined after this body: not for a slow agent
  absl::MutexLock lock(&mu_);
  JoinReleaserLocked();
}

void Client::JoinReleaserLocked() {
  if (releaser_.joinable()) releaser_.join();
}

void Client::ReleaseInBackgroundLocked(std::string load_id,
                                       std::unique_ptr<MappedStaging> mapping) {
  JoinReleaserLocked();
  releaser_ =
      std::thread([this, load_id = std::move(load_id), mapping = std::move(mapping)]() mutable {
        // Unmap before the release: after it our mapping may be the region's last reference.
        mapping.reset();
        if (load_id.empty()) return;
        v1::ReleaseLoadRequest request;
        request.set_load_id(load_id);
        v1::ReleaseLoadResponse response;
        grpc::ClientContext context;
        SetTimeout(&context, options_.release_load_timeout);
        if (!stub_->ReleaseLoad(&context, request, &response).ok()) {
          absl::MutexLock lock(&stats_mu_);
          ++stats_.failed_releases;
        }
      });
}

ClientStats Client::stats() const {
  ClientStats stats;
  {
    absl::MutexLock lock(&stats_mu_);
    stats = stats_;
  }
  if (prefetch_ != nullptr) {
    const ResidentPrefetch::Progress progress = prefetch_->progress();
    stats.prefetch_bytes = progress.bytes;
    stats.prefetch_populated_bytes = progress.populated_bytes;
    stats.prefetch_checked_bytes = progress.checked_bytes;
    stats.prefetch_mismatched_blocks = progress.mismatched_blocks;
    stats.prefetch_check_status = progress.check_status;
    stats.prefetch_done = progress.done;
    stats.prefetch_time = progress.elapsed;
  }
  return stats;
}

void Client::EndResidentMappingLocked() {
  CancelListing();
  std::unique_ptr<MappedStaging> mapping = std::move(resident_.mapping);
  resident_.checked.clear();
  if (mapping == nullptr && prefetch_ != nullptr) mapping = prefetch_->Take().mapping;
  // Unmapping a populated region takes ~9 ms per 256 MiB of page tables: not on a save's stall.
  if (mapping != nullptr) ReleaseInBackgroundLocked(/*load_id=*/"", std::move(mapping));
}

void Client::CancelListing() {
  absl::MutexLock lock(&listing_mu_);
  listing_cancelled_ = true;
  if (listing_ != nullptr) listing_->TryCancel();
}

bool Client::AwaitPrefetch(absl::Duration timeout) const {
  return prefetch_ == nullptr || prefetch_->Wait(timeout);
}

void Client::CountMap() {
  absl::MutexLock lock(&stats_mu_);
  ++stats_.staging_maps;
}

absl::StatusOr<MappedStaging*> Client::SaveMappingLocked(const std::string& name, uint64_t size,
                                                         bool pin) {
  // A region name never changes size (the agent's pool replaces a region that must grow by
  // one with a new name), so a mapping of the same name that is large enough is still valid.
  for (auto it = staging_.begin(); it != staging_.end(); ++it) {
    if ((*it)->name() != name) continue;
    if ((*it)->size() >= size && ((*it)->pinned() || !pin)) {
      std::rotate(it, it + 1, staging_.end());  // the latest last
      return staging_.back().get();
    }
    staging_.erase(it);
    break;
  }
  // Unmap the oldest first when two are held: the agent has let it go, and our mapping alone
  // would keep its memory alive.
  if (staging_.size() >= kMaxSaveMappings) staging_.erase(staging_.begin());
  ASSIGN_OR_RETURN(std::unique_ptr<MappedStaging> mapped, MapStaging(name, size, pin));
  staging_.push_back(std::move(mapped));
  CountMap();
  return staging_.back().get();
}

absl::Status Client::CopyLocked(absl::Span<const TensorRef> tensors,
                                const std::vector<char*>& slot_data, bool to_staging,
                                bool staging_pinned) {
  std::vector<CopyItem> host;
  std::vector<CopyItem> to_devices;  // a load's copies into device memory
  host.reserve(tensors.size());
  absl::Status status;
  for (size_t i = 0; i < tensors.size() && status.ok(); ++i) {
    const TensorRef& t = tensors[i];
    char* slot = slot_data[i];
    if (slot == nullptr || t.nbytes == 0) continue;
    if (t.memory == Memory::kCuda) {
      if (to_staging) {
        status = device_.ToHost(slot, t.data, t.nbytes);
      } else if (staging_pinned) {  // queued at the link's speed; no bounce needed
        status = device_.ToDevice(t.data, slot, t.nbytes);
      } else {
        status = DeviceCopier::DeviceOf(t.data).status();  // named here; copied below
        to_devices.push_back(CopyItem{t.data, slot, t.nbytes});
      }
      if (!status.ok()) {
        status = Prefixed(absl::StrCat("copying \"", t.fqn, "\" (tensor ", i, "): "), status);
      }
    } else {
      host.push_back(to_staging ? CopyItem{slot, t.data, t.nbytes}
                                : CopyItem{t.data, slot, t.nbytes});
    }
  }
  if (status.ok() && !to_devices.empty()) status = CopyToDevicesLocked(to_devices);
  // Host copies overlap the device copies already queued (a save's).
  const int threads =
      status.ok() ? ParallelCopy(host, copy_threads_, options_.parallel_copy_min_bytes) : 0;
  // Always drain the streams: no copy may still run when memory is unmapped or reused.
  absl::Status synced = device_.Synchronize();
  if (status.ok()) status = synced;
  if (status.ok() && to_staging) {
    absl::MutexLock lock(&stats_mu_);
    stats_.last_copy_threads = threads;
  }
  return status;
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
    if (!result.ok()) return Prefixed("copying a load into device memory: ", result);
  }
  return absl::OkStatus();
}

absl::Status Client::RefuseSave(int64_t step, absl::Status refusal) {
  if (refusal.ok() || step < 0) return refusal;
  v1::RefuseSaveRequest request;
  request.set_step(step);
  v1::ErrorDetail* error = request.mutable_error();
  *error = GetErrorDetail(refusal).value_or(v1::ErrorDetail());
  if (error->code() == v1::ERROR_CODE_UNSPECIFIED) error->set_code(v1::ERROR_CODE_MALFORMED_SHARD);
  error->set_message(std::string(refusal.message()));
  grpc::ClientContext context;
  SetTimeout(&context, options_.refuse_timeout);
  v1::RefuseSaveResponse response;
  if (grpc::Status told = stub_->RefuseSave(&context, request, &response); !told.ok()) {
    LogWarning("could not tell the other ranks that this rank refused step ", step, " (",
               told.error_message(), "); they wait for it until the planning timeout");
  }
  return refusal;
}

absl::StatusOr<SaveResult> Client::Save(int64_t step, absl::Span<const TensorRef> tensors,
                                        SaveOptions save_options) {
  const absl::Time start = absl::Now();
  if (step < 0) {
    return MakeError(absl::StatusCode::kInvalidArgument, v1::ERROR_CODE_MALFORMED_SHARD,
                     absl::StrCat("step must be >= 0, not ", step));
  }
  // What this rank refuses of its own tensors ends the step's save for every rank at once.
  absl::StatusOr<std::vector<v1::ShardDesc>> described = DescribeShards(identity_.layout(), tensors);
  if (!described.ok()) return RefuseSave(step, described.status());
  std::vector<v1::ShardDesc> shards = *std::move(described);
  const bool cuda = AnyCuda(tensors);
  if (cuda) {
    if (absl::Status checked = CheckCudaTensors(tensors); !checked.ok()) {
      return RefuseSave(step, checked);
    }
  }
  // Before BeginSave: a failed kernel then fails Save before a session waits for this rank.
  if (cuda && options_.synchronize_devices) {
    if (absl::Status synced = WaitForDevices(tensors); !synced.ok()) {
      return RefuseSave(step, synced);
    }
  }

  v1::BeginSaveRequest request;
  request.set_step(step);
  request.set_memory_only(save_options.memory_only);
  request.mutable_shards()->Reserve(static_cast<int>(shards.size()));
  for (v1::ShardDesc& s : shards) *request.add_shards() = std::move(s);
  shards.clear();
  if (absl::Status sized = CheckRequestSize("save", request.ByteSizeLong(),
                                            request.shards_size(), options_.max_plan_request_bytes);
      !sized.ok()) {
    return RefuseSave(step, sized);
  }

  absl::MutexLock lock(&mu_);
  JoinReleaserLocked();  // the last load's release, before anything stages
  EndResidentMappingLocked();
  v1::BeginSaveResponse response;
  {
    grpc::ClientContext context;
    SetTimeout(&context, options_.begin_save_timeout);
    grpc::Status status = stub_->BeginSave(&context, request, &response);
    if (!status.ok()) return FromGrpcStatus(status);
  }
  std::vector<bool> absent(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) absent[i] = tensors[i].state_absent;
  ASSIGN_OR_RETURN(const uint64_t total, CheckSlots("BeginSave", response.slots(), request.shards(),
                                                    absent, response.shm_size()));

  std::vector<char*> slot_data(tensors.size(), nullptr);
  if (total > 0) {
    ASSIGN_OR_RETURN(
        MappedStaging * mapping,
        SaveMappingLocked(response.shm_name(), response.shm_size(), cuda && options_.pin_staging));
    char* base = static_cast<char*>(mapping->data());
    for (size_t i = 0; i < tensors.size(); ++i) {
      slot_data[i] = base + response.slots(static_cast<int>(i)).offset();
    }
  }
  const absl::Time copy_start = absl::Now();
  RETURN_IF_ERROR(CopyLocked(tensors, slot_data, /*to_staging=*/true,
                             /*staging_pinned=*/cuda && options_.pin_staging));
  const absl::Duration copy = absl::Now() - copy_start;

  {
    v1::StagedRequest staged;
    staged.set_session_id(response.session_id());
    staged.set_trainer_stall_ns(
        static_cast<uint64_t>(absl::ToInt64Nanoseconds(absl::Now() - start)));
    v1::StagedResponse staged_response;
    grpc::ClientContext context;
    SetTimeout(&context, options_.staged_timeout);
    grpc::Status status = stub_->Staged(&context, staged, &staged_response);
    if (!status.ok()) return FromGrpcStatus(status);
  }
  {
    absl::MutexLock stats_lock(&stats_mu_);
    ++stats_.saves;
  }
  SaveResult result;
  result.session_id = response.session_id();
  result.plan_cached = response.plan_cached();
  result.stall = absl::Now() - start;
  result.copy = copy;
  return result;
}

absl::Status Client::ReserveStaging(absl::Span<const TensorRef> tensors) {
  const StagingDeclaration declared = DeclareStaging(tensors);
  if (declared.bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("ReserveStaging: the ", tensors.size(), " tensors hold no bytes to stage"));
  }
  v1::ReserveStagingRequest request;
  request.set_bytes(declared.bytes);
  request.set_tensors(declared.tensors);
  request.set_gather_bytes(declared.gather_bytes);
  absl::MutexLock lock(&mu_);
  JoinReleaserLocked();  // the last load's release, before anything stages
  EndResidentMappingLocked();
  v1::ReserveStagingResponse response;
  {
    grpc::ClientContext context;
    SetTimeout(&context, options_.reserve_staging_timeout);
    grpc::Status status = stub_->ReserveStaging(&context, request, &response);
    if (!status.ok()) return Prefixed("ReserveStaging: ", FromGrpcStatus(status));
  }
  // Pinned as a save with CUDA tensors maps it, where a GPU could use it.
  const bool pin = options_.pin_staging && identity_.has_gpu();
  for (const v1::StagingRegion& region : response.regions()) {
    RETURN_IF_ERROR(SaveMappingLocked(region.shm_name(), region.shm_size(), pin).status());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Client::WaitCommitted(int64_t step, absl::Duration timeout) {
  if (timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("WaitCommitted needs a positive timeout, not ",
                                                   absl::FormatDuration(timeout)));
  }
  v1::WaitCommittedRequest request;
  request.set_step(step);
  grpc::ClientContext context;
  if (timeout != absl::InfiniteDuration()) {
    // Round up so a sub-millisecond timeout does not become "no limit" (0).
    const double ms = std::ceil(absl::ToDoubleMilliseconds(timeout));
    request.set_timeout_ms(
        static_cast<uint32_t>(std::min<double>(ms, std::numeric_limits<uint32_t>::max())));
    SetTimeout(&context, timeout + options_.wait_committed_grace);
  }
  v1::WaitCommittedResponse response;
  grpc::Status status = stub_->WaitCommitted(&context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response.checkpoint_dir();
}

absl::StatusOr<LoadResult> Client::Load(int64_t step, absl::Span<const TensorRef> into) {
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
  ASSIGN_OR_RETURN(std::vector<v1::ShardDesc> shards, DescribeShards(identity_.layout(), into));
  if (AnyCuda(into)) RETURN_IF_ERROR(CheckCudaTensors(into));

  v1::LoadRequest request;
  request.set_step(step);
  request.mutable_shards()->Reserve(static_cast<int>(shards.size()));
  for (v1::ShardDesc& s : shards) *request.add_shards() = std::move(s);
  shards.clear();
  // Device copies read the region on the GPU's time: only host destinations are checked (and
  // fetched from other nodes) here.
  request.set_client_verifies(!AnyCuda(into));
  request.set_client_fetches(!AnyCuda(into));
  RETURN_IF_ERROR(CheckRequestSize("load", request.ByteSizeLong(), request.shards_size(),
                                   options_.max_plan_request_bytes));

  // One deadline for the load, its retries and its fetch included.
  const absl::Time deadline = absl::Now() + options_.load_timeout;
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
  // as a successful load does; an error return unmaps `temporary`, below, first).
  absl::Cleanup release_on_exit = [&] { ReleaseInBackgroundLocked(response.load_id(), nullptr); };

  LoadResult result;
  result.step = response.step();
  result.bytes_from_memory = response.bytes_from_memory();
  result.bytes_from_disk = response.bytes_from_disk();
  result.memory_blocks_rejected = response.memory_blocks_rejected();
  result.bytes_fetched_from_peers = response.bytes_fetched_from_peers();
  result.memory_only = response.memory_only();
  std::vector<bool> absent(into.size(), false);
  for (uint32_t index : response.absent()) {
    if (index >= into.size() || absent[index] ||
        request.shards(static_cast<int>(index)).kind() == v1::SHARD_KIND_PARAM) {
      return absl::InternalError(
          absl::StrCat("the agent's Load reply marks shard ", index,
                       " absent, which is not a distinct optimizer or extra shard of the ",
                       into.size(), " requested"));
    }
    absent[index] = true;
  }
  for (size_t i = 0; i < into.size(); ++i) {
    if (absent[i]) result.absent.push_back(i);
  }
  ASSIGN_OR_RETURN(const uint64_t total, CheckSlots("Load", response.slots(), request.shards(),
                                                    absent, response.shm_size()));

  // A load of no tensors only asks which step (the Python client's latest()): the mapping made
  // at Connect goes on being faulted in and checked for the load that follows.
  if (into.empty()) return result;

  // The mapping made at Connect serves every load the agent serves from that region (the
  // Python client's objects take three); the first load served from another ends it. Taken
  // here, its check stops: a listing still awaited would be of no use (and the agent answers
  // it only after this load), so it is cancelled, not waited for.
  if (resident_.mapping == nullptr && prefetch_ != nullptr) {
    CancelListing();
    resident_ = prefetch_->Take();
  }
  if (resident_.mapping != nullptr &&
      !Maps(*resident_.mapping, response.shm_name(), response.shm_size())) {
    EndResidentMappingLocked();
  }

  if (response.has_fetch()) {
    if (!request.client_fetches() || response.unverified_blocks_size() == 0 ||
        !response.shm_name().empty()) {
      return absl::InternalError(absl::StrCat(
          "the agent's Load reply names a memory copy of ", response.fetch().copy().file(),
          " to read from ", response.fetch().copy().bulk_address(),
          request.client_fetches() ? " but no blocks to check, or a region too"
                                   : ", which this client did not offer to (CUDA destinations)"));
    }
    std::vector<SlotCopy> slots;
    std::vector<BlockCheck> blocks;
    for (size_t i = 0; i < into.size(); ++i) {
      if (absent[i] || into[i].nbytes == 0) continue;
      slots.push_back(
          SlotCopy{into[i].data, response.slots(static_cast<int>(i)).offset(), into[i].nbytes});
    }
    for (const v1::BlockCheck& block : response.unverified_blocks()) {
      blocks.push_back(BlockCheck{block.offset(), block.length(), block.xxh3()});
    }
    // The agent's reply is checked here, so that every error of the fetch below is the
    // holder's or the network's, which the agent may not meet (it loads again).
    if (absl::Status bad = SlotsByBlock(response.shm_size(), slots, blocks).status(); !bad.ok()) {
      return absl::InternalError(absl::StrCat("the agent's Load reply: ", bad.message()));
    }
    if (response.fetch().copy().nbytes() != response.shm_size()) {
      return absl::InternalError(absl::StrCat(
          "the agent's Load reply names a copy of ", response.fetch().copy().nbytes(),
          " bytes but places its slots in ", response.shm_size()));
    }
    const absl::Time fetch_start = absl::Now();
    absl::StatusOr<VerifiedCopyResult> fetched =
        FetchVerified(response.fetch().job_id(), response.fetch().copy(), slots, blocks,
                      kFetchStreams, TimeLimit(deadline, kFetchStall));
    if (!fetched.ok()) {
      retry->fetch_error = fetched.status();
      retry->fetch_holder = response.fetch().copy().bulk_address();
      return result;
    }
    result.fetch_time = absl::Now() - fetch_start;
    retry->mismatched = fetched->mismatched.size();
    for (const BlockCheck& block : blocks) result.bytes_verified_by_client += block.length;
    result.bytes_fetched_by_client = result.bytes_verified_by_client;  // the blocks it read
    return result;  // the release runs in the background (release_on_exit)
  }

  const absl::Time copy_start = absl::Now();
  std::vector<char*> slot_data(into.size(), nullptr);
  // A load region other than a cached save region is mapped only for this load: loads are
  // rare, and the agent frees that region after ReleaseLoad. A region served in place (the
  // agent's resident copy) is often one of the cached save mappings: it is only read here, as
  // every load region is. Declared after release_on_exit, so on an error return it is
  // unmapped before the release too.
  std::unique_ptr<MappedStaging> temporary;
  const char* region_base = nullptr;
  bool region_pinned = false;  // page-locked in this process (a save mapping of CUDA saves)
  bool region_resident = false;  // read through resident_.mapping
  if (total > 0) {
    char* base = nullptr;
    auto cached = std::find_if(staging_.begin(), staging_.end(), [&](const auto& m) {
      return Maps(*m, response.shm_name(), response.shm_size());
    });
    if (cached != staging_.end()) {
      base = static_cast<char*>((*cached)->data());
      region_pinned = (*cached)->pinned();
    } else if (resident_.mapping != nullptr) {
      base = static_cast<char*>(resident_.mapping->data());
      region_resident = true;
      // Final: the first load's Take stopped it.
      result.prefetched_bytes = prefetch_->progress().populated_bytes;
      absl::MutexLock lock(&stats_mu_);
      ++stats_.prefetched_loads;
    } else {
      // Read-only, not pre-faulted: the copy threads fault the pages in as they read them,
      // in parallel and overlapped with the copy, instead of one serial pass before it.
      MapStagingOptions map_options;
      map_options.read_only = true;
      map_options.populate = false;
      ASSIGN_OR_RETURN(temporary,
                       MappedStaging::Map(response.shm_name(), response.shm_size(), map_options));
      CountMap();
      // Only read (CopyLocked with to_staging = false copies out of the slots).
      base = static_cast<char*>(temporary->data());
    }
    for (size_t i = 0; i < into.size(); ++i) {
      if (!absent[i]) slot_data[i] = base + response.slots(static_cast<int>(i)).offset();
    }
    region_base = base;
  }
  if (response.unverified_blocks_size() > 0) {
    if (!request.client_verifies()) {
      return absl::InternalError(absl::StrCat(
          "the agent's Load reply leaves ", response.unverified_blocks_size(),
          " blocks for this client to check, which it did not offer to (CUDA destinations)"));
    }
    if (region_base == nullptr) {
      return absl::InternalError(absl::StrCat("the agent's Load reply leaves ",
                                              response.unverified_blocks_size(),
                                              " blocks to check but no shard has bytes"));
    }
    std::vector<SlotCopy> slots;
    std::vector<BlockCheck> blocks;
    slots.reserve(into.size());
    for (size_t i = 0; i < into.size(); ++i) {
      if (slot_data[i] == nullptr || into[i].nbytes == 0) continue;
      slots.push_back(
          SlotCopy{into[i].data, response.slots(static_cast<int>(i)).offset(), into[i].nbytes});
    }
    blocks.reserve(response.unverified_blocks_size());
    for (const v1::BlockCheck& block : response.unverified_blocks()) {
      blocks.push_back(BlockCheck{block.offset(), block.length(), block.xxh3()});
      result.bytes_verified_by_client += block.length();
    }
    absl::StatusOr<VerifiedCopyResult> copied =
        VerifiedCopy(region_base, response.shm_size(), slots, blocks,
                     region_resident ? absl::MakeConstSpan(resident_.checked)
                                     : absl::Span<const BlockCheck>(),
                     copy_threads_, options_.parallel_copy_min_bytes);
    if (!copied.ok()) {
      return absl::InternalError(
          absl::StrCat("the agent's Load reply: ", copied.status().message()));
    }
    retry->mismatched = copied->mismatched.size();
    result.checked_ahead_bytes = copied->checked_ahead_bytes;
  } else {
    // Kernels the trainer queued that write these tensors (their initialisation) end before
    // the copies into them begin, on streams not ordered after the trainer's.
    if (options_.synchronize_devices && AnyCuda(into)) RETURN_IF_ERROR(WaitForDevices(into));
    RETURN_IF_ERROR(CopyLocked(into, slot_data, /*to_staging=*/false, region_pinned));
  }
  result.copy_time = absl::Now() - copy_start;
  // `into` is filled: unmapping and the release need not hold the trainer.
  std::move(release_on_exit).Cancel();
  ReleaseInBackgroundLocked(response.load_id(), std::move(temporary));
  return result;
}

}  // namespace tessera
