#include "storage/s3/retry.h"

#include <algorithm>

namespace tessera::s3 {

bool IsRetryableHttpStatus(int http_status) {
  switch (http_status) {
    case 429:
    case 500:
    case 502:
    case 503:
    case 504:
      return true;
    default:
      return false;
  }
}

bool IsRetryable(const AttemptOutcome& outcome) {
  switch (outcome.transport) {
    case TransportFailure::kTransient:
      return true;
    case TransportFailure::kPermanent:
      return false;
    case TransportFailure::kNone:
      return IsRetryableHttpStatus(outcome.http_status);
  }
  return false;
}

absl::Duration BackoffCap(const RetryPolicy& policy, int retry_number) {
  absl::Duration cap = policy.initial_backoff;
  for (int i = 1; i < retry_number && cap < policy.max_backoff; ++i) cap *= 2;
  return std::min(cap, policy.max_backoff);
}

RetryDecision DecideRetry(const RetryPolicy& policy, const AttemptOutcome& outcome,
                          int attempts_made, absl::Duration elapsed, double jitter) {
  RetryDecision decision;
  if (!IsRetryable(outcome) || attempts_made >= policy.max_attempts) return decision;
  jitter = std::clamp(jitter, 0.0, 1.0);
  const absl::Duration wait = BackoffCap(policy, attempts_made) * jitter;
  if (elapsed + wait > policy.max_total) return decision;
  decision.retry = true;
  decision.wait = wait;
  return decision;
}

}  // namespace tessera::s3
