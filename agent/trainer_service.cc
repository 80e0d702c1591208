#include "agent/trainer_service.h"

#include "common/grpc_reactors.h"
#include "common/grpc_status.h"

namespace tessera {
namespace {


}  // namespace

TrainerService::TrainerService(SaveExecutor* executor, Loader* loader,
                               v1::AgentIdentity identity)
    : executor_(executor), loader_(loader), identity_(std::move(identity)) {
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

grpc::ServerUnaryReactor* TrainerService::GetInfo(grpc::CallbackServerContext* context,
                                                  const v1::GetInfoRequest*,
                                                  v1::AgentIdentity* response) {
  *response = identity_;
  return FinishUnary(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* TrainerService::BeginSave(grpc::CallbackServerContext* context,
                                                    const v1::BeginSaveRequest* request,
                                                    v1::BeginSaveResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  executor_->BeginSave(*request, [reactor, response](absl::StatusOr<v1::BeginSaveResponse> r) {
    if (r.ok()) *response = *std::move(r);
    reactor->Finish(ToGrpcStatus(r.status()));
  });
  return reactor;
}

grpc::ServerUnaryReactor* TrainerService::Staged(grpc::CallbackServerContext* context,
                                                 const v1::StagedRequest* request,
                                                 v1::StagedResponse*) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  executor_->Staged(request->session_id(), request->trainer_stall_ns(),
                    [reactor](absl::Status s) { reactor->Finish(ToGrpcStatus(s)); });
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
                             }
                             reactor->Finish(ToGrpcStatus(dir.status()));
                           });
  return reactor;
}

grpc::ServerUnaryReactor* TrainerService::Load(grpc::CallbackServerContext* context,
                                               const v1::LoadRequest* request,
                                               v1::LoadResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::MutexLock lock(&mu_);
  loads_.push_back([this, reactor, request, response] {
    absl::StatusOr<v1::LoadResponse> loaded = loader_->Load(*request);
    if (loaded.ok()) *response = *std::move(loaded);
    reactor->Finish(ToGrpcStatus(loaded.status()));
  });
  return reactor;
}

grpc::ServerUnaryReactor* TrainerService::ReleaseLoad(grpc::CallbackServerContext* context,
                                                      const v1::ReleaseLoadRequest* request,
                                                      v1::ReleaseLoadResponse*) {
  loader_->Release(request->load_id());
  return FinishUnary(context, absl::OkStatus());
}

}  // namespace tessera
