// Tests of the coordinator's shell around the session core (server/session_manager.h): its
// threading (per-job strands, answers after the write is durable, nothing blocking another
// job) and its handling of a refused store write. The protocol itself is job_core_test's.
#include "server/session_manager.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/clock.h"
#include "common/layout.h"
#include "common/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/agent_registry.h"
#include "server/store/memory_state_store.h"
#include "server/testing/plan_fixtures.h"

namespace tessera {
namespace {

using ::testing::ElementsAre;

// Records commands; never blocks.
class RecordingSink : public CommandSink {
 public:
  void Send(const std::string& job_id, uint32_t rank, const v1::Command& command) override {
    absl::MutexLock lock(&mu_);
    sent_.push_back({job_id, rank, command});
  }
  // The commands sent to (job, rank), in order.
  std::vector<v1::Command> CommandsTo(const std::string& job_id, uint32_t rank) {
    absl::MutexLock lock(&mu_);
    std::vector<v1::Command> commands;
    for (const Sent& s : sent_) {
      if (s.job_id == job_id && s.rank == rank) commands.push_back(s.command);
    }
    return commands;
  }
  // Waits until a command of `body` was sent to (job, rank); false after `bound`.
  bool AwaitSent(const std::string& job_id, uint32_t rank, v1::Command::BodyCase body,
                 absl::Duration bound) {
    absl::MutexLock lock(&mu_);
    auto sent = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return std::any_of(sent_.begin(), sent_.end(), [&](const Sent& s) {
        return s.job_id == job_id && s.rank == rank && s.command.body_case() == body;
      });
    };
    return mu_.AwaitWithTimeout(absl::Condition(&sent), bound);
  }
  std::vector<uint32_t> RanksSent(const std::string& job_id, v1::Command::BodyCase body) {
    absl::MutexLock lock(&mu_);
    std::vector<uint32_t> ranks;
    for (const Sent& s : sent_) {
      if (s.job_id == job_id && s.command.body_case() == body) ranks.push_back(s.rank);
    }
    return ranks;
  }

 private:
  struct Sent {
    std::string job_id;
    uint32_t rank;
    v1::Command command;
  };
  absl::Mutex mu_;
  std::vector<Sent> sent_ ABSL_GUARDED_BY(mu_);
};

// A store whose next Commit, once armed, blocks until released.
class GatedStore : public MemoryStateStore {
 public:
  absl::Notification entered, release;
  std::atomic<bool> armed{false};
  absl::Status Commit(const StoreBatch& batch) override {
    if (armed.exchange(false)) {
      entered.Notify();
      release.WaitForNotification();
    }
    return MemoryStateStore::Commit(batch);
  }
};

// Records removals of aborted sessions' directories; commits and retention do nothing.
class RecordingEdge : public CommitEdge {
 public:
  CommitResolution Commit(const CommitAttempt&) override {
    return CommitResolution{CommitOutcome::kUnresolved, absl::UnavailableError("not here")};
  }
  absl::Status Retain(const RetentionWork&) override { return absl::OkStatus(); }
  absl::Status Remove(const std::string& dir) override {
    absl::MutexLock lock(&mu_);
    removed_.push_back(dir);
    return absl::OkStatus();
  }
  std::vector<std::string> removed() {
    absl::MutexLock lock(&mu_);
    return removed_;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> removed_ ABSL_GUARDED_BY(mu_);
};

class SessionManagerTest : public ::testing::Test {
 protected:
  SessionManagerTest() : registry_(&clock_, AgentRegistryOptions{}) {
    options_.session.coordinator_commits = false;  // no storage: commits go to an agent
    options_.session.storage_root = "/ckpt";
    options_.threads = 4;
  }

