// gRPC adapter for the Coordinator service (proto/tessera/v1/coordinator.proto): a thin layer
// that calls the core objects (AgentRegistry, SessionManager, PeerIdBroker) and maps
// absl::Status to grpc::Status with the ErrorDetail payload (common/grpc_status.h).
//
// Uses the callback API. Unary handlers finish inline: they only record, persist (one synced
// RocksDB write at most) and queue commands. Nothing waits for another rank on an RPC thread:
// the Commands stream is a reactor fed by CommandStreams, and ExchangePeerId finishes from the
// broker's callback (STYLE.md 8).
//
// Admission: an agent RPC from anything but the registered incarnation of its (job, rank) is
// refused STALE_INCARNATION by one rule, AgentRegistry::CheckIncarnation, applied once by the
// core object that handles it — the registry (Heartbeat, FindMemoryCopies), SessionManager
// (the session RPCs) — and here only for Commands and ExchangePeerId, whose handlers
// (CommandStreams, PeerIdBroker) are plumbing that knows no agents.
//
// Thread-safety: safe for concurrent RPCs; all state lives in the thread-safe core objects.
#ifndef TESSERA_SERVER_COORDINATOR_SERVICE_H_
#define TESSERA_SERVER_COORDINATOR_SERVICE_H_

#include <cstdint>
#include <string>

#include "common/clock.h"
#include "server/agent_registry.h"
#include "server/command_streams.h"
#include "server/death_watch.h"
#include "server/peer_id_broker.h"
#include "server/session_manager.h"
#include "tessera/v1/coordinator.grpc.pb.h"

namespace tessera {

struct CoordinatorServiceOptions {
  // Returned to agents; changes on every coordinator start so agents notice restarts.
  uint64_t coordinator_incarnation = 0;
  // Where checkpoints live (<root>/<job>/step-N), told to agents at registration.
  std::string storage_root;
  // Longest an ExchangePeerId call waits for its leader. Default: 60 s.
  absl::Duration peer_id_timeout = absl::Seconds(60);
  // Memory tier: name each agent's memory buddy (AgentRegistry::BuddyOf) in its heartbeat
  // replies. Default: true.
  bool memory_buddies = true;
  // Told of each registration, to find dead agents promptly (death_watch.h; the command
  // streams tell it of theirs); must outlive the service. Default: none (leases alone).
  DeathWatch* death_watch = nullptr;
  // The key from which each job's peer secret is derived (server/session/schema.h PeerKey),
  // handed to the job's agents in RegisterAgentResponse.peer_secret. Empty: none handed out,
  // so that agents refuse every peer (tests of registration alone). Default: empty.
  std::string peer_key;
};

class CoordinatorService final : public v1::Coordinator::CallbackService {
 public:
  // Every pointer must outlive the service. `sessions` and `streams` may be null in tests
  // that exercise registration only; the session RPCs then answer UNIMPLEMENTED.
  CoordinatorService(AgentRegistry* registry, SessionManager* sessions, CommandStreams* streams,
                     PeerIdBroker* broker, const Clock* clock, CoordinatorServiceOptions options);

  grpc::ServerUnaryReactor* RegisterAgent(grpc::CallbackServerContext* context,
                                          const v1::RegisterAgentRequest* request,
                                          v1::RegisterAgentResponse* response) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context,
                                      const v1::HeartbeatRequest* request,
                                      v1::HeartbeatResponse* response) override;
  grpc::ServerUnaryReactor* SubmitLocalPlan(grpc::CallbackServerContext* context,
                                            const v1::SubmitLocalPlanRequest* request,
                                            v1::SubmitLocalPlanResponse* response) override;
  grpc::ServerWriteReactor<v1::Command>* Commands(grpc::CallbackServerContext* context,
                                                  const v1::CommandsRequest* request) override;
  grpc::ServerUnaryReactor* ReportPhase(grpc::CallbackServerContext* context,
                                        const v1::ReportPhaseRequest* request,
                                        v1::ReportPhaseResponse* response) override;
  grpc::ServerUnaryReactor* ReportChunks(grpc::CallbackServerContext* context,
                                         const v1::ReportChunksRequest* request,
                                         v1::ReportChunksResponse* response) override;
  grpc::ServerUnaryReactor* ExchangePeerId(grpc::CallbackServerContext* context,
                                           const v1::ExchangePeerIdRequest* request,
                                           v1::ExchangePeerIdResponse* response) override;
  grpc::ServerUnaryReactor* FindMemoryCopies(grpc::CallbackServerContext* context,
                                             const v1::FindMemoryCopiesRequest* request,
                                             v1::FindMemoryCopiesResponse* response) override;
  grpc::ServerUnaryReactor* GetMemoryCheckpoint(grpc::CallbackServerContext* context,
                                                const v1::GetMemoryCheckpointRequest* request,
                                                v1::GetMemoryCheckpointResponse* response) override;
  grpc::ServerUnaryReactor* RelayFailed(grpc::CallbackServerContext* context,
                                        const v1::RelayFailedRequest* request,
                                        v1::RelayFailedResponse* response) override;

 private:
  AgentRegistry* const registry_;
  SessionManager* const sessions_;
  CommandStreams* const streams_;
  PeerIdBroker* const broker_;
  const Clock* const clock_;
  const CoordinatorServiceOptions options_;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_COORDINATOR_SERVICE_H_
