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

std::string ErrorCodeName(v1::ErrorCode code) {
  const std::string& full = v1::ErrorCode_Name(code);
  constexpr absl::string_view kPrefix = "ERROR_CODE_";
  if (full.empty()) return absl::StrCat("ERROR_CODE(", static_cast<int>(code), ")");
  return absl::string_view(full).substr(0, kPrefix.size()) == kPrefix
             ? full.substr(kPrefix.size())
             : full;
}

}  // namespace tessera
