// gRPC adapter for the Admin service (proto/tessera/v1/admin.proto), what operators and the
// `tessera` CLI call.
//
// Authentication: if `token` is non-empty every call must carry metadata
// "authorization: Bearer <token>", else it fails with UNAUTHENTICATED.
//
// WatchSession streams a status on every change of the session until it ends. Waiting for a
// change must not block a gRPC thread, so each watch runs on its own thread (admin watches
// are few; documented cost: one thread per open watch).
//
// Thread-safety: safe for concurrent RPCs.
#ifndef TESSERA_SERVER_ADMIN_SERVICE_H_
#define TESSERA_SERVER_ADMIN_SERVICE_H_

#include <string>

#include "server/agent_registry.h"
#include "server/session_manager.h"
#include "tessera/v1/admin.grpc.pb.h"

namespace tessera {

class AdminService final : public v1::Admin::CallbackService {
 public:
  // `registry` and `sessions` must outlive the service.
  AdminService(AgentRegistry* registry, SessionManager* sessions, std::string token);
  ~AdminService() override;

  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* context,
                                     const v1::ListJobsRequest* request,
                                     v1::ListJobsResponse* response) override;
  grpc::ServerUnaryReactor* ListAgents(grpc::CallbackServerContext* context,
                                       const v1::ListAgentsRequest* request,
                                       v1::ListAgentsResponse* response) override;
  grpc::ServerUnaryReactor* GetSession(grpc::CallbackServerContext* context,
                                       const v1::GetSessionRequest* request,
                                       v1::SessionStatus* response) override;
  grpc::ServerUnaryReactor* ListCheckpoints(grpc::CallbackServerContext* context,
                                            const v1::ListCheckpointsRequest* request,
                                            v1::ListCheckpointsResponse* response) override;
  grpc::ServerUnaryReactor* AbortSession(grpc::CallbackServerContext* context,
                                         const v1::AbortSessionRequest* request,
                                         v1::SessionStatus* response) override;
  grpc::ServerWriteReactor<v1::SessionStatus>* WatchSession(
      grpc::CallbackServerContext* context, const v1::GetSessionRequest* request) override;

 private:
  class Watch;
  absl::Status Authorize(const grpc::CallbackServerContext* context) const;

  AgentRegistry* const registry_;
  SessionManager* const sessions_;
  const std::string token_;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_ADMIN_SERVICE_H_
