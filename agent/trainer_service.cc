#include "agent/trainer_service.h"

#include <algorithm>
#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "agent/save/staging_layout.h"
#include "common/grpc_reactors.h"
#include "common/log.h"
#include "common/grpc_status.h"

namespace tessera {
namespace {

// BeginSave blocks until every rank pinned. If the trainer dies (or cancels) meanwhile, or
// before the slots reach it, the executor is told at once (OnCancel), so the session aborts
// with AGENT_LOST instead of waiting for the coordinator's COPYING timeout.
class BeginSaveReactor : public grpc::ServerUnaryReactor {
 public:
  explicit BeginSaveReactor(SaveExecutor* executor)
      : executor_(executor), call_(std::make_shared<Call>()) {}

  void Start(const v1::BeginSaveRequest& request, v1::BeginSaveResponse* response) {
    // Once BeginSave is called the reactor may finish and be deleted at any moment: only
    // locals are used afterwards.
    SaveExecutor* const executor = executor_;
    const std::shared_ptr<Call> call = call_;
    const uint64_t ticket =
        executor->BeginSave(request, [this, response](absl::StatusOr<v1::BeginSaveResponse> r) {
          if (r.ok()) *response = *std::move(r);
          Finish(ToGrpcStatus(r.status()));
        });
    absl::MutexLock lock(&call->mu);
    call->ticket = ticket;
    if (call->cancelled) executor->TrainerGone(ticket);
  }

  void OnCancel() override {
    absl::MutexLock lock(&call_->mu);
    call_->cancelled = true;
    if (call_->ticket != 0) executor_->TrainerGone(call_->ticket);
  }

  void OnDone() override { delete this; }

 private:
  struct Call {
    absl::Mutex mu;
    uint64_t ticket ABSL_GUARDED_BY(mu) = 0;
    bool cancelled ABSL_GUARDED_BY(mu) = false;
  };
  SaveExecutor* const executor_;
  const std::shared_ptr<Call> call_;
};

}  // namespace

TrainerService::TrainerService(SaveExecutor* executor, Loader* loader,
                               v1::AgentIdentity identity, StagingPool* staging,
                               int staging_sets, const MemoryTier* memory,
                               TrainerServiceOptions options)
    : executor_(executor),
      loader_(loader),
      identity_(std::move(identity)),
      staging_(staging),
      staging_sets_(staging_sets),
      memory_(memory),
      options_(std::move(options)) {
  load_worker_ = std::thread([this] { RunLoads(); });
}

TrainerService::~TrainerService() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  load_worker_.join();
}

void TrainerService::RunLoads() {
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !loads_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (stop_ && loads_.empty()) return;
      task = std::move(loads_.front());
      loads_.pop_front();
    }
    task();
  }
}

absl::Status TrainerService::Admitted() const {
  return options_.admission ? options_.admission() : absl::OkStatus();
}

