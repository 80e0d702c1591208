// Conversions between absl::Status (core libraries) and grpc::Status (service adapters).
//
// The ErrorDetail payload travels as grpc::Status::error_details(), so a client sees the same
// structured error the core library produced. Kept apart from status.h so core libraries do
// not depend on gRPC (DESIGN.md: proto <- common <- core <- gRPC adapters).
//
// Thread-safety: free functions, no shared state.
#ifndef TESSERA_COMMON_GRPC_STATUS_H_
#define TESSERA_COMMON_GRPC_STATUS_H_

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace tessera {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace tessera

#endif  // TESSERA_COMMON_GRPC_STATUS_H_
