// SaveExecutor as a whole, in one process: a fake coordinator, real staging, real storage in a
// temporary directory, loopback peers. Synchronised on the fake's notifications, never on sleeps.
#include "agent/save/save_executor.h"

#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "agent/peer/loopback_peer_transport.h"
#include "agent/save/save_test_messages.h"
#include "common/ids.h"
#include "common/status.h"
#include "format/test_checkpoint.h"
#include "gtest/gtest.h"
#include "storage/posix_storage.h"
#include "storage/testing.h"

namespace tessera {
namespace {

constexpr char kSession[] = "s7-00000000000000a1";
constexpr int64_t kStep = 7;
constexpr uint64_t kCoordinatorIncarnation = 0xc0;
// Long enough to tell a save that proceeds from one that stalls, short beside a test's timeout.
constexpr absl::Duration kBound = absl::Seconds(20);

// A coordinator that answers from its own rules; the test reads what it was told.
class FakeCoordinator : public CoordinatorClient {
 public:
  absl::StatusOr<v1::RegisterAgentResponse> Register(const v1::RegisterAgentRequest&) override {
    return absl::UnimplementedError("not used by the executor");
  }
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest&) override {
    return absl::UnimplementedError("not used by the executor");
  }
  absl::StatusOr<v1::SubmitLocalPlanResponse> SubmitLocalPlan(
      const v1::SubmitLocalPlanRequest&) override {
    v1::SubmitLocalPlanResponse response;
    response.set_session_id(kSession);
    return response;
  }
  absl::StatusOr<v1::ReportPhaseResponse> ReportPhase(
      const v1::ReportPhaseRequest& request) override {
    absl::MutexLock lock(&mu_);
    phases_.push_back(request.phase());
    if (request.has_error()) errors_.push_back(request.error());
    return v1::ReportPhaseResponse();
  }
  absl::StatusOr<v1::ReportChunksResponse> ReportChunks(
      const v1::ReportChunksRequest& request) override {
    absl::MutexLock lock(&mu_);
    if (outage_ > absl::ZeroDuration()) {
      if (outage_began_ == absl::InfinitePast()) outage_began_ = absl::Now();
      if (absl::Now() < outage_began_ + outage_) {
        ++chunk_failures_;
        return absl::UnavailableError("the coordinator is unreachable (test outage)");
      }
    }
    chunks_delivered_ += request.chunks_size();
    return v1::ReportChunksResponse();
  }

  // ReportChunks fails with Unavailable for `outage`, counted from the first call.
  void FailChunkReportsFor(absl::Duration outage) {
    absl::MutexLock lock(&mu_);
    outage_ = outage;
  }
  // Waits until `phase` was reported at least `times` times; false after `bound`.
  bool AwaitPhase(v1::AgentPhase phase, int times, absl::Duration bound) {
    absl::MutexLock lock(&mu_);
    auto reported = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return std::count(phases_.begin(), phases_.end(), phase) >= times;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&reported), bound);
  }
  // Waits until at least `n` reports carried an error; false after `bound`.
  bool AwaitErrors(size_t n, absl::Duration bound) {
    absl::MutexLock lock(&mu_);
    auto reported = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return errors_.size() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&reported), bound);
  }
  int chunk_failures() {
    absl::MutexLock lock(&mu_);
    return chunk_failures_;
  }
  int chunks_delivered() {
    absl::MutexLock lock(&mu_);
    return chunks_delivered_;
  }
  std::vector<v1::ErrorDetail> errors() {
    absl::MutexLock lock(&mu_);
    return errors_;
  }

 private:
  absl::Mutex mu_;
  std::vector<v1::AgentPhase> phases_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::ErrorDetail> errors_ ABSL_GUARDED_BY(mu_);
  absl::Duration outage_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
  absl::Time outage_began_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int chunk_failures_ ABSL_GUARDED_BY(mu_) = 0;
  int chunks_delivered_ ABSL_GUARDED_BY(mu_) = 0;
};

v1::BeginSaveRequest SaveRequest() { return testing_save::OneShardRequest(kStep); }
v1::Command Pin(uint64_t seq) {
  return testing_save::OneShardPin(kSession, kStep, seq, 0, "data-00000.safetensors");
}
v1::Command Bare(uint64_t seq) { return testing_save::BareCommand(kSession, kStep, seq); }

class SaveExecutorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = MakeTempDir("save_executor_test");
    StagingPoolOptions pool_options;
    pool_options.job_id = job_;
    pool_options.incarnation = 0x5eed;
    pool_options.budget_bytes = 16 << 20;
    pool_options.pin = false;
    absl::StatusOr<std::unique_ptr<StagingPool>> pool = StagingPool::Create(pool_options);
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = *std::move(pool);
  }

  std::unique_ptr<SaveExecutor> MakeExecutor(SaveExecutorOptions options) {
    options.core.job_id = job_;
    options.core.rank = 0;
    options.core.incarnation = 0x5eed;
    return std::make_unique<SaveExecutor>(&coordinator_, pool_.get(), &storage_, &peers_,
                                          options);
  }

  v1::RegisterAgentResponse Registered() const {
    v1::RegisterAgentResponse response;
    response.set_coordinator_incarnation(kCoordinatorIncarnation);
    response.set_storage_root(root_);
    return response;
  }

  // Runs the save up to the PERSIST command: BeginSave gets its slots, the trainer stages.
  void SaveUpToPersist(SaveExecutor& executor) {
    absl::Notification began;
    absl::StatusOr<v1::BeginSaveResponse> slots;
    executor.BeginSave(SaveRequest(), [&](absl::StatusOr<v1::BeginSaveResponse> r) {
      slots = std::move(r);
      began.Notify();
    });
    // PIN may overtake the submission's reply: the core holds it for the session (R1).
    executor.OnCommand(Pin(1));
    ASSERT_TRUE(coordinator_.AwaitPhase(v1::AGENT_PHASE_PINNED, 1, kBound));
    executor.OnCommand([] {
      v1::Command c = Bare(2);
      c.mutable_copy();
      return c;
    }());
    ASSERT_TRUE(began.WaitForNotificationWithTimeout(kBound));
    ASSERT_TRUE(slots.ok()) << slots.status();
    absl::Notification staged;
    absl::Status staged_status;
    executor.Staged(kSession, 1, [&](absl::Status s) {
      staged_status = s;
      staged.Notify();
    });
    ASSERT_TRUE(staged.WaitForNotificationWithTimeout(kBound));
    ASSERT_TRUE(staged_status.ok()) << staged_status;
    ASSERT_TRUE(coordinator_.AwaitPhase(v1::AGENT_PHASE_STAGED, 1, kBound));
    executor.OnCommand([] {
      v1::Command c = Bare(3);
      c.mutable_gather();
      return c;
    }());
    ASSERT_TRUE(coordinator_.AwaitPhase(v1::AGENT_PHASE_GATHERED, 1, kBound));
  }

  // Sends `committed` (a COMMITTED command) and waits for the save's outcome.
  absl::StatusOr<std::string> CommitAndWait(SaveExecutor& executor, const v1::Command& committed) {
    executor.OnCommand(committed);
    // Shared with the callback: it may come after a wait that gave up.
    struct Outcome {
      absl::Notification done;
      absl::StatusOr<std::string> dir;
    };
    auto outcome = std::make_shared<Outcome>();
    executor.WaitCommitted(kStep, absl::Now() + kBound,
                           [outcome](absl::StatusOr<std::string> d) {
                             outcome->dir = std::move(d);
                             outcome->done.Notify();
                           });
    if (!outcome->done.WaitForNotificationWithTimeout(kBound)) {
      return absl::DeadlineExceededError("WaitCommitted was not answered");
    }
    return outcome->dir;
  }

  v1::Command Persist(uint64_t seq) const {
    v1::Command c = Bare(seq);
    c.mutable_persist()->set_tmp_dir(TmpDirPath(root_, job_, kStep, kSession));
    return c;
  }

  const std::string job_ = absl::StrCat("exectest", getpid());
  std::string root_;
  FakeCoordinator coordinator_;
  PosixStorage storage_;
  LoopbackHub hub_;
  LoopbackPeerTransport peers_{&hub_, 0};
  std::unique_ptr<StagingPool> pool_;
};