  void Register(const std::string& job, const std::string& spec, uint64_t incarnation_base) {
    v1::Layout layout = *ParseLayoutSpec(spec);
    const uint32_t world = MeshLayout::FromProto(layout)->world_size();
    for (uint32_t r = 0; r < world; ++r) {
      v1::RegisterAgentRequest request;
      request.set_copies_when_pinned(true);  // as tessera-agent does
      request.set_job_id(job);
      request.mutable_coord()->set_rank(r);
      *request.mutable_layout() = layout;
      request.set_incarnation(incarnation_base + r);
      request.set_node_id(absl::StrCat(job, "-node-", r));
      ASSERT_TRUE(registry_.Register(request).ok());
    }
  }

  void Start(StateStore* store, CommitEdge* edge = nullptr) {
    manager_ = std::make_unique<SessionManager>(store, &registry_, &sink_, edge, &clock_,
                                                options_);
    ASSERT_TRUE(manager_->Recover().ok());
  }

  // Reports `phase` of (job, rank) for `session_id` and waits for the answer.
  void Report(const std::string& job, uint32_t rank, uint64_t incarnation,
              const std::string& session_id, v1::AgentPhase phase) {
    v1::ReportPhaseRequest request;
    request.set_job_id(job);
    request.set_rank(rank);
    request.set_incarnation(incarnation);
    request.set_session_id(session_id);
    request.set_phase(phase);
    absl::Notification done;
    manager_->ReportPhase(request, [&](absl::StatusOr<v1::SessionState> state) {
      EXPECT_TRUE(state.ok()) << state.status();
      done.Notify();
    });
    done.WaitForNotification();
  }

  // Submits and waits for the answer.
  absl::StatusOr<v1::SubmitLocalPlanResponse> Submit(const std::string& job, uint32_t rank, uint64_t incarnation,
                                     std::vector<v1::ShardDesc> shards, int64_t step = 5) {
    v1::SubmitLocalPlanRequest request;
    request.set_job_id(job);
    request.set_rank(rank);
    request.set_incarnation(incarnation);
    request.set_step(step);
    for (const v1::ShardDesc& s : shards) *request.add_shards() = s;
    absl::Notification done;
    absl::StatusOr<v1::SubmitLocalPlanResponse> result;
    manager_->SubmitLocalPlan(std::move(request), [&](absl::StatusOr<v1::SubmitLocalPlanResponse> r) {
      result = std::move(r);
      done.Notify();
    });
    done.WaitForNotification();
    return result;
  }

  // The coordinator removes aborted saves' directories, as soon as no job's trainers are in
  // a save, and never forced by the wait (the clean-up tests).
  void CleanUpWhenTrainersAreFree() {
    options_.session.coordinator_commits = true;
    options_.cleanup_grace = absl::ZeroDuration();
    options_.cleanup_max_wait = absl::Hours(1);
  }

  // Opens a save of "job-a" (dp=1, incarnation 1000) and aborts it as an operator would;
  // returns its session id. Its directory's removal is then pending.
  std::string AbortedSaveOfJobA() {
    EXPECT_TRUE(Submit("job-a", 0, 1000, {Whole("w", {4}, {"dp"})}, 5).ok());
    absl::Notification aborted;
    manager_->AbortSession("job-a", "test", [&](absl::StatusOr<v1::SessionStatus> status) {
      EXPECT_TRUE(status.ok()) << status.status();
      aborted.Notify();
    });
    aborted.WaitForNotification();
    absl::StatusOr<v1::SessionStatus> a = manager_->GetSession("job-a", "");
    EXPECT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a.ok() ? a->state() : v1::SESSION_STATE_UNSPECIFIED, v1::SESSION_STATE_ABORTED);
    return a.ok() ? a->session_id() : "";
  }

