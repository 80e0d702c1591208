#include "server/coordinator_service.h"

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/grpc_status.h"
#include "common/log.h"

namespace tessera {
namespace {

grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* context,
                                 const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

}  // namespace

CoordinatorService::CoordinatorService(AgentRegistry* registry,
                                       CoordinatorServiceOptions options)
    : registry_(registry), options_(std::move(options)) {}

grpc::ServerUnaryReactor* CoordinatorService::RegisterAgent(
    grpc::CallbackServerContext* context, const v1::RegisterAgentRequest* request,
    v1::RegisterAgentResponse* response) {
  absl::StatusOr<AgentRegistry::Registered> registered = registry_->Register(*request);
  if (!registered.ok()) {
    LogWarning("rejected registration job=", request->job_id(), " rank=",
               request->coord().rank(), ": ", registered.status().message());
    return Finish(context, registered.status());
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
  return Finish(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* CoordinatorService::Heartbeat(grpc::CallbackServerContext* context,
                                                        const v1::HeartbeatRequest* request,
                                                        v1::HeartbeatResponse* response) {
  absl::Status status = registry_->Heartbeat(request->job_id(), request->rank(),
                                             request->incarnation(), request->pinned_bytes());
  if (status.ok()) {
    response->set_lease_ms(
        static_cast<uint32_t>(absl::ToInt64Milliseconds(registry_->options().lease)));
    response->set_coordinator_incarnation(options_.coordinator_incarnation);
  }
  return Finish(context, status);
}

}  // namespace tessera
