// How an S3 call's failure becomes an absl::Status: the one table of the S3 client.
//
// Message: the operation, the object as s3://bucket/key (never the HTTP URL), the HTTP status,
// S3's error Code and Message (or the transport failure), S3's request id, and the attempts:
//   "PutObject s3://ckpt/run1/x: HTTP 403 SignatureDoesNotMatch: The request signature we
//    calculated does not match the signature you provided. (request id 17A; 1 attempt)"
// Never a credential: the client passes every text that came from elsewhere (S3's Message,
// libcurl's error text) through Credentials::Redact first, and signs with libcurl, whose
// Authorization header no message includes.
// Payload: tessera.v1.ErrorDetail{IO_ERROR, path = "s3://bucket/key"} (storage.h IoError).
//
// Status code, chosen by who retries (STYLE.md 3; storage.h's errno table is the model):
//   HTTP  S3 Code (or failure)                  -> status             who acts
//   403   AccessDenied, SignatureDoesNotMatch,  -> PermissionDenied   fix credentials or policy
//         InvalidAccessKeyId, any 403
//   400   ExpiredToken, InvalidToken,           -> PermissionDenied   refresh the credentials
//         TokenRefreshRequired
//   404   NoSuchKey, any 404 (HEAD: no Code)    -> NotFound
//   404   NoSuchBucket                          -> NotFound           message: "bucket B does
//                                                                     not exist"
//   404   NoSuchUpload                          -> Aborted            restart the multipart
//         upload: it was aborted, expired or completed, and no retry of this call can succeed
//         (NotFound would read as "the object is missing")
//   409   BucketAlreadyExists,                  -> AlreadyExists
//         BucketAlreadyOwnedByYou
//   409   any other (OperationAborted,          -> Aborted            a concurrent request won;
//         ConditionalRequestConflict)                                 redo the higher-level step
//   412   PreconditionFailed                    -> AlreadyExists      the key exists: the only
//         precondition this client sends is PutObject's If-None-Match: * (storage.h maps EEXIST
//         the same way)
//   416   InvalidRange                          -> OutOfRange         the object ends first
//   301, 307, 400 AuthorizationHeaderMalformed  -> FailedPrecondition fix region or endpoint
//   400   RequestTimeout                        -> Unavailable        retry the call (not
//         retried inside: no 4xx is, retry.h)
//   400   any other (InvalidArgument,           -> InvalidArgument    the request is wrong
//         InvalidPart, InvalidPartOrder, EntityTooSmall, MalformedXML, KeyTooLongError, ...)
//   501   NotImplemented                        -> Unimplemented      the store lacks the
//         feature (e.g. conditional writes); a caller may fall back
//   429, 500, 502, 503, 504 after the retries   -> Unavailable        retry the call later
//         (a 200 whose <Error> is InternalError, SlowDown or ServiceUnavailable counts as
//         the 500 or 503 it stands for: EffectiveHttpStatus)
//   transport: refused, reset, timed out, cut   -> Unavailable
//         short (after the retries); host not resolved
//   transport: TLS certificate not verified,    -> FailedPrecondition fix the TLS setup
//         CA file unusable
//   transport: URL malformed or not http(s)     -> InvalidArgument
//   a 200 with an <Error> body: by its Code as above (AccessDenied -> PermissionDenied, ...),
//         an unknown Code                       -> Internal
//   a 2xx reply that breaks the protocol        -> Internal
//         (malformed XML, a missing ETag, more bytes than asked)
//   anything else                               -> Internal
//
// Pure functions; thread-safe.
#ifndef TESSERA_STORAGE_S3_S3_ERRORS_H_
#define TESSERA_STORAGE_S3_S3_ERRORS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "storage/s3/retry.h"

namespace tessera::s3 {

// S3's <Error> reply (or what could be read of a reply that is not one).
struct S3ErrorReply {
  std::string code;     // "NoSuchKey"; "" if the reply had none (HEAD, a proxy's HTML page)
  std::string message;  // S3's Message, or the start of a reply that is not S3's XML
  std::string request_id;
};

// The call a failure belongs to, for messages.
struct CallContext {
  absl::string_view op;  // "PutObject"
  absl::string_view bucket;
  absl::string_view key;  // "" for bucket-level calls; a prefix for listings
  int attempts = 0;       // requests sent; 0: refused before sending (a bad key)
  absl::Duration elapsed = absl::ZeroDuration();

  // "s3://bucket/key".
  std::string Url() const;
};

// The status code for an error reply (the table above).
absl::StatusCode S3ErrorStatusCode(int http_status, absl::string_view s3_code);

// The HTTP status an error reply stands for: 500 for a 200 with InternalError, 503 for a 200
// with SlowDown or ServiceUnavailable (S3 can fail CompleteMultipartUpload after its 200 went
// out); else `http_status`. Retries and the table go by it.
int EffectiveHttpStatus(int http_status, absl::string_view s3_code);

// The status for an error reply with `http_status` (>= 300, or a 200 that carried an <Error>).
absl::Status S3ErrorToStatus(const CallContext& call, int http_status, const S3ErrorReply& reply);

// What a libcurl result code (CURLcode) means for retrying (retry.h).
TransportFailure ClassifyCurlCode(int curl_code);

// The status code for a libcurl failure (the table above).
absl::StatusCode CurlStatusCode(int curl_code);

// The status for a libcurl failure; `detail` is libcurl's error text, already redacted.
absl::Status TransportErrorToStatus(const CallContext& call, int curl_code,
                                    absl::string_view detail);

// A status with `code` for a reply that breaks the protocol or an outcome the operation
// refuses; `what` says how ("reply is not ListBucketResult XML: ...").
absl::Status CallError(const CallContext& call, absl::StatusCode code, absl::string_view what);

}  // namespace tessera::s3

#endif  // TESSERA_STORAGE_S3_S3_ERRORS_H_
