#include "storage/s3/s3_errors.h"

#include <curl/curl.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "storage/s3/s3_url.h"
#include "storage/storage.h"

namespace tessera::s3 {
namespace {

// " (request id R; 3 attempts over 1.2 s)", or less; "" before any request was sent.
std::string Suffix(const CallContext& call, absl::string_view request_id = "") {
  std::string inner;
  if (!request_id.empty()) absl::StrAppend(&inner, "request id ", request_id);
  if (call.attempts >= 1) {
    if (!inner.empty()) absl::StrAppend(&inner, "; ");
    if (call.attempts == 1) {
      absl::StrAppend(&inner, "1 attempt");
    } else {
      absl::StrAppend(&inner, absl::StrFormat("%d attempts over %.1f s", call.attempts,
                                              absl::ToDoubleSeconds(call.elapsed)));
    }
  }
  return inner.empty() ? "" : absl::StrCat(" (", inner, ")");
}

}  // namespace

std::string CallContext::Url() const { return S3ObjectUrl(bucket, key); }

int EffectiveHttpStatus(int http_status, absl::string_view s3_code) {
  if (http_status != 200) return http_status;
  if (s3_code == "InternalError") return 500;
  if (s3_code == "SlowDown" || s3_code == "ServiceUnavailable") return 503;
  return http_status;
}

absl::StatusCode S3ErrorStatusCode(int http_status, absl::string_view s3_code) {
  using C = absl::StatusCode;
  http_status = EffectiveHttpStatus(http_status, s3_code);
  if (s3_code == "NoSuchUpload") return C::kAborted;
  if (s3_code == "NoSuchKey" || s3_code == "NoSuchBucket") return C::kNotFound;
  if (s3_code == "AccessDenied" || s3_code == "SignatureDoesNotMatch" ||
      s3_code == "InvalidAccessKeyId" || s3_code == "ExpiredToken" || s3_code == "InvalidToken" ||
      s3_code == "TokenRefreshRequired") {
    return C::kPermissionDenied;
  }
  if (s3_code == "AuthorizationHeaderMalformed" || s3_code == "PermanentRedirect" ||
      s3_code == "TemporaryRedirect") {
    return C::kFailedPrecondition;
  }
  if (s3_code == "RequestTimeout") return C::kUnavailable;
  if (s3_code == "BucketAlreadyExists" || s3_code == "BucketAlreadyOwnedByYou") {
    return C::kAlreadyExists;
  }
  switch (http_status) {
    case 301:
    case 307:
      return C::kFailedPrecondition;
    case 400:
      return C::kInvalidArgument;
    case 403:
      return C::kPermissionDenied;
    case 404:
      return C::kNotFound;
    case 409:
      return C::kAborted;
    case 412:
      return C::kAlreadyExists;
    case 416:
      return C::kOutOfRange;
    case 501:
      return C::kUnimplemented;
    case 429:
    case 500:
    case 502:
    case 503:
    case 504:
      return C::kUnavailable;
    default:
      return C::kInternal;
  }
}

absl::Status S3ErrorToStatus(const CallContext& call, int http_status, const S3ErrorReply& reply) {
  std::string message = absl::StrCat(call.op, " ", call.Url(), ": HTTP ", http_status);
  if (!reply.code.empty()) absl::StrAppend(&message, " ", reply.code);
  if (!reply.message.empty()) absl::StrAppend(&message, ": ", reply.message);
  if (reply.code == "NoSuchBucket") {
    absl::StrAppend(&message, " (bucket ", call.bucket, " does not exist)");
  } else if (reply.code == "NoSuchUpload") {
    absl::StrAppend(&message, " (the multipart upload was aborted, expired or already completed)");
  } else if (http_status == 404 && reply.code.empty()) {
    absl::StrAppend(&message, " (no such key, or no such bucket: the reply has no error code)");
  }
  absl::StrAppend(&message, Suffix(call, reply.request_id));
  return IoError(S3ErrorStatusCode(http_status, reply.code), call.Url(), std::move(message));
}

TransportFailure ClassifyCurlCode(int curl_code) {
  switch (static_cast<CURLcode>(curl_code)) {
    case CURLE_OK:
      return TransportFailure::kNone;
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
      return TransportFailure::kTransient;
    default:
      return TransportFailure::kPermanent;
  }
}

absl::StatusCode CurlStatusCode(int curl_code) {
  switch (static_cast<CURLcode>(curl_code)) {
    case CURLE_COULDNT_RESOLVE_HOST:
      return absl::StatusCode::kUnavailable;
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_ISSUER_ERROR:
    case CURLE_SSL_PINNEDPUBKEYNOTMATCH:
      return absl::StatusCode::kFailedPrecondition;
    case CURLE_URL_MALFORMAT:
    case CURLE_UNSUPPORTED_PROTOCOL:
      return absl::StatusCode::kInvalidArgument;
    default:
      return ClassifyCurlCode(curl_code) == TransportFailure::kTransient
                 ? absl::StatusCode::kUnavailable
                 : absl::StatusCode::kInternal;
  }
}

absl::Status TransportErrorToStatus(const CallContext& call, int curl_code,
                                    absl::string_view detail) {
  std::string message = absl::StrCat(call.op, " ", call.Url(), ": ",
                                     curl_easy_strerror(static_cast<CURLcode>(curl_code)));
  if (!detail.empty()) absl::StrAppend(&message, ": ", detail);
  absl::StrAppend(&message, " [curl error ", curl_code, "]", Suffix(call));
  return IoError(CurlStatusCode(curl_code), call.Url(), std::move(message));
}

absl::Status CallError(const CallContext& call, absl::StatusCode code, absl::string_view what) {
  return IoError(code, call.Url(),
                 absl::StrCat(call.op, " ", call.Url(), ": ", what, Suffix(call)));
}

}  // namespace tessera::s3
