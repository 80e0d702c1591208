// Status helpers: early-return macros and Tessera's structured errors.
//
// Every Tessera error is an absl::Status whose payload (type URL kErrorDetailTypeUrl) is a
// serialized tessera.v1.ErrorDetail, so callers can tell DUPLICATE_FQN from a dropped
// connection without parsing messages (STYLE.md 5). The status code says who retries
// (STYLE.md 3): InvalidArgument for a bad plan, Aborted for a save that must be restarted,
// FailedPrecondition for state to fix first, DataLoss for corrupt bytes.
//
// Thread-safety: free functions, no shared state.
#ifndef TESSERA_COMMON_STATUS_H_
#define TESSERA_COMMON_STATUS_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tessera/v1/types.pb.h"

namespace tessera {

inline constexpr absl::string_view kErrorDetailTypeUrl =
    "type.googleapis.com/tessera.v1.ErrorDetail";

// Builds a status with `code`, `detail.message()` as its message and `detail` as payload.
absl::Status MakeError(absl::StatusCode code, const v1::ErrorDetail& detail);

// Shorthand for the common case of a code, a reason and a message.
absl::Status MakeError(absl::StatusCode code, v1::ErrorCode reason, absl::string_view message);

// The structured payload of `status`, if it carries one.
std::optional<v1::ErrorDetail> GetErrorDetail(const absl::Status& status);

// The ErrorCode of `status`, or ERROR_CODE_UNSPECIFIED if it carries no payload.
v1::ErrorCode GetErrorCode(const absl::Status& status);

// The status code an error of `reason` carries (STYLE.md 3: who retries): planning errors are
// InvalidArgument, execution errors Aborted, CHECKSUM_MISMATCH DataLoss,
// CHECKPOINT_NOT_FOUND / MEMORY_COPY_LOST NotFound, STEP_EXISTS / SESSION_IN_PROGRESS /
// STALE_INCARNATION / MEMORY_ONLY_REFUSED FailedPrecondition, ADMISSION_DENIED
// ResourceExhausted.
absl::StatusCode CanonicalCode(v1::ErrorCode reason);

// MakeError(CanonicalCode(detail.code()), detail).
absl::Status ErrorFromDetail(const v1::ErrorDetail& detail);

// "DUPLICATE_FQN" for ERROR_CODE_DUPLICATE_FQN.
std::string ErrorCodeName(v1::ErrorCode code);

namespace status_internal {
inline absl::Status AsStatus(absl::Status s) { return s; }
template <typename T>
absl::Status AsStatus(const absl::StatusOr<T>& s) { return s.status(); }
}  // namespace status_internal

}  // namespace tessera

#define TESSERA_CONCAT_INNER_(a, b) a##b
#define TESSERA_CONCAT_(a, b) TESSERA_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (a Status or StatusOr) is not OK.
#define RETURN_IF_ERROR(expr)                                                  \
  do {                                                                         \
    ::absl::Status _tessera_status = ::tessera::status_internal::AsStatus(expr); \
    if (!_tessera_status.ok()) return _tessera_status;                        \
  } while (0)

// `ASSIGN_OR_RETURN(auto x, F());` declares x from F()'s value or returns F()'s status.
#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL_(TESSERA_CONCAT_(_tessera_statusor_, __LINE__), lhs, expr)

#define ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                            \
  if (!statusor.ok()) return statusor.status();      \
  lhs = std::move(statusor).value()

#endif  // TESSERA_COMMON_STATUS_H_