  FakeClock clock_;
  AgentRegistry registry_;
  RecordingSink sink_;
  SessionManagerOptions options_;
  std::unique_ptr<SessionManager> manager_;
};

// Issue 11, bug 3: one mutex for every job, held across synced store writes on gRPC callback
// threads. While job A's transition is being persisted (its write blocks), job B's plan is
// still recorded and answered. Failed before: B waited for A's write.
TEST_F(SessionManagerTest, Regression_SlowStoreWriteOfOneJob_DoesNotBlockAnotherJob) {
  Register("job-a", "dp=2", 1000);
  Register("job-b", "dp=1", 2000);
  GatedStore gated;
  Start(&gated);
  ASSERT_TRUE(Submit("job-a", 0, 1000, {Whole("w", {4}, {"dp"})}).ok());
  // The last plan of job A: planning, then the PINNING write, which blocks.
  gated.armed = true;
  absl::Notification a_answered;
  v1::SubmitLocalPlanRequest last;
  last.set_job_id("job-a");
  last.set_rank(1);
  last.set_incarnation(1001);
  last.set_step(5);
  *last.add_shards() = Whole("w", {4}, {"dp"});
  manager_->SubmitLocalPlan(std::move(last), [&](absl::StatusOr<v1::SubmitLocalPlanResponse>) {
    a_answered.Notify();
  });
  gated.entered.WaitForNotification();

  absl::Notification b_done;
  absl::StatusOr<v1::SubmitLocalPlanResponse> b;
  v1::SubmitLocalPlanRequest other;
  other.set_job_id("job-b");
  other.set_rank(0);
  other.set_incarnation(2000);
  other.set_step(7);
  *other.add_shards() = Whole("v", {4}, {"dp"});
  manager_->SubmitLocalPlan(std::move(other), [&](absl::StatusOr<v1::SubmitLocalPlanResponse> r) {
    b = std::move(r);
    b_done.Notify();
  });
  const bool answered = b_done.WaitForNotificationWithTimeout(absl::Seconds(10));
  gated.release.Notify();
  manager_->WaitIdleForTesting();
  ASSERT_TRUE(answered) << "job B waited for job A's store write";
  EXPECT_TRUE(b.ok()) << b.status();
  // Job B (one rank) planned and pinned while job A's write was still blocked.
  EXPECT_THAT(sink_.RanksSent("job-b", v1::Command::kPin), ElementsAre(0));
  a_answered.WaitForNotification();
  EXPECT_THAT(sink_.RanksSent("job-a", v1::Command::kPin), ElementsAre(0, 1));
}

// The answer comes only once the step is durable: a caller is never told a session exists
// that the store does not have.
TEST_F(SessionManagerTest, Submit_AnsweredAfterTheWriteIsDurable) {
  Register("job-a", "dp=1", 1000);
  GatedStore gated;
  Start(&gated);
  gated.armed = true;
  absl::Notification answered;
  v1::SubmitLocalPlanRequest request;
  request.set_job_id("job-a");
  request.set_rank(0);
  request.set_incarnation(1000);
  request.set_step(1);
  *request.add_shards() = Whole("w", {4}, {"dp"});
  manager_->SubmitLocalPlan(std::move(request), [&](absl::StatusOr<v1::SubmitLocalPlanResponse>) {
    answered.Notify();
  });
  gated.entered.WaitForNotification();
  EXPECT_FALSE(answered.HasBeenNotified());
  EXPECT_EQ(gated.TableSize(Table::kSessions), 0u);
  gated.release.Notify();
  answered.WaitForNotification();
  EXPECT_EQ(gated.TableSize(Table::kSessions), 1u);
  manager_->WaitIdleForTesting();
}

// A session's verdict is replayed to a reconnecting command stream only once the write that
// records it is durable: were the write refused (or the coordinator killed during it), the
// recovered job would still hold the session open, and an agent that acted on the verdict (a
// memory-only COMMITTED: step kept, reports closed) would never report again. Failed before:
// the verdict was replayed while its write was blocked.
TEST_F(SessionManagerTest, Verdict_ReplayedOnlyOnceItsWriteIsDurable) {
  Register("job-a", "dp=2", 1000);
  GatedStore gated;
  Start(&gated);
  ASSERT_TRUE(Submit("job-a", 0, 1000, {Whole("w", {4}, {"dp"})}).ok());  // still PLANNING
  gated.armed = true;
  absl::Notification aborted;
  manager_->AbortSession("job-a", "test",
                         [&](absl::StatusOr<v1::SessionStatus>) { aborted.Notify(); });
  gated.entered.WaitForNotification();  // the ABORTED write, blocked
  const std::optional<v1::Command> during = manager_->CurrentCommand("job-a", 0);
  gated.release.Notify();
  aborted.WaitForNotification();
  manager_->WaitIdleForTesting();
  EXPECT_FALSE(during.has_value() && during->has_abort())
      << "the verdict was replayed before the store had it: " << during->DebugString();
  const std::optional<v1::Command> after = manager_->CurrentCommand("job-a", 0);
  ASSERT_TRUE(after.has_value());
  EXPECT_TRUE(after->has_abort()) << after->DebugString();
}

// A refused write: the caller is told to retry, the job is recovered from the store, and
// its agents are told to re-send (RESEND); a re-sent plan then goes through.
TEST_F(SessionManagerTest, StoreRefusesWrite_CallerRetriesJobRecovered) {
  Register("job-a", "dp=2", 1000);
  MemoryStateStore store;
  Start(&store);
  ASSERT_TRUE(Submit("job-a", 0, 1000, {Whole("w", {4}, {"dp"})}).ok());
  store.FailNextCommit(absl::UnavailableError("disk full"));
  // The second plan completes planning; the PINNING write is refused.
  ASSERT_TRUE(Submit("job-a", 1, 1001, {Whole("w", {4}, {"dp"})}).ok());
  manager_->WaitIdleForTesting();
  EXPECT_THAT(sink_.RanksSent("job-a", v1::Command::kPin), ::testing::IsEmpty());
  EXPECT_THAT(sink_.RanksSent("job-a", v1::Command::kResend), ElementsAre(0, 1));
  absl::StatusOr<v1::SessionStatus> status = manager_->GetSession("job-a", "");
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->state(), v1::SESSION_STATE_PLANNING);
  // The agents re-submit, as RESEND asks.
  ASSERT_TRUE(Submit("job-a", 0, 1000, {Whole("w", {4}, {"dp"})}).ok());
  ASSERT_TRUE(Submit("job-a", 1, 1001, {Whole("w", {4}, {"dp"})}).ok());
  manager_->WaitIdleForTesting();
  EXPECT_THAT(sink_.RanksSent("job-a", v1::Command::kPin), ElementsAre(0, 1));
}

