#include "common/status.h"

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace tessera {

absl::Status MakeError(absl::StatusCode code, const v1::ErrorDetail& detail) {
  absl::Status status(code, detail.message());
  status.SetPayload(kErrorDetailTypeUrl, absl::Cord(detail.SerializeAsString()));
  return status;
}

absl::Status MakeError(absl::StatusCode code, v1::ErrorCode reason, absl::string_view message) {
  v1::ErrorDetail detail;
  detail.set_code(reason);
  detail.set_message(std::string(message));
  return MakeError(code, detail);
}

std::optional<v1::ErrorDetail> GetErrorDetail(const absl::Status& status) {
  // Debian's absl is built with its own optional (not std::optional): take it as `auto`.
  auto payload = status.GetPayload(kErrorDetailTypeUrl);
  if (!payload.has_value()) return std::nullopt;
  v1::ErrorDetail detail;
  if (!detail.ParseFromString(std::string(*payload))) return std::nullopt;
  return detail;
}

v1::ErrorCode GetErrorCode(const absl::Status& status) {
  std::optional<v1::ErrorDetail> detail = GetErrorDetail(status);
  return detail.has_value() ? detail->code() : v1::ERROR_CODE_UNSPECIFIED;
}

absl::StatusCode CanonicalCode(v1::ErrorCode reason) {
  switch (reason) {
    case v1::ERROR_CODE_MALFORMED_SHARD:
    case v1::ERROR_CODE_SHAPE_MISMATCH:
    case v1::ERROR_CODE_DUPLICATE_FQN:
    case v1::ERROR_CODE_OVERLAPPING_SHARDS:
    case v1::ERROR_CODE_INCOMPLETE_COVERAGE:
    case v1::ERROR_CODE_OPTIMIZER_STATE_MISMATCH:
    case v1::ERROR_CODE_REPLICATION_MISMATCH:
    case v1::ERROR_CODE_LAYOUT_MISMATCH:
    case v1::ERROR_CODE_PLAN_TOO_LARGE:
      return absl::StatusCode::kInvalidArgument;
    case v1::ERROR_CODE_CHECKSUM_MISMATCH:
      return absl::StatusCode::kDataLoss;
    case v1::ERROR_CODE_CHECKPOINT_NOT_FOUND:
    case v1::ERROR_CODE_MEMORY_COPY_LOST:
      return absl::StatusCode::kNotFound;
    case v1::ERROR_CODE_STEP_EXISTS:
    case v1::ERROR_CODE_SESSION_IN_PROGRESS:
    case v1::ERROR_CODE_STALE_INCARNATION:
    case v1::ERROR_CODE_MEMORY_ONLY_REFUSED:
      return absl::StatusCode::kFailedPrecondition;
    case v1::ERROR_CODE_ADMISSION_DENIED:
      return absl::StatusCode::kResourceExhausted;
    default:
      return absl::StatusCode::kAborted;
  }
}

absl::Status ErrorFromDetail(const v1::ErrorDetail& detail) {
  return MakeError(CanonicalCode(detail.code()), detail);
}

std::string ErrorCodeName(v1::ErrorCode code) {
  const std::string& full = v1::ErrorCode_Name(code);
  constexpr absl::string_view kPrefix = "ERROR_CODE_";
  if (full.empty()) return absl::StrCat("ERROR_CODE(", static_cast<int>(code), ")");
  return absl::string_view(full).substr(0, kPrefix.size()) == kPrefix
             ? full.substr(kPrefix.size())
             : full;
}

}  // namespace tessera
