// SaveCore as a pure state machine: events in, effects out. No threads, no sleeps, no clock:
// the test owns the time and answers every RPC and work item itself. Test names follow the
// edges and rules of agent/save/save_core.h.
#include "agent/save/save_core.h"

#include <algorithm>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/save/save_test_messages.h"
#include "common/ids.h"
#include "common/plan_fingerprint.h"
#include "common/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr char kJob[] = "job";
constexpr char kRoot[] = "/ckpt";
constexpr char kSession[] = "s7-00000000000000a1";
constexpr int64_t kStep = 7;
constexpr uint64_t kAcquisition = 42;  // the staging pool's number for the session's staging
constexpr uint32_t kRank = 3;

alignas(4096) unsigned char staging_buffer[1 << 16];

// A later session of step 8.
constexpr char kSecondSession[] = "s8-00000000000000c3";

// The global plan's fingerprint the fake coordinator's PINs name.
constexpr uint64_t kPlan = 0xfeedf00d;

v1::BeginSaveRequest Request(int64_t step = kStep) {
  return testing_save::OneShardRequest(step);
}

v1::Command Bare(uint64_t seq, const std::string& session = kSession, int64_t step = kStep) {
  return testing_save::BareCommand(session, step, seq);
}

v1::Command Pin(uint64_t seq, const std::string& session = kSession) {
  v1::Command c =
      testing_save::OneShardPin(session, kStep, seq, kRank, "data-00003.safetensors");
  c.mutable_pin()->set_plan_cached(true);
  c.mutable_pin()->set_plan_fingerprint(kPlan);
  return c;
}

// A PIN that lets the trainer copy once this agent's staging is pinned (no COPY follows).
v1::Command PinCopyingWhenPinned(uint64_t seq) {
  v1::Command pin = Pin(seq);
  pin.mutable_pin()->set_copy_when_pinned(true);
  return pin;
}

// A PIN that lets the trainer copy once pinned and this agent write once staged (R13).
v1::Command PinWritingWhenStaged(uint64_t seq) {
  v1::Command pin = PinCopyingWhenPinned(seq);
  pin.mutable_pin()->set_write_when_staged(true);
  return pin;
}

// A PIN of plan `plan` that leaves the assignment out (R10).
v1::Command PinWithoutAssignment(uint64_t seq, const std::string& session, uint64_t plan) {
  v1::Command c = Bare(seq, session);
  c.mutable_pin()->set_plan_cached(true);
  c.mutable_pin()->set_plan_fingerprint(plan);
  c.mutable_pin()->set_assignment_omitted(true);
  return c;
}

v1::Command SendPlan(uint64_t seq, const std::string& session) {
  v1::Command c = Bare(seq, session);
  c.mutable_send_plan();
  return c;
}

v1::Command Copy(uint64_t seq) {
  v1::Command c = Bare(seq);
  c.mutable_copy();
  return c;
}

v1::Command Gather(uint64_t seq) {
  v1::Command c = Bare(seq);
  (*c.mutable_gather()->mutable_peer_addresses())[1] = "peer-1:4000";
  return c;
}

v1::Command Persist(uint64_t seq, const std::string& dir = TmpDirPath(kRoot, kJob, kStep,
                                                                        kSession)) {
  v1::Command c = Bare(seq);
  c.mutable_persist()->set_tmp_dir(dir);
  return c;
}

v1::Command Commit(uint64_t seq, bool roll_back = false, const std::string& session = kSession,
                   const std::string& final_dir = StepDirPath(kRoot, kJob, kStep)) {
  v1::Command c = Bare(seq, session);
  c.mutable_commit()->set_tmp_dir(TmpDirPath(kRoot, kJob, kStep, session));
  c.mutable_commit()->set_final_dir(final_dir);
  c.mutable_commit()->mutable_manifest()->set_session_id(session);
  c.mutable_commit()->set_roll_back_unless_committed(roll_back);
  c.mutable_commit()->add_retire_steps(5);
  return c;
}

v1::Command Committed(uint64_t seq) {
  v1::Command c = Bare(seq);
  c.mutable_committed()->set_checkpoint_dir(StepDirPath(kRoot, kJob, kStep));
  return c;
}

v1::Command Abort(uint64_t seq, v1::ErrorCode code, const std::string& message) {
  v1::Command c = Bare(seq);
  c.mutable_abort()->mutable_error()->set_code(code);
  c.mutable_abort()->mutable_error()->set_message(message);
  return c;
}

v1::Command Resend(uint64_t seq) {
  v1::Command c = Bare(seq);
  c.mutable_resend();
  return c;
}

// A name for an RPC: "PLAN", a phase ("PINNED"), "ERROR(<code>)" for a failure report,
// "CHUNKS(n)" or "HASHES(n)".
std::string NameOf(const CoordinatorRpc& rpc) {
  if (std::holds_alternative<std::shared_ptr<const v1::SubmitLocalPlanRequest>>(rpc.request)) {
    return "PLAN";
  }
  if (auto* p = std::get_if<std::shared_ptr<const v1::ReportPhaseRequest>>(&rpc.request)) {
    const v1::ReportPhaseRequest& r = **p;
    if (r.phase() == v1::AGENT_PHASE_UNSPECIFIED) {
      return absl::StrCat("ERROR(", ErrorCodeName(r.error().code()), ")");
    }
    return v1::AgentPhase_Name(r.phase()).substr(std::string("AGENT_PHASE_").size());
  }
  const v1::ReportChunksRequest& r =
      *std::get<std::shared_ptr<const v1::ReportChunksRequest>>(rpc.request);
  if (r.chunks_size() > 0) return absl::StrCat("CHUNKS(", r.chunks_size(), ")");
  return absl::StrCat("HASHES(", r.hashes_size(), ")");
}

class SaveCoreTest : public ::testing::Test {
 protected:
  static SaveCoreOptions Options() {
    SaveCoreOptions options;
    options.job_id = kJob;
    options.rank = kRank;
    options.incarnation = 0x5eed;
    options.retry_backoff = {absl::Milliseconds(100), absl::Seconds(2), 2.0, 0.0};
    options.report_batch = 2;
    return options;
  }

  void Apply(SaveEffects fx) {
    for (CoordinatorRpc& rpc : fx.rpcs) rpcs_.push_back(std::move(rpc));
    for (SaveWork& work : fx.work) work_.push_back(std::move(work));
    for (TrainerReply& reply : fx.replies) replies_.push_back(std::move(reply));
    for (std::string& s : fx.cancel_exchanges) cancelled_.push_back(std::move(s));
    for (LogLine& line : fx.logs) logs_.push_back(std::move(line.text));
    if (fx.resident.has_value()) resident_.push_back(std::move(*fx.resident));
    if (!fx.committed.empty()) committed_.push_back(std::move(fx.committed));
    next_tick_ = fx.next_tick;
  }

  // Events.
  void Register(const std::string& root = kRoot) {
    Apply(core_.OnRegistered(now_, 0xc0, root));
  }
  void Begin(uint64_t ticket = 1, int64_t step = kStep) {
    Apply(core_.BeginSave(now_, ticket, Request(step)));
  }
  void Command(const v1::Command& command) { Apply(core_.OnCommand(now_, command)); }
  void Staged(uint64_t ticket = 2) { Apply(core_.Staged(now_, ticket, kSession, 55)); }
  void Wait(uint64_t ticket, absl::Duration timeout = absl::Minutes(5)) {
    Apply(core_.WaitCommitted(now_, ticket, kStep, now_ + timeout));
  }
  void Tick() { Apply(core_.Tick(now_)); }
  void AdvanceTo(absl::Time t) { now_ = t; }

  // The RPCs out, each answered with `code` (submissions name `session`), until none is out;
  // returns their names in the order they were sent.
  std::vector<std::string> Deliver(absl::StatusCode code = absl::StatusCode::kOk,
                                   const std::string& session = kSession) {
    std::vector<std::string> names;
    while (!rpcs_.empty()) {
      CoordinatorRpc rpc = std::move(rpcs_.front());
      rpcs_.pop_front();
      names.push_back(NameOf(rpc));
      sent_.push_back(rpc);
      Answer(rpc, code, session);
    }
    return names;
  }
  // Answers only the first RPC out.
  std::string DeliverOne(absl::StatusCode code = absl::StatusCode::kOk) {
    CoordinatorRpc rpc = std::move(rpcs_.front());
    rpcs_.pop_front();
    sent_.push_back(rpc);
    Answer(rpc, code, kSession);
    return NameOf(rpc);
  }
  void Answer(const CoordinatorRpc& rpc, absl::StatusCode code, const std::string& session) {
    const absl::Status status =
        code == absl::StatusCode::kOk ? absl::OkStatus() : absl::Status(code, "test says so");
    if (std::holds_alternative<std::shared_ptr<const v1::SubmitLocalPlanRequest>>(rpc.request)) {
      v1::SubmitLocalPlanResponse accepted;
      accepted.set_session_id(session);
      const auto& plan = *std::get<std::shared_ptr<const v1::SubmitLocalPlanRequest>>(rpc.request);
      if ((plan.shards_omitted() && knows_no_plans_) || asks_for_sent_shards_) {
        accepted.set_send_full_plan(true);
      }
      absl::StatusOr<v1::SubmitLocalPlanResponse> result = accepted;
      if (!status.ok()) result = status;
      Apply(core_.OnPlanSubmitted(now_, rpc.id, result));
    } else {
      Apply(core_.OnReportDone(now_, rpc.id, status));
    }
  }
  // The last phase report sent.
  v1::ReportPhaseRequest LastPhaseSent() const {
    for (auto it = sent_.rbegin(); it != sent_.rend(); ++it) {
      if (auto* p = std::get_if<std::shared_ptr<const v1::ReportPhaseRequest>>(&it->request)) {
        return **p;
      }
    }
    return v1::ReportPhaseRequest();
  }

