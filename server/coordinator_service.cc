#include "server/coordinator_service.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/grpc_reactors.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "common/peer_auth.h"

namespace tessera {
namespace {


absl::Status NoSessions() {
  return absl::UnimplementedError("this coordinator runs without a session manager");
}

}  // namespace

CoordinatorService::CoordinatorService(AgentRegistry* registry, SessionManager* sessions,
                                       CommandStreams* streams, PeerIdBroker* broker,
                                       const Clock* clock, CoordinatorServiceOptions options)
    : registry_(registry),
      sessions_(sessions),
      streams_(streams),
      broker_(broker),
      clock_(clock),
      options_(std::move(options)) {}

grpc::ServerUnaryReactor* CoordinatorService::RegisterAgent(
    grpc::CallbackServerContext* context, const v1::RegisterAgentRequest* request,
    v1::RegisterAgentResponse* response) {
  absl::StatusOr<AgentRegistry::Registered> registered = registry_->Register(*request);
  // Refused or not, the job's session hears of it now: a refusal recorded against a rank
  // ends a save waiting for that rank at once, with its reason.
  if (sessions_ != nullptr) sessions_->AgentsChanged(request->job_id());
  if (!registered.ok()) {
    LogWarning("rejected registration job=", request->job_id(), " rank=",
               request->coord().rank(), ": ", registered.status().message());
    return FinishUnary(context, registered.status());
  }
  LogInfo("registered agent job=", request->job_id(), " rank=", request->coord().rank(),
          " node=", request->node_id(), " incarnation=", absl::Hex(request->incarnation()),
          registered->replaced_incarnation.has_value()
              ? absl::StrCat(" (replaces ", absl::Hex(*registered->replaced_incarnation), ")")
              : "");
  const AgentRegistryOptions& reg = registry_->options();
  response->set_lease_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(reg.lease)));
  response->set_heartbeat_interval_ms(
      static_cast<uint32_t>(absl::ToInt64Milliseconds(reg.heartbeat_interval)));
  response->set_coordinator_incarnation(options_.coordinator_incarnation);
  response->set_storage_root(options_.storage_root);
  response->set_lease_kept(registered->lease_kept);
  if (!options_.peer_key.empty()) {
    response->set_peer_secret(JobPeerSecret(options_.peer_key, request->job_id()));
  }
  if (options_.death_watch != nullptr) {
    options_.death_watch->Registered(request->job_id(), request->coord().rank(),
                                     request->incarnation(), request->peer_address());
  }
  return FinishUnary(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* CoordinatorService::Heartbeat(grpc::CallbackServerContext* context,
                                                        const v1::HeartbeatRequest* request,
                                                        v1::HeartbeatResponse* response) {
  std::optional<v1::MemoryCopy> resident;
  if (request->has_resident()) resident = request->resident();
  absl::StatusOr<AgentRegistry::Renewal> renewal = registry_->Heartbeat(
      request->job_id(), request->rank(), request->incarnation(), request->pinned_bytes(),
      std::move(resident),
      std::vector<v1::MemoryCopy>(request->buddy_copies().begin(), request->buddy_copies().end()),
      request->last_committed_session());
  const absl::Status status = renewal.status();
  if (status.ok()) {
    response->set_lease_kept(renewal->lease_kept);
    response->set_lease_ms(
        static_cast<uint32_t>(absl::ToInt64Milliseconds(registry_->options().lease)));
    response->set_coordinator_incarnation(options_.coordinator_incarnation);
    if (options_.memory_buddies) {
      if (std::optional<v1::MemoryBuddy> buddy =
              registry_->BuddyOf(request->job_id(), request->rank())) {
        *response->mutable_buddy() = *std::move(buddy);
      }
    }
  }
  return FinishUnary(context, status);
}

grpc::ServerUnaryReactor* CoordinatorService::FindMemoryCopies(
    grpc::CallbackServerContext* context, const v1::FindMemoryCopiesRequest* request,
    v1::FindMemoryCopiesResponse* response) {
  absl::StatusOr<std::vector<v1::MemoryCopy>> copies = registry_->FindMemoryCopies(*request);
  if (copies.ok()) {
    for (v1::MemoryCopy& copy : *copies) *response->add_copies() = std::move(copy);
  }
  return FinishUnary(context, copies.status());
}

grpc::ServerUnaryReactor* CoordinatorService::RelayFailed(grpc::CallbackServerContext* context,
                                                         const v1::RelayFailedRequest* request,
                                                         v1::RelayFailedResponse* /*response*/) {
  if (sessions_ == nullptr) return FinishUnary(context, NoSessions());
  return FinishUnary(context, sessions_->RelayFailed(*request));
}

grpc::ServerUnaryReactor* CoordinatorService::GetMemoryCheckpoint(
    grpc::CallbackServerContext* context, const v1::GetMemoryCheckpointRequest* request,
    v1::GetMemoryCheckpointResponse* response) {
  if (sessions_ == nullptr) return FinishUnary(context, NoSessions());
  absl::StatusOr<v1::Manifest> manifest = sessions_->GetMemoryCheckpoint(*request);
  if (manifest.ok()) *response->mutable_manifest() = *std::move(manifest);
  return FinishUnary(context, manifest.status());
}

grpc::ServerUnaryReactor* CoordinatorService::SubmitLocalPlan(
    grpc::CallbackServerContext* context, const v1::SubmitLocalPlanRequest* request,
    v1::SubmitLocalPlanResponse* response) {
  if (sessions_ == nullptr) return FinishUnary(context, NoSessions());
  // The request's shards are moved into the session rather than copied (a copy of every
  // rank's plan is half a GiB at 1,024 x 1,000 shards). gRPC's default message holder owns
  // the request as a non-const object and frees it only once the call is finished, so taking
  // its contents is sound; nothing reads the request afterwards. The answer comes once the
  // session's strand has recorded the plan (SessionManager), off this callback thread.
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  sessions_->SubmitLocalPlan(std::move(*const_cast<v1::SubmitLocalPlanRequest*>(request)),
                             [reactor, response](
                                 absl::StatusOr<v1::SubmitLocalPlanResponse> answer) {
                               if (answer.ok()) *response = *std::move(answer);
                               reactor->Finish(ToGrpcStatus(answer.status()));
                             });
  return reactor;
}

grpc::ServerWriteReactor<v1::Command>* CoordinatorService::Commands(
    grpc::CallbackServerContext* context, const v1::CommandsRequest* request) {
  absl::Status status =
      registry_->CheckIncarnation(request->job_id(), request->rank(), request->incarnation());
  if (status.ok() && (sessions_ == nullptr || streams_ == nullptr)) status = NoSessions();
  if (!status.ok()) {
    return new RefusedStream<v1::Command>(status);
  }
  // The current command is read after the stream is registered (CommandStreams::Open), so
  // one emitted while the agent connects is not lost.
  const std::string job_id = request->job_id();
  const uint32_t rank = request->rank();
  return streams_->Open(job_id, rank, request->incarnation(), [this, &job_id, rank] {
    std::optional<v1::Command> replay = sessions_->CurrentCommand(job_id, rank);
    LogInfo("command stream opened by job=", job_id, " rank=", rank,
            replay.has_value()
                ? absl::StrCat(" (replaying a command of ", replay->session_id(), ")")
                : "");
    return replay;
  });
}

grpc::ServerUnaryReactor* CoordinatorService::ReportPhase(grpc::CallbackServerContext* context,
                                                          const v1::ReportPhaseRequest* request,
                                                          v1::ReportPhaseResponse* response) {
  if (sessions_ == nullptr) return FinishUnary(context, NoSessions());
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  sessions_->ReportPhase(*request, [reactor, response](absl::StatusOr<v1::SessionState> state) {
    if (state.ok()) response->set_state(*state);
    reactor->Finish(ToGrpcStatus(state.status()));
  });
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::ReportChunks(
    grpc::CallbackServerContext* context, const v1::ReportChunksRequest* request,
    v1::ReportChunksResponse* response) {
  if (sessions_ == nullptr) return FinishUnary(context, NoSessions());
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  sessions_->ReportChunks(*request, [reactor, response](absl::StatusOr<v1::SessionState> state) {
    if (state.ok()) response->set_state(*state);
    reactor->Finish(ToGrpcStatus(state.status()));
  });
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::ExchangePeerId(
    grpc::CallbackServerContext* context, const v1::ExchangePeerIdRequest* request,
    v1::ExchangePeerIdResponse* response) {
  absl::Status status =
      registry_->CheckIncarnation(request->job_id(), request->rank(), request->incarnation());
  if (status.ok() && broker_ == nullptr) status = NoSessions();
  if (status.ok() && !request->unique_id().empty()) {
    status = broker_->Post(request->session_id(), request->group(), request->unique_id(),
                           clock_->Now());
  }
  if (!status.ok()) return FinishUnary(context, status);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::Time deadline = clock_->Now() + options_.peer_id_timeout;
  deadline = std::min(deadline, absl::FromChrono(context->deadline()));
  broker_->Wait(request->session_id(), request->group(), deadline,
                [reactor, response](absl::StatusOr<std::string> id) {
                  if (id.ok()) response->set_unique_id(*id);
                  reactor->Finish(ToGrpcStatus(id.status()));
                });
  return reactor;
}

}  // namespace tessera