// A store that, while `unreadable`, refuses every read.
class UnreadableStore : public MemoryStateStore {
 public:
  std::atomic<bool> unreadable{false};
  absl::StatusOr<std::optional<std::string>> Get(Table table,
                                                 absl::string_view key) const override {
    if (unreadable) return absl::UnavailableError("the store cannot be read");
    return MemoryStateStore::Get(table, key);
  }
};

// A refused write whose recovery cannot read the job back leaves the job to be recovered by
// its next event: a plan submitted then recovers it first, and never starts over from a blank
// job whose first write would replace the stored record (its latest commit, the session in
// flight). Failed before: step 7 opened on a blank job, step 5's session forgotten.
TEST_F(SessionManagerTest, StoreUnreadableAfterARefusedWrite_NextSubmissionRecoversTheJobFirst) {
  Register("job-a", "dp=2", 1000);
  UnreadableStore store;
  Start(&store);
  absl::StatusOr<v1::SubmitLocalPlanResponse> first =
      Submit("job-a", 0, 1000, {Whole("w", {4}, {"dp"})}, 5);
  ASSERT_TRUE(first.ok()) << first.status();
  store.FailNextCommit(absl::UnavailableError("disk full"));
  store.unreadable = true;
  // The last plan (recorded and answered, then validated): its PINNING write is refused,
  // and the recovery cannot read the job.
  ASSERT_TRUE(Submit("job-a", 1, 1001, {Whole("w", {4}, {"dp"})}, 5).ok());
  manager_->WaitIdleForTesting();
  EXPECT_THAT(sink_.RanksSent("job-a", v1::Command::kPin), ::testing::IsEmpty());
  store.unreadable = false;

  absl::StatusOr<v1::SubmitLocalPlanResponse> next =
      Submit("job-a", 0, 1000, {Whole("w", {4}, {"dp"})}, 7);
  manager_->WaitIdleForTesting();
  ASSERT_FALSE(next.ok()) << "step 7 opened beside step 5's session, " << next->session_id();
  EXPECT_EQ(next.status().code(), absl::StatusCode::kFailedPrecondition) << next.status();
  absl::StatusOr<v1::SessionStatus> status = manager_->GetSession("job-a", "");
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->session_id(), first->session_id());
  EXPECT_EQ(status->state(), v1::SESSION_STATE_PLANNING);
}

