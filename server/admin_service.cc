#include "server/admin_service.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/grpc_reactors.h"
#include "common/grpc_status.h"

namespace tessera {
namespace {


bool Terminal(v1::SessionState state) {
  return state == v1::SESSION_STATE_COMMITTED || state == v1::SESSION_STATE_ABORTED;
}

}  // namespace

// Streams statuses from a dedicated thread: wait for a change (no gRPC thread blocked), write,
// wait for the write to complete, repeat until the session ends or the client cancels.
class AdminService::Watch : public grpc::ServerWriteReactor<v1::SessionStatus> {
 public:
  Watch(SessionManager* sessions, v1::GetSessionRequest request)
      : sessions_(sessions), request_(std::move(request)) {
    thread_ = std::thread([this] { Run(); });
  }

  void OnWriteDone(bool ok) override {
    write_ok_ = ok;
    written_->Notify();
  }
  void OnCancel() override { cancelled_.Notify(); }
  void OnDone() override {
    // OnDone may run on the watch thread itself (after its Finish); never join oneself.
    if (thread_.get_id() == std::this_thread::get_id()) {
      thread_.detach();
    } else {
      thread_.join();
    }
    delete this;
  }

 private:
  void Run() {
    uint64_t seen = 0;
    std::string session_id = request_.session_id();
    while (!cancelled_.HasBeenNotified()) {
      absl::StatusOr<v1::SessionStatus> status =
          sessions_->GetSession(request_.job_id(), session_id);
      if (!status.ok()) {
        Finish(ToGrpcStatus(status.status()));
        return;
      }
      session_id = status->session_id();  // follow the session we started with
      status_ = *std::move(status);
      written_ = std::make_unique<absl::Notification>();
      StartWrite(&status_);
      written_->WaitForNotification();
      if (!write_ok_) {
        Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "watch stream broken"));
        return;
      }
      if (Terminal(status_.state())) {
        Finish(grpc::Status::OK);
        return;
      }
      // Wake at least once a second to notice a cancelled client.
      seen = sessions_->AwaitChange(seen, absl::Now() + absl::Seconds(1));
    }
    Finish(grpc::Status::CANCELLED);
  }

  SessionManager* const sessions_;
  const v1::GetSessionRequest request_;
  v1::SessionStatus status_;
  std::unique_ptr<absl::Notification> written_;
  bool write_ok_ = false;  // written by OnWriteDone before written_ is notified
  absl::Notification cancelled_;
  std::thread thread_;  // last: started once the fields above exist
};

AdminService::AdminService(AgentRegistry* registry, SessionManager* sessions, std::string token)
    : registry_(registry), sessions_(sessions), token_(std::move(token)) {}

AdminService::~AdminService() = default;

absl::Status AdminService::Authorize(const grpc::CallbackServerContext* context) const {
  if (token_.empty()) return absl::OkStatus();
  const auto& metadata = context->client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) {
    return absl::UnauthenticatedError("this coordinator requires an admin token (--token)");
  }
  if (std::string(it->second.data(), it->second.size()) != absl::StrCat("Bearer ", token_)) {
    return absl::UnauthenticatedError("the admin token is wrong");
  }
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* AdminService::ListJobs(grpc::CallbackServerContext* context,
                                                 const v1::ListJobsRequest*,
                                                 v1::ListJobsResponse* response) {
  if (absl::Status s = Authorize(context); !s.ok()) return FinishUnary(context, s);
  std::vector<v1::JobInfo> jobs = sessions_->ListJobs();
  // Jobs whose agents registered but that never saved are listed too.
  for (const std::string& job_id : registry_->Jobs()) {
    bool known = false;
    for (const v1::JobInfo& j : jobs) known = known || j.job_id() == job_id;
    if (known) continue;
    v1::JobInfo info;
    info.set_job_id(job_id);
    if (auto layout = registry_->JobLayout(job_id)) {
      *info.mutable_layout() = layout->proto();
      info.set_world_size(layout->world_size());
    }
    info.set_latest_committed_step(-1);
    jobs.push_back(std::move(info));
  }
  for (v1::JobInfo& job : jobs) {
    absl::StatusOr<std::vector<v1::AgentInfo>> agents = registry_->ListAgents(job.job_id());
    uint32_t alive = 0;
    if (agents.ok()) {
      for (const v1::AgentInfo& a : *agents) alive += a.alive() ? 1 : 0;
    }
    job.set_agents_alive(alive);
    *response->add_jobs() = std::move(job);
  }
  return FinishUnary(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* AdminService::ListAgents(grpc::CallbackServerContext* context,
                                                   const v1::ListAgentsRequest* request,
                                                   v1::ListAgentsResponse* response) {
  if (absl::Status s = Authorize(context); !s.ok()) return FinishUnary(context, s);
  absl::StatusOr<std::vector<v1::AgentInfo>> agents = registry_->ListAgents(request->job_id());
  if (agents.ok()) {
    for (v1::AgentInfo& a : *agents) *response->add_agents() = std::move(a);
  }
  return FinishUnary(context, agents.status());
}

grpc::ServerUnaryReactor* AdminService::GetSession(grpc::CallbackServerContext* context,
                                                   const v1::GetSessionRequest* request,
                                                   v1::SessionStatus* response) {
  if (absl::Status s = Authorize(context); !s.ok()) return FinishUnary(context, s);
  absl::StatusOr<v1::SessionStatus> status =
      sessions_->GetSession(request->job_id(), request->session_id());
  if (status.ok()) *response = *std::move(status);
  return FinishUnary(context, status.status());
}

grpc::ServerUnaryReactor* AdminService::ListCheckpoints(
    grpc::CallbackServerContext* context, const v1::ListCheckpointsRequest* request,
    v1::ListCheckpointsResponse* response) {
  if (absl::Status s = Authorize(context); !s.ok()) return FinishUnary(context, s);
  absl::StatusOr<std::vector<v1::CheckpointInfo>> list =
      sessions_->ListCheckpoints(request->job_id());
  if (list.ok()) {
    for (v1::CheckpointInfo& c : *list) *response->add_checkpoints() = std::move(c);
  }
  return FinishUnary(context, list.status());
}

grpc::ServerUnaryReactor* AdminService::AbortSession(grpc::CallbackServerContext* context,
                                                     const v1::AbortSessionRequest* request,
                                                     v1::SessionStatus* response) {
  if (absl::Status s = Authorize(context); !s.ok()) return FinishUnary(context, s);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  sessions_->AbortSession(request->job_id(), request->reason(),
                          [reactor, response](absl::StatusOr<v1::SessionStatus> status) {
                            if (status.ok()) *response = *std::move(status);
                            reactor->Finish(ToGrpcStatus(status.status()));
                          });
  return reactor;
}

grpc::ServerWriteReactor<v1::SessionStatus>* AdminService::WatchSession(
    grpc::CallbackServerContext* context, const v1::GetSessionRequest* request) {
  if (absl::Status s = Authorize(context); !s.ok()) {
    return new RefusedStream<v1::SessionStatus>(s);
  }
  return new Watch(sessions_, *request);
}

}  // namespace tessera