  // Work.
  SaveWork TakeWork() {
    EXPECT_FALSE(work_.empty());
    if (work_.empty()) return SaveWork();
    SaveWork w = std::move(work_.front());
    work_.pop_front();
    return w;
  }
  void StagingReady(uint64_t id) {
    Apply(core_.OnStagingReady(now_, id,
                               StagingMemory{"/tessera-test", staging_buffer,
                                             sizeof(staging_buffer), kAcquisition}));
  }
  void Gathered(uint64_t id, int hashes = 0) {
    std::vector<v1::ReplicaHash> h(hashes);
    for (int i = 0; i < hashes; ++i) h[i].set_chunk(static_cast<uint32_t>(i));
    Apply(core_.OnGathered(now_, id, h));
  }
  void Persisted(uint64_t id, int chunks) {
    std::vector<v1::ChunkReport> c(chunks);
    for (int i = 0; i < chunks; ++i) c[i].set_key(absl::StrCat("k", i));
    Apply(core_.OnPersisted(now_, id, c));
  }
  void Resolved(uint64_t id, CommitOutcome outcome, absl::Status status = absl::OkStatus(),
                std::optional<absl::StatusOr<RetentionReport>> retention = std::nullopt) {
    CommitWorkResult result;
    result.resolution = {outcome, status};
    result.retention = std::move(retention);
    Apply(core_.OnCommitResolved(now_, id, result));
  }

  // Replies to the trainer.
  const TrainerReply* ReplyTo(uint64_t ticket) const {
    for (const TrainerReply& r : replies_) {
      if (r.ticket == ticket) return &r;
    }
    return nullptr;
  }
  int RepliesTo(uint64_t ticket) const {
    return static_cast<int>(std::count_if(
        replies_.begin(), replies_.end(),
        [&](const TrainerReply& r) { return r.ticket == ticket; }));
  }
  absl::Status BeginStatus(uint64_t ticket) const {
    const TrainerReply* r = ReplyTo(ticket);
    if (r == nullptr) return absl::UnknownError("no reply");
    return std::get<BeginSaveReply>(r->reply).result.status();
  }
  absl::StatusOr<std::string> WaitResult(uint64_t ticket) const {
    const TrainerReply* r = ReplyTo(ticket);
    if (r == nullptr) return absl::UnknownError("no reply");
    return std::get<WaitCommittedReply>(r->reply).result;
  }
  SavePhase PhaseOf(const std::string& session = kSession) const {
    std::optional<SessionView> view = core_.View(session);
    EXPECT_TRUE(view.has_value());
    return view.has_value() ? view->phase : SavePhase::kAborted;
  }
  bool Logged(const std::string& text) const {
    return std::any_of(logs_.begin(), logs_.end(),
                       [&](const std::string& l) { return l.find(text) != std::string::npos; });
  }

  // Drives the session to a phase, every report delivered.
  void ToPlanned() {
    Register();
    Begin();
    ASSERT_THAT(Deliver(), ElementsAre("PLAN"));
  }
  // `after_plan`, if given, runs once the plan is submitted (e.g. the lease changing while the
  // save is under way).
  void ToPinned(const std::function<void()>& after_plan = nullptr) {
    ToPlanned();
    if (after_plan) after_plan();
    Command(Pin(1));
    StagingReady(TakeWork().id);
    ASSERT_THAT(Deliver(), ElementsAre("PINNED"));
  }
  void ToStaged(const std::function<void()>& after_plan = nullptr) {
    ToPinned(after_plan);
    Command(Copy(2));
    ASSERT_TRUE(BeginStatus(1).ok());
    Staged();
    ASSERT_THAT(Deliver(), ElementsAre("STAGED"));
  }
  void ToGathered(const std::function<void()>& after_plan = nullptr) {
    ToStaged(after_plan);
    Command(Gather(3));
    Gathered(TakeWork().id, 1);
    ASSERT_THAT(Deliver(), ElementsAre("HASHES(1)", "GATHERED"));
  }
  void ToPersisted() {
    ToGathered();
    Command(Persist(4));
    persist_work_ = TakeWork();
    Persisted(persist_work_.id, 3);
    ASSERT_THAT(Deliver(), ElementsAre("CHUNKS(2)", "CHUNKS(1)", "PERSISTED"));
  }

  // The last plan submission sent (delivered or still out).
  v1::SubmitLocalPlanRequest LastPlanOut() const {
    for (auto it = rpcs_.rbegin(); it != rpcs_.rend(); ++it) {
      if (auto* p = std::get_if<std::shared_ptr<const v1::SubmitLocalPlanRequest>>(&it->request)) {
        return **p;
      }
    }
    for (auto it = sent_.rbegin(); it != sent_.rend(); ++it) {
      if (auto* p = std::get_if<std::shared_ptr<const v1::SubmitLocalPlanRequest>>(&it->request)) {
        return **p;
      }
    }
    ADD_FAILURE() << "no plan was submitted";
    return v1::SubmitLocalPlanRequest();
  }
  // A first save committed: the agent holds the assignment of plan kPlan.
  void FirstSaveCommitted() {
    ToPersisted();
    Command(Committed(5));
    ASSERT_EQ(PhaseOf(), SavePhase::kCommitted);
  }

  bool knows_no_plans_ = false;  // the fake coordinator answers fingerprints send_full_plan
  bool asks_for_sent_shards_ = false;  // ... and every plan, shards or not (a broken one)
  SaveCore core_{Options()};
  absl::Time now_ = absl::FromUnixSeconds(1000000);
  std::deque<CoordinatorRpc> rpcs_;
  std::vector<CoordinatorRpc> sent_;
  std::deque<SaveWork> work_;
  std::vector<TrainerReply> replies_;
  std::vector<std::string> cancelled_;
  std::vector<std::string> logs_;
  std::vector<ResidentSave> resident_;
  std::vector<std::string> committed_;  // SaveEffects::committed, in order
  SaveWork persist_work_;  // ToPersisted's
  absl::Time next_tick_ = absl::InfiniteFuture();
};

// --- Edges 1–10: the way to PERSISTED --------------------------------------------------------

TEST_F(SaveCoreTest, Edge1_BeginSave_SubmitsThePlanWithItsShards) {
  Register();
  Begin();
  ASSERT_EQ(rpcs_.size(), 1u);
  const auto& plan =
      *std::get<std::shared_ptr<const v1::SubmitLocalPlanRequest>>(rpcs_.front().request);
  EXPECT_EQ(plan.job_id(), kJob);
  EXPECT_EQ(plan.rank(), kRank);
  EXPECT_EQ(plan.incarnation(), 0x5eedu);
  EXPECT_EQ(plan.step(), kStep);
  ASSERT_EQ(plan.shards_size(), 1);
  EXPECT_EQ(plan.shards(0).fqn(), "w");
}

TEST_F(SaveCoreTest, Edge2_PlanAccepted_SessionPlannedAndTrainerStillWaits) {
  ToPlanned();
  EXPECT_EQ(PhaseOf(), SavePhase::kPlanned);
  EXPECT_EQ(ReplyTo(1), nullptr);
}

