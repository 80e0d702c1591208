#include "agent/lifeline.h"

#include <deque>
#include <optional>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/status.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

// Answers from scripted queues; when a queue is empty it answers OK. Counts calls.
class FakeCoordinator : public CoordinatorClient {
 public:
  absl::StatusOr<v1::RegisterAgentResponse> Register(
      const v1::RegisterAgentRequest& request) override {
    absl::MutexLock lock(&mu_);
    ++registers_;
    last_incarnation_ = request.incarnation();
    if (!register_errors_.empty()) {
      absl::Status s = register_errors_.front();
      register_errors_.pop_front();
      return s;
    }
    v1::RegisterAgentResponse response;
    response.set_lease_ms(lease_ms_);
    response.set_heartbeat_interval_ms(interval_ms_);
    return response;
  }

  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& request) override {
    absl::MutexLock lock(&mu_);
    ++heartbeats_;
    last_pinned_ = request.pinned_bytes();
    last_resident_.reset();
    if (request.has_resident()) last_resident_ = request.resident();
    if (!heartbeat_errors_.empty()) {
      absl::Status s = heartbeat_errors_.front();
      heartbeat_errors_.pop_front();
      return s;
    }
    return v1::HeartbeatResponse();
  }

  absl::StatusOr<v1::SubmitLocalPlanResponse> SubmitLocalPlan(
      const v1::SubmitLocalPlanRequest&) override {
    return absl::UnimplementedError("not used by the lifeline");
  }
  absl::StatusOr<v1::ReportPhaseResponse> ReportPhase(const v1::ReportPhaseRequest&) override {
    return absl::UnimplementedError("not used by the lifeline");
  }
  absl::StatusOr<v1::ReportChunksResponse> ReportChunks(
      const v1::ReportChunksRequest&) override {
    return absl::UnimplementedError("not used by the lifeline");
  }

  void FailRegisters(int n, absl::Status s) {
    absl::MutexLock lock(&mu_);
    for (int i = 0; i < n; ++i) register_errors_.push_back(s);
  }
  void FailHeartbeats(absl::Status s) {
    absl::MutexLock lock(&mu_);
    heartbeat_errors_.push_back(s);
  }
  // Blocks until at least `n` heartbeats were received.
  void AwaitHeartbeats(int n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return heartbeats_ >= n; };
    mu_.Await(absl::Condition(&enough));
  }
  // As AwaitHeartbeats, giving up after `timeout`; false then.
  bool AwaitHeartbeatsFor(int n, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return heartbeats_ >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
  }
  int registers() {
    absl::MutexLock lock(&mu_);
    return registers_;
  }
  uint64_t last_pinned() {
    absl::MutexLock lock(&mu_);
    return last_pinned_;
  }
  std::optional<v1::MemoryCopy> last_resident() {
    absl::MutexLock lock(&mu_);
    return last_resident_;
  }
  // Lease and heartbeat interval granted by later registrations.
  void Grant(uint32_t lease_ms, uint32_t interval_ms) {
    absl::MutexLock lock(&mu_);
    lease_ms_ = lease_ms;
    interval_ms_ = interval_ms;
  }

 private:
  absl::Mutex mu_;
  int registers_ ABSL_GUARDED_BY(mu_) = 0;
  int heartbeats_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t last_incarnation_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t last_pinned_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<v1::MemoryCopy> last_resident_ ABSL_GUARDED_BY(mu_);
  // No lease unless a test grants one: the Lifeline checks its lease against the real clock, and
  // a thread descheduled past it on a loaded machine would register once more than asserted.
  uint32_t lease_ms_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t interval_ms_ ABSL_GUARDED_BY(mu_) = 1;
  std::deque<absl::Status> register_errors_ ABSL_GUARDED_BY(mu_);
  std::deque<absl::Status> heartbeat_errors_ ABSL_GUARDED_BY(mu_);
};

