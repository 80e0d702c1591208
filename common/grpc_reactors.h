// Small pieces shared by the callback-API services (coordinator, admin, trainer-facing agent).
//
// Thread-safety: free functions and self-deleting reactors, as gRPC requires.
#ifndef TESSERA_COMMON_GRPC_REACTORS_H_
#define TESSERA_COMMON_GRPC_REACTORS_H_

#include "absl/status/status.h"
#include "common/grpc_status.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/support/server_callback.h"

namespace tessera {

// Finishes a unary call at once with `status` (its ErrorDetail travels as error_details).
inline grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* context,
                                             const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

// A server-streaming reactor that finishes at once with an error (a refused stream).
template <typename Message>
class RefusedStream : public grpc::ServerWriteReactor<Message> {
 public:
  explicit RefusedStream(const absl::Status& status) { this->Finish(ToGrpcStatus(status)); }
  void OnDone() override { delete this; }
};

// A client-streaming reactor that finishes at once with an error, reading nothing (a refused
// stream: the peer's messages are never taken).
template <typename Message>
class RefusedReads : public grpc::ServerReadReactor<Message> {
 public:
  explicit RefusedReads(const absl::Status& status) { this->Finish(ToGrpcStatus(status)); }
  void OnDone() override { delete this; }
};

}  // namespace tessera

#endif  // TESSERA_COMMON_GRPC_REACTORS_H_
