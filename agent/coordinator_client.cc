#include "agent/coordinator_client.h"

#include "common/grpc_status.h"
#include "grpcpp/client_context.h"

namespace tessera {
namespace {

template <typename Response, typename Call>
absl::StatusOr<Response> Unary(absl::Duration timeout, Call call) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  Response response;
  grpc::Status status = call(&context, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

}  // namespace

GrpcCoordinatorClient::GrpcCoordinatorClient(std::shared_ptr<grpc::Channel> channel,
                                             absl::Duration rpc_timeout)
    : stub_(v1::Coordinator::NewStub(std::move(channel))), rpc_timeout_(rpc_timeout) {}

absl::StatusOr<v1::RegisterAgentResponse> GrpcCoordinatorClient::Register(
    const v1::RegisterAgentRequest& request) {
  return Unary<v1::RegisterAgentResponse>(
      rpc_timeout_, [&](grpc::ClientContext* ctx, v1::RegisterAgentResponse* response) {
        return stub_->RegisterAgent(ctx, request, response);
      });
}

absl::StatusOr<v1::HeartbeatResponse> GrpcCoordinatorClient::Heartbeat(
    const v1::HeartbeatRequest& request) {
  return Unary<v1::HeartbeatResponse>(
      rpc_timeout_, [&](grpc::ClientContext* ctx, v1::HeartbeatResponse* response) {
        return stub_->Heartbeat(ctx, request, response);
      });
}

absl::StatusOr<v1::SubmitLocalPlanResponse> GrpcCoordinatorClient::SubmitLocalPlan(
    const v1::SubmitLocalPlanRequest& request) {
  // A plan of up to 256 MiB (a million shards) takes seconds to send and parse on a busy
  // host: 1 s more per 4 MiB, so a large plan gets its verdict instead of DEADLINE_EXCEEDED.
  const absl::Duration timeout =
      rpc_timeout_ + absl::Seconds(static_cast<int64_t>(request.ByteSizeLong() >> 22));
  return Unary<v1::SubmitLocalPlanResponse>(
      timeout, [&](grpc::ClientContext* ctx, v1::SubmitLocalPlanResponse* response) {
        return stub_->SubmitLocalPlan(ctx, request, response);
      });
}

absl::StatusOr<v1::ReportPhaseResponse> GrpcCoordinatorClient::ReportPhase(
    const v1::ReportPhaseRequest& request) {
  return Unary<v1::ReportPhaseResponse>(
      rpc_timeout_, [&](grpc::ClientContext* ctx, v1::ReportPhaseResponse* response) {
        return stub_->ReportPhase(ctx, request, response);
      });
}

absl::StatusOr<v1::ReportChunksResponse> GrpcCoordinatorClient::ReportChunks(
    const v1::ReportChunksRequest& request) {
  return Unary<v1::ReportChunksResponse>(
      rpc_timeout_, [&](grpc::ClientContext* ctx, v1::ReportChunksResponse* response) {
        return stub_->ReportChunks(ctx, request, response);
      });
}

absl::StatusOr<v1::FindMemoryCopiesResponse> CoordinatorClient::FindMemoryCopies(
    const v1::FindMemoryCopiesRequest&) {
  return absl::UnimplementedError("this coordinator client does not find memory copies");
}

absl::StatusOr<v1::FindMemoryCopiesResponse> GrpcCoordinatorClient::FindMemoryCopies(
    const v1::FindMemoryCopiesRequest& request) {
  return Unary<v1::FindMemoryCopiesResponse>(
      rpc_timeout_, [&](grpc::ClientContext* ctx, v1::FindMemoryCopiesResponse* response) {
        return stub_->FindMemoryCopies(ctx, request, response);
      });
}

absl::StatusOr<v1::GetMemoryCheckpointResponse> CoordinatorClient::GetMemoryCheckpoint(
    const v1::GetMemoryCheckpointRequest&) {
  return absl::UnimplementedError("this coordinator client does not find memory checkpoints");
}

absl::StatusOr<v1::GetMemoryCheckpointResponse> GrpcCoordinatorClient::GetMemoryCheckpoint(
    const v1::GetMemoryCheckpointRequest& request) {
  return Unary<v1::GetMemoryCheckpointResponse>(
      rpc_timeout_, [&](grpc::ClientContext* ctx, v1::GetMemoryCheckpointResponse* response) {
        return stub_->GetMemoryCheckpoint(ctx, request, response);
      });
}

absl::StatusOr<v1::RelayFailedResponse> CoordinatorClient::RelayFailed(
    const v1::RelayFailedRequest&) {
  return absl::UnimplementedError("this coordinator client does not report failed relays");
}

absl::StatusOr<v1::RelayFailedResponse> GrpcCoordinatorClient::RelayFailed(
    const v1::RelayFailedRequest& request) {
  return Unary<v1::RelayFailedResponse>(
      rpc_timeout_, [&](grpc::ClientContext* ctx, v1::RelayFailedResponse* response) {
        return stub_->RelayFailed(ctx, request, response);
      });
}

}  // namespace tessera