// Buddy replication waits here between chunks: a trainer is blocked from BeginSave until
// Staged, and free again after.
TEST_F(SaveExecutorTest, AwaitTrainerFree_FalseFromBeginSaveUntilStaged) {
  std::unique_ptr<SaveExecutor> executor = MakeExecutor({});
  executor->OnRegistered(Registered());
  EXPECT_TRUE(executor->AwaitTrainerFree(absl::ZeroDuration()));
  absl::Notification began;
  executor->BeginSave(SaveRequest(), [&](absl::StatusOr<v1::BeginSaveResponse> r) {
    EXPECT_TRUE(r.ok()) << r.status();
    began.Notify();
  });
  EXPECT_FALSE(executor->AwaitTrainerFree(absl::ZeroDuration()));  // waiting for its slots
  executor->OnCommand(Pin(1));
  ASSERT_TRUE(coordinator_.AwaitPhase(v1::AGENT_PHASE_PINNED, 1, kBound));
  executor->OnCommand([] {
    v1::Command c = Bare(2);
    c.mutable_copy();
    return c;
  }());
  ASSERT_TRUE(began.WaitForNotificationWithTimeout(kBound));
  EXPECT_FALSE(executor->AwaitTrainerFree(absl::ZeroDuration()));  // copying into them
  absl::Notification staged;
  executor->Staged(kSession, 1, [&](absl::Status s) {
    EXPECT_TRUE(s.ok()) << s;
    staged.Notify();
  });
  ASSERT_TRUE(staged.WaitForNotificationWithTimeout(kBound));
  EXPECT_TRUE(executor->AwaitTrainerFree(kBound));
  executor->Shutdown();
}

// The memory tier's buddy sends give way here (BuddyReplicator::GiveWay): before_acquire runs
// at PIN, before the save's staging is acquired, once per save.
TEST_F(SaveExecutorTest, Pin_BeforeAcquireRunsBeforeStagingIsAcquired) {
  std::atomic<int> calls{0};
  std::atomic<uint64_t> regions_at_call{~uint64_t{0}};
  SaveExecutorOptions options;
  options.before_acquire = [&] {
    regions_at_call.store(pool_->regions_created());
    calls.fetch_add(1);
  };
  std::unique_ptr<SaveExecutor> executor = MakeExecutor(options);
  executor->OnRegistered(Registered());
  ASSERT_EQ(pool_->regions_created(), 0u);
  SaveUpToPersist(*executor);
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(regions_at_call.load(), 0u) << "staging was acquired before before_acquire ran";
  EXPECT_EQ(pool_->regions_created(), 1u);
  executor->Shutdown();
}

// Bug 2 (issue 11): a chunk report that failed for longer than the retry window (3 s) was
// given up, and the save waited for the coordinator's phase timeout. It must be re-sent once
// the coordinator answers again, and the session proceed to its commit.
TEST_F(SaveExecutorTest, ChunkReport_FailsLongerThanRetryWindow_ResentAndSessionProceeds) {
  SaveExecutorOptions options;
  options.core.retry_backoff = {absl::Milliseconds(10), absl::Milliseconds(50), 2.0, 0.5};
  std::unique_ptr<SaveExecutor> executor = MakeExecutor(options);
  executor->OnRegistered(Registered());
  SaveUpToPersist(*executor);

  coordinator_.FailChunkReportsFor(absl::Milliseconds(3500));
  executor->OnCommand(Persist(4));

  ASSERT_TRUE(coordinator_.AwaitPhase(v1::AGENT_PHASE_PERSISTED, 1, kBound))
      << "the chunk report was not re-sent after the outage (" << coordinator_.chunk_failures()
      << " failed attempts, " << coordinator_.chunks_delivered() << " chunks delivered)";
  EXPECT_EQ(coordinator_.chunks_delivered(), 1);
  EXPECT_GT(coordinator_.chunk_failures(), 1);
  v1::Command committed = Bare(5);
  committed.mutable_committed()->set_checkpoint_dir(StepDirPath(root_, job_, kStep));
  absl::StatusOr<std::string> dir = CommitAndWait(*executor, committed);
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_EQ(*dir, StepDirPath(root_, job_, kStep));
}

