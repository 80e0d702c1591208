// CoordinatorClient: the agent's calls to the coordinator, behind an interface so the agent's
// core logic is tested with fakes (STYLE.md 7). GrpcCoordinatorClient is the real one.
//
// Thread-safety: implementations are safe for concurrent calls.
#ifndef TESSERA_AGENT_COORDINATOR_CLIENT_H_
#define TESSERA_AGENT_COORDINATOR_CLIENT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/channel.h"
#include "tessera/v1/coordinator.grpc.pb.h"

namespace tessera {

class CoordinatorClient {
 public:
  virtual ~CoordinatorClient() = default;

  // Errors: as Coordinator.RegisterAgent; Unavailable / DeadlineExceeded if unreachable.
  virtual absl::StatusOr<v1::RegisterAgentResponse> Register(
      const v1::RegisterAgentRequest& request) = 0;

  // Errors: as Coordinator.Heartbeat; Unavailable / DeadlineExceeded if unreachable.
  virtual absl::StatusOr<v1::HeartbeatResponse> Heartbeat(
      const v1::HeartbeatRequest& request) = 0;

  // Errors: as Coordinator.SubmitLocalPlan; Unavailable / DeadlineExceeded if unreachable.
  virtual absl::StatusOr<v1::SubmitLocalPlanResponse> SubmitLocalPlan(
      const v1::SubmitLocalPlanRequest& request) = 0;

  // Errors: as Coordinator.ReportPhase; Unavailable / DeadlineExceeded if unreachable.
  virtual absl::StatusOr<v1::ReportPhaseResponse> ReportPhase(
      const v1::ReportPhaseRequest& request) = 0;

  // Errors: as Coordinator.ReportChunks; Unavailable / DeadlineExceeded if unreachable.
  virtual absl::StatusOr<v1::ReportChunksResponse> ReportChunks(
      const v1::ReportChunksRequest& request) = 0;

  // Errors: as Coordinator.FindMemoryCopies; Unavailable / DeadlineExceeded if unreachable.
  // The default (fakes that do not serve it) is Unimplemented.
  virtual absl::StatusOr<v1::FindMemoryCopiesResponse> FindMemoryCopies(
      const v1::FindMemoryCopiesRequest& request);

  // Errors: as Coordinator.GetMemoryCheckpoint; Unavailable / DeadlineExceeded if unreachable.
  // The default (fakes that do not serve it) is Unimplemented.
  virtual absl::StatusOr<v1::GetMemoryCheckpointResponse> GetMemoryCheckpoint(
      const v1::GetMemoryCheckpointRequest& request);

  // Errors: as Coordinator.RelayFailed; Unavailable / DeadlineExceeded if unreachable.
  // The default (fakes that do not serve it) is Unimplemented.
  virtual absl::StatusOr<v1::RelayFailedResponse> RelayFailed(
      const v1::RelayFailedRequest& request);
};

class GrpcCoordinatorClient : public CoordinatorClient {
 public:
  // `rpc_timeout` bounds each unary call. Default: 5 s.
  explicit GrpcCoordinatorClient(std::shared_ptr<grpc::Channel> channel,
                                 absl::Duration rpc_timeout = absl::Seconds(5));

  absl::StatusOr<v1::RegisterAgentResponse> Register(
      const v1::RegisterAgentRequest& request) override;
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& request) override;
  absl::StatusOr<v1::SubmitLocalPlanResponse> SubmitLocalPlan(
      const v1::SubmitLocalPlanRequest& request) override;
  absl::StatusOr<v1::ReportPhaseResponse> ReportPhase(
      const v1::ReportPhaseRequest& request) override;
  absl::StatusOr<v1::ReportChunksResponse> ReportChunks(
      const v1::ReportChunksRequest& request) override;
  absl::StatusOr<v1::FindMemoryCopiesResponse> FindMemoryCopies(
      const v1::FindMemoryCopiesRequest& request) override;
  absl::StatusOr<v1::GetMemoryCheckpointResponse> GetMemoryCheckpoint(
      const v1::GetMemoryCheckpointRequest& request) override;
  absl::StatusOr<v1::RelayFailedResponse> RelayFailed(
      const v1::RelayFailedRequest& request) override;

  v1::Coordinator::Stub* stub() { return stub_.get(); }

 private:
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  const absl::Duration rpc_timeout_;
};

}  // namespace tessera

#endif  // TESSERA_AGENT_COORDINATOR_CLIENT_H_
