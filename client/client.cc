// Client, part 1: connection, save, wait, and the plumbing both parts share — the staging
// mappings, the background release, the copies between tensors and staging, and the checks of
// client/client_internal.h. Part 2, the load, is client/client_load.cc.
#include "client/client.h"

#include <sys/un.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/client_internal.h"
#include "client/overlapped_save.h"
#include "client/parallel_copy.h"
#include "client/staging_estimate.h"
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

using client_internal::AnyCuda;
using client_internal::CheckCudaTensors;
using client_internal::CheckRequestSize;
using client_internal::CheckSlots;
using client_internal::Prefixed;
using client_internal::WaitForDevices;

namespace {

// Save regions kept mapped: the memory tier alternates between two.
constexpr size_t kMaxSaveMappings = 2;

// The agent lists its resident checkpoint's blocks from the manifest (a file read) on its
// load thread: long enough for a large manifest behind another load. (A Save, or the
// destructor, cancels the call rather than wait for it: Client::CancelListing.)
constexpr absl::Duration kListResidentBlocksTimeout = absl::Seconds(30);

void SetTimeout(grpc::ClientContext* context, absl::Duration timeout) {
  if (timeout != absl::InfiniteDuration()) {
    context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  }
}

// `status`'s ErrorDetail with its message, its code `fallback` where it carries none: what
// the agent is told of a refusal or a withdrawal.
v1::ErrorDetail DetailOf(const absl::Status& status, v1::ErrorCode fallback) {
  v1::ErrorDetail detail = GetErrorDetail(status).value_or(v1::ErrorDetail());
  if (detail.code() == v1::ERROR_CODE_UNSPECIFIED) detail.set_code(fallback);
  detail.set_message(std::string(status.message()));
  return detail;
}

}  // namespace

namespace client_internal {

absl::Status Prefixed(absl::string_view prefix, const absl::Status& status) {
  absl::Status out(status.code(), absl::StrCat(prefix, status.message()));
  status.ForEachPayload(
      [&](absl::string_view url, const absl::Cord& payload) { out.SetPayload(url, payload); });
  return out;
}

bool AnyCuda(absl::Span<const TensorRef> tensors) {
  for (const TensorRef& t : tensors) {
    if (t.memory == Memory::kCuda) return true;
  }
  return false;
}

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

}  // namespace client_internal

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
  // An overlapped save not yet fenced is refused, never staged (the trainer is going away
  // and no longer vouches for its state): edge 6 of client/overlapped_save.h.
  std::vector<std::pair<std::shared_ptr<OverlappedSave>, std::thread>> threads;
  {
    absl::MutexLock lock(&overlap_mu_);
    closing_ = true;
    for (grpc::ClientContext* call : calls_) call->TryCancel();
    threads = std::move(save_threads_);
  }
  for (auto& [save, thread] : threads) {
    if (!save->fenced()) {
      // Gives the verdict once the copy ended (the save thread no longer waits for a
      // cancelled BeginSave, nor for other ranks).
      save->Fence(MakeError(absl::StatusCode::kAborted, v1::ERROR_CODE_AGENT_LOST,
                            absl::StrCat("the trainer of rank ", identity_.coord().rank(),
                                         " ended before its overlapped save of step ",
                                         save->step(), " was fenced")))
          .IgnoreError();
    }
    thread.join();
  }
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

absl::Status Client::RefuseSave(int64_t step, absl::Status refusal) {
  if (refusal.ok() || step < 0) return refusal;
  v1::RefuseSaveRequest request;
  request.set_step(step);
  *request.mutable_error() = DetailOf(refusal, v1::ERROR_CODE_MALFORMED_SHARD);
  grpc::ClientContext context;
  SetTimeout(&context, options_.refuse_timeout);
  v1::RefuseSaveResponse response;
  if (grpc::Status told = stub_->RefuseSave(&context, request, &response); !told.ok()) {
    LogWarning("could not tell the other ranks that this rank refused step ", step, " (",
               told.error_message(), "); they wait for it until the planning timeout");
  }
  return refusal;
}