v1::RegisterAgentRequest Registration() {
  v1::RegisterAgentRequest r;
  r.set_job_id("job");
  r.mutable_coord()->set_rank(0);
  r.set_incarnation(42);
  return r;
}

LifelineOptions FastOptions() {
  LifelineOptions options;
  options.backoff.initial = absl::Milliseconds(1);
  options.backoff.max = absl::Milliseconds(4);
  return options;
}

TEST(LifelineTest, Registers_ThenHeartbeats) {
  FakeCoordinator fake;
  Lifeline lifeline(&fake, Registration(), FastOptions());
  lifeline.Start();
  ASSERT_TRUE(lifeline.WaitRegistered(absl::Seconds(30)));
  fake.AwaitHeartbeats(3);
  EXPECT_GE(lifeline.heartbeats_ok(), 2u);
  lifeline.Stop();
  EXPECT_EQ(lifeline.state(), Lifeline::State::kStopped);
}

// REGISTERED only once on_registered returned: what waits for it (the command stream, which
// may be replayed a command of a save at once) finds the agent knowing what the registration
// told it (the storage root). Failed before: registered before the callback ran.
TEST(LifelineTest, Registered_OnlyOnceOnRegisteredReturned) {
  FakeCoordinator fake;
  LifelineOptions options = FastOptions();
  absl::Notification in_callback, release;
  options.on_registered = [&](const v1::RegisterAgentResponse&) {
    if (in_callback.HasBeenNotified()) return;  // a later registration
    in_callback.Notify();
    release.WaitForNotification();
  };
  Lifeline lifeline(&fake, Registration(), options);
  lifeline.Start();
  in_callback.WaitForNotification();
  EXPECT_FALSE(lifeline.WaitRegistered(absl::Milliseconds(50)));
  release.Notify();
  EXPECT_TRUE(lifeline.WaitRegistered(absl::Seconds(30)));
  lifeline.Stop();
}

TEST(LifelineTest, CoordinatorUnavailable_RetriesWithBackoffUntilRegistered) {
  FakeCoordinator fake;
  fake.FailRegisters(5, absl::UnavailableError("connection refused"));
  Lifeline lifeline(&fake, Registration(), FastOptions());
  lifeline.Start();
  ASSERT_TRUE(lifeline.WaitRegistered(absl::Seconds(30)));
  EXPECT_EQ(fake.registers(), 6);
}

TEST(LifelineTest, HeartbeatNotFound_Reregisters) {
  FakeCoordinator fake;
  fake.FailHeartbeats(absl::NotFoundError("coordinator restarted"));
  Lifeline lifeline(&fake, Registration(), FastOptions());
  lifeline.Start();
  fake.AwaitHeartbeats(3);
  EXPECT_EQ(lifeline.registrations(), 2u);
}

TEST(LifelineTest, StaleIncarnation_Superseded) {
  FakeCoordinator fake;
  fake.FailHeartbeats(MakeError(absl::StatusCode::kFailedPrecondition,
                                v1::ERROR_CODE_STALE_INCARNATION, "newer agent"));
  Lifeline lifeline(&fake, Registration(), FastOptions());
  lifeline.Start();
  EXPECT_EQ(lifeline.WaitTerminal(absl::Seconds(30)), Lifeline::State::kSuperseded);
  lifeline.Stop();
  EXPECT_EQ(lifeline.state(), Lifeline::State::kSuperseded);
}

TEST(LifelineTest, Stop_WhileBackingOff_ReturnsPromptly) {
  FakeCoordinator fake;
  fake.FailRegisters(1000, absl::UnavailableError("down"));
  LifelineOptions options;
  options.backoff.initial = absl::Hours(1);  // Stop() must not wait for this.
  Lifeline lifeline(&fake, Registration(), options);
  lifeline.Start();
  EXPECT_FALSE(lifeline.WaitRegistered(absl::Milliseconds(20)));
  lifeline.Stop();
  EXPECT_EQ(lifeline.state(), Lifeline::State::kStopped);
}