// Disk clean-up (here: an aborted save's directory) waits while any job's trainers are in a
// save, since every job's saves sync on the one state store, and runs once they resume,
// without holding a thread meanwhile. DESIGN.md "Disk clean-up waits for the trainers".
TEST_F(SessionManagerTest, Cleanup_WaitsWhileAnyJobsTrainersAreInASave) {
  CleanUpWhenTrainersAreFree();
  Register("job-a", "dp=1", 1000);
  Register("job-b", "dp=1", 2000);
  MemoryStateStore store;
  RecordingEdge edge;
  Start(&store, &edge);

  // Job B's trainer is in a save (PINNING); job A's save is aborted by an operator.
  absl::StatusOr<v1::SubmitLocalPlanResponse> b = Submit("job-b", 0, 2000, {Whole("v", {4}, {"dp"})}, 7);
  ASSERT_TRUE(b.ok()) << b.status();
  const std::string a = AbortedSaveOfJobA();
  ASSERT_FALSE(a.empty());

  EXPECT_EQ(manager_->RunDueCleanupsForTesting(), 0);
  EXPECT_THAT(edge.removed(), ::testing::IsEmpty()) << "removed while job B's trainer copies";

  // Job B's trainer copies and resumes: PERSISTING. The removal runs (a tick offers it).
  // (Its plan is validated off the submission's path: PINNED is taken once PIN went out.)
  ASSERT_TRUE(sink_.AwaitSent("job-b", 0, v1::Command::kPin, absl::Seconds(20)));
  Report("job-b", 0, 2000, b->session_id(), v1::AGENT_PHASE_PINNED);
  Report("job-b", 0, 2000, b->session_id(), v1::AGENT_PHASE_STAGED);
  absl::StatusOr<v1::SessionStatus> b_status = manager_->GetSession("job-b", "");
  ASSERT_TRUE(b_status.ok());
  EXPECT_EQ(b_status->state(), v1::SESSION_STATE_PERSISTING);
  manager_->WaitIdleForTesting();  // a waiting clean-up counts as busy until it ran
  EXPECT_THAT(edge.removed(), ElementsAre(::testing::HasSubstr(a)));
}