grpc::ServerUnaryReactor* TrainerService::GetInfo(grpc::CallbackServerContext* context,
                                                  const v1::GetInfoRequest*,
                                                  v1::AgentIdentity* response) {
  if (absl::Status admitted = Admitted(); !admitted.ok()) return FinishUnary(context, admitted);
  *response = identity_;
  if (memory_ != nullptr) {
    if (std::optional<ResidentCheckpoint> resident = memory_->Current(); resident.has_value()) {
      response->set_resident_shm_name(resident->region.name);
      response->set_resident_shm_size(resident->region.capacity);
      response->set_resident_bytes(resident->nbytes);
    }
  }
  return FinishUnary(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* TrainerService::RefuseSave(grpc::CallbackServerContext* context,
                                                     const v1::RefuseSaveRequest* request,
                                                     v1::RefuseSaveResponse*) {
  if (absl::Status admitted = Admitted(); !admitted.ok()) return FinishUnary(context, admitted);
  if (request->step() < 0 || request->error().code() == v1::ERROR_CODE_UNSPECIFIED) {
    return FinishUnary(context, absl::InvalidArgumentError(absl::StrCat(
                                    "RefuseSave needs a step >= 0 (not ", request->step(),
                                    ") and an error with a code")));
  }
  if (!options_.refuse_save) {
    return FinishUnary(context, absl::UnimplementedError("this agent cannot pass on refusals"));
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  Queue([this, reactor, request] { reactor->Finish(ToGrpcStatus(options_.refuse_save(*request))); });
  return reactor;
}

grpc::ServerUnaryReactor* TrainerService::BeginSave(grpc::CallbackServerContext* context,
                                                    const v1::BeginSaveRequest* request,
                                                    v1::BeginSaveResponse* response) {
  if (absl::Status admitted = Admitted(); !admitted.ok()) return FinishUnary(context, admitted);
  auto* reactor = new BeginSaveReactor(executor_);
  reactor->Start(*request, response);
  return reactor;
}

grpc::ServerUnaryReactor* TrainerService::Staged(grpc::CallbackServerContext* context,
                                                 const v1::StagedRequest* request,
                                                 v1::StagedResponse*) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  std::optional<v1::ErrorDetail> withdrawn;
  if (request->withdrawn().code() != v1::ERROR_CODE_UNSPECIFIED) withdrawn = request->withdrawn();
  executor_->Staged(request->session_id(), request->trainer_stall_ns(),
                    [reactor](absl::Status s) { reactor->Finish(ToGrpcStatus(s)); },
                    std::move(withdrawn));
  return reactor;
}

grpc::ServerUnaryReactor* TrainerService::WaitCommitted(grpc::CallbackServerContext* context,
                                                        const v1::WaitCommittedRequest* request,
                                                        v1::WaitCommittedResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::Time deadline = absl::FromChrono(context->deadline());
  if (request->timeout_ms() > 0) {
    deadline = std::min(deadline, absl::Now() + absl::Milliseconds(request->timeout_ms()));
  }
  const int64_t step = request->step();
  executor_->WaitCommitted(step, deadline,
                           [reactor, response, step](absl::StatusOr<std::string> dir) {
                             if (dir.ok()) {
                               response->set_checkpoint_dir(*dir);
                               response->set_step(step);
                               // A disk commit always names its directory.
                               response->set_memory_only(dir->empty());
                             }
                             reactor->Finish(ToGrpcStatus(dir.status()));
                           });
  return reactor;
}

grpc::ServerUnaryReactor* TrainerService::Load(grpc::CallbackServerContext* context,
                                               const v1::LoadRequest* request,
                                               v1::LoadResponse* response) {
  if (absl::Status admitted = Admitted(); !admitted.ok()) return FinishUnary(context, admitted);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  Queue([this, reactor, request, response] {
    absl::StatusOr<v1::LoadResponse> loaded = loader_->Load(*request);
    if (loaded.ok()) *response = *std::move(loaded);
    reactor->Finish(ToGrpcStatus(loaded.status()));
  });
  return reactor;
}

grpc::ServerUnaryReactor* TrainerService::ListResidentBlocks(
    grpc::CallbackServerContext* context, const v1::ListResidentBlocksRequest*,
    v1::ListResidentBlocksResponse* response) {
  if (absl::Status admitted = Admitted(); !admitted.ok()) return FinishUnary(context, admitted);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  Queue([this, reactor, response] {
    absl::StatusOr<v1::ListResidentBlocksResponse> listed = loader_->ResidentBlocks();
    if (listed.ok()) *response = *std::move(listed);
    reactor->Finish(ToGrpcStatus(listed.status()));
  });
  return reactor;
}

grpc::ServerUnaryReactor* TrainerService::ReserveStaging(
    grpc::CallbackServerContext* context, const v1::ReserveStagingRequest* request,
    v1::ReserveStagingResponse* response) {
  if (absl::Status admitted = Admitted(); !admitted.ok()) return FinishUnary(context, admitted);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  Queue([this, reactor, request, response] {
    absl::StatusOr<uint64_t> reserved =
        ReservedStagingBytes(request->bytes(), request->gather_bytes(), request->tensors());
    absl::Status status = reserved.status();
    if (reserved.ok()) {
      const uint64_t bytes = *reserved;
      absl::StatusOr<std::vector<StagingSlot>> regions = staging_->Reserve(bytes, staging_sets_);
      status = regions.status();
      if (regions.ok()) {
        for (const StagingSlot& region : *regions) {
          v1::StagingRegion* out = response->add_regions();
          out->set_shm_name(region.name);
          out->set_shm_size(region.capacity);
        }
        LogInfo("staging reserved ahead of the first save: ", regions->size(), " region(s) of ",
                bytes, " bytes for ", request->tensors(), " tensors of ", request->bytes(),
                " bytes and ", request->gather_bytes(), " for DP peers' slices");
      }
    }
    reactor->Finish(ToGrpcStatus(status));
  });
  return reactor;
}

void TrainerService::Queue(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  loads_.push_back(std::move(task));
}

grpc::ServerUnaryReactor* TrainerService::ReleaseLoad(grpc::CallbackServerContext* context,
                                                      const v1::ReleaseLoadRequest* request,
                                                      v1::ReleaseLoadResponse*) {
  loader_->Release(request->load_id());
  return FinishUnary(context, absl::OkStatus());
}

}  // namespace tessera