TEST_F(SaveCoreTest, Edge1_PlanRefused_TrainerGetsTheErrorAndNoSession) {
  Register();
  Begin();
  Deliver(absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BeginStatus(1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(core_.View(kSession).has_value());
}

TEST_F(SaveCoreTest, Edge1_CoordinatorUnreachable_RetriedWithBackoffThenUnavailable) {
  Register();
  Begin();
  EXPECT_THAT(Deliver(absl::StatusCode::kUnavailable), ElementsAre("PLAN"));
  EXPECT_EQ(next_tick_, now_ + absl::Milliseconds(100));
  AdvanceTo(now_ + absl::Milliseconds(99));
  Tick();
  EXPECT_TRUE(rpcs_.empty());
  AdvanceTo(now_ + absl::Milliseconds(1));
  Tick();
  EXPECT_THAT(Deliver(absl::StatusCode::kUnavailable), ElementsAre("PLAN"));
  EXPECT_EQ(ReplyTo(1), nullptr);
  AdvanceTo(now_ + absl::Seconds(61));
  Tick();
  Deliver(absl::StatusCode::kUnavailable);
  EXPECT_EQ(BeginStatus(1).code(), absl::StatusCode::kUnavailable);
}

TEST_F(SaveCoreTest, Edge3_Pin_LaysOutStagingAndAsksForIt) {
  ToPlanned();
  Command(Pin(1));
  EXPECT_EQ(PhaseOf(), SavePhase::kPinning);
  SaveWork w = TakeWork();
  EXPECT_EQ(w.session_id, kSession);
  const PinWork& pin = std::get<PinWork>(w.item);
  ASSERT_TRUE(pin.layout->file.has_value());
  EXPECT_EQ(pin.layout->file_name, "data-00003.safetensors");
  EXPECT_GE(pin.layout->total_bytes, 4096u);
}

TEST_F(SaveCoreTest, Edge4_StagingReady_ReportsPinnedWithItsBytes) {
  ToPlanned();
  Command(Pin(1));
  StagingReady(TakeWork().id);
  EXPECT_EQ(PhaseOf(), SavePhase::kPinned);
  EXPECT_THAT(Deliver(), ElementsAre("PINNED"));
  EXPECT_EQ(LastPhaseSent().pinned_bytes(), sizeof(staging_buffer));
}

TEST_F(SaveCoreTest, Edge4_StagingOverBudget_ReportedAsAdmissionDenied) {
  ToPlanned();
  Command(Pin(1));
  Apply(core_.OnStagingReady(now_, TakeWork().id,
                             MakeError(absl::StatusCode::kResourceExhausted,
                                       v1::ERROR_CODE_ADMISSION_DENIED, "over budget")));
  EXPECT_EQ(PhaseOf(), SavePhase::kFailed);
  EXPECT_THAT(Deliver(), ElementsAre("ERROR(ADMISSION_DENIED)"));
}

TEST_F(SaveCoreTest, Edge5_Copy_HandsTheSlotsToTheWaitingTrainer) {
  ToPinned();
  Command(Copy(2));
  EXPECT_EQ(PhaseOf(), SavePhase::kCopying);
  const TrainerReply* reply = ReplyTo(1);
  ASSERT_NE(reply, nullptr);
  const absl::StatusOr<v1::BeginSaveResponse>& slots =
      std::get<BeginSaveReply>(reply->reply).result;
  ASSERT_TRUE(slots.ok()) << slots.status();
  EXPECT_EQ(slots->session_id(), kSession);
  EXPECT_EQ(slots->shm_name(), "/tessera-test");
  EXPECT_EQ(slots->shm_size(), sizeof(staging_buffer));
  EXPECT_TRUE(slots->plan_cached());
  ASSERT_EQ(slots->slots_size(), 1);
  EXPECT_EQ(slots->slots(0).nbytes(), 4096u);
}

TEST_F(SaveCoreTest, Edge5_PinSaysCopyWhenPinned_SlotsGoWithTheStagingNoCopyAwaited) {
  ToPlanned();
  Command(PinCopyingWhenPinned(1));
  StagingReady(TakeWork().id);
  EXPECT_EQ(PhaseOf(), SavePhase::kCopying);
  EXPECT_TRUE(BeginStatus(1).ok()) << BeginStatus(1);  // the slots, as on COPY (Edge5_Copy)
  // PINNED goes before STAGED; a COPY that comes anyway (a coordinator restart) is ignored.
  Staged(/*ticket=*/9);
  EXPECT_THAT(Deliver(), ElementsAre("PINNED", "STAGED"));
  Command(Copy(2));
  EXPECT_EQ(PhaseOf(), SavePhase::kStaged);
  EXPECT_EQ(RepliesTo(1), 1);
}

TEST_F(SaveCoreTest, R8_PinSaysCopyWhenPinned_TrainerGoneMeanwhile_AgentLost) {
  ToPlanned();
  Command(PinCopyingWhenPinned(1));
  const uint64_t work = TakeWork().id;
  Apply(core_.TrainerGone(now_, 1));
  StagingReady(work);
  EXPECT_EQ(BeginStatus(1).code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(RepliesTo(1), 1);
  EXPECT_EQ(PhaseOf(), SavePhase::kFailed);
}

TEST_F(SaveCoreTest, Edge6_Staged_AnsweredAtOnceThenReported) {
  ToPinned();
  Command(Copy(2));
  Staged(/*ticket=*/9);
  ASSERT_NE(ReplyTo(9), nullptr);
  EXPECT_TRUE(std::get<StagedReply>(ReplyTo(9)->reply).result.ok());
  EXPECT_EQ(PhaseOf(), SavePhase::kStaged);
  EXPECT_THAT(Deliver(), ElementsAre("STAGED"));
  EXPECT_EQ(LastPhaseSent().trainer_stall_ns(), 55u);
}

TEST_F(SaveCoreTest, Edge6_StagedWithdrawn_FailsWithTheTrainersReasonNeverStaged) {
  ToPinned();
  Command(Copy(2));
  v1::ErrorDetail withdrawn;
  withdrawn.set_code(v1::ERROR_CODE_STATE_CHANGED);
  withdrawn.set_message("tensor 'w' was written before the fence");
  Apply(core_.Staged(now_, /*ticket=*/9, kSession, /*stall_ns=*/0, &withdrawn));
  ASSERT_NE(ReplyTo(9), nullptr);
  EXPECT_TRUE(std::get<StagedReply>(ReplyTo(9)->reply).result.ok());
  EXPECT_EQ(PhaseOf(), SavePhase::kFailed);
  EXPECT_THAT(Deliver(), ElementsAre("ERROR(STATE_CHANGED)"));
  EXPECT_THAT(LastPhaseSent().error().message(), HasSubstr("written before the fence"));
}

TEST_F(SaveCoreTest, R13_PinSaysWriteWhenStaged_HashesThenWritesWithoutGatherOrPersist) {
  ToPlanned();
  Command(PinWritingWhenStaged(1));
  StagingReady(TakeWork().id);
  ASSERT_TRUE(BeginStatus(1).ok());
  Staged();
  // Edge 7 at once: hashing only, no peers.
  EXPECT_EQ(PhaseOf(), SavePhase::kGathering);
  const SaveWork gather_work = TakeWork();
  const GatherWork& gather = std::get<GatherWork>(gather_work.item);
  EXPECT_TRUE(gather.peer_addresses.empty());
  EXPECT_EQ(gather.staging, staging_buffer);
  // Edge 9 at once, into the session's own tmp dir under the registered root.
  const absl::Time began = now_;
  Gathered(gather_work.id, 1);
  EXPECT_EQ(PhaseOf(), SavePhase::kPersisting);
  const SaveWork write = TakeWork();
  const PersistWork& persist = std::get<PersistWork>(write.item);
  EXPECT_EQ(persist.dir, "/ckpt/job/step-000000007.tmp-s7-00000000000000a1");
  EXPECT_FALSE(persist.memory_only);
  EXPECT_EQ(core_.View(kSession)->written_dir, persist.dir);
  // GATHER and PERSIST that come anyway (a coordinator restart) start nothing more.
  Command(Gather(3));
  Command(Persist(4));
  EXPECT_TRUE(work_.empty());
  AdvanceTo(now_ + absl::Milliseconds(30));
  Persisted(write.id, 1);
  EXPECT_THAT(Deliver(),
              ElementsAre("PINNED", "STAGED", "HASHES(1)", "GATHERED", "CHUNKS(1)", "PERSISTED"));
  EXPECT_EQ(PhaseOf(), SavePhase::kPersisted);
  // PERSISTED says when the write began and how long it took.
  EXPECT_EQ(LastPhaseSent().write_started_unix_ms(), absl::ToUnixMillis(began));
  EXPECT_EQ(LastPhaseSent().write_ns(), 30'000'000u);
}

TEST_F(SaveCoreTest, R13_WriteWhenStaged_LeaseChangedMeanwhile_AgentLostNothingWritten) {
  Apply(core_.OnLease(now_, 1));
  ToPlanned();
  Command(PinWritingWhenStaged(1));
  StagingReady(TakeWork().id);
  Staged();
  const uint64_t gather = TakeWork().id;
  Apply(core_.OnLease(now_, std::nullopt));  // frozen past the lease
  Apply(core_.OnLease(now_, 2));             // registered again under a new lease
  Gathered(gather);
  EXPECT_TRUE(work_.empty());
  EXPECT_EQ(PhaseOf(), SavePhase::kFailed);
  EXPECT_THAT(Deliver(), ElementsAre("PINNED", "STAGED", "GATHERED", "ERROR(AGENT_LOST)"));
}

TEST_F(SaveCoreTest, R13_WriteWhenStaged_StorageRootUnknown_IoErrorNothingWritten) {
  Begin();  // never registered
  Deliver();
  Command(PinWritingWhenStaged(1));
  StagingReady(TakeWork().id);
  Staged();
  Gathered(TakeWork().id);
  EXPECT_TRUE(work_.empty());
  EXPECT_THAT(Deliver(), ElementsAre("PINNED", "STAGED", "GATHERED", "ERROR(IO_ERROR)"));
  EXPECT_THAT(LastPhaseSent().error().message(), HasSubstr("no storage root"));
}

TEST_F(SaveCoreTest, Edge6_StagedBeforeTheSlots_FailedPrecondition) {
  ToPinned();
  Staged(/*ticket=*/9);
  EXPECT_EQ(std::get<StagedReply>(ReplyTo(9)->reply).result.code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(PhaseOf(), SavePhase::kPinned);
}

TEST_F(SaveCoreTest, Edge6_StagedUnknownSession_NotFound) {
  Apply(core_.Staged(now_, 9, "s1-nope", 1));
  EXPECT_EQ(std::get<StagedReply>(ReplyTo(9)->reply).result.code(), absl::StatusCode::kNotFound);
}

TEST_F(SaveCoreTest, Edge7_Gather_ExchangeWithTheDeadlineAndPeers) {
  ToStaged();
  Command(Gather(3));
  EXPECT_EQ(PhaseOf(), SavePhase::kGathering);
  const SaveWork work = TakeWork();
  const GatherWork& gather = std::get<GatherWork>(work.item);
  EXPECT_EQ(gather.deadline, now_ + absl::Minutes(10));
  EXPECT_EQ(gather.staging, staging_buffer);
  EXPECT_EQ(gather.peer_addresses.at(1), "peer-1:4000");
}

TEST_F(SaveCoreTest, Edge8_Gathered_HashesAcknowledgedBeforeGathered) {
  ToStaged();
  Command(Gather(3));
  Gathered(TakeWork().id, 2);
  EXPECT_EQ(PhaseOf(), SavePhase::kGathered);
  ASSERT_EQ(rpcs_.size(), 1u);  // GATHERED waits for its hashes' acknowledgement
  EXPECT_EQ(DeliverOne(), "HASHES(2)");
  EXPECT_THAT(Deliver(), ElementsAre("GATHERED"));
}

TEST_F(SaveCoreTest, Edge8_ExchangeTimedOut_ReportedAsTimeout) {
  ToStaged();
  Command(Gather(3));
  Apply(core_.OnGathered(now_, TakeWork().id, absl::DeadlineExceededError("peer 1 silent")));
  EXPECT_THAT(Deliver(), ElementsAre("ERROR(TIMEOUT)"));
}

TEST_F(SaveCoreTest, Edge8_ExchangeCancelled_FailedWithoutReport) {
  ToStaged();
  Command(Gather(3));
  Apply(core_.OnGathered(now_, TakeWork().id, absl::AbortedError("cancelled at the leader")));
  EXPECT_EQ(PhaseOf(), SavePhase::kFailed);
  EXPECT_TRUE(rpcs_.empty());
}

TEST_F(SaveCoreTest, Edge9_Persist_WritesIntoTheSessionsTmpDir) {
  ToGathered();
  Command(Persist(4));
  EXPECT_EQ(PhaseOf(), SavePhase::kPersisting);
  const SaveWork work = TakeWork();
  const PersistWork& persist = std::get<PersistWork>(work.item);
  EXPECT_EQ(persist.dir, "/ckpt/job/step-000000007.tmp-s7-00000000000000a1");
  EXPECT_EQ(persist.staging, staging_buffer);
  EXPECT_EQ(core_.View(kSession)->written_dir, persist.dir);
}

TEST_F(SaveCoreTest, Edge10_Persisted_ChunksInBatchesThenPersisted) {
  ToPersisted();  // asserts CHUNKS(2), CHUNKS(1), PERSISTED
  EXPECT_EQ(PhaseOf(), SavePhase::kPersisted);
}

TEST_F(SaveCoreTest, Edge10_WriteFailed_IoErrorWithThePath) {
  ToGathered();
  Command(Persist(4));
  Apply(core_.OnPersisted(
      now_, TakeWork().id,
      IoError(absl::StatusCode::kResourceExhausted, "/ckpt/job/x/data-00003.safetensors",
              "No space left on device")));
  EXPECT_THAT(Deliver(), ElementsAre("ERROR(IO_ERROR)"));
  EXPECT_EQ(LastPhaseSent().error().path(), "/ckpt/job/x/data-00003.safetensors");
}

// --- Edges 11, 12 and the commit sub-state ---------------------------------------------------

TEST_F(SaveCoreTest, Edge11_CommitForAnUnknownSession_CommitOnlyAndResolves) {
  Register();
  Command(Commit(5));
  EXPECT_EQ(PhaseOf(), SavePhase::kCommitOnly);
  const SaveWork work = TakeWork();
  const CommitWork& commit = std::get<CommitWork>(work.item);
  EXPECT_EQ(commit.tmp_dir, "/ckpt/job/step-000000007.tmp-s7-00000000000000a1");
  EXPECT_EQ(commit.final_dir, "/ckpt/job/step-000000007");
  EXPECT_EQ(commit.job_dir, "/ckpt/job");
  EXPECT_EQ(commit.step, kStep);
}

TEST_F(SaveCoreTest, C2_Committed_CommitWrittenAndRetentionFailureOnlyLogged) {
  ToPersisted();
  Command(Commit(5));
  EXPECT_EQ(core_.View(kSession)->commit, CommitState::kResolving);
  RetentionReport retention;
  retention.removed = {"step-000000005"};
  retention.failed = {{"step-000000004", absl::DataLossError("EIO")}};
  Resolved(TakeWork().id, CommitOutcome::kCommitted, absl::OkStatus(), retention);
  EXPECT_THAT(Deliver(), ElementsAre("COMMIT_WRITTEN"));
  EXPECT_EQ(core_.View(kSession)->commit, CommitState::kWritten);
  EXPECT_EQ(PhaseOf(), SavePhase::kPersisted);
  EXPECT_TRUE(Logged("retention could not remove step-000000004"));
}

TEST_F(SaveCoreTest, C3_RolledBack_ReportedWithTheReason) {
  ToPersisted();
  Command(Commit(5, /*roll_back=*/true));
  Resolved(TakeWork().id, CommitOutcome::kRolledBack,
           absl::UnavailableError("the commit did not complete and was rolled back: fsync"));
  EXPECT_THAT(Deliver(), ElementsAre("COMMIT_ROLLED_BACK"));
  EXPECT_THAT(LastPhaseSent().error().message(), HasSubstr("rolled back"));
  EXPECT_EQ(LastPhaseSent().error().code(), v1::ERROR_CODE_IO_ERROR);
}

TEST_F(SaveCoreTest, C4C5_Unresolved_RetriedWithBackoffUntilResolved) {
  ToPersisted();
  Command(Commit(5));
  Resolved(TakeWork().id, CommitOutcome::kUnresolved, absl::DataLossError("fsync: EIO"));
  EXPECT_EQ(core_.View(kSession)->commit, CommitState::kBackoff);
  EXPECT_TRUE(rpcs_.empty());
  EXPECT_EQ(next_tick_, now_ + absl::Milliseconds(100));
  AdvanceTo(next_tick_);
  Tick();
  Resolved(TakeWork().id, CommitOutcome::kUnresolved, absl::DataLossError("fsync: EIO"));
  EXPECT_EQ(next_tick_, now_ + absl::Milliseconds(200));
  AdvanceTo(next_tick_);
  Tick();
  Resolved(TakeWork().id, CommitOutcome::kCommitted);
  EXPECT_THAT(Deliver(), ElementsAre("COMMIT_WRITTEN"));
}

TEST_F(SaveCoreTest, C1_NewerCommitWhileResolving_RunsAgainWithIt) {
  ToPersisted();
  Command(Commit(5));
  const uint64_t first = TakeWork().id;
  Command(Commit(6, /*roll_back=*/true));
  EXPECT_TRUE(work_.empty());  // one resolution at a time
  Resolved(first, CommitOutcome::kUnresolved, absl::DataLossError("EIO"));
  const SaveWork work = TakeWork();
  const CommitWork& again = std::get<CommitWork>(work.item);
  EXPECT_TRUE(again.commit->roll_back_unless_committed());
}

TEST_F(SaveCoreTest, C2_RepeatedCommit_ResolvesAgainReportsOnce) {
  ToPersisted();
  Command(Commit(5));
  Resolved(TakeWork().id, CommitOutcome::kCommitted);
  EXPECT_THAT(Deliver(), ElementsAre("COMMIT_WRITTEN"));
  Command(Commit(6));
  Resolved(TakeWork().id, CommitOutcome::kCommitted);
  EXPECT_TRUE(rpcs_.empty());
  // HASHES, 2 x CHUNKS; PINNED, STAGED, GATHERED, PERSISTED, one COMMIT_WRITTEN.
  EXPECT_EQ(core_.View(kSession)->reports, 8u);
}

// --- Edges 13–16: failure and verdicts -------------------------------------------------------

TEST_F(SaveCoreTest, Edge13_LocalFailure_ReportedNoFurtherWork_TrainerWaitsForVerdict) {
  ToPlanned();
  Command(Pin(1));
  Apply(core_.OnStagingReady(now_, TakeWork().id, absl::ResourceExhaustedError("/dev/shm full")));
  EXPECT_EQ(PhaseOf(), SavePhase::kFailed);
  EXPECT_THAT(Deliver(), ElementsAre("ERROR(IO_ERROR)"));
  EXPECT_EQ(ReplyTo(1), nullptr);  // the verdict decides what the trainer hears
  Command(Copy(2));
  EXPECT_EQ(ReplyTo(1), nullptr);
  EXPECT_TRUE(work_.empty());
  Command(Abort(3, v1::ERROR_CODE_IO_ERROR, "rank 3: /dev/shm full"));
  EXPECT_THAT(BeginStatus(1).message(), HasSubstr("rank 3: /dev/shm full"));
}

TEST_F(SaveCoreTest, Edge14_AbortWhileWriting_WaitsRemovesOwnDirThenAnswers) {
  ToGathered();
  Command(Persist(4));
  const uint64_t write = TakeWork().id;
  Wait(/*ticket=*/20);
  Command(Abort(5, v1::ERROR_CODE_TIMEOUT, "rank 1 timed out"));
  EXPECT_EQ(PhaseOf(), SavePhase::kEnding);
  EXPECT_THAT(cancelled_, ElementsAre(kSession));
  EXPECT_TRUE(work_.empty());  // the write is still running
  EXPECT_EQ(ReplyTo(20), nullptr);
  Persisted(write, 1);
  EXPECT_TRUE(rpcs_.empty());  // no reports after the verdict
  SaveWork remove = TakeWork();
  EXPECT_EQ(std::get<RemoveWork>(remove.item).dir,
            "/ckpt/job/step-000000007.tmp-s7-00000000000000a1");
  EXPECT_EQ(ReplyTo(20), nullptr);
  Apply(core_.OnRemoved(now_, remove.id, absl::OkStatus()));
  EXPECT_EQ(PhaseOf(), SavePhase::kAborted);
  EXPECT_THAT(WaitResult(20).status().message(), HasSubstr("rank 1 timed out"));
}

TEST_F(SaveCoreTest, Edge14_AbortBeforeWriting_NothingRemoved) {
  ToStaged();
  Wait(20);
  Command(Abort(3, v1::ERROR_CODE_ABORTED_BY_USER, "operator"));
  EXPECT_TRUE(work_.empty());
  EXPECT_EQ(PhaseOf(), SavePhase::kAborted);
  EXPECT_EQ(WaitResult(20).status().code(), absl::StatusCode::kAborted);
}

TEST_F(SaveCoreTest, Edge14_AbortWhileWaitingForSlots_TrainerAnsweredAtOnce) {
  ToPinned();
  Command(Abort(2, v1::ERROR_CODE_AGENT_LOST, "rank 0 lost"));
  EXPECT_THAT(BeginStatus(1).message(), HasSubstr("rank 0 lost"));
}

TEST_F(SaveCoreTest, Edge16_Committed_WaitersGetTheDirectory) {
  ToPersisted();
  Wait(20);
  Command(Committed(5));
  EXPECT_EQ(PhaseOf(), SavePhase::kCommitted);
  ASSERT_TRUE(WaitResult(20).ok());
  EXPECT_EQ(*WaitResult(20), "/ckpt/job/step-000000007");
  EXPECT_EQ(core_.sessions_committed(), 1u);
  Wait(21);  // after the end: at once
  EXPECT_EQ(*WaitResult(21), "/ckpt/job/step-000000007");
}

TEST_F(SaveCoreTest, Edge16_CommittedAfterALocalFailure_Committed) {
  // A failure after every chunk was reported cannot stop the commit: the verdict rules (R7).
  ToPersisted();
  Apply(core_.TrainerGone(now_, 1));  // too late to matter
  Wait(20);
  Command(Committed(5));
  EXPECT_TRUE(WaitResult(20).ok());
}

TEST_F(SaveCoreTest, R11_CommittedAfterWriting_StagingHandedOverAsResident) {
  ToPersisted();
  EXPECT_TRUE(resident_.empty());
  Command(Committed(5));
  ASSERT_EQ(resident_.size(), 1u);
  const ResidentSave& r = resident_[0];
  EXPECT_EQ(r.step, kStep);
  EXPECT_EQ(r.session_id, kSession);
  EXPECT_EQ(r.memory.name, "/tessera-test");
  EXPECT_EQ(r.memory.data, staging_buffer);
  EXPECT_EQ(r.memory.acquisition, kAcquisition);
  // The data section of the file this rank wrote: where staging's bytes sit in the file.
  const PersistWork& persist = std::get<PersistWork>(persist_work_.item);
  ASSERT_TRUE(persist.layout->file.has_value());
  EXPECT_EQ(r.file, persist.layout->file_name);
  EXPECT_EQ(r.file_offset, persist.layout->file->data_start);
  EXPECT_GT(r.file_offset, 0u);
  EXPECT_EQ(r.nbytes, persist.layout->file->data_size);
  EXPECT_EQ(committed_, std::vector<std::string>{kSession});  // the last commit handled
  Command(Committed(6));  // a repeated verdict hands nothing again
  EXPECT_EQ(resident_.size(), 1u);
  EXPECT_EQ(committed_.size(), 1u);
}

TEST_F(SaveCoreTest, R11_CommittedWithoutHavingWritten_NothingResident) {
  // A local failure before writing: the commit can still come (R7); staging is not the file.
  ToStaged();
  Command(Gather(3));
  Apply(core_.OnGathered(now_, TakeWork().id, absl::DeadlineExceededError("peer 2 silent")));
  EXPECT_EQ(PhaseOf(), SavePhase::kFailed);
  Command(Committed(5));
  EXPECT_EQ(PhaseOf(), SavePhase::kCommitted);
  EXPECT_TRUE(resident_.empty());
  // Named all the same: the coordinator learns this agent kept nothing of it.
  EXPECT_EQ(committed_, std::vector<std::string>{kSession});
}

TEST_F(SaveCoreTest, R11_AbortedAfterWriting_NothingResident) {
  ToPersisted();
  Command(Abort(5, v1::ERROR_CODE_TIMEOUT, "rank 2 timed out"));
  while (!work_.empty()) {
    const SaveWork w = TakeWork();
    Apply(core_.OnRemoved(now_, w.id, absl::OkStatus()));
  }
  EXPECT_EQ(PhaseOf(), SavePhase::kAborted);
  EXPECT_TRUE(resident_.empty());
  EXPECT_TRUE(committed_.empty());
}

TEST_F(SaveCoreTest, WaitCommitted_DeadlinePasses_DeadlineExceeded) {
  ToStaged();
  Wait(20, absl::Seconds(30));
  EXPECT_EQ(next_tick_, now_ + absl::Seconds(30));
  AdvanceTo(next_tick_);
  Tick();
  EXPECT_EQ(WaitResult(20).status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST_F(SaveCoreTest, WaitCommitted_UnknownStep_NotFound) {
  Apply(core_.WaitCommitted(now_, 20, 99, now_ + absl::Seconds(1)));
  EXPECT_EQ(WaitResult(20).status().code(), absl::StatusCode::kNotFound);
}

// --- R1: commands ----------------------------------------------------------------------------

TEST_F(SaveCoreTest, R1_SeqNotAboveTheLast_Ignored) {
  ToPlanned();
  Command(Pin(4));
  TakeWork();
  Command(Pin(4));
  Command(Pin(3));
  EXPECT_TRUE(work_.empty());
  Command(Copy(2));  // an older COPY replayed after the stream reconnected
  EXPECT_EQ(ReplyTo(1), nullptr);
}

TEST_F(SaveCoreTest, R1_PinBeforeTheSubmissionsReply_HeldThenHandled) {
  Register();
  Begin();
  Command(Pin(1));  // the reply to SubmitLocalPlan is still on its way
  EXPECT_TRUE(work_.empty());
  EXPECT_THAT(Deliver(), ElementsAre("PLAN"));
  EXPECT_EQ(PhaseOf(), SavePhase::kPinning);
  EXPECT_EQ(work_.size(), 1u);
}

TEST_F(SaveCoreTest, R1_CommandForAnUnknownSession_Ignored) {
  Register();
  Command(Pin(1));
  Command(Persist(2));
  EXPECT_FALSE(core_.View(kSession).has_value());
  EXPECT_TRUE(work_.empty());
}

TEST_F(SaveCoreTest, R1_RepeatedPhaseCommand_IgnoredNoSecondWork) {
  ToGathered();
  Command(Persist(4));
  TakeWork();
  Command(Persist(5));  // a newer seq, but the write is under way
  EXPECT_TRUE(work_.empty());
}

// --- R2, R8: the trainer ---------------------------------------------------------------------

TEST_F(SaveCoreTest, R8_TrainerGoneBeforeStaged_AgentLostNamingRankAndCancelled) {
  ToPinned();
  Apply(core_.TrainerGone(now_, 1));
  EXPECT_EQ(BeginStatus(1).code(), absl::StatusCode::kCancelled);
  EXPECT_THAT(Deliver(), ElementsAre("ERROR(AGENT_LOST)"));
  EXPECT_THAT(LastPhaseSent().error().message(), HasSubstr("rank 3"));
  EXPECT_EQ(RepliesTo(1), 1);
}

TEST_F(SaveCoreTest, R8_TrainerGoneAfterStaged_NothingHappens) {
  ToStaged();
  Apply(core_.TrainerGone(now_, 1));
  EXPECT_TRUE(rpcs_.empty());
  EXPECT_EQ(PhaseOf(), SavePhase::kStaged);
}

TEST_F(SaveCoreTest, R8_TrainerGoneWhileSubmitting_FailsOnceAccepted) {
  Register();
  Begin();
  Apply(core_.TrainerGone(now_, 1));
  EXPECT_EQ(BeginStatus(1).code(), absl::StatusCode::kCancelled);
  EXPECT_THAT(Deliver(), ElementsAre("PLAN", "ERROR(AGENT_LOST)"));
  EXPECT_EQ(RepliesTo(1), 1);
}

TEST_F(SaveCoreTest, R8_CopyAfterTheTrainerLeft_NoSlotsNoSecondFailure) {
  ToPinned();
  Apply(core_.TrainerGone(now_, 1));
  EXPECT_THAT(Deliver(), ElementsAre("ERROR(AGENT_LOST)"));
  Command(Copy(2));
  EXPECT_TRUE(rpcs_.empty());
  EXPECT_EQ(RepliesTo(1), 1);  // Cancelled, and nothing more
}

TEST_F(SaveCoreTest, R2_NewerBeginSaveOfTheSession_TakesItsPlace) {
  ToPinned();
  Begin(/*ticket=*/5);
  Deliver();
  EXPECT_EQ(BeginStatus(1).code(), absl::StatusCode::kAborted);
  Command(Copy(2));
  EXPECT_TRUE(BeginStatus(5).ok());
}

// --- R3: re-sending --------------------------------------------------------------------------

TEST_F(SaveCoreTest, R3_ReRegisteredWithTheSameCoordinator_EverythingResentChunksFirst) {
  ToPersisted();
  Register();  // the same coordinator incarnation as before
  EXPECT_THAT(Deliver(), ElementsAre("HASHES(1)", "CHUNKS(2)", "CHUNKS(1)", "PINNED", "STAGED",
                                     "GATHERED", "PERSISTED"));
}

TEST_F(SaveCoreTest, R3_StreamReconnected_EverythingResent) {
  ToGathered();
  Apply(core_.OnStreamConnected(now_));
  EXPECT_THAT(Deliver(), ElementsAre("HASHES(1)", "PINNED", "STAGED", "GATHERED"));
}

TEST_F(SaveCoreTest, R3_ResendCommand_EverythingResent) {
  ToStaged();
  Command(Resend(9));
  EXPECT_THAT(Deliver(), ElementsAre("PINNED", "STAGED"));
}

TEST_F(SaveCoreTest, R3_FailedChunkReport_RetriedWithBackoffUntilAcknowledged) {
  ToGathered();
  Command(Persist(4));
  Persisted(TakeWork().id, 1);
  EXPECT_THAT(Deliver(absl::StatusCode::kUnavailable), ElementsAre("CHUNKS(1)"));
  EXPECT_EQ(next_tick_, now_ + absl::Milliseconds(100));
  AdvanceTo(now_ + absl::Milliseconds(100));
  Tick();
  EXPECT_THAT(Deliver(absl::StatusCode::kDeadlineExceeded), ElementsAre("HASHES(1)"));
  EXPECT_EQ(next_tick_, now_ + absl::Milliseconds(200));  // the backoff grows
  AdvanceTo(next_tick_);
  Tick();
  // The outage is over: all of them again, chunks first, and PERSISTED at last.
  EXPECT_THAT(Deliver(), ElementsAre("HASHES(1)", "CHUNKS(1)", "PINNED", "STAGED", "GATHERED",
                                     "PERSISTED"));
  EXPECT_EQ(next_tick_, absl::InfiniteFuture());
}

TEST_F(SaveCoreTest, R3_NotFoundAfterACoordinatorRestart_Retried) {
  ToStaged();
  Command(Gather(3));
  Gathered(TakeWork().id);
  EXPECT_THAT(Deliver(absl::StatusCode::kNotFound), ElementsAre("GATHERED"));
  AdvanceTo(next_tick_);
  Tick();
  EXPECT_THAT(Deliver(), ElementsAre("PINNED", "STAGED", "GATHERED"));
}

// A report refused because the session ended is not retried with backoff: the coordinator
// answered it by sending the verdict again. In case that went to a stream this agent no longer
// has, one report (a reminder) goes again after a (re)connection and on a timer, until the
// verdict is here; each answer closes the queue again.
TEST_F(SaveCoreTest, R3_RefusedBecauseTheSessionEnded_NotRetried_RemindedUntilTheVerdict) {
  ToStaged();
  Command(Gather(3));
  Gathered(TakeWork().id);
  EXPECT_THAT(Deliver(absl::StatusCode::kFailedPrecondition), ElementsAre("GATHERED"));
  EXPECT_TRUE(core_.View(kSession)->reports_closed);
  EXPECT_EQ(next_tick_, now_ + absl::Seconds(1));
  Register();
  EXPECT_THAT(Deliver(absl::StatusCode::kFailedPrecondition), ElementsAre("GATHERED"));
  EXPECT_TRUE(rpcs_.empty());
  AdvanceTo(next_tick_);
  Tick();
  EXPECT_THAT(Deliver(absl::StatusCode::kFailedPrecondition), ElementsAre("GATHERED"));
  // The verdict ends the reminders.
  Command(Abort(9, v1::ERROR_CODE_TIMEOUT, "PERSISTING did not finish"));
  EXPECT_EQ(next_tick_, absl::InfiniteFuture());
}

TEST_F(SaveCoreTest, R3_ResendWhileAReportIsOut_NeverTwoAtOnce) {
  ToStaged();
  Command(Gather(3));
  Gathered(TakeWork().id);
  ASSERT_EQ(rpcs_.size(), 1u);  // GATHERED out
  Register();
  EXPECT_EQ(rpcs_.size(), 1u);
  EXPECT_THAT(Deliver(), ElementsAre("GATHERED", "PINNED", "STAGED", "GATHERED"));
}

TEST_F(SaveCoreTest, R3_WaitingPlan_ResubmittedOnResendAndReRegistration) {
  ToPlanned();
  Command(Resend(1));
  EXPECT_THAT(Deliver(), ElementsAre("PLAN"));
  Register();
  EXPECT_THAT(Deliver(), ElementsAre("PLAN"));
  EXPECT_EQ(PhaseOf(), SavePhase::kPlanned);
  Command(Pin(2));
  EXPECT_EQ(PhaseOf(), SavePhase::kPinning);
}

TEST_F(SaveCoreTest, R3_ResubmissionNamesAnotherSession_SessionMoves) {
  ToPlanned();
  Register();
  Deliver(absl::StatusCode::kOk, "s7-00000000000000b2");
  EXPECT_FALSE(core_.View(kSession).has_value());
  EXPECT_EQ(PhaseOf("s7-00000000000000b2"), SavePhase::kPlanned);
  Command(Pin(1, "s7-00000000000000b2"));
  EXPECT_EQ(PhaseOf("s7-00000000000000b2"), SavePhase::kPinning);
}

// --- R4: paths -------------------------------------------------------------------------------

TEST_F(SaveCoreTest, R4_PersistIntoAnotherDirectory_IoErrorNamingBothNothingWrittenOrRemoved) {
  ToGathered();
  Command(Persist(4, "/ckpt/job/../precious"));
  EXPECT_TRUE(work_.empty());
  EXPECT_EQ(PhaseOf(), SavePhase::kFailed);
  EXPECT_THAT(Deliver(), ElementsAre("ERROR(IO_ERROR)"));
  const v1::ErrorDetail error = LastPhaseSent().error();
  EXPECT_THAT(error.message(), HasSubstr("/ckpt/job/../precious"));
  EXPECT_THAT(error.message(), HasSubstr("/ckpt/job/step-000000007.tmp-s7-00000000000000a1"));
  EXPECT_EQ(error.path(), "/ckpt/job/../precious");
  Command(Abort(5, v1::ERROR_CODE_IO_ERROR, "rank 3"));
  EXPECT_TRUE(work_.empty());  // nothing to remove: nothing was written
  EXPECT_EQ(PhaseOf(), SavePhase::kAborted);
}

TEST_F(SaveCoreTest, R4_CommitToAnotherFinalDir_IoErrorNoCommit) {
  ToPersisted();
  Command(Commit(5, false, kSession, "/ckpt/other/step-000000007"));
  EXPECT_TRUE(work_.empty());
  EXPECT_THAT(Deliver(), ElementsAre("ERROR(IO_ERROR)"));
  EXPECT_THAT(LastPhaseSent().error().message(), HasSubstr("/ckpt/job/step-000000007"));
}

// A COMMIT this agent refused (R4) failed the session here, and no later COMMIT is acted on.
// The coordinator asks again when it did not count the refusal (it restarted, or the refusal
// came while this rank was not its committer). Before, that COMMIT was dropped silently — for
// as long as the agent heartbeats, and the coordinator asked no other committer; now it is
// answered with the session's reports again, the refusal among them.
TEST_F(SaveCoreTest, R4_CommitRefused_CommitAgainAnsweredWithTheRefusalAgain) {
  ToPersisted();
  Command(Commit(5, false, kSession, "/ckpt/other/step-000000007"));
  ASSERT_THAT(Deliver(), ElementsAre("ERROR(IO_ERROR)"));
  ASSERT_EQ(PhaseOf(), SavePhase::kFailed);
  Command(Commit(6, false, kSession, "/ckpt/other/step-000000007"));
  EXPECT_TRUE(work_.empty());
  EXPECT_THAT(Deliver(), ElementsAre("HASHES(1)", "CHUNKS(2)", "CHUNKS(1)", "PINNED", "STAGED",
                                     "GATHERED", "PERSISTED", "ERROR(IO_ERROR)"));
  EXPECT_THAT(LastPhaseSent().error().message(), HasSubstr("/ckpt/job/step-000000007"));
}

TEST_F(SaveCoreTest, R4_StorageRootUnknown_Refused) {
  Begin();  // never registered
  Deliver();
  Command(Pin(1));
  StagingReady(TakeWork().id);
  Command(Copy(2));
  Staged();
  Command(Gather(3));
  Gathered(TakeWork().id);
  Deliver();
  Command(Persist(4));
  EXPECT_TRUE(work_.empty());
  EXPECT_THAT(Deliver(), ElementsAre("ERROR(IO_ERROR)"));
  EXPECT_THAT(LastPhaseSent().error().message(), HasSubstr("no storage root"));
}

TEST_F(SaveCoreTest, R4_SessionIdNotAPathComponent_TrainerGetsInternal) {
  Register();
  Begin();
  Deliver(absl::StatusCode::kOk, "../../etc");
  EXPECT_EQ(BeginStatus(1).code(), absl::StatusCode::kInternal);
  EXPECT_FALSE(core_.View("../../etc").has_value());
}

TEST_F(SaveCoreTest, R4_CommitOnlyWithAnUnsafeSessionId_Refused) {
  Register();
  v1::Command c = Commit(1, false, "x/../../y");
  Command(c);
  EXPECT_TRUE(work_.empty());
  EXPECT_THAT(Deliver(), ElementsAre("ERROR(IO_ERROR)"));
}

// --- R5: the lease ---------------------------------------------------------------------------

TEST_F(SaveCoreTest, R5_LeaseChangedBeforePersist_AgentLostNothingWritten) {
  Apply(core_.OnLease(now_, 1));
  ToGathered();
  Apply(core_.OnLease(now_, std::nullopt));  // frozen past the lease
  Apply(core_.OnLease(now_, 2));             // registered again under a new lease
  Command(Persist(4));
  EXPECT_TRUE(work_.empty());
  EXPECT_THAT(Deliver(), ElementsAre("ERROR(AGENT_LOST)"));
  EXPECT_THAT(LastPhaseSent().error().message(), HasSubstr("lease"));
}

// A PERSIST that comes while no lease is current but the generation has not moved (a paused
// coordinator answers the heartbeats it had queued only after it sent the PERSIST): the write
// waits for the renewal and goes ahead under the same lease (issue 52, bug 1).
TEST_F(SaveCoreTest, R5_PersistWhileTheRenewalIsLate_WaitsThenWritesUnderTheSameLease) {
  Apply(core_.OnLease(now_, 1));
  ToGathered();
  Apply(core_.OnLease(now_, std::nullopt));  // not renewed in time by this agent's clock
  Command(Persist(4));
  EXPECT_TRUE(work_.empty()) << "nothing written while the lease is not current";
  EXPECT_TRUE(rpcs_.empty());
  Apply(core_.OnLease(now_, 1));  // renewed: the coordinator kept it
  EXPECT_EQ(work_.size(), 1u);
  EXPECT_THAT(Deliver(), IsEmpty());
}

// ... and if the renewal says the lease was lost meanwhile, or never comes: AGENT_LOST.
TEST_F(SaveCoreTest, R5_PersistWhileTheRenewalIsLate_LeaseLostOrNeverRenewed_AgentLost) {
  Apply(core_.OnLease(now_, 1));
  ToGathered();
  Apply(core_.OnLease(now_, std::nullopt));
  Command(Persist(4));
  Apply(core_.OnLease(now_, 2));  // the coordinator had given it up
  EXPECT_TRUE(work_.empty());
  EXPECT_THAT(Deliver(), ElementsAre("ERROR(AGENT_LOST)"));
}

TEST_F(SaveCoreTest, R5_PersistWhileTheRenewalIsLate_NeverRenewed_AgentLostAtTheBound) {
  Apply(core_.OnLease(now_, 1));
  ToGathered();
  Apply(core_.OnLease(now_, std::nullopt));
  Command(Persist(4));
  EXPECT_TRUE(rpcs_.empty());
  AdvanceTo(next_tick_);
  Tick();
  EXPECT_TRUE(work_.empty());
  EXPECT_THAT(Deliver(), ElementsAre("ERROR(AGENT_LOST)"));
  EXPECT_THAT(LastPhaseSent().error().message(), HasSubstr("not renewed within 1m"));
}

// A commit is asked under a lease: once that lease lapsed, the agent neither retries it nor
// fails the session; the coordinator's next COMMIT, under the new lease, runs (R5).
TEST_F(SaveCoreTest, R5_LeaseLapsedBetweenCommitAttempts_NoRetryUntilAskedAgain) {
  Apply(core_.OnLease(now_, 1));
  ToPersisted();
  Command(Commit(5));
  Resolved(TakeWork().id, CommitOutcome::kUnresolved, absl::DataLossError("EIO"));
  Apply(core_.OnLease(now_, std::nullopt));
  AdvanceTo(next_tick_);
  Tick();
  EXPECT_TRUE(work_.empty());
  EXPECT_TRUE(rpcs_.empty()) << "no error is reported for a commit the lease no longer covers";
  // Registered again under a new lease, the agent is asked again: that COMMIT runs.
  Apply(core_.OnLease(now_, 2));
  Command(Commit(6));
  EXPECT_EQ(work_.size(), 1u);
}

// A COMMIT that arrives while the lease is lapsed is not acted on (it may be stale: received
// by a process that was frozen); nothing is reported either.
TEST_F(SaveCoreTest, R5_CommitWhileLeaseLapsed_Ignored) {
  Apply(core_.OnLease(now_, 1));
  ToPersisted();
  Apply(core_.OnLease(now_, std::nullopt));
  Command(Commit(5));
  EXPECT_TRUE(work_.empty());
  EXPECT_TRUE(rpcs_.empty());
}

// The coordinator crashed after other ranks' plans opened the session, and this rank's trainer
// began its save while the heartbeat found the coordinator gone (no lease current, none lost
// either): the save began under the lease the agent last held, and writes once the agent is
// registered again under that same lease.
TEST_F(SaveCoreTest, R5_SaveBegunWhileUnregistered_SameLeaseAfterwards_Writes) {
  Apply(core_.OnLease(now_, 1));
  Apply(core_.OnLease(now_, std::nullopt));  // heartbeat failed: re-registering
  ToGathered([&] { Apply(core_.OnLease(now_, 1)); });
  Command(Persist(4));
  EXPECT_EQ(work_.size(), 1u);
  EXPECT_THAT(Deliver(), IsEmpty());
}

// Begun in the same gap, but the lease it last held was lost before the agent registered again
// (the coordinator gave it up meanwhile): AGENT_LOST, nothing written.
TEST_F(SaveCoreTest, R5_SaveBegunWhileUnregistered_LeaseLostAfterwards_AgentLost) {
  Apply(core_.OnLease(now_, 1));
  Apply(core_.OnLease(now_, std::nullopt));
  ToGathered([&] { Apply(core_.OnLease(now_, 2)); });
  Command(Persist(4));
  EXPECT_TRUE(work_.empty());
  EXPECT_THAT(Deliver(), ElementsAre("ERROR(AGENT_LOST)"));
}

// Begun before the agent ever held a lease (its first registration still under way): the save
// belongs to the first lease it gets.
TEST_F(SaveCoreTest, R5_SaveBegunBeforeTheFirstLease_WritesUnderTheFirst) {
  Apply(core_.OnLease(now_, std::nullopt));
  ToGathered([&] { Apply(core_.OnLease(now_, 0)); });
  Command(Persist(4));
  EXPECT_EQ(work_.size(), 1u);
}

TEST_F(SaveCoreTest, R5_LeaseUnchanged_Writes) {
  Apply(core_.OnLease(now_, 1));
  ToGathered();
  Command(Persist(4));
  EXPECT_EQ(work_.size(), 1u);
}

// --- R6, R7: whose reason wins -----------------------------------------------------------------

TEST_F(SaveCoreTest, R7_AbortAfterALocalFailureItCaused_TheCoordinatorsReasonWins) {
  ToGathered();
  Command(Persist(4));
  const uint64_t write = TakeWork().id;
  Wait(20);
  // The coordinator aborted and removed the directory under the writer...
  Apply(core_.OnPersisted(now_, write,
                          IoError(absl::StatusCode::kNotFound, "/ckpt/job/x", "No such file")));
  Deliver(absl::StatusCode::kFailedPrecondition);  // ... so the failure report is refused
  Command(Abort(5, v1::ERROR_CODE_AGENT_LOST, "rank 0: no heartbeat within the lease"));
  SaveWork remove = TakeWork();
  Apply(core_.OnRemoved(now_, remove.id, absl::OkStatus()));
  EXPECT_THAT(WaitResult(20).status().message(), HasSubstr("no heartbeat within the lease"));
  EXPECT_EQ(GetErrorCode(WaitResult(20).status()), v1::ERROR_CODE_AGENT_LOST);
}

TEST_F(SaveCoreTest, R7_WorkResultAfterTheAbort_NoFailureReported) {
  ToStaged();
  Command(Gather(3));
  const uint64_t gather = TakeWork().id;
  Command(Abort(4, v1::ERROR_CODE_TIMEOUT, "planning"));
  Apply(core_.OnGathered(now_, gather, absl::AbortedError("cancelled")));
  EXPECT_TRUE(rpcs_.empty());
  EXPECT_EQ(PhaseOf(), SavePhase::kAborted);
}

// --- R1 and R3: a submission answered after a reconnection ------------------------------------

TEST_F(SaveCoreTest, R1_VerdictForTheSessionAReSubmissionNames_HeldUntilItsReply) {
  ToPlanned();
  Register();  // the coordinator restarted: the PLANNED session re-submits its plan
  ASSERT_EQ(rpcs_.size(), 1u);
  // It moved the plan to another session and aborted that before the reply arrived.
  constexpr char kMoved[] = "s7-00000000000000b2";
  v1::Command abort = Abort(1, v1::ERROR_CODE_AGENT_LOST, "lost rank 1");
  abort.set_session_id(kMoved);
  Command(abort);
  ASSERT_THAT(Deliver(absl::StatusCode::kOk, kMoved), ElementsAre("PLAN"));
  EXPECT_EQ(BeginStatus(1).code(), absl::StatusCode::kAborted) << "the held ABORT was dropped";
  EXPECT_THAT(std::string(BeginStatus(1).message()), HasSubstr("lost rank 1"));
}

TEST_F(SaveCoreTest, R3_PlanMovedAfterItsSessionAbortedHere_TheNewSessionFailedAtOnce) {
  // The soak's agent_stop fault: another rank froze past its lease, the coordinator aborted
  // the session, and this agent's re-submission (its stream had reconnected) reached the
  // coordinator just after: it opened a new session of the step with this rank's plan. The
  // ABORT reached this agent before the reply naming the new session.
  ToPlanned();
  Register();
  ASSERT_EQ(rpcs_.size(), 1u);
  Command(Abort(1, v1::ERROR_CODE_AGENT_LOST, "lost the agent of rank 1"));
  EXPECT_EQ(BeginStatus(1).code(), absl::StatusCode::kAborted);
  constexpr char kMoved[] = "s7-00000000000000b2";
  // This rank's trainer was told: the new session can never complete, and is failed at once
  // rather than left to wait for its PINNING deadline.
  EXPECT_THAT(Deliver(absl::StatusCode::kOk, kMoved), ElementsAre("PLAN", "ERROR(AGENT_LOST)"));
  EXPECT_EQ(LastPhaseSent().session_id(), kMoved);
  EXPECT_THAT(LastPhaseSent().error().message(), HasSubstr("rank 3"));
  Command(Pin(2, kMoved));
  EXPECT_TRUE(work_.empty()) << "nothing pinned for a session no trainer waits for";
  EXPECT_EQ(RepliesTo(1), 1);
}

TEST_F(SaveCoreTest, R3_PlanAnsweredAfterTheStreamReconnected_SubmittedAgain) {
  Register();
  Begin();
  ASSERT_EQ(rpcs_.size(), 1u);
  Apply(core_.OnStreamConnected(now_));  // nothing to re-send yet: the session is not known
  EXPECT_EQ(rpcs_.size(), 1u);
  // The reply names the session; its verdict may have gone to the stream that broke.
  ASSERT_THAT(Deliver(), ElementsAre("PLAN", "PLAN"));
  EXPECT_EQ(PhaseOf(), SavePhase::kPlanned);
  // Without a reconnection, a reply is taken as it is.
  Begin(/*ticket=*/7, /*step=*/8);
  EXPECT_THAT(Deliver(absl::StatusCode::kOk, kSecondSession), ElementsAre("PLAN"));
}

// --- R10: cached plans ---------------------------------------------------------------------------

TEST_F(SaveCoreTest, R10_SamePlanAgain_OnlyItsFingerprintAndTheHeldAssignment) {
  FirstSaveCommitted();
  const uint64_t local = FingerprintShards(kRank, Request().shards());
  EXPECT_EQ(LastPlanOut().local_plan_fingerprint(), local);
  EXPECT_EQ(LastPlanOut().held_plan_fingerprint(), 0u);  // nothing held before the first PIN

  Begin(/*ticket=*/7, /*step=*/8);
  const v1::SubmitLocalPlanRequest slim = LastPlanOut();
  EXPECT_TRUE(slim.shards_omitted());
  EXPECT_EQ(slim.shards_size(), 0);
  EXPECT_EQ(slim.local_plan_fingerprint(), local);
  EXPECT_EQ(slim.held_plan_fingerprint(), kPlan);
  EXPECT_EQ(slim.step(), 8);
  ASSERT_THAT(Deliver(absl::StatusCode::kOk, kSecondSession), ElementsAre("PLAN"));

  // The PIN names the plan; the staging layout is the one the first PIN's assignment gave.
  Command(PinWithoutAssignment(1, kSecondSession, kPlan));
  SaveWork pin = TakeWork();
  ASSERT_TRUE(std::holds_alternative<PinWork>(pin.item));
  EXPECT_EQ(PhaseOf(kSecondSession), SavePhase::kPinning);
  const StagingLayout& layout = *std::get<PinWork>(pin.item).layout;
  ASSERT_EQ(layout.shards.size(), 1u);
  EXPECT_EQ(layout.file_name, "data-00003.safetensors");
  EXPECT_GT(layout.shards[0].nbytes, 0u);
}

TEST_F(SaveCoreTest, R10_CoordinatorDoesNotKnowTheFingerprint_ShardsSentAtOnce) {
  FirstSaveCommitted();
  knows_no_plans_ = true;  // e.g. it restarted
  Begin(/*ticket=*/7, /*step=*/8);
  EXPECT_TRUE(LastPlanOut().shards_omitted());
  ASSERT_THAT(Deliver(absl::StatusCode::kOk, kSecondSession), ElementsAre("PLAN", "PLAN"));
  const v1::SubmitLocalPlanRequest full = LastPlanOut();
  EXPECT_FALSE(full.shards_omitted());
  ASSERT_EQ(full.shards_size(), 1);
  EXPECT_EQ(full.held_plan_fingerprint(), kPlan);  // a PIN of the same plan may still omit it
  EXPECT_EQ(PhaseOf(kSecondSession), SavePhase::kPlanned);
  EXPECT_EQ(ReplyTo(7), nullptr);  // the trainer still waits for its slots
  // Re-submissions of the session (a RESEND) carry the shards from now on.
  Command(Resend(1));
  ASSERT_EQ(rpcs_.size(), 1u);
  EXPECT_EQ(LastPlanOut().shards_size(), 1);
}

TEST_F(SaveCoreTest, R10_AskedForShardsThatWereSent_TrainerGetsInternalAndNoSession) {
  Register();
  asks_for_sent_shards_ = true;
  Begin();
  ASSERT_THAT(Deliver(), ElementsAre("PLAN"));  // not sent again: it would be answered alike
  EXPECT_EQ(BeginStatus(1).code(), absl::StatusCode::kInternal);
  EXPECT_FALSE(core_.View(kSession).has_value());
}

TEST_F(SaveCoreTest, R10_SendPlanCommand_ShardsSubmittedAgain) {
  FirstSaveCommitted();
  Begin(/*ticket=*/7, /*step=*/8);
  ASSERT_THAT(Deliver(absl::StatusCode::kOk, kSecondSession), ElementsAre("PLAN"));
  Command(SendPlan(1, kSecondSession));
  ASSERT_EQ(rpcs_.size(), 1u);
  EXPECT_FALSE(LastPlanOut().shards_omitted());
  EXPECT_EQ(LastPlanOut().shards_size(), 1);
  ASSERT_THAT(Deliver(absl::StatusCode::kOk, kSecondSession), ElementsAre("PLAN"));
  EXPECT_EQ(PhaseOf(kSecondSession), SavePhase::kPlanned);
}

TEST_F(SaveCoreTest, R10_ChangedPlan_SubmittedWithItsShards) {
  FirstSaveCommitted();
  v1::BeginSaveRequest changed = Request(8);
  changed.mutable_shards(0)->set_fqn("w2");
  Apply(core_.BeginSave(now_, 7, changed));
  const v1::SubmitLocalPlanRequest plan = LastPlanOut();
  EXPECT_FALSE(plan.shards_omitted());
  EXPECT_EQ(plan.shards_size(), 1);
  EXPECT_EQ(plan.held_plan_fingerprint(), 0u);
  EXPECT_EQ(plan.local_plan_fingerprint(), FingerprintShards(kRank, plan.shards()));
}

TEST_F(SaveCoreTest, R10_PinOmitsAnAssignmentThisAgentDoesNotHold_FailsInternal) {
  ToPlanned();
  Command(PinWithoutAssignment(1, kSession, kPlan));
  EXPECT_TRUE(work_.empty());
  ASSERT_THAT(Deliver(), ElementsAre("ERROR(INTERNAL)"));
  EXPECT_THAT(LastPhaseSent().error().message(), HasSubstr("does not hold"));
}

// --- R9 and the end of the agent ---------------------------------------------------------------

TEST_F(SaveCoreTest, R9_NewSessionAccepted_OlderSessionsReportsStop) {
  ToStaged();
  Begin(/*ticket=*/7, /*step=*/8);
  Deliver(absl::StatusCode::kOk, "s8-00000000000000c3");
  EXPECT_TRUE(core_.View(kSession)->reports_closed);
  Register();
  EXPECT_THAT(Deliver(), ElementsAre("PLAN"));  // the new session's plan; nothing of the old
}

// An older session orphaned while it gathers (its ABORT never reached this DP leader) has its
// exchange cancelled at once: the executor's one worker would otherwise run the new session's
// PIN only after the gather's deadline (10 min), the coordinator aborting it meanwhile. Failed
// before: nothing was cancelled.
TEST_F(SaveCoreTest, R9_NewSessionAccepted_OlderSessionsExchangeCancelled) {
  ToStaged();
  Command(Gather(3));
  EXPECT_EQ(PhaseOf(), SavePhase::kGathering);
  Begin(/*ticket=*/7, /*step=*/8);
  Deliver(absl::StatusCode::kOk, "s8-00000000000000c3");
  EXPECT_THAT(cancelled_, ElementsAre(kSession));
}

TEST_F(SaveCoreTest, Shutdown_OpenTicketsUnavailable_ExchangeCancelled) {
  ToStaged();
  Command(Gather(3));
  Wait(20);
  Apply(core_.Shutdown(now_));
  EXPECT_EQ(WaitResult(20).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(cancelled_, ElementsAre(kSession));
  Begin(/*ticket=*/30);
  EXPECT_EQ(BeginStatus(30).code(), absl::StatusCode::kUnavailable);
}

// The same events in the same order give the same effects, backoff jitter included.
TEST(SaveCoreDeterminism, SameEvents_SameEffects) {
  auto run = [] {
    SaveCoreOptions options;
    options.job_id = kJob;
    options.rank = kRank;
    options.seed = 42;  // jitter on (the default backoff's 0.5)
    SaveCore core(options);
    absl::Time now = absl::FromUnixSeconds(5);
    std::string trace;
    uint64_t plan_rpc = 0;
    absl::Time next = absl::InfiniteFuture();
    auto record = [&](const SaveEffects& fx) {
      for (const CoordinatorRpc& rpc : fx.rpcs) {
        absl::StrAppend(&trace, rpc.id, NameOf(rpc), ";");
        plan_rpc = rpc.id;
      }
      absl::StrAppend(&trace, "tick@", absl::FormatTime(fx.next_tick), ";");
      next = fx.next_tick;
    };
    record(core.OnRegistered(now, 1, kRoot));
    record(core.BeginSave(now, 1, Request()));
    for (int i = 0; i < 4; ++i) {
      record(core.OnPlanSubmitted(now, plan_rpc, absl::UnavailableError("down")));
      now = next;
      record(core.Tick(now));
    }
    return trace;
  };
  const std::string first = run();
  EXPECT_THAT(first, HasSubstr("5PLAN"));  // the fourth retry
  EXPECT_EQ(first, run());
}

}  // namespace
}  // namespace tessera