// The window opens before the store write that opens it: a session's open (its PLANNING
// record) is on its trainers' path, so no clean-up may start while that write is in flight.
TEST_F(SessionManagerTest, Cleanup_NotWhileTheWriteThatBlocksTrainersIsInFlight) {
  CleanUpWhenTrainersAreFree();
  Register("job-a", "dp=1", 1000);
  Register("job-b", "dp=2", 2000);
  Register("job-c", "dp=1", 3000);
  GatedStore store;
  RecordingEdge edge;
  Start(&store, &edge);

  // Job C's trainer is in a save, so job A's aborted directory waits.
  absl::StatusOr<v1::SubmitLocalPlanResponse> c = Submit("job-c", 0, 3000, {Whole("u", {4}, {"dp"})}, 3);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_FALSE(AbortedSaveOfJobA().empty());
  // Its plan is validated off the submission's path: once PIN went out, its PINNING write is
  // done (the gate below is for job B's) and its PINNED report is taken.
  ASSERT_TRUE(sink_.AwaitSent("job-c", 0, v1::Command::kPin, absl::Seconds(20)));

  // Job B's first plan opens its session; that write blocks in the store.
  store.armed = true;
  absl::Notification b_answered;
  v1::SubmitLocalPlanRequest first;
  first.set_job_id("job-b");
  first.set_rank(0);
  first.set_incarnation(2000);
  first.set_step(7);
  *first.add_shards() = Whole("v", {4}, {"dp"});
  manager_->SubmitLocalPlan(std::move(first), [&](absl::StatusOr<v1::SubmitLocalPlanResponse>) {
    b_answered.Notify();
  });
  store.entered.WaitForNotification();

  // Job C's trainer resumes while B's open is still being written: nothing may start.
  Report("job-c", 0, 3000, c->session_id(), v1::AGENT_PHASE_PINNED);
  Report("job-c", 0, 3000, c->session_id(), v1::AGENT_PHASE_STAGED);
  EXPECT_EQ(manager_->RunDueCleanupsForTesting(), 0);
  EXPECT_THAT(edge.removed(), ::testing::IsEmpty()) << "removed during job B's open";

  store.release.Notify();
  b_answered.WaitForNotification();
  EXPECT_EQ(manager_->RunDueCleanupsForTesting(), 0);  // B's trainers wait for its plan
}

// Relayed PINs (server/relay.h): a relay that could not pass a session's command on reports
// the ranks, and each of them that still has a command of that session is sent it on its own
// stream — the same command, seq and all. A report of another session sends nothing.
TEST_F(SessionManagerTest, RelayFailed_RanksAreSentTheirCurrentCommandOfThatSession) {
  Register("job-a", "dp=3", 1000);
  MemoryStateStore store;
  Start(&store);
  std::string session;
  for (uint32_t r = 0; r < 3; ++r) {
    absl::StatusOr<v1::SubmitLocalPlanResponse> response =
        Submit("job-a", r, 1000 + r, {Whole("w", {4}, {"dp"})});
    ASSERT_TRUE(response.ok()) << response.status();
    session = response->session_id();
  }
  manager_->WaitIdleForTesting();
  ASSERT_THAT(sink_.RanksSent("job-a", v1::Command::kPin), ElementsAre(0, 1, 2));
  const v1::Command pin_of_2 = sink_.CommandsTo("job-a", 2).back();

  v1::RelayFailedRequest other;
  other.set_job_id("job-a");
  other.set_rank(0);
  other.set_incarnation(1000);
  other.set_session_id("another-session");
  other.add_ranks(1);
  EXPECT_TRUE(manager_->RelayFailed(other).ok());
  v1::RelayFailedRequest failed = other;
  failed.set_session_id(session);
  failed.clear_ranks();
  failed.add_ranks(2);
  // From a relay's earlier incarnation: refused, and nothing is sent for it.
  v1::RelayFailedRequest stale = failed;
  stale.set_incarnation(999);
  EXPECT_EQ(GetErrorCode(manager_->RelayFailed(stale)), v1::ERROR_CODE_STALE_INCARNATION);
  EXPECT_THAT(sink_.RanksSent("job-a", v1::Command::kPin), ElementsAre(0, 1, 2));
  EXPECT_TRUE(manager_->RelayFailed(failed).ok());

  EXPECT_THAT(sink_.RanksSent("job-a", v1::Command::kPin), ElementsAre(0, 1, 2, 2));
  const std::vector<v1::Command> to_2 = sink_.CommandsTo("job-a", 2);
  ASSERT_EQ(to_2.size(), 2u);
  EXPECT_EQ(to_2[1].SerializeAsString(), pin_of_2.SerializeAsString());
}

}  // namespace
}  // namespace tessera
