#include "storage/s3/retry.h"

#include "gtest/gtest.h"

namespace tessera::s3 {
namespace {

AttemptOutcome Http(int status) { return AttemptOutcome{TransportFailure::kNone, status}; }

TEST(IsRetryable, ServerErrorsAndThrottling_Retried) {
  for (int status : {429, 500, 502, 503, 504}) EXPECT_TRUE(IsRetryable(Http(status))) << status;
}

TEST(IsRetryable, OtherStatuses_NotRetried) {
  for (int status : {200, 204, 206, 301, 400, 403, 404, 409, 412, 416, 501}) {
    EXPECT_FALSE(IsRetryable(Http(status))) << status;
  }
}

TEST(IsRetryable, TransientTransport_Retried_PermanentNot) {
  EXPECT_TRUE(IsRetryable({TransportFailure::kTransient, 0}));
  EXPECT_FALSE(IsRetryable({TransportFailure::kPermanent, 0}));
}

TEST(BackoffCap, DoublesFromInitial_CappedAtMax) {
  RetryPolicy policy;
  policy.initial_backoff = absl::Milliseconds(100);
  policy.max_backoff = absl::Milliseconds(500);
  EXPECT_EQ(BackoffCap(policy, 1), absl::Milliseconds(100));
  EXPECT_EQ(BackoffCap(policy, 2), absl::Milliseconds(200));
  EXPECT_EQ(BackoffCap(policy, 3), absl::Milliseconds(400));
  EXPECT_EQ(BackoffCap(policy, 4), absl::Milliseconds(500));
  EXPECT_EQ(BackoffCap(policy, 40), absl::Milliseconds(500));
}

TEST(DecideRetry, Retryable_WaitIsJitterTimesCap) {
  RetryPolicy policy;
  const RetryDecision d = DecideRetry(policy, Http(503), 2, absl::Seconds(1), 0.5);
  EXPECT_TRUE(d.retry);
  EXPECT_EQ(d.wait, absl::Milliseconds(100));  // 0.5 * 200 ms
}

TEST(DecideRetry, ZeroJitter_RetriesAtOnce) {
  const RetryDecision d = DecideRetry(RetryPolicy{}, Http(500), 1, absl::ZeroDuration(), 0.0);
  EXPECT_TRUE(d.retry);
  EXPECT_EQ(d.wait, absl::ZeroDuration());
}

TEST(DecideRetry, NotRetryable_NoRetry) {
  EXPECT_FALSE(DecideRetry(RetryPolicy{}, Http(403), 1, absl::ZeroDuration(), 0.5).retry);
}

TEST(DecideRetry, AttemptsExhausted_NoRetry) {
  RetryPolicy policy;
  policy.max_attempts = 3;
  EXPECT_TRUE(DecideRetry(policy, Http(500), 2, absl::ZeroDuration(), 0.5).retry);
  EXPECT_FALSE(DecideRetry(policy, Http(500), 3, absl::ZeroDuration(), 0.5).retry);
}

TEST(DecideRetry, SingleAttemptPolicy_NeverRetries) {
  RetryPolicy policy;
  policy.max_attempts = 1;
  EXPECT_FALSE(
      DecideRetry(policy, {TransportFailure::kTransient, 0}, 1, absl::ZeroDuration(), 0.0).retry);
}

TEST(DecideRetry, WaitWouldEndPastTotal_NoRetry) {
  RetryPolicy policy;
  policy.max_total = absl::Seconds(10);
  policy.initial_backoff = absl::Seconds(2);
  // 9 s spent; a 1 s wait would end exactly at the limit, a 1.2 s one past it.
  EXPECT_TRUE(DecideRetry(policy, Http(503), 1, absl::Seconds(9), 0.5).retry);
  EXPECT_FALSE(DecideRetry(policy, Http(503), 1, absl::Seconds(9), 0.6).retry);
}

}  // namespace
}  // namespace tessera::s3
