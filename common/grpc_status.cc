#include "common/grpc_status.h"

#include <optional>
#include <string>

#include "common/status.h"

namespace tessera {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl and gRPC share the canonical code numbering.
  auto code = static_cast<grpc::StatusCode>(status.code());
  std::optional<v1::ErrorDetail> detail = GetErrorDetail(status);
  std::string message(status.message());
  return detail.has_value() ? grpc::Status(code, message, detail->SerializeAsString())
                            : grpc::Status(code, message);
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  auto code = static_cast<absl::StatusCode>(status.error_code());
  v1::ErrorDetail detail;
  if (!status.error_details().empty() && detail.ParseFromString(status.error_details())) {
    if (detail.message().empty()) detail.set_message(status.error_message());
    return MakeError(code, detail);
  }
  return absl::Status(code, status.error_message());
}

}  // namespace tessera