// The heartbeat names the last commit the agent handled (HeartbeatRequest
// .last_committed_session), and a committed save becomes it only once the memory tier has it:
// a heartbeat that reads the name and then asks the tier states the kept step, never the one
// before it (the coordinator would call a memory-only step lost); then the agent heartbeats
// at once (after_keep).
TEST_F(SaveExecutorTest, LastCommittedSession_OnceTheMemoryTierHasTheSave) {
  SaveExecutor* executor_seen = nullptr;
  std::string named_at_publish = "not called";
  MemoryTier tier([&] { named_at_publish = executor_seen->LastCommittedSession(); });
  std::string named_after_keep = "not called";
  std::optional<ResidentCheckpoint> kept_after_keep;
  SaveExecutorOptions options;
  options.memory_tier = &tier;
  options.after_keep = [&] {  // where the agent heartbeats at once
    named_after_keep = executor_seen->LastCommittedSession();
    kept_after_keep = tier.Current();
  };
  std::unique_ptr<SaveExecutor> executor = MakeExecutor(options);
  executor_seen = executor.get();
  executor->OnRegistered(Registered());
  SaveUpToPersist(*executor);
  v1::Command persist = Bare(4);
  persist.mutable_persist()->set_memory_only(true);
  executor->OnCommand(persist);
  ASSERT_TRUE(coordinator_.AwaitPhase(v1::AGENT_PHASE_PERSISTED, 1, kBound));
  EXPECT_EQ(executor->LastCommittedSession(), "");

  v1::Command committed = Bare(5);
  committed.mutable_committed();
  absl::StatusOr<std::string> dir = CommitAndWait(*executor, committed);
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_EQ(named_at_publish, "") << "the commit was named before the tier had its save";
  EXPECT_EQ(named_after_keep, kSession);
  ASSERT_TRUE(kept_after_keep.has_value()) << "the committed save was not kept";
  EXPECT_EQ(kept_after_keep->session_id, kSession);
  EXPECT_EQ(executor->LastCommittedSession(), kSession);
}

// Bug 2 (issue 11): an agent that registered again with the same coordinator (a blip that
// cost it its lease, or a coordinator that lost the agent) never re-sent its reports.
TEST_F(SaveExecutorTest, ReRegistered_SameCoordinator_ReportsResent) {
  std::unique_ptr<SaveExecutor> executor = MakeExecutor(SaveExecutorOptions());
  executor->OnRegistered(Registered());
  SaveUpToPersist(*executor);

  executor->OnRegistered(Registered());

  EXPECT_TRUE(coordinator_.AwaitPhase(v1::AGENT_PHASE_GATHERED, 2, kBound))
      << "the reports were not re-sent after registering again with the same coordinator";
  EXPECT_TRUE(coordinator_.AwaitPhase(v1::AGENT_PHASE_STAGED, 2, kBound));
  EXPECT_TRUE(coordinator_.errors().empty());
}

// Bug 6 (issue 11): the agent wrote into whatever directory PERSIST named, and removed it when
// the session aborted. A directory that is not the session's own must be refused untouched.
TEST_F(SaveExecutorTest, Persist_TmpDirNotTheSessions_RefusedNothingWrittenOrRemoved) {
  std::unique_ptr<SaveExecutor> executor = MakeExecutor(SaveExecutorOptions());
  executor->OnRegistered(Registered());
  SaveUpToPersist(*executor);
  const std::string precious = JoinPath(root_, "precious");
  ASSERT_TRUE(storage_.CreateDirs(precious).ok());
  {
    absl::StatusOr<std::unique_ptr<WritableFile>> file =
        storage_.OpenForWrite(JoinPath(precious, "keep.txt"));
    ASSERT_TRUE(file.ok()) << file.status();
    ASSERT_TRUE((*file)->WriteAt(0, "keep", 4).ok());
    ASSERT_TRUE((*file)->Close().ok());
  }

  v1::Command persist = Bare(4);
  persist.mutable_persist()->set_tmp_dir(precious);
  executor->OnCommand(persist);
  EXPECT_TRUE(coordinator_.AwaitErrors(1, kBound)) << "the foreign directory was not refused";
  v1::Command abort = Bare(5);
  abort.mutable_abort()->mutable_error()->set_code(v1::ERROR_CODE_IO_ERROR);
  abort.mutable_abort()->mutable_error()->set_message("rank 0 failed");
  absl::Notification ended;
  executor->OnCommand(abort);
  executor->WaitCommitted(kStep, absl::Now() + kBound,
                          [&](absl::StatusOr<std::string>) { ended.Notify(); });
  ASSERT_TRUE(ended.WaitForNotificationWithTimeout(kBound));

  absl::StatusOr<std::vector<std::string>> left = storage_.ListDir(precious);
  EXPECT_TRUE(left.ok()) << "the foreign directory was removed: " << left.status();
  if (left.ok()) {
    EXPECT_EQ(*left, std::vector<std::string>{"keep.txt"});
  }
  std::vector<v1::ErrorDetail> errors = coordinator_.errors();
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].code(), v1::ERROR_CODE_IO_ERROR);
  EXPECT_NE(errors[0].message().find(precious), std::string::npos) << errors[0].message();
  EXPECT_NE(errors[0].message().find(TmpDirPath(root_, job_, kStep, kSession)),
            std::string::npos)
      << errors[0].message();
}

}  // namespace
}  // namespace tessera