TEST(LifelineTest, PinnedBytes_ReportedInHeartbeats) {
  FakeCoordinator fake;
  Lifeline lifeline(&fake, Registration(), FastOptions());
  lifeline.SetPinnedBytes(1 << 20);
  lifeline.Start();
  fake.AwaitHeartbeats(2);
  EXPECT_EQ(fake.last_pinned(), 1u << 20);
}

TEST(LifelineTest, FillHeartbeat_StatedInEveryHeartbeat) {
  FakeCoordinator fake;
  absl::Mutex mu;
  std::optional<v1::MemoryCopy> held;
  LifelineOptions options = FastOptions();
  options.fill_heartbeat = [&](v1::HeartbeatRequest& request) {
    absl::MutexLock lock(&mu);
    if (held.has_value()) *request.mutable_resident() = *held;
  };
  Lifeline lifeline(&fake, Registration(), options);
  {
    absl::MutexLock lock(&mu);
    held.emplace();
    held->set_step(7);
    held->set_region("/tessera-job-r0-1");
  }
  lifeline.Start();
  fake.AwaitHeartbeats(2);
  ASSERT_TRUE(fake.last_resident().has_value());
  EXPECT_EQ(fake.last_resident()->step(), 7);
  EXPECT_EQ(fake.last_resident()->region(), "/tessera-job-r0-1");

  {
    absl::MutexLock lock(&mu);
    held.reset();  // dropped to make room for a save
  }
  // A heartbeat that began before the reset may still state it; the one after does not.
  fake.AwaitHeartbeats(static_cast<int>(lifeline.heartbeats_ok()) + 2);
  EXPECT_FALSE(fake.last_resident().has_value());
}

TEST(LifelineTest, OnHeartbeat_GetsEveryReply) {
  FakeCoordinator fake;
  absl::Mutex mu;
  int replies = 0;
  LifelineOptions options = FastOptions();
  options.on_heartbeat = [&](const v1::HeartbeatResponse&) {
    absl::MutexLock lock(&mu);
    ++replies;
  };
  Lifeline lifeline(&fake, Registration(), options);
  lifeline.Start();
  fake.AwaitHeartbeats(3);
  lifeline.Stop();
  absl::MutexLock lock(&mu);
  EXPECT_EQ(static_cast<uint64_t>(replies), lifeline.heartbeats_ok());
  EXPECT_GE(replies, 2);
}

TEST(LifelineTest, BeatNow_HeartbeatWithoutWaitingForTheInterval) {
  FakeCoordinator fake;
  fake.Grant(/*lease_ms=*/0, /*interval_ms=*/3'600'000);  // no lease, one beat an hour
  Lifeline lifeline(&fake, Registration(), FastOptions());
  lifeline.Start();
  ASSERT_TRUE(lifeline.WaitRegistered(absl::Seconds(30)));
  lifeline.BeatNow();
  EXPECT_TRUE(fake.AwaitHeartbeatsFor(1, absl::Seconds(60)));  // an hour without BeatNow
  lifeline.Stop();
  EXPECT_EQ(lifeline.heartbeats_ok(), 1u);
}

TEST(BackoffTest, GrowsToMaxWithJitterAndResets) {
  BackoffOptions options;
  options.initial = absl::Milliseconds(100);
  options.max = absl::Milliseconds(400);
  options.jitter = 0.5;
  Backoff backoff(options);
  absl::Duration expected_ceiling[] = {absl::Milliseconds(100), absl::Milliseconds(200),
                                       absl::Milliseconds(400), absl::Milliseconds(400)};
  for (absl::Duration ceiling : expected_ceiling) {
    absl::Duration d = backoff.Next();
    EXPECT_LE(d, ceiling);
    EXPECT_GE(d, ceiling / 2);
  }
  backoff.Reset();
  EXPECT_LE(backoff.Next(), absl::Milliseconds(100));
}

}  // namespace
}  // namespace tessera
