// gRPC adapter for the Coordinator service (proto/tessera/v1/coordinator.proto): a thin layer
// that validates transport-level input, calls the core libraries and maps absl::Status to
// grpc::Status with the ErrorDetail payload (common/grpc_status.h).
//
// Implemented now: RegisterAgent, Heartbeat (over AgentRegistry). The save-session RPCs
// (SubmitLocalPlan, Commands, ReportPhase, ReportChunks, ExchangePeerId) answer UNIMPLEMENTED
// until the session state machine is wired in.
//
// Uses the callback API; no handler blocks a reactor thread (STYLE.md 8).
// Thread-safety: safe for concurrent RPCs; state lives in the thread-safe core objects.
#ifndef TESSERA_SERVER_COORDINATOR_SERVICE_H_
#define TESSERA_SERVER_COORDINATOR_SERVICE_H_

#include <cstdint>
#include <string>

#include "server/agent_registry.h"
#include "tessera/v1/coordinator.grpc.pb.h"

namespace tessera {

struct CoordinatorServiceOptions {
  // Returned to agents; changes on every coordinator start so agents notice restarts.
  uint64_t coordinator_incarnation = 0;
  // Where checkpoints live (<root>/<job>/step-N); empty if this coordinator has no storage.
  std::string storage_root;
};

class CoordinatorService final : public v1::Coordinator::CallbackService {
 public:
  // `registry` must outlive the service.
  CoordinatorService(AgentRegistry* registry, CoordinatorServiceOptions options);

  grpc::ServerUnaryReactor* RegisterAgent(grpc::CallbackServerContext* context,
                                          const v1::RegisterAgentRequest* request,
                                          v1::RegisterAgentResponse* response) override;

  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context,
                                      const v1::HeartbeatRequest* request,
                                      v1::HeartbeatResponse* response) override;

 private:
  AgentRegistry* const registry_;
  const CoordinatorServiceOptions options_;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_COORDINATOR_SERVICE_H_