absl::StatusOr<v1::BeginSaveRequest> Client::PrepareSave(int64_t step,
                                                         absl::Span<const TensorRef> tensors,
                                                         const SaveOptions& save_options,
                                                         bool* cuda) {
  if (step < 0) {
    return MakeError(absl::StatusCode::kInvalidArgument, v1::ERROR_CODE_MALFORMED_SHARD,
                     absl::StrCat("step must be >= 0, not ", step));
  }
  // What this rank refuses of its own tensors ends the step's save for every rank at once.
  absl::StatusOr<std::vector<v1::ShardDesc>> described = DescribeShards(identity_.layout(), tensors);
  if (!described.ok()) return RefuseSave(step, described.status());
  std::vector<v1::ShardDesc> shards = *std::move(described);
  *cuda = AnyCuda(tensors);
  if (*cuda) {
    if (absl::Status checked = CheckCudaTensors(tensors); !checked.ok()) {
      return RefuseSave(step, checked);
    }
  }
  // Before BeginSave: a failed kernel then fails Save before a session waits for this rank.
  // An overlapped save orders its copies after the caller's stream by an event instead.
  if (*cuda && options_.synchronize_devices && !save_options.overlap) {
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
  return request;
}

absl::StatusOr<Client::Begun> Client::BeginAndCopyLocked(const v1::BeginSaveRequest& request,
                                                         absl::Span<const TensorRef> tensors,
                                                         bool cuda, OverlappedSave* progress) {
  JoinReleaserLocked();  // the last load's release, before anything stages
  EndResidentMappingLocked();
  v1::BeginSaveResponse response;
  {
    grpc::ClientContext context;
    SetTimeout(&context, options_.begin_save_timeout);
    if (progress != nullptr && !TrackCall(&context)) {
      return absl::CancelledError("the client is being destroyed");
    }
    grpc::Status status = stub_->BeginSave(&context, request, &response);
    if (progress != nullptr) UntrackCall(&context);
    if (!status.ok()) return FromGrpcStatus(status);
  }
  if (progress != nullptr) progress->Copying();
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
  return Begun{response.session_id(), response.plan_cached(), absl::Now() - copy_start};
}

absl::Status Client::ReportStaged(const std::string& session_id, absl::Duration stall) {
  v1::StagedRequest staged;
  staged.set_session_id(session_id);
  staged.set_trainer_stall_ns(static_cast<uint64_t>(absl::ToInt64Nanoseconds(stall)));
  v1::StagedResponse staged_response;
  grpc::ClientContext context;
  SetTimeout(&context, options_.staged_timeout);
  grpc::Status status = stub_->Staged(&context, staged, &staged_response);
  if (!status.ok()) return FromGrpcStatus(status);
  absl::MutexLock stats_lock(&stats_mu_);
  ++stats_.saves;
  return absl::OkStatus();
}

absl::Status Client::WithdrawStaged(const std::string& session_id, const absl::Status& why) {
  v1::StagedRequest withdrawn;
  withdrawn.set_session_id(session_id);
  *withdrawn.mutable_withdrawn() = DetailOf(why, v1::ERROR_CODE_STATE_CHANGED);
  v1::StagedResponse response;
  grpc::ClientContext context;
  SetTimeout(&context, options_.staged_timeout);
  return FromGrpcStatus(stub_->Staged(&context, withdrawn, &response));
}

absl::StatusOr<SaveResult> Client::Save(int64_t step, absl::Span<const TensorRef> tensors,
                                        SaveOptions save_options) {
  const absl::Time start = absl::Now();
  if (save_options.overlap) {
    std::shared_ptr<OverlappedSave> previous;
    {
      absl::MutexLock lock(&overlap_mu_);
      previous = overlapped_;
    }
    // The trainer calls Save after its optimizer step: the previous save's fence is due.
    if (previous != nullptr && !previous->fenced()) previous->Fence(absl::OkStatus()).IgnoreError();
    if (previous != nullptr && !previous->ended() &&
        save_options.when_busy == SaveOptions::WhenBusy::kSkip) {
      SaveResult result;
      result.overlapped = true;
      result.skipped = absl::StrCat("step ", previous->step(),
                                    "'s save is still in flight (a job has one save at a time)");
      {
        absl::MutexLock lock(&stats_mu_);
        ++stats_.overlap_skips;
      }
      // Off the caller's thread: the other ranks' sessions of `step` end at once with why.
      // (An OverlappedSave that never copies: only its End, which lets the thread be reaped.)
      auto refusal = std::make_shared<OverlappedSave>(step);
      std::thread refuse([this, step, why = result.skipped, refusal] {
        RefuseSave(step, MakeError(absl::StatusCode::kFailedPrecondition,
                                   v1::ERROR_CODE_SESSION_IN_PROGRESS,
                                   absl::StrCat("rank ", identity_.coord().rank(),
                                                " skipped step ", step, ": ", why)))
            .IgnoreError();
        refusal->End(absl::OkStatus());
      });
      absl::MutexLock lock(&overlap_mu_);
      save_threads_.emplace_back(std::move(refusal), std::move(refuse));
      result.stall = absl::Now() - start;
      return result;
    }
    bool cuda = false;
    ASSIGN_OR_RETURN(v1::BeginSaveRequest request,
                     PrepareSave(step, tensors, save_options, &cuda));
    void* cuda_event = nullptr;
    if (cuda) {
      absl::StatusOr<void*> event = DeviceCopier::RecordEvent(save_options.cuda_stream);
      if (!event.ok()) {
        return RefuseSave(step, absl::FailedPreconditionError(absl::StrCat(
                                    "overlapped save: cannot order the copy after the caller's "
                                    "stream: ", event.status().message())));
      }
      cuda_event = *event;
    }
    auto save = std::make_shared<OverlappedSave>(step);
    {
      absl::MutexLock lock(&overlap_mu_);
      // Reap the threads of saves that ended (the previous one at most is still running).
      for (auto it = save_threads_.begin(); it != save_threads_.end();) {
        if (it->first->ended()) {
          it->second.join();
          it = save_threads_.erase(it);
        } else {
          ++it;
        }
      }
      overlapped_ = save;
      std::thread thread(&Client::RunOverlapped, this, save, std::move(previous),
                         std::move(request), std::vector<TensorRef>(tensors.begin(), tensors.end()),
                         cuda, cuda_event);
      save_threads_.emplace_back(save, std::move(thread));
    }
    {
      absl::MutexLock lock(&stats_mu_);
      ++stats_.overlapped_saves;
    }
    SaveResult result;
    result.overlapped = true;
    result.stall = absl::Now() - start;
    save->AddBlocked(result.stall);
    return result;
  }

  bool cuda = false;
  ASSIGN_OR_RETURN(const v1::BeginSaveRequest request,
                   PrepareSave(step, tensors, save_options, &cuda));
  FenceImplicitly();
  {
    // A job has one session at a time: after the last overlapped save's.
    std::shared_ptr<OverlappedSave> previous;
    {
      absl::MutexLock lock(&overlap_mu_);
      previous = overlapped_;
    }
    if (previous != nullptr) previous->AwaitEnded().IgnoreError();
  }
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(const Begun begun, BeginAndCopyLocked(request, tensors, cuda, nullptr));
  RETURN_IF_ERROR(ReportStaged(begun.session_id, absl::Now() - start));
  SaveResult result;
  result.session_id = begun.session_id;
  result.plan_cached = begun.plan_cached;
  result.stall = absl::Now() - start;
  result.copy = begun.copy;
  return result;
}

void Client::RunOverlapped(std::shared_ptr<OverlappedSave> save,
                           std::shared_ptr<OverlappedSave> previous, v1::BeginSaveRequest request,
                           std::vector<TensorRef> tensors, bool cuda, void* cuda_event) {
  const int64_t step = save->step();
  // A job has one session at a time: this one begins when the previous one has ended.
  if (previous != nullptr) previous->AwaitEnded().IgnoreError();
  absl::StatusOr<Begun> begun;
  {
    absl::MutexLock lock(&mu_);
    device_.set_wait_event(cuda_event);
    begun = BeginAndCopyLocked(request, tensors, cuda, save.get());
    device_.set_wait_event(nullptr);
  }
  DeviceCopier::DestroyEvent(cuda_event);
  save->Copied(begun.status(), begun.ok() ? begun->copy : absl::ZeroDuration());
  if (!begun.ok()) {
    // Edge 5. A session that began (its slots handed out) is withdrawn, and waited for, so
    // that the next save does not find it in progress; one that did not has ended already
    // (a refused plan) or ends with the cancelled BeginSave.
    if (save->began()) AwaitWithdrawn(*save, /*session_id=*/"", begun.status());
    save->End(begun.status());
    return;
  }
  const absl::Status verdict = save->AwaitVerdict();
  if (!verdict.ok()) {
    // Edge 6: never staged, so never committed; the agent withdraws this rank's snapshot and
    // the session aborts for every rank with the verdict's reason.
    {
      absl::MutexLock lock(&stats_mu_);
      ++stats_.overlap_refused;
    }
    AwaitWithdrawn(*save, begun->session_id, verdict);
    save->End(verdict);
    return;
  }
  if (absl::Status staged = ReportStaged(begun->session_id, save->blocked()); !staged.ok()) {
    save->End(staged);
    return;
  }
  save->Staged();
  v1::WaitCommittedRequest wait;
  wait.set_step(step);
  v1::WaitCommittedResponse response;
  grpc::ClientContext context;
  if (!TrackCall(&context)) {
    save->End(absl::CancelledError("the client was destroyed before the commit was seen"));
    return;
  }
  const grpc::Status committed = stub_->WaitCommitted(&context, wait, &response);
  UntrackCall(&context);
  save->End(FromGrpcStatus(committed));
}

void Client::AwaitWithdrawn(const OverlappedSave& save, const std::string& session_id,
                            const absl::Status& why) {
  if (!session_id.empty()) WithdrawStaged(session_id, why).IgnoreError();
  v1::WaitCommittedRequest wait;
  wait.set_step(save.step());
  v1::WaitCommittedResponse response;
  grpc::ClientContext context;
  if (!TrackCall(&context)) return;
  stub_->WaitCommitted(&context, wait, &response);  // the session's end, whatever it says
  UntrackCall(&context);
}

bool Client::TrackCall(grpc::ClientContext* context) {
  absl::MutexLock lock(&overlap_mu_);
  if (closing_) return false;
  calls_.push_back(context);
  return true;
}

void Client::UntrackCall(grpc::ClientContext* context) {
  absl::MutexLock lock(&overlap_mu_);
  calls_.erase(std::find(calls_.begin(), calls_.end(), context));
}

absl::Status Client::Fence(absl::Status verdict) {
  std::shared_ptr<OverlappedSave> save;
  {
    absl::MutexLock lock(&overlap_mu_);
    save = overlapped_;
  }
  if (save == nullptr) return absl::OkStatus();
  return save->Fence(std::move(verdict));
}

void Client::FenceImplicitly() {
  std::shared_ptr<OverlappedSave> save;
  {
    absl::MutexLock lock(&overlap_mu_);
    save = overlapped_;
  }
  if (save != nullptr && !save->fenced()) save->Fence(absl::OkStatus()).IgnoreError();
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
  FenceImplicitly();
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
  FenceImplicitly();
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

}  // namespace tessera
