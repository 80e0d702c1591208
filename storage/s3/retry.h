// When the S3 client tries a request again, and how long it waits first: a pure decision over
// what one attempt ended with, so the rule is in one place and tested without a network.
//
// Retried (the store or the path to it is briefly unwell; the same request can succeed):
//   HTTP 500 InternalError, 502, 503 SlowDown / ServiceUnavailable, 504, 429 (throttled);
//   transport failures: connection refused or reset, a connect or stall timeout, a TLS
//   handshake cut short, a reply cut short or missing (a keep-alive connection the server
//   closed).
// Never retried: every other status (any other 4xx: the request itself is wrong, or refused;
// 2xx with an error body is decided by the operation), a host name that does not resolve, a
// TLS certificate that does not verify, a malformed URL.
//
// Backoff: "full jitter" (AWS Architecture Blog, "Exponential Backoff And Jitter"): before retry
// n (n = 1 after the first failure) wait jitter * min(max_backoff, initial_backoff * 2^(n-1)),
// jitter uniform in [0, 1). A retry is not started once max_attempts were made, nor if its
// wait would end past max_total since the call began.
//
// Retrying a non-idempotent request has consequences the operations document: a conditional
// PutObject retried after its first attempt landed sees its own object (412), a
// CompleteMultipartUpload retried after the first completed sees NoSuchUpload.
//
// Pure functions; thread-safe.
#ifndef TESSERA_STORAGE_S3_RETRY_H_
#define TESSERA_STORAGE_S3_RETRY_H_

#include "absl/time/time.h"

namespace tessera::s3 {

struct RetryPolicy {
  // Attempts per call, the first included; 1 disables retries. Default: 5.
  int max_attempts = 5;
  // Backoff cap before the first retry (doubled for each later one). Default: 100 ms.
  absl::Duration initial_backoff = absl::Milliseconds(100);
  // Largest backoff cap. Default: 5 s.
  absl::Duration max_backoff = absl::Seconds(5);
  // No retry whose wait ends later than this after the call began. Attempts in flight are
  // bounded by the connect and stall timeouts (S3ClientOptions), not by this. Default: 60 s.
  absl::Duration max_total = absl::Seconds(60);
};

// How one attempt ended, as far as retrying is concerned.
enum class TransportFailure {
  kNone,       // an HTTP response arrived (its status decides)
  kTransient,  // refused, reset, timed out, cut short: retried
  kPermanent,  // unresolvable host, TLS verification, bad URL, ...: not retried
};

struct AttemptOutcome {
  TransportFailure transport = TransportFailure::kNone;
  int http_status = 0;  // with kNone
};

// True if the status alone asks for a retry (500, 502, 503, 504, 429).
bool IsRetryableHttpStatus(int http_status);

// True if `outcome` is worth another attempt (see the header comment), ignoring limits.
bool IsRetryable(const AttemptOutcome& outcome);

struct RetryDecision {
  bool retry = false;
  absl::Duration wait = absl::ZeroDuration();  // before the next attempt, if retry
};

// After `attempts_made` attempts (>= 1), the last ending with `outcome`, `elapsed` since the
// call began: retry, and after how long? `jitter` is uniform in [0, 1), drawn by the caller.
RetryDecision DecideRetry(const RetryPolicy& policy, const AttemptOutcome& outcome,
                          int attempts_made, absl::Duration elapsed, double jitter);

// The backoff cap before retry `retry_number` (1-based): min(max, initial * 2^(n-1)).
absl::Duration BackoffCap(const RetryPolicy& policy, int retry_number);

}  // namespace tessera::s3

#endif  // TESSERA_STORAGE_S3_RETRY_H_
