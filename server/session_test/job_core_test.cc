// Tests of the coordinator's session core (server/session/): JobCore and SessionMachine,
// driven synchronously by SyncSessions.
//
// Everything is in memory: a MemoryStateStore, a FakeClock, a real AgentRegistry, a sink that
// records commands and a CommitEdge that records commits, retention and removals. The "agents" are helpers of the fixture
// that answer commands the way a real agent does: they read their assignment from the PIN they
// were sent, report hashes of the replicas they hold, and report the chunks they write with
// checksums of deterministic bytes. Time moves only through the FakeClock, and Tick() is called
// directly.
#include "server/session_test/sync_sessions.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/checksum.h"
#include "common/clock.h"
#include "common/ids.h"
#include "common/layout.h"
#include "common/plan_fingerprint.h"
#include "common/status.h"
#include "common/tensor_key.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/testing/plan_fixtures.h"
#include "server/agent_registry.h"
#include "server/plan/planner.h"
#include "format/test_checkpoint.h"
#include "server/session/commit_driver.h"
#include "server/store/memory_state_store.h"
#include "storage/fault_injecting_storage.h"
#include "storage/posix_storage.h"
#include "storage/testing.h"

namespace tessera {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;
using ::testing::UnorderedElementsAre;

constexpr char kJob[] = "job-a";
constexpr char kRoot[] = "/ckpt";
// Small blocks, so that even tiny chunks have several block checksums.
constexpr uint32_t kBlockSize = 16;
// When the agents say their writes began (ReportPhaseRequest.write_started_unix_ms).
constexpr int64_t kWritesBeganMs = 1'800'000'000'000;

// ---------------------------------------------------------------------------------------------
// Fakes

struct SentCommand {
  std::string job_id;
  uint32_t rank;
  v1::Command command;
};

class RecordingSink : public CommandSink {
 public:
  void Send(const std::string& job_id, uint32_t rank, const v1::Command& command) override {
    absl::MutexLock lock(&mu_);
    sent_.push_back({job_id, rank, command});
  }
  std::vector<SentCommand> sent() const {
    absl::MutexLock lock(&mu_);
    return sent_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<SentCommand> sent_ ABSL_GUARDED_BY(mu_);
};

class FakeCommitEdge : public CommitEdge {
 public:
  struct CommitCall {
    v1::Manifest manifest;
    std::string tmp_dir;
    std::string final_dir;
    bool roll_back = false;
  };

  CommitResolution Commit(const CommitAttempt& work) override {
    commits_.push_back({*work.manifest, work.tmp_dir, work.final_dir,
                        work.roll_back_unless_committed});
    if (during_commit_) std::exchange(during_commit_, nullptr)();
    if (results_.empty()) return default_;
    CommitResolution r = results_.front();
    results_.pop_front();
    return r;
  }
  absl::Status Retain(const RetentionWork& work) override {
    retentions_.push_back(work);
    if (retentions_to_fail_ > 0) {
      --retentions_to_fail_;
      return absl::UnavailableError("injected: retention could not remove a directory");
    }
    return absl::OkStatus();
  }
  // The next `n` retentions fail (as a coordinator killed before its retention ran would).
  void FailRetentions(int n) { retentions_to_fail_ = n; }
  absl::Status Remove(const std::string& dir) override {
    removed_.push_back(dir);
    return absl::OkStatus();
  }

  // The next commit resolves as `resolution` (queued); by default commits succeed.
  void NextCommit(CommitOutcome outcome, absl::Status status = absl::OkStatus()) {
    results_.push_back({outcome, std::move(status)});
  }
  // Commits not queued with NextCommit resolve as this. Default: committed.
  void SetDefault(CommitOutcome outcome, absl::Status status = absl::OkStatus()) {
    default_ = {outcome, std::move(status)};
  }
  // Runs `fn` inside the next commit, as if it happened while the commit I/O runs.
  void DuringNextCommit(std::function<void()> fn) { during_commit_ = std::move(fn); }

  const std::vector<CommitCall>& commits() const { return commits_; }
  const std::vector<std::string>& removed() const { return removed_; }
  const std::vector<RetentionWork>& retentions() const { return retentions_; }

 private:
  std::vector<CommitCall> commits_;
  std::vector<std::string> removed_;
  std::vector<RetentionWork> retentions_;
  int retentions_to_fail_ = 0;
  std::deque<CommitResolution> results_;
  CommitResolution default_{CommitOutcome::kCommitted, absl::OkStatus()};
  std::function<void()> during_commit_;
};

// ---------------------------------------------------------------------------------------------
// Plans and bytes

bool SameBox(const v1::Box& a, const v1::Box& b) {
  return std::equal(a.offsets().begin(), a.offsets().end(), b.offsets().begin(),
                    b.offsets().end()) &&
         std::equal(a.lengths().begin(), a.lengths().end(), b.lengths().begin(),
                    b.lengths().end());
}

std::vector<v1::SessionState> PhaseStates(const v1::SessionStatus& status) {
  std::vector<v1::SessionState> states;
  for (const v1::PhaseTiming& p : status.phases()) states.push_back(p.state());
  return states;
}

std::vector<int64_t> PhaseDurations(const v1::SessionStatus& status) {
  std::vector<int64_t> durations;
  for (const v1::PhaseTiming& p : status.phases()) durations.push_back(p.duration_ms());
  return durations;
}

std::vector<uint32_t> Ranks(const v1::ErrorDetail& detail) {
  std::vector<uint32_t> ranks;
  for (const v1::RankRef& r : detail.ranks()) ranks.push_back(r.rank());
  return ranks;
}

std::vector<std::string> Coords(const v1::ErrorDetail& detail) {
  std::vector<std::string> coords;
  for (const v1::RankRef& r : detail.ranks()) coords.push_back(r.coords());
  return coords;
}

std::vector<int64_t> Steps(const std::vector<v1::CheckpointInfo>& checkpoints) {
  std::vector<int64_t> steps;
  for (const v1::CheckpointInfo& c : checkpoints) steps.push_back(c.step());
  return steps;
}

// ---------------------------------------------------------------------------------------------
// The harness

struct AgentSetup {
  std::string node_id;
  uint64_t node_budget = 0;  // 0: no budget
  bool storage_root_mounted = false;
  bool memory_tier = true;  // RegisterAgentRequest.memory_tier
  bool copies_when_pinned = true;  // RegisterAgentRequest.copies_when_pinned, as tessera-agent
  // RegisterAgentRequest.writes_when_staged. tessera-agent says it; off unless a test asks, so
  // that the other tests drive GATHER and PERSIST.
  bool writes_when_staged = false;
  bool relays_commands = false;  // RegisterAgentRequest.relays_commands, as tessera-agent
};

bool Has(const std::vector<uint32_t>& ranks, uint32_t rank) {
  return std::find(ranks.begin(), ranks.end(), rank) != ranks.end();
}

// Every rank's agent follows PinCommand.write_when_staged, each on its own node.
AgentSetup WritesWhenStaged(uint32_t rank) {
  AgentSetup setup{absl::StrCat("node-", rank)};
  setup.writes_when_staged = true;
  return setup;
}

class SessionManagerTest : public ::testing::Test {
 protected:
  SessionManagerTest()
      : registry_(std::make_unique<AgentRegistry>(&clock_, AgentRegistryOptions{})) {
    options_.storage_root = kRoot;
  }

  // Sets the job's mesh, e.g. "tp=2,dp=2", and registers one agent per rank (each on its own
  // node unless `setup` says otherwise).
  void StartJob(const std::string& spec,
                std::function<AgentSetup(uint32_t rank)> setup = nullptr) {
    absl::StatusOr<v1::Layout> layout = ParseLayoutSpec(spec);
    ASSERT_TRUE(layout.ok()) << layout.status();
    layout_ = *layout;
    absl::StatusOr<MeshLayout> mesh = MeshLayout::FromProto(layout_);
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    mesh_ = *mesh;
    plans_.assign(world(), {});
    incarnations_.assign(world(), 0);
    setups_.assign(world(), {});
    for (uint32_t r = 0; r < world(); ++r) {
      setups_[r] = setup ? setup(r) : AgentSetup{absl::StrCat("node-", r)};
      incarnations_[r] = 1000 + r;
      absl::StatusOr<AgentRegistry::Registered> registered = Register(r);
      ASSERT_TRUE(registered.ok()) << registered.status();
    }
    manager();  // the coordinator starts (and recovers) before any test step
  }

  uint32_t world() const { return mesh_.has_value() ? mesh_->world_size() : 0; }

  absl::StatusOr<AgentRegistry::Registered> Register(uint32_t rank) {
    v1::RegisterAgentRequest request;
    request.set_copies_when_pinned(setups_[rank].copies_when_pinned);
    request.set_writes_when_staged(setups_[rank].writes_when_staged);
    request.set_job_id(kJob);
    request.mutable_coord()->set_rank(rank);
    *request.mutable_layout() = layout_;
    request.set_incarnation(incarnations_[rank]);
    request.set_node_id(setups_[rank].node_id);
    request.set_node_host_ram_budget(setups_[rank].node_budget);
    request.set_peer_address(absl::StrCat("10.0.0.", rank, ":7070"));
    request.set_storage_root_mounted(setups_[rank].storage_root_mounted);
    request.set_memory_tier(setups_[rank].memory_tier);
    request.set_relays_commands(setups_[rank].relays_commands);
    absl::StatusOr<AgentRegistry::Registered> registered = registry_->Register(request);
    // As CoordinatorService does: the job's core hears of it before the agent's next RPC.
    if (manager_ != nullptr) manager_->AgentsChanged(kJob);
    return registered;
  }

  // The agent of `rank` restarts: registers with a new incarnation, and the coordinator's
  // service tells the manager, as RegisterAgent does.
  void RestartAgent(uint32_t rank) {
    incarnations_[rank] += 100;
    absl::StatusOr<AgentRegistry::Registered> registered = Register(rank);
    ASSERT_TRUE(registered.ok()) << registered.status();
    ASSERT_TRUE(registered->replaced_incarnation.has_value());
  }

  void HeartbeatAll(std::optional<uint32_t> except = std::nullopt) {
    for (uint32_t r = 0; r < world(); ++r) {
      if (except.has_value() && *except == r) continue;
      ASSERT_TRUE(registry_->Heartbeat(kJob, r, incarnations_[r], 0).ok());
    }
  }

  // `d` of time the coordinator runs through: its clock read every 250 ms, as its ticker
  // does (a single clock_.Advance is a pause of the coordinator: server/running_clock.h).
  void Pass(absl::Duration d) {
    while (d > absl::ZeroDuration()) {
      const absl::Duration step = std::min(d, absl::Milliseconds(250));
      clock_.Advance(step);
      registry_->RunningNow();
      d -= step;
    }
  }

  // Moves time and keeps every lease alive, then runs the manager's periodic work.
  void AdvanceAndTick(absl::Duration d) {
    Pass(d);
    HeartbeatAll();
    manager().Tick();
  }

  // The coordinator: created, and recovered from the store, on first use.
  SyncSessions& manager() {
    if (manager_ == nullptr) {
      manager_ = std::make_unique<SyncSessions>(
          &store_, registry_.get(), &sink_,
          committer_override_ != nullptr ? committer_override_ : &committer_, &clock_, options_);
      absl::Status recovered = manager_->Recover();
      EXPECT_TRUE(recovered.ok()) << recovered;
    }
    return *manager_;
  }

  // A coordinator restart: a new manager over the same store (and the same registry: agents
  // re-register with the same incarnation, which replaces nothing).
  // Commands sent before the restart stay in the sink (agents keep what they were told, e.g.
  // their PIN), but the command queries below see only those sent after it.
  void RestartCoordinator() {
    manager_.reset();
    commands_before_restart_ = sink_.sent().size();
    manager();
  }
  // The same as a new process: the registry too is new, and every agent registers again
  // (same incarnation) once the coordinator has recovered — but `gone`'s, if given: that
  // agent died meanwhile and never registers with the new process.
  void RestartCoordinatorProcess(std::optional<uint32_t> gone = std::nullopt) {
    manager_.reset();
    registry_ = std::make_unique<AgentRegistry>(&clock_, AgentRegistryOptions{});
    commands_before_restart_ = sink_.sent().size();
    manager();
    for (uint32_t r = 0; r < world(); ++r) {
      if (gone != r) {
        ASSERT_TRUE(Register(r).ok());
      }
    }
  }

  // --- Plans

  // tp=2,dp=2: a TP-sharded (and DP-replicated) weight, and a norm replicated over the mesh.
  void UseTpDpPlans() {
    for (uint32_t r = 0; r < world(); ++r) {
      const int64_t tp = mesh_->Coords(r)[0];
      plans_[r] = {Param("layers.0.wq", {8, 4}, {4 * tp, 0}, {4, 4}, {"dp"}),
                   Whole("norm.weight", {4}, {"tp", "dp"})};
    }
  }

  // tp=2,dp=2: the TP-sharded weight, and its optimizer state flattened and sliced over dp
  // (a distributed optimizer): each rank exchanges slices with its DP partner.
  void UseDpSlicedPlans() {
    for (uint32_t r = 0; r < world(); ++r) {
      const int64_t tp = mesh_->Coords(r)[0], dp = mesh_->Coords(r)[1];
      v1::ShardDesc state = Param("layers.0.wq", {8, 4}, {4 * tp, 0}, {4, 4}, {});
      state.set_kind(v1::SHARD_KIND_OPTIMIZER);
      state.set_state_key("exp_avg");
      state.mutable_flat_range()->set_begin(8 * dp);
      state.mutable_flat_range()->set_end(8 * dp + 8);
      state.set_nbytes(8 * 4);
      plans_[r] = {Param("layers.0.wq", {8, 4}, {4 * tp, 0}, {4, 4}, {"dp"}), state};
    }
  }

  absl::StatusOr<std::string> Submit(uint32_t rank, int64_t step) {
    absl::StatusOr<v1::SubmitLocalPlanResponse> response = SubmitAs(rank, step);
    if (!response.ok()) return response.status();
    EXPECT_FALSE(response->send_full_plan()) << "rank " << rank << " sent its shards";
    return response->session_id();
  }

  // Rank `rank`'s plan as an agent submits it (agent/save/save_core.h R10): with its shards, or
  // only its fingerprint (`omit_shards`), naming the global plan whose assignment it holds.
  absl::StatusOr<v1::SubmitLocalPlanResponse> SubmitAs(uint32_t rank, int64_t step,
                                                       bool omit_shards = false,
                                                       uint64_t held = 0) {
    v1::SubmitLocalPlanRequest request;
    request.set_job_id(kJob);
    request.set_rank(rank);
    request.set_incarnation(incarnations_[rank]);
    request.set_step(step);
    request.set_local_plan_fingerprint(FingerprintShards(rank, plans_[rank]));
    request.set_held_plan_fingerprint(held);
    request.set_shards_omitted(omit_shards);
    request.set_memory_only(memory_only_.count(rank) > 0);
    if (!omit_shards) {
      for (const v1::ShardDesc& s : plans_[rank]) *request.add_shards() = s;
    }
    return manager().SubmitLocalPlan(request);
  }

  std::string SubmitAll(int64_t step) {
    std::string id;
    for (uint32_t r = 0; r < world(); ++r) {
      absl::StatusOr<std::string> session = Submit(r, step);
      EXPECT_TRUE(session.ok()) << "rank " << r << ": " << session.status();
      if (!session.ok()) return "";
      if (r == 0) id = *session;
      EXPECT_EQ(*session, id);
    }
    return id;
  }

  // --- Commands

  // Commands sent by the current manager (since the last coordinator restart).
  std::vector<SentCommand> Sent() const {
    std::vector<SentCommand> sent = sink_.sent();
    sent.erase(sent.begin(), sent.begin() + std::min(sent.size(), commands_before_restart_));
    return sent;
  }

  std::vector<v1::Command> CommandsTo(uint32_t rank, const std::string& session_id) const {
    std::vector<v1::Command> commands;
    for (const SentCommand& c : Sent()) {
      if (c.job_id == kJob && c.rank == rank && c.command.session_id() == session_id) {
        commands.push_back(c.command);
      }
    }
    return commands;
  }

  // Ranks that were sent a command of kind `body` in `session_id`, ascending, with repeats.
  std::vector<uint32_t> RanksSent(v1::Command::BodyCase body,
                                  const std::string& session_id) const {
    std::vector<uint32_t> ranks;
    for (const SentCommand& c : Sent()) {
      if (c.job_id == kJob && c.command.session_id() == session_id &&
          c.command.body_case() == body) {
        ranks.push_back(c.rank);
      }
    }
    std::sort(ranks.begin(), ranks.end());
    return ranks;
  }

  // The ranks of `among` that were sent PERSIST in `session_id`, ascending, with repeats.
  std::vector<uint32_t> PersistSentTo(const std::vector<uint32_t>& among,
                                      const std::string& session_id) const {
    std::vector<uint32_t> sent;
    for (uint32_t r : RanksSent(v1::Command::kPersist, session_id)) {
      if (Has(among, r)) sent.push_back(r);
    }
    return sent;
  }

  std::vector<uint32_t> AllRanks() const {
    std::vector<uint32_t> ranks(world());
    for (uint32_t r = 0; r < world(); ++r) ranks[r] = r;
    return ranks;
  }

  // The last ABORT `rank` got in `session_id` (fails the test if none).
  v1::ErrorDetail AbortErrorOf(uint32_t rank, const std::string& session_id) const {
    std::optional<v1::ErrorDetail> error;
    for (const v1::Command& c : CommandsTo(rank, session_id)) {
      if (c.has_abort()) error = c.abort().error();
    }
    EXPECT_TRUE(error.has_value()) << "rank " << rank << " got no ABORT";
    return error.value_or(v1::ErrorDetail());
  }

  // What each relay's agent does with a command of `session_id` that names others
  // (Command.relay_to): passes it on to them, without relay_to, with their own seqs. Recorded
  // as sent to them.
  void PassOnRelays(const std::string& session_id) {
    for (const SentCommand& c : Sent()) {
      if (c.job_id != kJob || c.command.session_id() != session_id) continue;
      for (const v1::RelayTarget& target : c.command.relay_to()) {
        v1::Command passed = c.command;
        passed.clear_relay_to();
        passed.set_seq(target.seq());
        sink_.Send(kJob, target.rank(), passed);
      }
    }
  }

  // The PIN `rank` got in `session_id`, even one sent before a coordinator restart.
  std::optional<v1::PinCommand> PinOf(uint32_t rank, const std::string& session_id) const {
    for (const SentCommand& c : sink_.sent()) {
      if (c.job_id == kJob && c.rank == rank && c.command.session_id() == session_id &&
          c.command.has_pin()) {
        return c.command.pin();
      }
    }
    return std::nullopt;
  }

  // What `rank` was told to do in `session_id`: the assignment of its PIN — or, for a PIN that
  // left it out, of the last PIN of that plan that carried it, as an agent keeps it.
  v1::RankAssignment AssignmentOf(uint32_t rank, const std::string& session_id) const {
    std::optional<v1::PinCommand> pin = PinOf(rank, session_id);
    if (!pin.has_value()) {
      ADD_FAILURE() << "rank " << rank << " got no PIN in " << session_id;
      return {};
    }
    if (!pin->assignment_omitted()) return pin->assignment();
    std::optional<v1::RankAssignment> held;
    for (const SentCommand& c : sink_.sent()) {
      if (c.job_id == kJob && c.rank == rank && c.command.has_pin() &&
          !c.command.pin().assignment_omitted() &&
          c.command.pin().plan_fingerprint() == pin->plan_fingerprint()) {
        held = c.command.pin().assignment();
      }
    }
    EXPECT_TRUE(held.has_value()) << "rank " << rank << "'s PIN in " << session_id
                                  << " left out an assignment it was never sent";
    return held.value_or(v1::RankAssignment());
  }

  std::vector<uint32_t> Writers(const std::string& session_id) const {
    std::vector<uint32_t> writers;
    for (uint32_t r = 0; r < world(); ++r) {
      if (!AssignmentOf(r, session_id).writes().empty()) writers.push_back(r);
    }
    return writers;
  }

  // --- Agent reports

  absl::StatusOr<v1::SessionState> Phase(uint32_t rank, const std::string& session_id,
                                         v1::AgentPhase phase) {
    v1::ReportPhaseRequest request;
    request.set_job_id(kJob);
    request.set_rank(rank);
    request.set_incarnation(incarnations_[rank]);
    request.set_session_id(session_id);
    request.set_phase(phase);
    if (phase == v1::AGENT_PHASE_PINNED) request.set_pinned_bytes(4096 * (rank + 1));
    if (phase == v1::AGENT_PHASE_STAGED) request.set_trainer_stall_ns(1000 * (rank + 1));
    if (phase == v1::AGENT_PHASE_PERSISTED) {  // the higher ranks began writing first
      request.set_write_started_unix_ms(kWritesBeganMs - 100 * rank);
      request.set_write_ns(2'000'000 * (rank + 1));
    }
    return manager().ReportPhase(request);
  }

  void PhaseAll(const std::string& session_id, v1::AgentPhase phase) {
    for (uint32_t r = 0; r < world(); ++r) {
      absl::StatusOr<v1::SessionState> state = Phase(r, session_id, phase);
      ASSERT_TRUE(state.ok()) << "rank " << r << ": " << state.status();
    }
  }

  // Rank's agent pinned and its trainer copied (the two reports, in order).
  void PinAndStage(uint32_t rank, const std::string& session_id) {
    ASSERT_TRUE(Phase(rank, session_id, v1::AGENT_PHASE_PINNED).ok()) << "rank " << rank;
    ASSERT_TRUE(Phase(rank, session_id, v1::AGENT_PHASE_STAGED).ok()) << "rank " << rank;
  }

  // PinCommand.copy_when_pinned of every PIN sent to `rank` for the session.
  std::vector<bool> PinsCopyWhenPinned(uint32_t rank, const std::string& session_id) const {
    std::vector<bool> flags;
    for (const v1::Command& c : CommandsTo(rank, session_id)) {
      if (c.has_pin()) flags.push_back(c.pin().copy_when_pinned());
    }
    return flags;
  }

  // PinCommand.write_when_staged of the PIN `rank` got in the session (fails if none).
  bool PinWritesWhenStaged(uint32_t rank, const std::string& session_id) const {
    std::optional<v1::PinCommand> pin = PinOf(rank, session_id);
    EXPECT_TRUE(pin.has_value()) << "rank " << rank << " got no PIN";
    return pin.has_value() && pin->write_when_staged();
  }

  // What an agent told write_when_staged reports after its PINNED and STAGED, unasked: its
  // replica hashes, GATHERED, its chunks, PERSISTED (agent/save/save_core.h R13).
  void GatherAndPersist(uint32_t rank, const std::string& session_id) {
    ASSERT_TRUE(ReportHashes(rank, session_id).ok()) << "rank " << rank;
    ASSERT_TRUE(Phase(rank, session_id, v1::AGENT_PHASE_GATHERED).ok()) << "rank " << rank;
    ASSERT_TRUE(ReportWrites(rank, session_id).ok()) << "rank " << rank;
    ASSERT_TRUE(Phase(rank, session_id, v1::AGENT_PHASE_PERSISTED).ok()) << "rank " << rank;
  }

  // The tensor key of the replica `item` of `rank` names: its local shard's.
  std::string HashedKey(uint32_t rank, const v1::HashItem& item) const {
    return TensorKeyOf(plans_[rank].at(item.local_shard()), rank);
  }

  // The replica hashes of `rank`'s HashItems; the replica of `corrupt_key` holds other bytes.
  absl::StatusOr<v1::SessionState> ReportHashes(uint32_t rank, const std::string& session_id,
                                                const std::string& corrupt_key = "") {
    v1::ReportChunksRequest request;
    request.set_job_id(kJob);
    request.set_rank(rank);
    request.set_incarnation(incarnations_[rank]);
    request.set_session_id(session_id);
    const v1::RankAssignment assignment = AssignmentOf(rank, session_id);
    for (const v1::HashItem& item : assignment.hashes()) {
      v1::ReplicaHash* hash = request.add_hashes();
      hash->set_chunk(item.chunk());
      const std::string key = HashedKey(rank, item);
      const v1::Box& box = plans_[rank].at(item.local_shard()).box();
      hash->set_xxh3(ChunkDigest(Blocks(ChunkBytes(key, box, key == corrupt_key), kBlockSize)));
    }
    return manager().ReportChunks(request);
  }

  // The chunk entry a writer reports for a WriteItem at `offset` of its file.
  static v1::ChunkEntry WrittenEntry(const v1::WriteItem& w, const std::string& file,
                                     uint64_t offset) {
    v1::ChunkEntry entry;
    *entry.mutable_box() = w.box();
    entry.set_file(file);
    entry.set_offset(offset);
    entry.set_nbytes(w.nbytes());
    entry.set_block_size(kBlockSize);
    for (uint64_t b : Blocks(ChunkBytes(w.key(), w.box()), kBlockSize)) entry.add_block_xxh3(b);
    return entry;
  }

  // Every chunk `rank` writes, laid out at 4 KiB-aligned offsets after a 4 KiB header.
  absl::StatusOr<v1::SessionState> ReportWrites(uint32_t rank, const std::string& session_id) {
    const v1::RankAssignment assignment = AssignmentOf(rank, session_id);
    v1::ReportChunksRequest request;
    request.set_job_id(kJob);
    request.set_rank(rank);
    request.set_incarnation(incarnations_[rank]);
    request.set_session_id(session_id);
    uint64_t offset = 4096;
    for (const v1::WriteItem& w : assignment.writes()) {
      v1::ChunkReport* report = request.add_chunks();
      report->set_key(w.key());
      *report->mutable_chunk() = WrittenEntry(w, assignment.file(), offset);
      offset += (w.nbytes() + 4095) / 4096 * 4096;
    }
    return manager().ReportChunks(request);
  }

  void GatherAll(const std::string& session_id) {
    for (uint32_t r = 0; r < world(); ++r) {
      absl::StatusOr<v1::SessionState> hashed = ReportHashes(r, session_id);
      ASSERT_TRUE(hashed.ok()) << "rank " << r << ": " << hashed.status();
      absl::StatusOr<v1::SessionState> gathered = Phase(r, session_id, v1::AGENT_PHASE_GATHERED);
      ASSERT_TRUE(gathered.ok()) << "rank " << r << ": " << gathered.status();
    }
  }

  void PersistAll(const std::string& session_id) {
    for (uint32_t r = 0; r < world(); ++r) {
      absl::StatusOr<v1::SessionState> written = ReportWrites(r, session_id);
      ASSERT_TRUE(written.ok()) << "rank " << r << ": " << written.status();
      absl::StatusOr<v1::SessionState> persisted =
          Phase(r, session_id, v1::AGENT_PHASE_PERSISTED);
      ASSERT_TRUE(persisted.ok()) << "rank " << r << ": " << persisted.status();
    }
  }

  // Submits, pins and stages: the session is PERSISTING and every agent got GATHER.
  std::string DriveToPersisting(int64_t step) {
    const std::string id = SubmitAll(step);
    PhaseAll(id, v1::AGENT_PHASE_PINNED);
    PhaseAll(id, v1::AGENT_PHASE_STAGED);
    EXPECT_EQ(State(id), v1::SESSION_STATE_PERSISTING);
    return id;
  }

  // A tp=2,dp=2 job whose coordinator has no storage and only rank 2 mounts it, its save of
  // `step` driven through PERSISTING (the callers assert COMMITTING): rank 2 is the one
  // committer agent. With `rank3_mounts_too`, rank 3 mounts it as well: rank 2 (the first
  // that does) is the committer, and rank 3 the one that can replace it.
  std::string DriveToCommittingByRank2(int64_t step, bool rank3_mounts_too = false) {
    options_.coordinator_commits = false;
    StartJob("tp=2,dp=2", [rank3_mounts_too](uint32_t r) {
      return AgentSetup{absl::StrCat("node-", r), 0,
                        /*storage_root_mounted=*/r == 2 || (rank3_mounts_too && r == 3)};
    });
    UseTpDpPlans();
    const std::string id = DriveToPersisting(step);
    GatherAll(id);
    PersistAll(id);
    return id;
  }

  // A whole save, committed by the coordinator in Tick().
  std::string SaveAndCommit(int64_t step) {
    const std::string id = SubmitAll(step);
    FinishSave(id);
    return id;
  }

  // Carries a PINNING session through to COMMITTED, every agent doing its part.
  void FinishSave(const std::string& id) {
    PhaseAll(id, v1::AGENT_PHASE_PINNED);
    PhaseAll(id, v1::AGENT_PHASE_STAGED);
    EXPECT_EQ(State(id), v1::SESSION_STATE_PERSISTING);
    GatherAll(id);
    PersistAll(id);
    AdvanceAndTick(absl::Seconds(1));
    EXPECT_EQ(State(id), v1::SESSION_STATE_COMMITTED);
  }

  v1::SessionStatus Status(const std::string& session_id = "") {
    absl::StatusOr<v1::SessionStatus> status = manager().GetSession(kJob, session_id);
    EXPECT_TRUE(status.ok()) << status.status();
    return status.ok() ? *status : v1::SessionStatus();
  }
  v1::SessionState State(const std::string& session_id) { return Status(session_id).state(); }

  std::vector<int64_t> CheckpointSteps() {
    absl::StatusOr<std::vector<v1::CheckpointInfo>> list = manager().ListCheckpoints(kJob);
    EXPECT_TRUE(list.ok()) << list.status();
    return list.ok() ? Steps(*list) : std::vector<int64_t>{};
  }

  int64_t LatestStep() {
    for (const v1::JobInfo& job : manager().ListJobs()) {
      if (job.job_id() == kJob) return job.latest_committed_step();
    }
    ADD_FAILURE() << "job not listed";
    return -2;
  }

  std::string JobDir() const { return absl::StrCat(kRoot, "/", kJob); }
  std::string TmpDir(int64_t step, const std::string& session_id) const {
    return absl::StrCat(JobDir(), "/", TmpDirName(step, session_id));
  }
  std::string FinalDir(int64_t step) const {
    return absl::StrCat(JobDir(), "/", StepDirName(step));
  }

  FakeClock clock_;
  MemoryStateStore store_;
  std::unique_ptr<AgentRegistry> registry_;  // replaced by RestartCoordinatorProcess
  RecordingSink sink_;
  FakeCommitEdge committer_;
  CommitEdge* committer_override_ = nullptr;
  SessionOptions options_;
  std::unique_ptr<SyncSessions> manager_;
  size_t commands_before_restart_ = 0;

  v1::Layout layout_;
  std::optional<MeshLayout> mesh_;
  std::vector<std::vector<v1::ShardDesc>> plans_;  // by rank
  std::vector<uint64_t> incarnations_;             // by rank
  std::vector<AgentSetup> setups_;                 // by rank
  std::set<uint32_t> memory_only_;                 // ranks whose submissions ask memory-only
};

// ---------------------------------------------------------------------------------------------
// The whole protocol

TEST_F(SessionManagerTest, Save_HappyPath_CommitsAndRecordsLatest) {
  StartJob("tp=2,dp=2");
  UseTpDpPlans();

  // PLANNING lasts 1 s: rank 0 submits first.
  absl::StatusOr<std::string> first = Submit(0, 100);
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string id = *first;
  EXPECT_EQ(State(id), v1::SESSION_STATE_PLANNING);
  EXPECT_THAT(RanksSent(v1::Command::kPin, id), IsEmpty());
  Pass(absl::Seconds(1));
  for (uint32_t r = 1; r < 4; ++r) {
    absl::StatusOr<std::string> session = Submit(r, 100);
    ASSERT_TRUE(session.ok()) << session.status();
    EXPECT_EQ(*session, id);
  }
  EXPECT_EQ(State(id), v1::SESSION_STATE_PINNING);
  EXPECT_THAT(RanksSent(v1::Command::kPin, id), ElementsAre(0, 1, 2, 3));

  // Each chunk has one writer; every other replica holder hashes it.
  int writes = 0, hashes = 0;
  for (uint32_t r = 0; r < 4; ++r) {
    const v1::RankAssignment a = AssignmentOf(r, id);
    writes += a.writes_size();
    hashes += a.hashes_size();
    if (!a.writes().empty()) {
      EXPECT_EQ(a.file(), DataFileName(r));
    }
  }
  EXPECT_EQ(writes, 3);  // wq: two TP chunks; norm: one
  EXPECT_EQ(hashes, 5);  // wq: one replica per chunk; norm: three
  ASSERT_TRUE(manager().CurrentCommand(kJob, 2).has_value());
  EXPECT_TRUE(manager().CurrentCommand(kJob, 2)->has_pin());

  Pass(absl::Seconds(2));
  PhaseAll(id, v1::AGENT_PHASE_PINNED);
  EXPECT_EQ(State(id), v1::SESSION_STATE_COPYING);
  // The PINs let each trainer copy once its agent pinned: no COPY round.
  EXPECT_THAT(PinsCopyWhenPinned(1, id), ElementsAre(true));
  EXPECT_THAT(RanksSent(v1::Command::kCopy, id), IsEmpty());

  Pass(absl::Seconds(3));
  PhaseAll(id, v1::AGENT_PHASE_STAGED);
  EXPECT_EQ(State(id), v1::SESSION_STATE_PERSISTING);
  EXPECT_THAT(RanksSent(v1::Command::kGather, id), ElementsAre(0, 1, 2, 3));
  for (const v1::Command& c : CommandsTo(1, id)) {
    // No DP-sliced state in these plans: no rank exchanges slices, none needs an address.
    if (c.has_gather()) {
      EXPECT_THAT(c.gather().peer_addresses(), IsEmpty());
    }
  }

  Pass(absl::Seconds(4));
  GatherAll(id);
  EXPECT_THAT(RanksSent(v1::Command::kPersist, id), ElementsAre(0, 1, 2, 3));
  for (const v1::Command& c : CommandsTo(0, id)) {
    if (c.has_persist()) {
      EXPECT_EQ(c.persist().tmp_dir(), TmpDir(100, id));
    }
  }
  PersistAll(id);
  EXPECT_EQ(State(id), v1::SESSION_STATE_COMMITTING);
  EXPECT_THAT(committer_.commits(), IsEmpty());  // commit I/O happens in Tick only

  AdvanceAndTick(absl::Seconds(1));

  // The committer got the manifest with what the writers reported.
  const std::vector<FakeCommitEdge::CommitCall> commits = committer_.commits();
  ASSERT_THAT(commits, SizeIs(1));
  EXPECT_EQ(commits[0].tmp_dir, TmpDir(100, id));
  EXPECT_EQ(commits[0].final_dir, FinalDir(100));
  const v1::Manifest& m = commits[0].manifest;
  EXPECT_EQ(m.job_id(), kJob);
  EXPECT_EQ(m.step(), 100);
  EXPECT_EQ(m.session_id(), id);
  EXPECT_EQ(m.total_bytes(), 2u * 64 + 16);
  EXPECT_EQ(LayoutSpec(m.layout()), "tp=2,dp=2");
  ASSERT_THAT(m.tensors(), SizeIs(2));
  EXPECT_EQ(m.tensors(0).key(), "layers.0.wq");
  EXPECT_EQ(m.tensors(1).key(), "norm.weight");
  int chunks = 0;
  for (const v1::TensorEntry& t : m.tensors()) {
    for (const v1::ChunkEntry& c : t.chunks()) {
      ++chunks;
      // Find the WriteItem this chunk came from and what its writer reported.
      const v1::RankAssignment a = AssignmentOf(c.writer_rank(), id);
      uint64_t offset = 4096;
      bool found = false;
      for (const v1::WriteItem& w : a.writes()) {
        if (w.key() == t.key() && SameBox(w.box(), c.box())) {
          const v1::ChunkEntry want = WrittenEntry(w, a.file(), offset);
          EXPECT_EQ(c.file(), want.file());
          EXPECT_EQ(c.offset(), want.offset());
          EXPECT_EQ(c.nbytes(), want.nbytes());
          EXPECT_EQ(c.block_size(), kBlockSize);
          EXPECT_THAT(c.block_xxh3(), ::testing::ElementsAreArray(want.block_xxh3()));
          found = true;
        }
        offset += (w.nbytes() + 4095) / 4096 * 4096;
      }
      EXPECT_TRUE(found) << t.key() << " chunk not written by rank " << c.writer_rank();
      EXPECT_GE(c.block_xxh3_size(), 1);
    }
  }
  EXPECT_EQ(chunks, 3);
  EXPECT_EQ(m.tensors(0).chunks(0).block_xxh3_size(), 4);  // 64 bytes in 16-byte blocks

  // COMMITTED went to everyone; the job's latest is the step.
  EXPECT_THAT(RanksSent(v1::Command::kCommitted, id), ElementsAre(0, 1, 2, 3));
  for (const v1::Command& c : CommandsTo(3, id)) {
    if (c.has_committed()) {
      EXPECT_EQ(c.committed().checkpoint_dir(), FinalDir(100));
    }
  }
  // An agent whose stream reconnects now is told the outcome it may have missed.
  std::optional<v1::Command> replay = manager().CurrentCommand(kJob, 0);
  ASSERT_TRUE(replay.has_value());
  EXPECT_TRUE(replay->has_committed());
  EXPECT_EQ(replay->session_id(), id);
  absl::StatusOr<std::vector<v1::CheckpointInfo>> list = manager().ListCheckpoints(kJob);
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_THAT(*list, SizeIs(1));
  EXPECT_EQ((*list)[0].step(), 100);
  EXPECT_EQ((*list)[0].dir(), FinalDir(100));
  EXPECT_EQ((*list)[0].session_id(), id);
  EXPECT_EQ((*list)[0].bytes(), 144u);
  EXPECT_EQ((*list)[0].tensors(), 2u);
  EXPECT_EQ((*list)[0].chunks(), 3u);
  const std::vector<v1::JobInfo> jobs = manager().ListJobs();
  ASSERT_THAT(jobs, SizeIs(1));
  EXPECT_EQ(jobs[0].job_id(), kJob);
  EXPECT_EQ(jobs[0].latest_committed_step(), 100);
  EXPECT_EQ(jobs[0].world_size(), 4u);
  EXPECT_TRUE(jobs[0].current_session_id().empty());

  // The session's status, with a timing per phase.
  const v1::SessionStatus status = Status();
  EXPECT_EQ(status.session_id(), id);
  EXPECT_EQ(status.state(), v1::SESSION_STATE_COMMITTED);
  EXPECT_EQ(status.checkpoint_dir(), FinalDir(100));
  EXPECT_EQ(status.bytes_total(), 144u);
  EXPECT_EQ(status.bytes_written(), 144u);
  EXPECT_EQ(status.chunks_total(), 3u);
  EXPECT_EQ(status.chunks_reported(), 3u);
  EXPECT_FALSE(status.plan_cached());
  EXPECT_THAT(PhaseStates(status),
              ElementsAre(v1::SESSION_STATE_PLANNING, v1::SESSION_STATE_PINNING,
                          v1::SESSION_STATE_COPYING, v1::SESSION_STATE_PERSISTING,
                          v1::SESSION_STATE_COMMITTING, v1::SESSION_STATE_COMMITTED));
  EXPECT_THAT(PhaseDurations(status), ElementsAre(1000, 2000, 3000, 4000, 1000, 0));
  ASSERT_THAT(status.ranks(), SizeIs(4));
  EXPECT_EQ(status.ranks(3).coords(), "tp=1,dp=1");
  EXPECT_EQ(status.ranks(3).trainer_stall_ns(), 4000u);
  EXPECT_FALSE(status.ranks(3).straggler());

  // Retention ran (keep all: nothing retired), and the state store has the commit.
  ASSERT_THAT(committer_.retentions(), SizeIs(1));
  EXPECT_EQ(committer_.retentions()[0].job_dir, JobDir());
  EXPECT_THAT(committer_.retentions()[0].retire_steps, IsEmpty());
  EXPECT_EQ(committer_.retentions()[0].committed_step, 100);
  EXPECT_THAT(committer_.removed(), IsEmpty());
  EXPECT_EQ(store_.TableSize(Table::kCheckpoints), 1u);

  // Reports after the end are refused, naming the state.
  absl::StatusOr<v1::SessionState> late = Phase(0, id, v1::AGENT_PHASE_PERSISTED);
  EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(late.status().message(), HasSubstr("COMMITTED"));
}

// ---------------------------------------------------------------------------------------------
// Planning

// What the shell's disk clean-up waits for (SessionManager::RunDueCleanups): the trainers
// are blocked from the first plan until every rank staged, and not once the save persists,
// commits or aborts.
TEST_F(SessionManagerTest, TrainersBlocked_FromTheFirstPlanUntilEveryRankStaged) {
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  EXPECT_FALSE(manager().TrainersBlocked(kJob));
  absl::StatusOr<std::string> first = Submit(0, 100);
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string id = *first;
  EXPECT_EQ(State(id), v1::SESSION_STATE_PLANNING);
  EXPECT_TRUE(manager().TrainersBlocked(kJob));
  for (uint32_t r = 1; r < 4; ++r) ASSERT_TRUE(Submit(r, 100).ok());
  EXPECT_EQ(State(id), v1::SESSION_STATE_PINNING);
  EXPECT_TRUE(manager().TrainersBlocked(kJob));
  PhaseAll(id, v1::AGENT_PHASE_PINNED);
  EXPECT_EQ(State(id), v1::SESSION_STATE_COPYING);
  EXPECT_TRUE(manager().TrainersBlocked(kJob));
  PhaseAll(id, v1::AGENT_PHASE_STAGED);
  EXPECT_EQ(State(id), v1::SESSION_STATE_PERSISTING);
  EXPECT_FALSE(manager().TrainersBlocked(kJob));
  GatherAll(id);
  PersistAll(id);
  AdvanceAndTick(absl::Seconds(1));
  EXPECT_EQ(State(id), v1::SESSION_STATE_COMMITTED);
  EXPECT_FALSE(manager().TrainersBlocked(kJob));

  // An operator's abort while the trainers copy lets them go too.
  const std::string next = SubmitAll(101);
  PhaseAll(next, v1::AGENT_PHASE_PINNED);
  EXPECT_EQ(State(next), v1::SESSION_STATE_COPYING);
  EXPECT_TRUE(manager().TrainersBlocked(kJob));
  ASSERT_TRUE(manager().AbortSession(kJob, "test").ok());
  EXPECT_EQ(State(next), v1::SESSION_STATE_ABORTED);
  EXPECT_FALSE(manager().TrainersBlocked(kJob));
}

// The torchtitan PP bug: stage 1 names its layers like stage 0.
TEST_F(SessionManagerTest, Save_PlanRejected_AbortsBeforeAnyCopy) {
  StartJob("pp=2,dp=2");
  for (uint32_t r = 0; r < 4; ++r) plans_[r] = {Whole("layers.0.w", {4, 4}, {"dp"})};

  const std::string id = SubmitAll(7);  // the verdict comes as commands, not as the reply
  ASSERT_FALSE(id.empty());
  EXPECT_THAT(RanksSent(v1::Command::kAbort, id), ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(RanksSent(v1::Command::kPin, id), IsEmpty());
  for (uint32_t r = 0; r < 4; ++r) {
    const v1::ErrorDetail error = AbortErrorOf(r, id);
    EXPECT_EQ(error.code(), v1::ERROR_CODE_DUPLICATE_FQN);
    EXPECT_THAT(error.fqns(), ElementsAre("layers.0.w"));
    EXPECT_THAT(Coords(error), ElementsAre("pp=0,dp=0", "pp=1,dp=0"));
  }
  const v1::SessionStatus status = Status(id);
  EXPECT_EQ(status.state(), v1::SESSION_STATE_ABORTED);
  EXPECT_EQ(status.error().code(), v1::ERROR_CODE_DUPLICATE_FQN);
  EXPECT_THAT(committer_.commits(), IsEmpty());
  EXPECT_THAT(committer_.removed(), IsEmpty());  // directory I/O happens in Tick, off the lock
  manager().Tick();
  EXPECT_THAT(committer_.removed(), ElementsAre(TmpDir(7, id)));
  EXPECT_EQ(LatestStep(), -1);

  // With unique names per stage, the same step saves.
  for (uint32_t r = 0; r < 4; ++r) {
    plans_[r] = {Whole(absl::StrCat("layers.", mesh_->Coords(r)[0], ".w"), {4, 4}, {"dp"})};
  }
  const std::string retry = SubmitAll(7);
  EXPECT_NE(retry, id);
  EXPECT_EQ(State(retry), v1::SESSION_STATE_PINNING);
  EXPECT_THAT(RanksSent(v1::Command::kPin, retry), ElementsAre(0, 1, 2, 3));
}

// A stream that opens while a session's verdict is being sent gets it twice: from the send
// and as the replay of the rank's current command. The replay carries the seq that rank was
// sent, so its agent handles the verdict once (R1), whichever way the session ended.
TEST_F(SessionManagerTest, Replay_AfterASessionEnds_CarriesTheSeqEachRankWasSent) {
  StartJob("pp=2,dp=2");
  for (uint32_t r = 0; r < 4; ++r) plans_[r] = {Whole("layers.0.w", {4, 4}, {"dp"})};
  const std::string aborted = SubmitAll(7);
  ASSERT_FALSE(aborted.empty());
  auto verdict_seq = [&](uint32_t r, const std::string& id) -> std::optional<uint64_t> {
    for (const v1::Command& c : CommandsTo(r, id)) {
      if (c.has_abort() || c.has_committed()) return c.seq();
    }
    return std::nullopt;
  };
  for (uint32_t r = 0; r < 4; ++r) {
    std::optional<v1::Command> replay = manager().CurrentCommand(kJob, r);
    ASSERT_TRUE(replay.has_value() && replay->has_abort()) << "rank " << r;
    EXPECT_EQ(replay->seq(), verdict_seq(r, aborted)) << "rank " << r;
  }

  for (uint32_t r = 0; r < 4; ++r) {
    plans_[r] = {Whole(absl::StrCat("layers.", mesh_->Coords(r)[0], ".w"), {4, 4}, {"dp"})};
  }
  const std::string committed = SaveAndCommit(8);
  ASSERT_EQ(State(committed), v1::SESSION_STATE_COMMITTED);
  for (uint32_t r = 0; r < 4; ++r) {
    std::optional<v1::Command> replay = manager().CurrentCommand(kJob, r);
    ASSERT_TRUE(replay.has_value() && replay->has_committed()) << "rank " << r;
    EXPECT_EQ(replay->seq(), verdict_seq(r, committed)) << "rank " << r;
  }

  // A session the coordinator recovered mid-flight, then ended.
  const std::string recovered = SubmitAll(9);
  ASSERT_EQ(State(recovered), v1::SESSION_STATE_PINNING);
  RestartCoordinator();
  FinishSave(recovered);
  for (uint32_t r = 0; r < 4; ++r) {
    std::optional<v1::Command> replay = manager().CurrentCommand(kJob, r);
    ASSERT_TRUE(replay.has_value() && replay->has_committed()) << "rank " << r;
    EXPECT_EQ(replay->session_id(), recovered);
    EXPECT_EQ(replay->seq(), verdict_seq(r, recovered)) << "rank " << r;
  }
}

TEST_F(SessionManagerTest, Save_NodeBudgetTooSmall_AdmissionDenied) {
  // All four ranks on one node that may pin 100 bytes; they need far more.
  StartJob("tp=2,dp=2", [](uint32_t) { return AgentSetup{"node-0", 100}; });
  UseTpDpPlans();
  const std::string id = SubmitAll(1);
  EXPECT_THAT(RanksSent(v1::Command::kPin, id), IsEmpty());
  const v1::ErrorDetail error = AbortErrorOf(0, id);
  EXPECT_EQ(error.code(), v1::ERROR_CODE_ADMISSION_DENIED);
  EXPECT_THAT(error.message(), HasSubstr("node-0"));
}

TEST_F(SessionManagerTest, Save_NodeBudgetLargeEnough_Pins) {
  StartJob("tp=2,dp=2", [](uint32_t) { return AgentSetup{"node-0", 1 << 20}; });
  UseTpDpPlans();
  const std::string id = SubmitAll(1);
  EXPECT_EQ(State(id), v1::SESSION_STATE_PINNING);
}

TEST_F(SessionManagerTest, Save_OtherStepInFlight_SessionInProgress) {
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  absl::StatusOr<std::string> first = Submit(0, 10);
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<std::string> other = Submit(1, 20);
  EXPECT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(GetErrorCode(other.status()), v1::ERROR_CODE_SESSION_IN_PROGRESS);
  EXPECT_THAT(other.status().message(), HasSubstr("step 10"));
  EXPECT_THAT(other.status().message(), HasSubstr(*first));
  // The session of step 10 is untouched and completes.
  for (uint32_t r = 1; r < 4; ++r) ASSERT_TRUE(Submit(r, 10).ok());
  EXPECT_EQ(State(*first), v1::SESSION_STATE_PINNING);
}

// An agent frozen past its lease submits, after resuming, the step every other rank saw
// abort. When the others move on to a newer step, that re-opened session gives way.
TEST_F(SessionManagerTest, Save_LatePlanReopensAbortedStep_NewerStepSupersedesIt) {
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  const std::string aborted = SubmitAll(10);
  ASSERT_TRUE(manager().AbortSession(kJob, "lost rank 3").ok());
  absl::StatusOr<std::string> late = Submit(3, 10);  // the late plan opens step 10 again
  ASSERT_TRUE(late.ok()) << late.status();
  ASSERT_NE(*late, aborted);

  absl::StatusOr<std::string> newer = Submit(0, 20);
  ASSERT_TRUE(newer.ok()) << newer.status();
  EXPECT_EQ(State(*late), v1::SESSION_STATE_ABORTED);
  const v1::ErrorDetail error = AbortErrorOf(3, *late);
  EXPECT_EQ(error.code(), v1::ERROR_CODE_SUPERSEDED);
  EXPECT_THAT(error.message(), HasSubstr("step 20 from rank 0 supersedes it"));
  ASSERT_EQ(error.ranks_size(), 1);
  EXPECT_EQ(error.ranks(0).rank(), 3u);
  // Step 20 goes on normally.
  for (uint32_t r = 1; r < 4; ++r) ASSERT_TRUE(Submit(r, 20).ok());
  EXPECT_EQ(State(*newer), v1::SESSION_STATE_PINNING);
}

// --- Plan caching: fingerprints instead of plans (DESIGN.md "Plan caching")

TEST_F(SessionManagerTest, CachedSave_FingerprintsOnly_PinNamesThePlanWithoutAssignment) {
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  const std::string first = SaveAndCommit(10);
  const uint64_t plan = PinOf(0, first)->plan_fingerprint();
  ASSERT_NE(plan, 0u);
  for (uint32_t r = 0; r < 4; ++r) {
    EXPECT_EQ(PinOf(r, first)->plan_fingerprint(), plan) << "rank " << r;
    EXPECT_FALSE(PinOf(r, first)->assignment_omitted()) << "rank " << r;
  }

  // Ranks 0-2 hold the plan's assignment; rank 3's agent restarted and holds none.
  std::string second;
  for (uint32_t r = 0; r < 4; ++r) {
    absl::StatusOr<v1::SubmitLocalPlanResponse> response =
        SubmitAs(r, 20, /*omit_shards=*/true, /*held=*/r < 3 ? plan : 0);
    ASSERT_TRUE(response.ok()) << "rank " << r << ": " << response.status();
    EXPECT_FALSE(response->send_full_plan()) << "rank " << r;
    second = response->session_id();
  }
  EXPECT_EQ(State(second), v1::SESSION_STATE_PINNING);
  EXPECT_TRUE(Status(second).plan_cached());
  EXPECT_THAT(RanksSent(v1::Command::kSendPlan, second), IsEmpty());
  for (uint32_t r = 0; r < 4; ++r) {
    const v1::PinCommand pin = *PinOf(r, second);
    EXPECT_EQ(pin.plan_fingerprint(), plan) << "rank " << r;
    EXPECT_EQ(pin.assignment_omitted(), r < 3) << "rank " << r;
    EXPECT_EQ(pin.has_assignment(), r == 3) << "rank " << r;
    EXPECT_EQ(AssignmentOf(r, second).SerializeAsString(),
              AssignmentOf(r, first).SerializeAsString())
        << "rank " << r;
  }
  FinishSave(second);
  EXPECT_THAT(CheckpointSteps(), ElementsAre(20, 10));
}

// Relayed PINs (server/relay.h): with agents that relay, a cached save's PIN is sent once per
// node, to the node's first rank, naming the others with their own seqs; a PIN that carries
// an assignment is sent to every rank. Passed on, the save goes on as without relays.
TEST_F(SessionManagerTest, CachedSave_AgentsThatRelay_PinOncePerNodeNamingTheOthers) {
  options_.relay_from = 1;
  StartJob("tp=2,dp=2", [](uint32_t rank) {
    AgentSetup setup{absl::StrCat("node-", rank / 2)};  // two ranks a node
    setup.relays_commands = true;
    return setup;
  });
  UseTpDpPlans();
  const std::string first = SaveAndCommit(10);
  EXPECT_THAT(RanksSent(v1::Command::kPin, first), ElementsAre(0, 1, 2, 3));
  for (uint32_t r = 0; r < 4; ++r) {
    for (const v1::Command& c : CommandsTo(r, first)) {
      EXPECT_EQ(c.relay_to_size(), 0) << "rank " << r << ": " << c.ShortDebugString();
    }
  }
  const uint64_t plan = PinOf(0, first)->plan_fingerprint();

  std::string second;
  for (uint32_t r = 0; r < 4; ++r) {
    absl::StatusOr<v1::SubmitLocalPlanResponse> response =
        SubmitAs(r, 20, /*omit_shards=*/true, plan);
    ASSERT_TRUE(response.ok()) << "rank " << r << ": " << response.status();
    second = response->session_id();
  }
  ASSERT_EQ(State(second), v1::SESSION_STATE_PINNING);
  EXPECT_THAT(RanksSent(v1::Command::kPin, second), ElementsAre(0, 2));
  for (uint32_t relay : {0u, 2u}) {
    const std::vector<v1::Command> sent = CommandsTo(relay, second);
    ASSERT_EQ(sent.size(), 1u) << "rank " << relay;
    const v1::Command& pin = sent[0];
    EXPECT_TRUE(pin.pin().assignment_omitted());
    ASSERT_EQ(pin.relay_to_size(), 1) << pin.ShortDebugString();
    const v1::RelayTarget& target = pin.relay_to(0);
    EXPECT_EQ(target.rank(), relay + 1);
    EXPECT_EQ(target.incarnation(), incarnations_[relay + 1]);
    EXPECT_EQ(target.peer_address(), absl::StrCat("10.0.0.", relay + 1, ":7070"));
    EXPECT_EQ(target.seq(), pin.seq() + 1);  // the seq the session gave rank relay + 1's PIN
  }
  // A relay whose stream reconnects is replayed its PIN naming its targets again; a target
  // is replayed its own PIN.
  for (uint32_t relay : {0u, 2u}) {
    std::optional<v1::Command> replay = manager().CurrentCommand(kJob, relay);
    ASSERT_TRUE(replay.has_value());
    EXPECT_EQ(replay->SerializeAsString(), CommandsTo(relay, second)[0].SerializeAsString());
    std::optional<v1::Command> target = manager().CurrentCommand(kJob, relay + 1);
    ASSERT_TRUE(target.has_value());
    EXPECT_TRUE(target->has_pin());
    EXPECT_EQ(target->relay_to_size(), 0);
    EXPECT_EQ(target->seq(), replay->relay_to(0).seq());
  }
  PassOnRelays(second);
  for (uint32_t r = 0; r < 4; ++r) {
    EXPECT_EQ(AssignmentOf(r, second).SerializeAsString(),
              AssignmentOf(r, first).SerializeAsString())
        << "rank " << r;
  }
  FinishSave(second);
  EXPECT_THAT(CheckpointSteps(), ElementsAre(20, 10));
}

TEST_F(SessionManagerTest, CachedSave_OneRankChanged_OthersAreAskedForTheirShards) {
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  const std::string first = SaveAndCommit(10);
  const uint64_t plan = PinOf(0, first)->plan_fingerprint();

  // Rank 0 now also holds a tensor of its own: it must send its shards (its fingerprint
  // changed); the others send fingerprints, which the coordinator takes — until it finds that
  // the global plan changed and needs every shard to validate it again.
  plans_[0].push_back(Whole("rank0.counter", {2}, {}));
  ASSERT_TRUE(SubmitAs(0, 20).ok());
  std::string second;
  for (uint32_t r = 1; r < 4; ++r) {
    absl::StatusOr<v1::SubmitLocalPlanResponse> response =
        SubmitAs(r, 20, /*omit_shards=*/true, plan);
    ASSERT_TRUE(response.ok()) << "rank " << r << ": " << response.status();
    EXPECT_FALSE(response->send_full_plan()) << "rank " << r;
    second = response->session_id();
  }
  EXPECT_EQ(State(second), v1::SESSION_STATE_PLANNING);
  EXPECT_THAT(RanksSent(v1::Command::kSendPlan, second), ElementsAre(1, 2, 3));
  EXPECT_THAT(RanksSent(v1::Command::kPin, second), IsEmpty());

  // A repeated fingerprint changes nothing; the shards asked for complete the plan.
  ASSERT_TRUE(SubmitAs(1, 20, /*omit_shards=*/true, plan).ok());
  EXPECT_EQ(State(second), v1::SESSION_STATE_PLANNING);
  for (uint32_t r = 1; r < 4; ++r) ASSERT_TRUE(SubmitAs(r, 20, false, plan).ok());
  EXPECT_EQ(State(second), v1::SESSION_STATE_PINNING);
  EXPECT_FALSE(Status(second).plan_cached());
  for (uint32_t r = 0; r < 4; ++r) {
    const v1::PinCommand pin = *PinOf(r, second);
    EXPECT_NE(pin.plan_fingerprint(), plan) << "rank " << r;
    EXPECT_FALSE(pin.assignment_omitted()) << "rank " << r << " holds the old plan only";
  }
  EXPECT_EQ(Status(second).chunks_total(), Status(first).chunks_total() + 1);
  FinishSave(second);
}

TEST_F(SessionManagerTest, CachedSave_AfterCoordinatorRestart_FullPlansAskedAndAssignmentsKept) {
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  const std::string first = SaveAndCommit(10);
  const uint64_t plan = PinOf(0, first)->plan_fingerprint();
  RestartCoordinator();

  // The restarted coordinator knows no plan by its ranks' fingerprints: each is asked for its
  // shards in the reply, and nothing of the fingerprint-only submission is recorded.
  for (uint32_t r = 0; r < 4; ++r) {
    absl::StatusOr<v1::SubmitLocalPlanResponse> response =
        SubmitAs(r, 20, /*omit_shards=*/true, plan);
    ASSERT_TRUE(response.ok()) << "rank " << r << ": " << response.status();
    EXPECT_TRUE(response->send_full_plan()) << "rank " << r;
  }
  const std::string second = Status().session_id();
  EXPECT_EQ(State(second), v1::SESSION_STATE_PLANNING);
  // Three ranks' shards do not make a plan: rank 3's fingerprint was not taken as its plan.
  for (uint32_t r = 0; r < 3; ++r) ASSERT_TRUE(SubmitAs(r, 20, false, plan).ok());
  EXPECT_EQ(State(second), v1::SESSION_STATE_PLANNING);
  ASSERT_TRUE(SubmitAs(3, 20, false, plan).ok());
  EXPECT_EQ(State(second), v1::SESSION_STATE_PINNING);
  EXPECT_FALSE(Status(second).plan_cached());  // validated again after the restart
  // The same plan: the agents still hold its assignments, and the PINs leave them out.
  for (uint32_t r = 0; r < 4; ++r) {
    EXPECT_EQ(PinOf(r, second)->plan_fingerprint(), plan) << "rank " << r;
    EXPECT_TRUE(PinOf(r, second)->assignment_omitted()) << "rank " << r;
  }
  FinishSave(second);
  EXPECT_THAT(CheckpointSteps(), ElementsAre(20, 10));
}

TEST_F(SessionManagerTest, Submit_ShardsWithShardsOmitted_MalformedShard) {
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  v1::SubmitLocalPlanRequest request;
  request.set_job_id(kJob);
  request.set_rank(0);
  request.set_incarnation(incarnations_[0]);
  request.set_step(10);
  request.set_shards_omitted(true);
  *request.add_shards() = plans_[0][0];
  absl::StatusOr<v1::SubmitLocalPlanResponse> response = manager().SubmitLocalPlan(request);
  EXPECT_EQ(response.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GetErrorCode(response.status()), v1::ERROR_CODE_MALFORMED_SHARD);
  EXPECT_THAT(response.status().message(), HasSubstr("shards_omitted"));
}

TEST_F(SessionManagerTest, Save_StepAlreadyCommitted_StepExists) {
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  SaveAndCommit(10);
  absl::StatusOr<std::string> again = Submit(0, 10);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(GetErrorCode(again.status()), v1::ERROR_CODE_STEP_EXISTS);
  // The header's contract: a step that is not newer than the latest is refused too.
  absl::StatusOr<std::string> older = Submit(0, 5);
  EXPECT_EQ(GetErrorCode(older.status()), v1::ERROR_CODE_STEP_EXISTS) << older.status();
  EXPECT_TRUE(Submit(0, 11).ok());
}

TEST_F(SessionManagerTest, Save_SecondSaveSamePlan_PlanCached) {
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  const std::string first = SaveAndCommit(10);
  EXPECT_FALSE(Status(first).plan_cached());
  const std::string second = SaveAndCommit(20);
  EXPECT_TRUE(Status(second).plan_cached());
  for (uint32_t r = 0; r < 4; ++r) {
    EXPECT_EQ(AssignmentOf(r, first).SerializeAsString(),
              AssignmentOf(r, second).SerializeAsString());
  }
  // A changed plan is validated again.
  for (uint32_t r = 0; r < 4; ++r) plans_[r].push_back(Whole("bias", {2}, {"tp", "dp"}));
  const std::string third = SaveAndCommit(30);
  EXPECT_FALSE(Status(third).plan_cached());
  EXPECT_EQ(Status(third).chunks_total(), 4u);
}

// A distributed optimizer: each DP rank holds a flat slice of its TP box's exp_avg, gathered by
// one DP leader per box. GATHER tells each rank only the addresses of the ranks it exchanges
// slices with (its leader, or its senders) — also when replayed after a coordinator restart.
TEST_F(SessionManagerTest, Save_DpSlicedOptimizerState_GatherNamesOnlyPeers) {
  StartJob("tp=2,dp=2");
  UseDpSlicedPlans();
  const std::string id = SubmitAll(100);
  PhaseAll(id, v1::AGENT_PHASE_PINNED);
  PhaseAll(id, v1::AGENT_PHASE_STAGED);
  ASSERT_EQ(State(id), v1::SESSION_STATE_PERSISTING);

  // Whom each rank exchanges slices with, from its assignment.
  std::vector<std::map<uint32_t, std::string>> expected(world());
  int sends = 0;
  for (uint32_t r = 0; r < world(); ++r) {
    const v1::RankAssignment a = AssignmentOf(r, id);
    for (const v1::GatherSend& g : a.sends()) {
      ++sends;
      EXPECT_EQ(mesh_->Coords(g.leader_rank())[0], mesh_->Coords(r)[0]);
      expected[r][g.leader_rank()] = absl::StrCat("10.0.0.", g.leader_rank(), ":7070");
    }
    for (const v1::WriteItem& w : a.writes()) {
      for (const v1::ChunkSource& s : w.sources()) {
        if (s.rank() != r) expected[r][s.rank()] = absl::StrCat("10.0.0.", s.rank(), ":7070");
      }
    }
    EXPECT_THAT(expected[r], SizeIs(1)) << "rank " << r;  // its DP partner, leader or sender
  }
  EXPECT_EQ(sends, 2);  // one slice per TP box travels
  auto gathers = [&](uint32_t r) {
    std::vector<std::map<uint32_t, std::string>> seen;
    for (const v1::Command& c : CommandsTo(r, id)) {
      if (c.has_gather()) {
        seen.emplace_back(c.gather().peer_addresses().begin(), c.gather().peer_addresses().end());
      }
    }
    return seen;
  };
  for (uint32_t r = 0; r < world(); ++r) {
    EXPECT_THAT(gathers(r), ElementsAre(expected[r])) << "rank " << r;
  }

  RestartCoordinator();
  for (uint32_t r = 0; r < world(); ++r) {
    EXPECT_THAT(gathers(r), ElementsAre(expected[r])) << "rank " << r << " after a restart";
    std::optional<v1::Command> replay = manager().CurrentCommand(kJob, r);
    ASSERT_TRUE(replay.has_value() && replay->has_gather());
    EXPECT_EQ(replay->gather().peer_addresses_size(), 1);
  }
}

// After a restart in PINNING, the replayed PIN carries the whole assignment, as sent first.
TEST_F(SessionManagerTest, Save_RestartWhilePinning_PinReplayedWithAssignment) {
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  const std::string id = SubmitAll(100);
  ASSERT_EQ(State(id), v1::SESSION_STATE_PINNING);
  std::vector<std::string> first(world());
  for (uint32_t r = 0; r < world(); ++r) {
    first[r] = AssignmentOf(r, id).SerializeAsString();
    std::optional<v1::Command> current = manager().CurrentCommand(kJob, r);
    ASSERT_TRUE(current.has_value() && current->has_pin());
    EXPECT_EQ(current->pin().assignment().SerializeAsString(), first[r]);
  }
  RestartCoordinator();
  for (uint32_t r = 0; r < world(); ++r) {
    std::vector<v1::Command> pins;
    for (const v1::Command& c : CommandsTo(r, id)) {
      if (c.has_pin()) pins.push_back(c);
    }
    ASSERT_THAT(pins, SizeIs(1)) << "rank " << r;
    EXPECT_EQ(pins[0].pin().assignment().SerializeAsString(), first[r]);
    std::optional<v1::Command> current = manager().CurrentCommand(kJob, r);
    ASSERT_TRUE(current.has_value() && current->has_pin());
    EXPECT_EQ(current->pin().assignment().SerializeAsString(), first[r]);
  }
  PhaseAll(id, v1::AGENT_PHASE_PINNED);
  EXPECT_EQ(State(id), v1::SESSION_STATE_COPYING);
}

TEST_F(SessionManagerTest, Submit_UnknownAgentOrStaleIncarnation_Rejected) {
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  incarnations_[1] += 1;
  EXPECT_EQ(GetErrorCode(Submit(1, 1).status()), v1::ERROR_CODE_STALE_INCARNATION);
  v1::SubmitLocalPlanRequest request;
  request.set_job_id("other-job");
  request.set_rank(0);
  request.set_incarnation(1);
  request.set_step(1);
  EXPECT_EQ(manager().SubmitLocalPlan(request).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(SessionManagerTest, Submit_TooManyShards_PlanTooLarge) {
  options_.planner.max_shards_per_rank = 1;
  StartJob("tp=2,dp=2");
  UseTpDpPlans();  // two shards per rank
  absl::StatusOr<std::string> submitted = Submit(0, 1);
  EXPECT_EQ(submitted.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GetErrorCode(submitted.status()), v1::ERROR_CODE_PLAN_TOO_LARGE);
}

// ---------------------------------------------------------------------------------------------
// Liveness (issue 52): a pause of the coordinator is no death; refusals reach every rank

// Bug 1: the coordinator paused (SIGSTOP, a VM freeze) for 2.5 leases heard nothing meanwhile:
// its agents are not lost, and the save goes on.
TEST_F(SessionManagerTest, CoordinatorPausedPastTheLease_NobodyLost_TheSaveCommits) {
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  const std::string id = DriveToPersisting(100);
  clock_.Advance(absl::Seconds(25));  // paused: nothing read the clock
  manager().Tick();
  EXPECT_EQ(State(id), v1::SESSION_STATE_PERSISTING) << Status(id).error().message();
  HeartbeatAll();  // their queued heartbeats, read once it resumes
  manager().Tick();
  GatherAll(id);
  PersistAll(id);
  AdvanceAndTick(absl::Seconds(1));
  EXPECT_EQ(State(id), v1::SESSION_STATE_COMMITTED);
}

// Bug 3: a registration refused for a rank a save waits for ends the save at once, for every
// rank, with the refusal (not AGENT_LOST at the lease, not STALE_INCARNATION).
TEST_F(SessionManagerTest, RegistrationRefused_TheSaveWaitingForTheRankAbortsWithIt) {
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  SaveAndCommit(100);
  std::string id;
  for (uint32_t r = 0; r < 3; ++r) {
    absl::StatusOr<std::string> session = Submit(r, 200);
    ASSERT_TRUE(session.ok()) << session.status();
    id = *session;
  }
  ASSERT_EQ(State(id), v1::SESSION_STATE_PLANNING);
  // Rank 3's agent is stopped, and comes back with another layout: refused, and the manager
  // told as CoordinatorService tells it.
  ASSERT_TRUE(registry_->MarkDead(kJob, 3, incarnations_[3], "its process is gone"));
  v1::RegisterAgentRequest other;
  other.set_job_id(kJob);
  other.mutable_coord()->set_rank(3);
  other.set_incarnation(4242);
  *other.mutable_layout() = *ParseLayoutSpec("tp=4");
  ASSERT_EQ(GetErrorCode(registry_->Register(other).status()), v1::ERROR_CODE_LAYOUT_MISMATCH);
  manager().AgentsChanged(kJob);

  const v1::SessionStatus status = Status(id);
  EXPECT_EQ(status.state(), v1::SESSION_STATE_ABORTED);
  EXPECT_EQ(status.error().code(), v1::ERROR_CODE_LAYOUT_MISMATCH);
  EXPECT_THAT(Ranks(status.error()), ElementsAre(3));
  EXPECT_THAT(status.error().message(),
              AllOf(HasSubstr("rank 3 during PLANNING"), HasSubstr("registration was refused"),
                    HasSubstr("tp=4")));
  EXPECT_THAT(RanksSent(v1::Command::kAbort, id), ElementsAre(0, 1, 2, 3));
}

// Bug 4: a rank whose client refuses its tensors aborts the save in PLANNING for every rank at
// once, with its reason; arriving first, every later submission of the step is answered with
// it, until that rank submits a plan of the step after all.
TEST_F(SessionManagerTest, RefusedPlan_EndsTheStepsSaveForEveryRankWithItsReason) {
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  auto refuse = [&](uint32_t rank, int64_t step) {
    v1::SubmitLocalPlanRequest request;
    request.set_job_id(kJob);
    request.set_rank(rank);
    request.set_incarnation(incarnations_[rank]);
    request.set_step(step);
    request.mutable_refusal()->set_code(v1::ERROR_CODE_MALFORMED_SHARD);
    request.mutable_refusal()->set_message("box [8:12] is outside the tensor on axis 0");
    return manager().SubmitLocalPlan(request);
  };
  // Last to arrive: the others wait in PLANNING.
  std::string id;
  for (uint32_t r = 0; r < 3; ++r) id = *Submit(r, 100);
  ASSERT_TRUE(refuse(3, 100).ok());
  v1::SessionStatus status = Status(id);
  EXPECT_EQ(status.state(), v1::SESSION_STATE_ABORTED);
  EXPECT_EQ(status.error().code(), v1::ERROR_CODE_MALFORMED_SHARD);
  EXPECT_THAT(Ranks(status.error()), ElementsAre(3));
  EXPECT_THAT(status.error().message(),
              HasSubstr("rank 3 refused its tensors for step 100: box [8:12] is outside"));
  EXPECT_THAT(RanksSent(v1::Command::kAbort, id), ElementsAre(0, 1, 2, 3));

  // First to arrive: nothing is open; each later submission of the step is answered with it.
  ASSERT_TRUE(refuse(1, 200).ok());
  absl::StatusOr<std::string> after = Submit(0, 200);
  EXPECT_EQ(after.status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(GetErrorCode(after.status()), v1::ERROR_CODE_MALFORMED_SHARD);
  EXPECT_THAT(after.status().message(), HasSubstr("rank 1 refused its tensors for step 200"));
  // Rank 1 saves the step after all: the refusal no longer stands.
  ASSERT_TRUE(Submit(1, 200).ok());
  const std::string pinning = SubmitAll(200);
  ASSERT_EQ(State(pinning), v1::SESSION_STATE_PINNING);

  // Too late: a refusal of a step past PLANNING changes nothing.
  EXPECT_EQ(refuse(2, 200).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(State(pinning), v1::SESSION_STATE_PINNING);
}

// ---------------------------------------------------------------------------------------------
// Aborts during execution

TEST_F(SessionManagerTest, Save_AgentLeaseExpiresWhileCopying_AbortsWithAgentLost) {
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  SaveAndCommit(100);

  const std::string id = SubmitAll(200);
  PhaseAll(id, v1::AGENT_PHASE_PINNED);
  ASSERT_EQ(State(id), v1::SESSION_STATE_COPYING);

  // Within the lease nothing happens.
  Pass(absl::Seconds(9));
  manager().Tick();
  EXPECT_EQ(State(id), v1::SESSION_STATE_COPYING);

  // Rank 3 stops heartbeating; the others keep their leases.
  Pass(absl::Seconds(2));
  HeartbeatAll(/*except=*/3);
  manager().Tick();

  const v1::SessionStatus status = Status(id);
  EXPECT_EQ(status.state(), v1::SESSION_STATE_ABORTED);
  EXPECT_EQ(status.error().code(), v1::ERROR_CODE_AGENT_LOST);
  EXPECT_THAT(Ranks(status.error()), ElementsAre(3));
  EXPECT_THAT(Coords(status.error()), ElementsAre("tp=1,dp=1"));
  EXPECT_THAT(status.error().message(), HasSubstr("rank 3"));
  EXPECT_THAT(status.error().message(), HasSubstr("COPYING"));
  EXPECT_THAT(RanksSent(v1::Command::kAbort, id), ElementsAre(0, 1, 2, 3));
  EXPECT_EQ(AbortErrorOf(0, id).code(), v1::ERROR_CODE_AGENT_LOST);
  EXPECT_THAT(committer_.removed(), ElementsAre(TmpDir(200, id)));

  // The previous checkpoint is still the latest, and nothing else was committed.
  EXPECT_EQ(LatestStep(), 100);
  EXPECT_THAT(CheckpointSteps(), ElementsAre(100));
  EXPECT_THAT(committer_.commits(), SizeIs(1));
  std::optional<v1::Command> replay = manager().CurrentCommand(kJob, 0);
  ASSERT_TRUE(replay.has_value());
  EXPECT_EQ(replay->abort().error().code(), v1::ERROR_CODE_AGENT_LOST);
}

TEST_F(SessionManagerTest, Save_PhaseTimeout_AbortsNamingWaitingRanks) {
  options_.pinning_timeout = absl::Seconds(60);
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  const std::string id = SubmitAll(5);
  ASSERT_TRUE(Phase(0, id, v1::AGENT_PHASE_PINNED).ok());
  ASSERT_TRUE(Phase(1, id, v1::AGENT_PHASE_PINNED).ok());

  AdvanceAndTick(absl::Seconds(30));
  AdvanceAndTick(absl::Seconds(29));
  EXPECT_EQ(State(id), v1::SESSION_STATE_PINNING);
  EXPECT_TRUE(Status(id).ranks(2).straggler());
  EXPECT_FALSE(Status(id).ranks(0).straggler());

  AdvanceAndTick(absl::Seconds(2));
  const v1::SessionStatus status = Status(id);
  EXPECT_EQ(status.state(), v1::SESSION_STATE_ABORTED);
  EXPECT_EQ(status.error().code(), v1::ERROR_CODE_TIMEOUT);
  EXPECT_THAT(status.error().message(), HasSubstr("PINNING"));
  EXPECT_THAT(status.error().message(), HasSubstr("waiting for ranks 2, 3"));
  EXPECT_THAT(Ranks(status.error()), ElementsAre(2, 3));
  EXPECT_THAT(Coords(status.error()), ElementsAre("tp=1,dp=0", "tp=1,dp=1"));
  EXPECT_EQ(AbortErrorOf(3, id).code(), v1::ERROR_CODE_TIMEOUT);
  // A late report is refused.
  EXPECT_EQ(Phase(2, id, v1::AGENT_PHASE_PINNED).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(SessionManagerTest, Save_PlanningTimeout_NamesRanksThatDidNotSubmit) {
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  absl::StatusOr<std::string> id = Submit(0, 5);
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(Submit(2, 5).ok());
  AdvanceAndTick(options_.planning_timeout + absl::Seconds(1));
  const v1::SessionStatus status = Status(*id);
  EXPECT_EQ(status.state(), v1::SESSION_STATE_ABORTED);
  EXPECT_EQ(status.error().code(), v1::ERROR_CODE_TIMEOUT);
  EXPECT_THAT(Ranks(status.error()), ElementsAre(1, 3));
}

TEST_F(SessionManagerTest, Save_ReplicaBytesDiffer_ReplicaDiverged) {
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  const std::string id = DriveToPersisting(3);

  // The replica of a wq chunk holds other bytes than its writer (a false replica claim).
  std::optional<uint32_t> bad;
  uint32_t writer = 0;
  for (uint32_t r = 0; r < 4 && !bad.has_value(); ++r) {
    const v1::RankAssignment assignment = AssignmentOf(r, id);
    for (const v1::HashItem& item : assignment.hashes()) {
      if (HashedKey(r, item) == "layers.0.wq") {
        bad = r;
        writer = item.writer_rank();
      }
    }
  }
  ASSERT_TRUE(bad.has_value());
  for (uint32_t r = 0; r < 4; ++r) {
    ASSERT_TRUE(ReportHashes(r, id, r == *bad ? "layers.0.wq" : "").ok());
    ASSERT_TRUE(Phase(r, id, v1::AGENT_PHASE_GATHERED).ok());
  }
  v1::SessionState last = v1::SESSION_STATE_UNSPECIFIED;
  for (uint32_t r = 0; r < 4; ++r) {
    ASSERT_TRUE(ReportWrites(r, id).ok());
    absl::StatusOr<v1::SessionState> state = Phase(r, id, v1::AGENT_PHASE_PERSISTED);
    ASSERT_TRUE(state.ok()) << state.status();
    last = *state;
  }
  EXPECT_EQ(last, v1::SESSION_STATE_ABORTED);
  const v1::ErrorDetail error = Status(id).error();
  EXPECT_EQ(error.code(), v1::ERROR_CODE_REPLICA_DIVERGED);
  EXPECT_THAT(error.fqns(), ElementsAre("layers.0.wq"));
  EXPECT_THAT(Ranks(error), ElementsAre(writer, *bad));
  EXPECT_THAT(error.message(), HasSubstr("layers.0.wq"));
  EXPECT_THAT(RanksSent(v1::Command::kAbort, id), ElementsAre(0, 1, 2, 3));
  manager().Tick();
  EXPECT_THAT(committer_.commits(), IsEmpty());
  EXPECT_EQ(LatestStep(), -1);
}

TEST_F(SessionManagerTest, Save_ReplicaNeverHashed_ReplicaDiverged) {
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  const std::string id = DriveToPersisting(3);
  // Every agent gathers, but none reports a hash.
  PhaseAll(id, v1::AGENT_PHASE_GATHERED);
  PersistAll(id);
  const v1::ErrorDetail error = Status(id).error();
  EXPECT_EQ(error.code(), v1::ERROR_CODE_REPLICA_DIVERGED);
  EXPECT_THAT(error.message(), HasSubstr("did not report"));
}

TEST_F(SessionManagerTest, Save_AgentReportsIoError_AbortsWithPath) {
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  const std::string id = DriveToPersisting(4);
  GatherAll(id);

  const std::string path = absl::StrCat(TmpDir(4, id), "/", DataFileName(2));
  v1::ReportPhaseRequest request;
  request.set_job_id(kJob);
  request.set_rank(2);
  request.set_incarnation(incarnations_[2]);
  request.set_session_id(id);
  request.set_phase(v1::AGENT_PHASE_PERSISTED);
  request.mutable_error()->set_code(v1::ERROR_CODE_IO_ERROR);
  request.mutable_error()->set_message("No space left on device");
  request.mutable_error()->set_path(path);
  absl::StatusOr<v1::SessionState> state = manager().ReportPhase(request);
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(*state, v1::SESSION_STATE_ABORTED);

  for (uint32_t r = 0; r < 4; ++r) {
    const v1::ErrorDetail error = AbortErrorOf(r, id);
    EXPECT_EQ(error.code(), v1::ERROR_CODE_IO_ERROR);
    EXPECT_EQ(error.path(), path);
    EXPECT_THAT(Ranks(error), ElementsAre(2));  // the reporter, filled in by the coordinator
    EXPECT_THAT(Coords(error), ElementsAre("tp=1,dp=0"));
  }
  EXPECT_EQ(Status(id).error().path(), path);
  manager().Tick();
  EXPECT_THAT(committer_.removed(), ElementsAre(TmpDir(4, id)));
  manager().Tick();
  EXPECT_THAT(committer_.commits(), IsEmpty());
  EXPECT_EQ(ReportWrites(0, id).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(SessionManagerTest, CopyWhenPinned_StagedBeforeEveryRankPinned_Counted) {
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  const std::string id = SubmitAll(3);
  ASSERT_EQ(State(id), v1::SESSION_STATE_PINNING);
  // Ranks 0-2 pinned and their trainers copied; rank 3 has not pinned yet.
  for (uint32_t r = 0; r < 3; ++r) PinAndStage(r, id);
  EXPECT_EQ(State(id), v1::SESSION_STATE_PINNING);
  // A STAGED re-sent (after a reconnection) is not counted twice.
  ASSERT_TRUE(Phase(0, id, v1::AGENT_PHASE_STAGED).ok());
  ASSERT_TRUE(Phase(3, id, v1::AGENT_PHASE_PINNED).ok());
  EXPECT_EQ(State(id), v1::SESSION_STATE_COPYING);
  EXPECT_THAT(RanksSent(v1::Command::kCopy, id), IsEmpty());
  ASSERT_TRUE(Phase(3, id, v1::AGENT_PHASE_STAGED).ok());
  EXPECT_EQ(State(id), v1::SESSION_STATE_PERSISTING);
  EXPECT_THAT(RanksSent(v1::Command::kGather, id), ElementsAre(0, 1, 2, 3));
}

TEST_F(SessionManagerTest, CopyWhenPinned_LastRankPinsAndStagesAtOnce_StraightToPersisting) {
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  const std::string id = SubmitAll(3);
  for (uint32_t r = 0; r < 3; ++r) PinAndStage(r, id);
  // The last rank's reports come together after a coordinator restart in PINNING.
  RestartCoordinator();
  EXPECT_EQ(State(id), v1::SESSION_STATE_PINNING);
  for (uint32_t r = 0; r < 4; ++r) PinAndStage(r, id);
  EXPECT_EQ(State(id), v1::SESSION_STATE_PERSISTING);
  absl::StatusOr<v1::SessionStatus> status = manager().GetSession(kJob, id);
  ASSERT_TRUE(status.ok()) << status.status();
  std::vector<v1::SessionState> phases;
  for (const v1::PhaseTiming& p : status->phases()) phases.push_back(p.state());
  EXPECT_THAT(phases, ElementsAre(v1::SESSION_STATE_PLANNING, v1::SESSION_STATE_PINNING,
                                  v1::SESSION_STATE_COPYING, v1::SESSION_STATE_PERSISTING));
}

TEST_F(SessionManagerTest, CopyWhenPinned_PinnedReSentAfterStaged_RankStaysStaged) {
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  const std::string id = SubmitAll(3);
  PinAndStage(0, id);
  // A reconnection re-sends both, in order; the rank does not go back to PINNED.
  ASSERT_TRUE(Phase(0, id, v1::AGENT_PHASE_PINNED).ok());
  for (uint32_t r = 1; r < 4; ++r) PinAndStage(r, id);
  EXPECT_EQ(State(id), v1::SESSION_STATE_PERSISTING);
}

TEST_F(SessionManagerTest, CopyWhenPinned_StagedAheadOfItsPinned_UnavailableToComeAgain) {
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  const std::string id = SubmitAll(3);
  EXPECT_EQ(Phase(2, id, v1::AGENT_PHASE_STAGED).status().code(),
            absl::StatusCode::kUnavailable);
  PinAndStage(2, id);
  EXPECT_EQ(State(id), v1::SESSION_STATE_PINNING);
}

TEST_F(SessionManagerTest, CopyWhenPinned_KeptInTheRecord_ARestartWithTheOptionOffKeepsIt) {
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  const std::string id = SubmitAll(3);
  PinAndStage(0, id);
  // The coordinator comes back with the option off: this session's PINs said otherwise.
  options_.copy_when_pinned = false;
  RestartCoordinator();
  EXPECT_EQ(State(id), v1::SESSION_STATE_PINNING);
  EXPECT_THAT(PinsCopyWhenPinned(1, id), ElementsAre(true));  // the PIN sent again
  for (uint32_t r = 0; r < 4; ++r) PinAndStage(r, id);
  EXPECT_EQ(State(id), v1::SESSION_STATE_PERSISTING);
  EXPECT_THAT(RanksSent(v1::Command::kCopy, id), IsEmpty());
}

TEST_F(SessionManagerTest, CopyWhenPinned_AnAgentWithoutIt_EveryRankGetsCopy) {
  StartJob("tp=2,dp=2", [](uint32_t r) {
    AgentSetup setup{absl::StrCat("node-", r)};
    setup.copies_when_pinned = r != 2;  // rank 2's agent is older: it waits for COPY
    return setup;
  });
  UseTpDpPlans();
  const std::string id = SubmitAll(3);
  EXPECT_THAT(PinsCopyWhenPinned(0, id), ElementsAre(false));
  PhaseAll(id, v1::AGENT_PHASE_PINNED);
  EXPECT_EQ(State(id), v1::SESSION_STATE_COPYING);
  EXPECT_THAT(RanksSent(v1::Command::kCopy, id), ElementsAre(0, 1, 2, 3));
  // Kept in the record: after a restart, COPY again, and the session goes on.
  RestartCoordinator();
  EXPECT_EQ(State(id), v1::SESSION_STATE_COPYING);
  PhaseAll(id, v1::AGENT_PHASE_STAGED);
  EXPECT_EQ(State(id), v1::SESSION_STATE_PERSISTING);
}

TEST_F(SessionManagerTest, CopyWhenPinnedOff_StagedWhilePinning_RefusedAndCopySent) {
  options_.copy_when_pinned = false;
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  const std::string id = SubmitAll(3);
  ASSERT_TRUE(Phase(0, id, v1::AGENT_PHASE_PINNED).ok());
  EXPECT_EQ(Phase(0, id, v1::AGENT_PHASE_STAGED).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(PinsCopyWhenPinned(0, id), ElementsAre(false));
  PhaseAll(id, v1::AGENT_PHASE_PINNED);
  EXPECT_EQ(State(id), v1::SESSION_STATE_COPYING);
  EXPECT_THAT(RanksSent(v1::Command::kCopy, id), ElementsAre(0, 1, 2, 3));
}

// ---------------------------------------------------------------------------------------------
// Writing when staged (PinCommand.write_when_staged)

TEST_F(SessionManagerTest, WriteWhenStaged_RanksWriteWhileOthersCopy_NoGatherNoPersist) {
  options_.write_when_staged = true;
  StartJob("tp=2,dp=2", WritesWhenStaged);
  UseTpDpPlans();  // no DP-sliced state: no rank exchanges slices
  const std::string id = SubmitAll(3);
  for (uint32_t r = 0; r < 4; ++r) EXPECT_TRUE(PinWritesWhenStaged(r, id)) << "rank " << r;
  // Ranks 0-2 pinned, copied, hashed and wrote while rank 3 has not even pinned.
  for (uint32_t r = 0; r < 3; ++r) {
    PinAndStage(r, id);
    GatherAndPersist(r, id);
  }
  EXPECT_EQ(State(id), v1::SESSION_STATE_PINNING);
  PinAndStage(3, id);
  EXPECT_EQ(State(id), v1::SESSION_STATE_PERSISTING);
  GatherAndPersist(3, id);
  EXPECT_EQ(State(id), v1::SESSION_STATE_COMMITTING);
  ASSERT_THAT(Status(id).ranks(), SizeIs(4));
  EXPECT_EQ(Status(id).ranks(2).write_ns(), 6'000'000u);
  AdvanceAndTick(absl::Seconds(1));
  EXPECT_EQ(State(id), v1::SESSION_STATE_COMMITTED);
  // The first write began before PERSISTING: the earliest of the ranks' reports is kept.
  EXPECT_EQ(Status(id).writes_began_unix_ms(), kWritesBeganMs - 300);
  EXPECT_THAT(RanksSent(v1::Command::kGather, id), IsEmpty());
  EXPECT_THAT(RanksSent(v1::Command::kPersist, id), IsEmpty());
  EXPECT_THAT(RanksSent(v1::Command::kCommitted, id), ElementsAre(0, 1, 2, 3));
}

TEST_F(SessionManagerTest, WriteWhenStaged_EveryRankDoneBeforeTheLastStaged_StraightToCommitting) {
  options_.write_when_staged = true;
  StartJob("tp=2,dp=2", WritesWhenStaged);
  UseTpDpPlans();
  const std::string id = SubmitAll(3);
  for (uint32_t r = 0; r < 3; ++r) {
    PinAndStage(r, id);
    GatherAndPersist(r, id);
  }
  // Rank 3's reports come all at once (re-sent after a reconnection): chunks first, then its
  // phases in order.
  ASSERT_TRUE(ReportHashes(3, id).ok());
  ASSERT_TRUE(ReportWrites(3, id).ok());
  PinAndStage(3, id);
  ASSERT_TRUE(Phase(3, id, v1::AGENT_PHASE_GATHERED).ok());
  ASSERT_TRUE(Phase(3, id, v1::AGENT_PHASE_PERSISTED).ok());
  EXPECT_EQ(State(id), v1::SESSION_STATE_COMMITTING);
}

TEST_F(SessionManagerTest, WriteWhenStaged_PhaseAheadOfItsStaged_UnavailableToComeAgain) {
  options_.write_when_staged = true;
  StartJob("tp=2,dp=2", WritesWhenStaged);
  UseTpDpPlans();
  const std::string id = SubmitAll(3);
  ASSERT_TRUE(Phase(0, id, v1::AGENT_PHASE_PINNED).ok());
  for (v1::AgentPhase phase : {v1::AGENT_PHASE_GATHERED, v1::AGENT_PHASE_PERSISTED}) {
    absl::StatusOr<v1::SessionState> early = Phase(0, id, phase);
    EXPECT_EQ(early.status().code(), absl::StatusCode::kUnavailable)
        << v1::AgentPhase_Name(phase) << ": " << early.status();
  }
  ASSERT_TRUE(Phase(0, id, v1::AGENT_PHASE_STAGED).ok());
  GatherAndPersist(0, id);
  EXPECT_EQ(State(id), v1::SESSION_STATE_PINNING);
}

TEST_F(SessionManagerTest, WriteWhenStaged_WriterBound_FirstWritersAndNonWritersOnly) {
  options_.write_when_staged = true;
  options_.max_concurrent_writers = 1;
  StartJob("tp=2,dp=2", WritesWhenStaged);
  UseTpDpPlans();
  const std::string id = SubmitAll(3);
  const std::vector<uint32_t> writers = Writers(id);
  ASSERT_GE(writers.size(), 2u);
  std::vector<uint32_t> told, waiting;
  for (uint32_t r = 0; r < 4; ++r) {
    (PinWritesWhenStaged(r, id) ? told : waiting).push_back(r);
  }
  // The first writer and every rank that writes nothing; the other writers wait for PERSIST.
  std::vector<uint32_t> later_writers(writers.begin() + 1, writers.end());
  EXPECT_THAT(waiting, ::testing::ElementsAreArray(later_writers));
  EXPECT_THAT(told, ::testing::Contains(writers[0]));

  for (uint32_t r : told) {
    PinAndStage(r, id);
    GatherAndPersist(r, id);
  }
  // A rank not told may not report ahead of the session.
  ASSERT_TRUE(Phase(waiting[0], id, v1::AGENT_PHASE_PINNED).ok());
  ASSERT_TRUE(Phase(waiting[0], id, v1::AGENT_PHASE_STAGED).ok());
  EXPECT_EQ(Phase(waiting[0], id, v1::AGENT_PHASE_GATHERED).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReportWrites(waiting[0], id).status().code(),
            absl::StatusCode::kFailedPrecondition);
  for (size_t i = 1; i < waiting.size(); ++i) PinAndStage(waiting[i], id);
  ASSERT_EQ(State(id), v1::SESSION_STATE_PERSISTING);
  EXPECT_THAT(RanksSent(v1::Command::kGather, id), ::testing::ElementsAreArray(waiting));
  for (uint32_t r : waiting) {
    ASSERT_TRUE(ReportHashes(r, id).ok());
    ASSERT_TRUE(Phase(r, id, v1::AGENT_PHASE_GATHERED).ok());
  }
  // The first writer is done, so its slot is free: PERSIST to the next writer alone.
  EXPECT_THAT(RanksSent(v1::Command::kPersist, id), ElementsAre(waiting[0]));
  for (uint32_t r : waiting) {
    ASSERT_TRUE(ReportWrites(r, id).ok());
    ASSERT_TRUE(Phase(r, id, v1::AGENT_PHASE_PERSISTED).ok());
  }
  EXPECT_THAT(RanksSent(v1::Command::kPersist, id), ::testing::ElementsAreArray(waiting));
  EXPECT_EQ(State(id), v1::SESSION_STATE_COMMITTING);
}

TEST_F(SessionManagerTest, WriteWhenStaged_RanksExchangingSlices_GatherAndPersistAsBefore) {
  options_.write_when_staged = true;
  StartJob("tp=2,dp=2", WritesWhenStaged);
  UseDpSlicedPlans();  // every rank has a DP partner (leader or sender)
  const std::string id = SubmitAll(3);
  for (uint32_t r = 0; r < 4; ++r) EXPECT_FALSE(PinWritesWhenStaged(r, id)) << "rank " << r;
  PinAndStage(0, id);
  EXPECT_EQ(Phase(0, id, v1::AGENT_PHASE_GATHERED).status().code(),
            absl::StatusCode::kInvalidArgument);
  for (uint32_t r = 1; r < 4; ++r) PinAndStage(r, id);
  EXPECT_THAT(RanksSent(v1::Command::kGather, id), ElementsAre(0, 1, 2, 3));
}

TEST_F(SessionManagerTest, WriteWhenStaged_AnAgentWithoutIt_NoRankIsTold) {
  options_.write_when_staged = true;
  StartJob("tp=2,dp=2", [](uint32_t r) {
    AgentSetup setup = WritesWhenStaged(r);
    setup.writes_when_staged = r != 1;  // rank 1's agent is older: it waits for PERSIST
    return setup;
  });
  UseTpDpPlans();
  const std::string id = SubmitAll(3);
  for (uint32_t r = 0; r < 4; ++r) EXPECT_FALSE(PinWritesWhenStaged(r, id)) << "rank " << r;
  FinishSave(id);
}

TEST_F(SessionManagerTest, WriteWhenStagedOffByDefault_NoRankIsTold) {
  StartJob("tp=2,dp=2", WritesWhenStaged);
  UseTpDpPlans();
  const std::string id = SubmitAll(3);
  for (uint32_t r = 0; r < 4; ++r) EXPECT_FALSE(PinWritesWhenStaged(r, id)) << "rank " << r;
  FinishSave(id);
}

TEST_F(SessionManagerTest, WriteWhenStaged_KeptInTheRecord_ARestartWithTheOptionOffKeepsIt) {
  options_.write_when_staged = true;
  options_.max_concurrent_writers = 1;
  StartJob("tp=2,dp=2", WritesWhenStaged);
  UseTpDpPlans();
  const std::string id = SubmitAll(3);
  std::vector<uint32_t> told;
  for (uint32_t r = 0; r < 4; ++r) {
    if (PinWritesWhenStaged(r, id)) told.push_back(r);
  }
  ASSERT_THAT(told, SizeIs(::testing::Lt(4u)));
  PinAndStage(told[0], id);
  GatherAndPersist(told[0], id);
  // The coordinator comes back with the option off and another writer bound: this session's
  // PINs said otherwise, and the same ranks count ahead and write without PERSIST.
  options_.write_when_staged = false;
  options_.max_concurrent_writers = 64;
  RestartCoordinator();
  ASSERT_EQ(State(id), v1::SESSION_STATE_PINNING);
  for (uint32_t r = 0; r < 4; ++r) {
    bool replayed_flag = false;
    for (const v1::Command& c : CommandsTo(r, id)) {
      if (c.has_pin()) replayed_flag = c.pin().write_when_staged();
    }
    EXPECT_EQ(replayed_flag, Has(told, r))
        << "rank " << r;
  }
  for (uint32_t r : told) {  // every report re-sent after the restart
    PinAndStage(r, id);
    GatherAndPersist(r, id);
  }
  for (uint32_t r = 0; r < 4; ++r) {
    if (!Has(told, r)) PinAndStage(r, id);
  }
  ASSERT_EQ(State(id), v1::SESSION_STATE_PERSISTING);
  for (uint32_t r = 0; r < 4; ++r) {
    if (Has(told, r)) continue;
    ASSERT_TRUE(ReportHashes(r, id).ok());
    ASSERT_TRUE(Phase(r, id, v1::AGENT_PHASE_GATHERED).ok());
  }
  EXPECT_THAT(PersistSentTo(told, id), IsEmpty());
}

TEST_F(SessionManagerTest, Save_WriterBound_ANonWriterFinishingFreesNoWriterSlot) {
  options_.max_concurrent_writers = 1;
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  const std::string id = DriveToPersisting(9);
  const std::vector<uint32_t> writers = Writers(id);
  ASSERT_GE(writers.size(), 2u);
  std::vector<uint32_t> others;
  for (uint32_t r = 0; r < 4; ++r) {
    if (!Has(writers, r)) others.push_back(r);
  }
  ASSERT_FALSE(others.empty()) << "the plan needs a rank that writes nothing";
  for (uint32_t r = 0; r < 4; ++r) {
    ASSERT_TRUE(ReportHashes(r, id).ok());
    ASSERT_TRUE(Phase(r, id, v1::AGENT_PHASE_GATHERED).ok());
  }
  ASSERT_THAT(PersistSentTo(writers, id), SizeIs(1));
  // A rank with nothing to write finishes while the one writer writes: still one writer.
  ASSERT_TRUE(Phase(others[0], id, v1::AGENT_PHASE_PERSISTED).ok());
  EXPECT_THAT(PersistSentTo(writers, id), SizeIs(1));
}

TEST_F(SessionManagerTest, Save_WriterBound_OnePersistAtATime) {
  options_.max_concurrent_writers = 1;
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  const std::string id = DriveToPersisting(8);
  const std::vector<uint32_t> writers = Writers(id);
  ASSERT_GE(writers.size(), 2u);
  auto is_writer = [&](uint32_t r) { return Has(writers, r); };
  auto writers_sent = [&] { return PersistSentTo(writers, id); };

  // No PERSIST before every rank gathered.
  for (uint32_t r = 0; r + 1 < 4; ++r) {
    ASSERT_TRUE(ReportHashes(r, id).ok());
    ASSERT_TRUE(Phase(r, id, v1::AGENT_PHASE_GATHERED).ok());
  }
  EXPECT_THAT(RanksSent(v1::Command::kPersist, id), IsEmpty());
  ASSERT_TRUE(ReportHashes(3, id).ok());
  ASSERT_TRUE(Phase(3, id, v1::AGENT_PHASE_GATHERED).ok());

  // Non-writers get their PERSIST at once; writers one at a time.
  for (uint32_t r = 0; r < 4; ++r) {
    if (!is_writer(r)) {
      EXPECT_THAT(CommandsTo(r, id).back().body_case(), v1::Command::kPersist);
    }
  }
  std::set<uint32_t> done;
  for (size_t i = 0; i < writers.size(); ++i) {
    // Each writer got at most one PERSIST, and exactly one writer is writing.
    const std::vector<uint32_t> sent = writers_sent();
    ASSERT_THAT(sent, SizeIs(i + 1)) << "after " << i << " writers finished";
    std::optional<uint32_t> writing;
    for (uint32_t r : sent) {
      if (done.count(r) == 0) writing = r;
    }
    ASSERT_TRUE(writing.has_value());
    ASSERT_TRUE(ReportWrites(*writing, id).ok());
    // Reporting chunks does not free the slot; PERSISTED does.
    EXPECT_THAT(writers_sent(), SizeIs(i + 1));
    ASSERT_TRUE(Phase(*writing, id, v1::AGENT_PHASE_PERSISTED).ok());
    done.insert(*writing);
  }
  for (uint32_t r = 0; r < 4; ++r) {
    if (!is_writer(r)) {
      ASSERT_TRUE(Phase(r, id, v1::AGENT_PHASE_PERSISTED).ok());
    }
  }
  EXPECT_EQ(State(id), v1::SESSION_STATE_COMMITTING);
  AdvanceAndTick(absl::Seconds(1));
  EXPECT_EQ(State(id), v1::SESSION_STATE_COMMITTED);
}

TEST_F(SessionManagerTest, AbortSession_ByOperator_AbortedByUser) {
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  const std::string id = SubmitAll(9);
  PhaseAll(id, v1::AGENT_PHASE_PINNED);

  absl::StatusOr<v1::SessionStatus> aborted = manager().AbortSession(kJob, "wrong step");
  ASSERT_TRUE(aborted.ok()) << aborted.status();
  EXPECT_EQ(aborted->session_id(), id);
  EXPECT_EQ(aborted->state(), v1::SESSION_STATE_ABORTED);
  EXPECT_EQ(aborted->error().code(), v1::ERROR_CODE_ABORTED_BY_USER);
  EXPECT_THAT(aborted->error().message(), HasSubstr("wrong step"));
  EXPECT_THAT(RanksSent(v1::Command::kAbort, id), ElementsAre(0, 1, 2, 3));
  EXPECT_EQ(AbortErrorOf(1, id).code(), v1::ERROR_CODE_ABORTED_BY_USER);
  EXPECT_EQ(Status().state(), v1::SESSION_STATE_ABORTED);
  manager().Tick();
  EXPECT_THAT(committer_.removed(), ElementsAre(TmpDir(9, id)));

  // The abort is persisted: a restarted coordinator does not resume it; it tells every rank
  // the outcome again, in case one missed it.
  RestartCoordinator();
  EXPECT_EQ(State(id), v1::SESSION_STATE_ABORTED);
  EXPECT_THAT(RanksSent(v1::Command::kAbort, id), ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(Sent(), SizeIs(4));
  // And the step can be saved again.
  EXPECT_NE(SaveAndCommit(9), id);
}

TEST_F(SessionManagerTest, AbortSession_NothingInFlight_NotFoundOrFailedPrecondition) {
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  EXPECT_EQ(manager().AbortSession(kJob, "").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(manager().AbortSession("no-such-job", "").status().code(),
            absl::StatusCode::kNotFound);
  const std::string id = SaveAndCommit(1);
  absl::StatusOr<v1::SessionStatus> aborted = manager().AbortSession(kJob, "");
  EXPECT_EQ(aborted.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(aborted.status().message(), HasSubstr("COMMITTED"));
  EXPECT_EQ(State(id), v1::SESSION_STATE_COMMITTED);
  EXPECT_EQ(LatestStep(), 1);
}

// An operator's abort that arrives while the checkpoint is being renamed into place must not
// leave a committed directory behind a session recorded as ABORTED.
TEST_F(SessionManagerTest, AbortSession_WhileCommitting_Refused) {
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  const std::string id = DriveToPersisting(6);
  GatherAll(id);
  PersistAll(id);
  ASSERT_EQ(State(id), v1::SESSION_STATE_COMMITTING);

  absl::StatusOr<v1::SessionStatus> during;
  committer_.DuringNextCommit([&] { during = manager().AbortSession(kJob, "too late"); });
  AdvanceAndTick(absl::Seconds(1));
  EXPECT_EQ(during.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(State(id), v1::SESSION_STATE_COMMITTED);
  EXPECT_EQ(LatestStep(), 6);
  EXPECT_THAT(committer_.removed(), IsEmpty());
}

TEST_F(SessionManagerTest, Save_AgentRestartsMidSession_AgentLost) {
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  const std::string id = DriveToPersisting(12);
  const uint64_t old_incarnation = incarnations_[1];

  // A first registration (nothing replaced) is not a restart.
  manager().AgentsChanged(kJob);
  EXPECT_EQ(State(id), v1::SESSION_STATE_PERSISTING);

  RestartAgent(1);
  const v1::SessionStatus status = Status(id);
  EXPECT_EQ(status.state(), v1::SESSION_STATE_ABORTED);
  EXPECT_EQ(status.error().code(), v1::ERROR_CODE_AGENT_LOST);
  EXPECT_THAT(Ranks(status.error()), ElementsAre(1));
  EXPECT_THAT(Coords(status.error()), ElementsAre("tp=0,dp=1"));
  EXPECT_THAT(status.error().message(), HasSubstr("restarted"));
  EXPECT_THAT(RanksSent(v1::Command::kAbort, id), ElementsAre(0, 1, 2, 3));

  // The previous life of rank 1 can no longer report.
  v1::ReportPhaseRequest stale;
  stale.set_job_id(kJob);
  stale.set_rank(1);
  stale.set_incarnation(old_incarnation);
  stale.set_session_id(id);
  stale.set_phase(v1::AGENT_PHASE_GATHERED);
  EXPECT_EQ(GetErrorCode(manager().ReportPhase(stale).status()),
            v1::ERROR_CODE_STALE_INCARNATION);
}

TEST_F(SessionManagerTest, Report_StaleIncarnation_Rejected) {
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  const std::string id = SubmitAll(1);
  incarnations_[2] += 7;  // not the registered one
  absl::StatusOr<v1::SessionState> phase = Phase(2, id, v1::AGENT_PHASE_PINNED);
  EXPECT_EQ(phase.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(GetErrorCode(phase.status()), v1::ERROR_CODE_STALE_INCARNATION);
  incarnations_[2] -= 7;
  PhaseAll(id, v1::AGENT_PHASE_PINNED);
  PhaseAll(id, v1::AGENT_PHASE_STAGED);
  incarnations_[0] += 7;
  EXPECT_EQ(GetErrorCode(ReportHashes(0, id).status()), v1::ERROR_CODE_STALE_INCARNATION);
  // The stale reports changed nothing.
  EXPECT_EQ(State(id), v1::SESSION_STATE_PERSISTING);
}

TEST_F(SessionManagerTest, Report_InvalidPhasesAndChunks_Rejected) {
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  const std::string id = SubmitAll(1);

  // A phase ahead of the session.
  absl::StatusOr<v1::SessionState> ahead = Phase(0, id, v1::AGENT_PHASE_PERSISTED);
  EXPECT_EQ(ahead.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Phase(0, id, v1::AGENT_PHASE_UNSPECIFIED).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Chunks before PERSISTING.
  EXPECT_EQ(ReportHashes(0, id).status().code(), absl::StatusCode::kFailedPrecondition);
  // An unknown session.
  EXPECT_EQ(Phase(0, "s1-0000000000000000", v1::AGENT_PHASE_PINNED).status().code(),
            absl::StatusCode::kNotFound);

  PhaseAll(id, v1::AGENT_PHASE_PINNED);
  // An earlier phase re-reported (after a lost reply) is harmless.
  absl::StatusOr<v1::SessionState> again = Phase(0, id, v1::AGENT_PHASE_PINNED);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, v1::SESSION_STATE_COPYING);
  PhaseAll(id, v1::AGENT_PHASE_STAGED);
  ASSERT_EQ(State(id), v1::SESSION_STATE_PERSISTING);

  const uint32_t writer = Writers(id).front();
  const v1::RankAssignment a = AssignmentOf(writer, id);
  auto report = [&](uint32_t rank, const std::string& key, v1::ChunkEntry entry) {
    v1::ReportChunksRequest request;
    request.set_job_id(kJob);
    request.set_rank(rank);
    request.set_incarnation(incarnations_[rank]);
    request.set_session_id(id);
    v1::ChunkReport* chunk = request.add_chunks();
    chunk->set_key(key);
    *chunk->mutable_chunk() = std::move(entry);
    return manager().ReportChunks(request);
  };
  const v1::ChunkEntry good = WrittenEntry(a.writes(0), a.file(), 4096);

  // A chunk not in the plan: an unknown key, or a box the plan does not have.
  absl::StatusOr<v1::SessionState> unknown = report(writer, "not.a.tensor", good);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unknown.status().message(), HasSubstr("not in the plan"));
  v1::ChunkEntry shifted = good;
  shifted.mutable_box()->set_offsets(0, shifted.box().offsets(0) + 1);
  EXPECT_EQ(report(writer, a.writes(0).key(), shifted).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Another rank's chunk, and a wrong size.
  const uint32_t other = (writer + 1) % 4;
  EXPECT_EQ(report(other, a.writes(0).key(), good).status().code(),
            absl::StatusCode::kInvalidArgument);
  v1::ChunkEntry short_chunk = good;
  short_chunk.set_nbytes(good.nbytes() - 4);
  EXPECT_EQ(report(writer, a.writes(0).key(), short_chunk).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Status(id).chunks_reported(), 0u);

  // A good chunk, twice: counted once.
  ASSERT_TRUE(report(writer, a.writes(0).key(), good).ok());
  ASSERT_TRUE(report(writer, a.writes(0).key(), good).ok());
  EXPECT_EQ(Status(id).chunks_reported(), 1u);
  EXPECT_EQ(Status(id).ranks(writer).chunks_reported(), 1u);
  EXPECT_EQ(State(id), v1::SESSION_STATE_PERSISTING);
}

// ---------------------------------------------------------------------------------------------
// Committing

TEST_F(SessionManagerTest, Save_CommitThroughAgent_WhenCoordinatorHasNoStorage) {
  const std::string id = DriveToCommittingByRank2(50);
  ASSERT_EQ(State(id), v1::SESSION_STATE_COMMITTING);

  // Only rank 2 can commit; it gets COMMIT with the manifest.
  EXPECT_THAT(RanksSent(v1::Command::kCommit, id), ElementsAre(2));
  const v1::Command commit = CommandsTo(2, id).back();
  ASSERT_TRUE(commit.has_commit());
  EXPECT_EQ(commit.commit().tmp_dir(), TmpDir(50, id));
  EXPECT_EQ(commit.commit().final_dir(), FinalDir(50));
  EXPECT_EQ(commit.commit().manifest().session_id(), id);
  EXPECT_THAT(commit.commit().manifest().tensors(), SizeIs(2));
  ASSERT_TRUE(manager().CurrentCommand(kJob, 2).has_value());
  EXPECT_TRUE(manager().CurrentCommand(kJob, 2)->has_commit());

  // The coordinator itself never touches the storage.
  AdvanceAndTick(absl::Seconds(1));
  EXPECT_EQ(State(id), v1::SESSION_STATE_COMMITTING);
  EXPECT_THAT(committer_.commits(), IsEmpty());

  // COMMIT_ROLLED_BACK from anyone but the committer does not count.
  v1::ReportPhaseRequest rolled;
  rolled.set_job_id(kJob);
  rolled.set_rank(0);
  rolled.set_incarnation(incarnations_[0]);
  rolled.set_session_id(id);
  rolled.set_phase(v1::AGENT_PHASE_COMMIT_ROLLED_BACK);
  rolled.mutable_error()->set_code(v1::ERROR_CODE_IO_ERROR);
  absl::StatusOr<v1::SessionState> wrong = manager().ReportPhase(rolled);
  ASSERT_TRUE(wrong.ok()) << wrong.status();
  EXPECT_EQ(*wrong, v1::SESSION_STATE_COMMITTING);

  absl::StatusOr<v1::SessionState> written = Phase(2, id, v1::AGENT_PHASE_COMMIT_WRITTEN);
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_EQ(*written, v1::SESSION_STATE_COMMITTED);
  EXPECT_THAT(RanksSent(v1::Command::kCommitted, id), ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(CheckpointSteps(), ElementsAre(50));
  EXPECT_EQ(LatestStep(), 50);
  EXPECT_THAT(committer_.commits(), IsEmpty());
}

// COMMIT_WRITTEN says the final directory holds the session's manifest: true whoever found it,
// such as a committer that was replaced (or that a reloaded coordinator does not remember).
TEST_F(SessionManagerTest, Save_CommitWrittenByAReplacedCommitter_Committed) {
  options_.coordinator_commits = false;
  StartJob("tp=2,dp=2", [](uint32_t r) {
    return AgentSetup{absl::StrCat("node-", r), 0, /*storage_root_mounted=*/r >= 2};
  });
  UseTpDpPlans();
  const std::string id = DriveToPersisting(51);
  GatherAll(id);
  PersistAll(id);
  ASSERT_THAT(RanksSent(v1::Command::kCommit, id), ElementsAre(2));
  // Rank 2 is lost; rank 3 is asked; rank 2's (late) report arrives.
  for (int i = 0; i < 12; ++i) {
    Pass(absl::Seconds(1));
    HeartbeatAll(/*except=*/2);
    manager().Tick();
  }
  ASSERT_THAT(RanksSent(v1::Command::kCommit, id), ::testing::Contains(3));
  absl::StatusOr<v1::SessionState> written = Phase(2, id, v1::AGENT_PHASE_COMMIT_WRITTEN);
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_EQ(*written, v1::SESSION_STATE_COMMITTED);
}

// The committer's agent died while the coordinator restarted: the new process's registry
// never hears from it, so no lease of it ever expires. Before, only an expired lease counted
// as a lost committer: COMMIT went to the missing rank forever, rank 3 (which mounts the
// storage too) was never asked, and every later save was refused SESSION_IN_PROGRESS. Once
// the restarted registry has had a lease to hear from it, a committer not registered is lost.
TEST_F(SessionManagerTest, Regression_CommitterNeverRegistersAfterRestart_AnotherCommits) {
  const std::string id = DriveToCommittingByRank2(52, /*rank3_mounts_too=*/true);
  ASSERT_EQ(State(id), v1::SESSION_STATE_COMMITTING);
  RestartCoordinatorProcess(/*gone=*/2);
  ASSERT_EQ(State(id), v1::SESSION_STATE_COMMITTING);
  ASSERT_THAT(RanksSent(v1::Command::kCommit, id), ElementsAre(2));  // the recovered committer
  // Within the restarted registry's first lease rank 2 may still be on its way back.
  for (int i = 0; i < 5; ++i) {
    Pass(absl::Seconds(1));
    HeartbeatAll(/*except=*/2);
    manager().Tick();
  }
  ASSERT_THAT(RanksSent(v1::Command::kCommit, id), ElementsAre(2));
  // Past it, rank 2 is lost and rank 3 commits.
  for (int i = 0; i < 6; ++i) {
    Pass(absl::Seconds(1));
    HeartbeatAll(/*except=*/2);
    manager().Tick();
  }
  EXPECT_THAT(RanksSent(v1::Command::kCommit, id), ElementsAre(2, 3));
  absl::StatusOr<v1::SessionState> written = Phase(3, id, v1::AGENT_PHASE_COMMIT_WRITTEN);
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_EQ(*written, v1::SESSION_STATE_COMMITTED);
  // The job saves again.
  absl::StatusOr<v1::SubmitLocalPlanResponse> next = SubmitAs(0, 53);
  EXPECT_TRUE(next.ok()) << next.status();
}

// The job restarted on a smaller mesh while its save was COMMITTING: once every agent of the
// old mesh expired, the new mesh's registered and the registry dropped the old ones, the
// committer (rank 2) among them. Before, that committer was never lost (no lease of it
// expires any more) and the session waited for it forever; now an agent of the new mesh that
// mounts the storage commits it (a COMMIT for a session it does not know: edge 11 of
// agent/save/save_core.h).
TEST_F(SessionManagerTest, Regression_JobResumedOnSmallerMesh_CommitterGone_AnotherCommits) {
  const std::string id = DriveToCommittingByRank2(54);
  ASSERT_EQ(State(id), v1::SESSION_STATE_COMMITTING);
  Pass(absl::Seconds(11));  // every agent of tp=2,dp=2 expired
  manager().Tick();
  StartJob("tp=2", [](uint32_t r) {
    return AgentSetup{absl::StrCat("node-", r), 0, /*storage_root_mounted=*/true};
  });
  ASSERT_FALSE(registry_->Get(kJob, 2).has_value());
  Pass(absl::Seconds(1));
  HeartbeatAll();
  manager().Tick();
  EXPECT_THAT(RanksSent(v1::Command::kCommit, id), ElementsAre(0, 2));
  absl::StatusOr<v1::SessionState> written = Phase(0, id, v1::AGENT_PHASE_COMMIT_WRITTEN);
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_EQ(*written, v1::SESSION_STATE_COMMITTED);
  absl::StatusOr<v1::SubmitLocalPlanResponse> next = SubmitAs(0, 55);
  EXPECT_TRUE(next.ok()) << next.status();
}

// A committer agent that refuses its COMMIT (agent/save/save_core.h R4: a directory is not the one
// it computes, so it touches nothing) reports the error and acts on no later COMMIT of the
// session. Before, the coordinator only logged the error ("it retries") and re-sent COMMIT to
// that agent forever, never asking rank 3, which mounts the storage too.
TEST_F(SessionManagerTest, Regression_CommitterRefusesCommit_AnotherCommitterAskedAtOnce) {
  const std::string id = DriveToCommittingByRank2(56, /*rank3_mounts_too=*/true);
  ASSERT_EQ(State(id), v1::SESSION_STATE_COMMITTING);
  ASSERT_THAT(RanksSent(v1::Command::kCommit, id), ElementsAre(2));
  v1::ReportPhaseRequest refused;
  refused.set_job_id(kJob);
  refused.set_rank(2);
  refused.set_incarnation(incarnations_[2]);
  refused.set_session_id(id);
  refused.mutable_error()->set_code(v1::ERROR_CODE_IO_ERROR);
  refused.mutable_error()->set_path("/elsewhere/job-a/step-000000056");
  refused.mutable_error()->set_message("COMMIT's final_dir is /elsewhere/job-a/step-000000056");
  absl::StatusOr<v1::SessionState> state = manager().ReportPhase(refused);
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(*state, v1::SESSION_STATE_COMMITTING);
  EXPECT_THAT(RanksSent(v1::Command::kCommit, id), ElementsAre(2, 3));
  absl::StatusOr<v1::SessionState> written = Phase(3, id, v1::AGENT_PHASE_COMMIT_WRITTEN);
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_EQ(*written, v1::SESSION_STATE_COMMITTED);
}

TEST_F(SessionManagerTest, Save_NoAgentHasStorage_AbortsWithIoError) {
  options_.coordinator_commits = false;
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  const std::string id = DriveToPersisting(50);
  GatherAll(id);
  PersistAll(id);
  const v1::SessionStatus status = Status(id);
  EXPECT_EQ(status.state(), v1::SESSION_STATE_ABORTED);
  EXPECT_EQ(status.error().code(), v1::ERROR_CODE_IO_ERROR);
  EXPECT_THAT(status.error().message(), HasSubstr("storage root"));
  EXPECT_THAT(RanksSent(v1::Command::kCommit, id), IsEmpty());
}

TEST_F(SessionManagerTest, Save_CommitFindsOtherCheckpoint_StepExists) {
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  const std::string id = DriveToPersisting(70);
  GatherAll(id);
  PersistAll(id);
  committer_.NextCommit(CommitOutcome::kRolledBack,
                        MakeError(absl::StatusCode::kFailedPrecondition,
                                  v1::ERROR_CODE_STEP_EXISTS, "step-70 exists"));
  AdvanceAndTick(absl::Seconds(1));
  EXPECT_EQ(State(id), v1::SESSION_STATE_ABORTED);
  EXPECT_EQ(Status(id).error().code(), v1::ERROR_CODE_STEP_EXISTS);
  EXPECT_EQ(AbortErrorOf(0, id).code(), v1::ERROR_CODE_STEP_EXISTS);
  EXPECT_EQ(LatestStep(), -1);
}

TEST_F(SessionManagerTest, Save_CommitIoErrorThenSuccess_RetriedByTick) {
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  const std::string id = DriveToPersisting(71);
  GatherAll(id);
  PersistAll(id);
  committer_.NextCommit(CommitOutcome::kUnresolved,
                        MakeError(absl::StatusCode::kUnavailable, v1::ERROR_CODE_IO_ERROR, "EIO"));
  AdvanceAndTick(absl::Seconds(1));
  EXPECT_EQ(State(id), v1::SESSION_STATE_COMMITTING);
  EXPECT_THAT(CheckpointSteps(), IsEmpty());
  AdvanceAndTick(absl::Seconds(1));
  EXPECT_EQ(State(id), v1::SESSION_STATE_COMMITTED);
  EXPECT_THAT(committer_.commits(), SizeIs(2));
  EXPECT_EQ(committer_.commits()[0].manifest.SerializeAsString(),
            committer_.commits()[1].manifest.SerializeAsString());
}

TEST_F(SessionManagerTest, Save_CommitKeepsFailing_NotAbortedByTimer_RolledBackOnceProven) {
  options_.committing_timeout = absl::Seconds(5);
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  const std::string id = DriveToPersisting(72);
  GatherAll(id);
  PersistAll(id);
  committer_.SetDefault(CommitOutcome::kUnresolved,
                        MakeError(absl::StatusCode::kDataLoss, v1::ERROR_CODE_IO_ERROR, "EIO"));
  for (int i = 0; i < 40; ++i) AdvanceAndTick(absl::Seconds(1));
  // Unresolved commits never end the session, whatever the clock says.
  EXPECT_EQ(State(id), v1::SESSION_STATE_COMMITTING);
  const std::vector<FakeCommitEdge::CommitCall> commits = committer_.commits();
  ASSERT_GE(commits.size(), 3u);
  EXPECT_FALSE(commits.front().roll_back);
  // Past the deadline the commit is asked to roll back unless it completes.
  EXPECT_TRUE(commits.back().roll_back);

  // Until a rollback is proven.
  committer_.SetDefault(CommitOutcome::kRolledBack,
                        MakeError(absl::StatusCode::kDataLoss, v1::ERROR_CODE_IO_ERROR, "EIO"));
  for (int i = 0; i < 40 && State(id) == v1::SESSION_STATE_COMMITTING; ++i) {
    AdvanceAndTick(absl::Seconds(1));
  }
  const v1::SessionStatus status = Status(id);
  EXPECT_EQ(status.state(), v1::SESSION_STATE_ABORTED);
  EXPECT_EQ(status.error().code(), v1::ERROR_CODE_TIMEOUT);
  EXPECT_THAT(status.error().message(), HasSubstr("COMMITTING"));
  // The coordinator's own commit failed: no agent is to blame.
  EXPECT_THAT(Ranks(status.error()), IsEmpty());
  EXPECT_THAT(committer_.removed(), ElementsAre(TmpDir(72, id)));
}

// ---------------------------------------------------------------------------------------------
// Coordinator restarts

TEST_F(SessionManagerTest, Recover_InPersisting_AgentsReReport_Commits) {
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  const std::string id = DriveToPersisting(30);
  GatherAll(id);
  ASSERT_TRUE(ReportWrites(0, id).ok());

  RestartCoordinator();
  const v1::SessionStatus recovered = Status(id);
  EXPECT_EQ(recovered.state(), v1::SESSION_STATE_PERSISTING);
  EXPECT_EQ(recovered.chunks_total(), 3u);
  EXPECT_EQ(recovered.chunks_reported(), 0u);  // progress is re-reported, not persisted
  EXPECT_THAT(RanksSent(v1::Command::kGather, id), ElementsAre(0, 1, 2, 3));
  ASSERT_TRUE(manager().CurrentCommand(kJob, 0).has_value());
  EXPECT_TRUE(manager().CurrentCommand(kJob, 0)->has_gather());

  // The agents re-send what they had reported (with the PINs they kept), then carry on.
  GatherAll(id);
  EXPECT_THAT(RanksSent(v1::Command::kPersist, id), ElementsAre(0, 1, 2, 3));
  PersistAll(id);
  EXPECT_EQ(State(id), v1::SESSION_STATE_COMMITTING);
  AdvanceAndTick(absl::Seconds(1));
  EXPECT_EQ(State(id), v1::SESSION_STATE_COMMITTED);
  ASSERT_THAT(committer_.commits(), SizeIs(1));
  const v1::Manifest m = committer_.commits()[0].manifest;
  EXPECT_EQ(m.session_id(), id);
  for (const v1::TensorEntry& t : m.tensors()) {
    for (const v1::ChunkEntry& c : t.chunks()) {
      EXPECT_EQ(c.offset(), 4096u) << t.key();  // every writer writes one chunk here
      EXPECT_THAT(c.block_xxh3(), SizeIs((c.nbytes() + kBlockSize - 1) / kBlockSize));
    }
  }
  EXPECT_THAT(CheckpointSteps(), ElementsAre(30));
}

TEST_F(SessionManagerTest, Recover_InCommitting_TickCommits) {
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  const std::string first = SaveAndCommit(10);
  const std::string id = DriveToPersisting(20);
  GatherAll(id);
  PersistAll(id);
  ASSERT_EQ(State(id), v1::SESSION_STATE_COMMITTING);
  ASSERT_THAT(committer_.commits(), SizeIs(1));  // only the first save's

  // The coordinator dies before its Tick commits; the new one finds the manifest persisted.
  RestartCoordinator();
  EXPECT_EQ(State(id), v1::SESSION_STATE_COMMITTING);
  EXPECT_THAT(CheckpointSteps(), ElementsAre(10));
  EXPECT_EQ(LatestStep(), 10);
  committer_.NextCommit(CommitOutcome::kUnresolved,
                        MakeError(absl::StatusCode::kUnavailable, v1::ERROR_CODE_IO_ERROR, "EIO"));
  AdvanceAndTick(absl::Seconds(1));
  EXPECT_EQ(State(id), v1::SESSION_STATE_COMMITTING);
  AdvanceAndTick(absl::Seconds(1));
  EXPECT_EQ(State(id), v1::SESSION_STATE_COMMITTED);

  const std::vector<FakeCommitEdge::CommitCall> commits = committer_.commits();
  ASSERT_THAT(commits, SizeIs(3));
  EXPECT_EQ(commits[2].manifest.session_id(), id);
  EXPECT_EQ(commits[2].final_dir, FinalDir(20));
  EXPECT_EQ(commits[2].tmp_dir, TmpDir(20, id));
  EXPECT_THAT(commits[2].manifest.tensors(), SizeIs(2));
  EXPECT_THAT(commits[2].manifest.tensors(0).chunks(0).block_xxh3(), SizeIs(4));
  EXPECT_THAT(CheckpointSteps(), ElementsAre(20, 10));
  EXPECT_EQ(LatestStep(), 20);
  EXPECT_THAT(RanksSent(v1::Command::kCommitted, id), ElementsAre(0, 1, 2, 3));
  EXPECT_EQ(State(first), v1::SESSION_STATE_COMMITTED);  // read back from the store
}

// The coordinator dies right after persisting COMMITTED, before its agents heard it: after the
// restart, an agent whose stream reconnects is told COMMITTED (or its trainer would wait in
// WaitCommitted forever), and the status shows the ended session.
TEST_F(SessionManagerTest, Recover_AfterCommitted_ReplaysCommittedToReconnectingAgents) {
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  const std::string id = SaveAndCommit(10);
  RestartCoordinator();
  for (uint32_t rank = 0; rank < world(); ++rank) {
    std::optional<v1::Command> replay = manager().CurrentCommand(kJob, rank);
    ASSERT_TRUE(replay.has_value()) << "rank " << rank;
    EXPECT_EQ(replay->session_id(), id);
    EXPECT_EQ(replay->step(), 10);
    ASSERT_TRUE(replay->has_committed());
    EXPECT_EQ(replay->committed().checkpoint_dir(), FinalDir(10));
  }
  EXPECT_EQ(Status().session_id(), id);
  EXPECT_EQ(Status().state(), v1::SESSION_STATE_COMMITTED);
  // The next save is not disturbed by the replayed outcome.
  EXPECT_NE(SaveAndCommit(20), id);
  EXPECT_EQ(LatestStep(), 20);
}

TEST_F(SessionManagerTest, Recover_AfterAborted_ReplaysAbortWithItsReason) {
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  const std::string id = SubmitAll(9);
  ASSERT_TRUE(manager().AbortSession(kJob, "operator says no").ok());
  RestartCoordinator();
  std::optional<v1::Command> replay = manager().CurrentCommand(kJob, 3);
  ASSERT_TRUE(replay.has_value());
  EXPECT_EQ(replay->session_id(), id);
  ASSERT_TRUE(replay->has_abort());
  EXPECT_EQ(replay->abort().error().code(), v1::ERROR_CODE_ABORTED_BY_USER);
  EXPECT_THAT(replay->abort().error().message(), HasSubstr("operator says no"));
  EXPECT_EQ(Status().state(), v1::SESSION_STATE_ABORTED);
}

TEST_F(SessionManagerTest, Recover_InPlanning_AgentsResubmit) {
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  absl::StatusOr<std::string> id = Submit(0, 3);
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(Submit(1, 3).ok());
  RestartCoordinator();
  EXPECT_EQ(State(*id), v1::SESSION_STATE_PLANNING);
  EXPECT_EQ(SubmitAll(3), *id);
  EXPECT_EQ(State(*id), v1::SESSION_STATE_PINNING);
}

TEST_F(SessionManagerTest, Recover_InCopying_ResendsCopy) {
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  const std::string id = SubmitAll(3);
  PhaseAll(id, v1::AGENT_PHASE_PINNED);
  ASSERT_TRUE(Phase(0, id, v1::AGENT_PHASE_STAGED).ok());
  RestartCoordinator();
  EXPECT_EQ(State(id), v1::SESSION_STATE_COPYING);
  EXPECT_THAT(RanksSent(v1::Command::kCopy, id), ElementsAre(0, 1, 2, 3));
  // A stale PINNED re-report is harmless; STAGED from everyone moves on.
  ASSERT_TRUE(Phase(1, id, v1::AGENT_PHASE_PINNED).ok());
  PhaseAll(id, v1::AGENT_PHASE_STAGED);
  EXPECT_EQ(State(id), v1::SESSION_STATE_PERSISTING);
}

// A session in flight whose plan an older coordinator stored (HashItems with key and box, no
// chunk index: PlanRecord.assignment_format unset) is not recovered with that plan: the
// coordinator says which format it found instead of checking replicas against wrong chunks.
TEST_F(SessionManagerTest, Recover_PlanOfAnotherAssignmentFormat_RefusedNamingTheFormat) {
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  const std::string id = SubmitAll(3);
  PhaseAll(id, v1::AGENT_PHASE_PINNED);
  StoreBatch older;
  ASSERT_TRUE(store_
                  .Scan(Table::kPlans, "",
                        [&](absl::string_view key, absl::string_view value) {
                          v1::PlanRecord record;
                          EXPECT_TRUE(record.ParseFromArray(value.data(), value.size()));
                          EXPECT_EQ(record.assignment_format(), kAssignmentFormat);
                          record.clear_assignment_format();
                          older.Put(Table::kPlans, std::string(key), record.SerializeAsString());
                          return true;
                        })
                  .ok());
  ASSERT_FALSE(older.empty());
  ASSERT_TRUE(store_.Commit(older).ok());
  manager_.reset();
  SyncSessions restarted(&store_, registry_.get(), &sink_, &committer_, &clock_, options_);
  const absl::Status recovered = restarted.Recover();
  EXPECT_EQ(recovered.code(), absl::StatusCode::kDataLoss) << recovered;
  EXPECT_THAT(recovered.message(), HasSubstr("assignment format 0"));
}

// ---------------------------------------------------------------------------------------------
// State store failures

// A refused store write is not a verdict on the save: the caller is told to retry
// (Unavailable), the job is recovered from the store, and its agents are told to re-send what
// the store does not keep (RESEND). Nothing of the refused step goes out.
TEST_F(SessionManagerTest, Save_StoreFailsOnTransition_JobReloadedAgentsResend) {
  StartJob("tp=2,dp=2");
  UseTpDpPlans();

  // Opening the session: the caller gets Unavailable and no session exists.
  store_.FailNextCommit(absl::UnavailableError("disk full"));
  absl::StatusOr<std::string> opened = Submit(0, 1);
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(manager().GetSession(kJob, "").status().code(), absl::StatusCode::kNotFound);

  // A transition (STAGED -> PERSISTING): refused, the session is COPYING again as stored.
  const std::string id = SubmitAll(1);
  PhaseAll(id, v1::AGENT_PHASE_PINNED);
  for (uint32_t r = 0; r + 1 < 4; ++r) ASSERT_TRUE(Phase(r, id, v1::AGENT_PHASE_STAGED).ok());
  store_.FailNextCommit(absl::UnavailableError("disk full"));
  absl::StatusOr<v1::SessionState> staged = Phase(3, id, v1::AGENT_PHASE_STAGED);
  EXPECT_EQ(staged.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(State(id), v1::SESSION_STATE_COPYING);
  EXPECT_THAT(RanksSent(v1::Command::kGather, id), IsEmpty());
  EXPECT_THAT(RanksSent(v1::Command::kResend, id), ElementsAre(0, 1, 2, 3));
  // The agents re-send their STAGED reports: the session moves on.
  PhaseAll(id, v1::AGENT_PHASE_STAGED);
  EXPECT_EQ(State(id), v1::SESSION_STATE_PERSISTING);
  EXPECT_THAT(RanksSent(v1::Command::kGather, id), ElementsAre(0, 1, 2, 3));
  GatherAll(id);
  PersistAll(id);
  ASSERT_EQ(State(id), v1::SESSION_STATE_COMMITTING);

  // Recording COMMITTED: refused; the session is COMMITTING again, its commit redone (it is
  // idempotent) and recorded by the next attempt, and only then acknowledged.
  store_.FailNextCommit(absl::UnavailableError("disk full"));
  AdvanceAndTick(absl::Seconds(1));
  EXPECT_EQ(State(id), v1::SESSION_STATE_COMMITTING);
  EXPECT_THAT(CheckpointSteps(), IsEmpty());
  EXPECT_EQ(LatestStep(), -1);
  EXPECT_THAT(RanksSent(v1::Command::kCommitted, id), IsEmpty());
  AdvanceAndTick(absl::Seconds(1));
  EXPECT_EQ(State(id), v1::SESSION_STATE_COMMITTED);
  EXPECT_THAT(CheckpointSteps(), ElementsAre(1));
  EXPECT_THAT(committer_.commits(), SizeIs(2));
  EXPECT_THAT(RanksSent(v1::Command::kCommitted, id), ElementsAre(0, 1, 2, 3));
}

// A refused PINNING write must not leave the job pointing at a plan that was never stored:
// the session continues from the stored PLANNING (agents re-submit on RESEND) and is
// recoverable after a restart.
TEST_F(SessionManagerTest, Save_StoreFailsWhilePinning_ReplannedAndRecoverable) {
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  for (uint32_t r = 0; r + 1 < 4; ++r) ASSERT_TRUE(Submit(r, 1).ok());
  // The last plan is accepted (it is not persisted); the PINNING write that follows is refused.
  store_.FailNextCommit(absl::UnavailableError("disk full"));
  absl::StatusOr<std::string> last = Submit(3, 1);
  ASSERT_TRUE(last.ok()) << last.status();
  const std::string id = *last;
  EXPECT_EQ(State(id), v1::SESSION_STATE_PLANNING);
  EXPECT_THAT(RanksSent(v1::Command::kPin, id), IsEmpty());
  EXPECT_THAT(RanksSent(v1::Command::kResend, id), ElementsAre(0, 1, 2, 3));

  EXPECT_EQ(SubmitAll(1), id);
  ASSERT_EQ(State(id), v1::SESSION_STATE_PINNING);
  RestartCoordinator();
  EXPECT_EQ(State(id), v1::SESSION_STATE_PINNING);
  EXPECT_THAT(RanksSent(v1::Command::kPin, id), ElementsAre(0, 1, 2, 3));
}

// ---------------------------------------------------------------------------------------------
// Retention

TEST_F(SessionManagerTest, Retention_KeepLast_DeletesOldCheckpointRecords) {
  options_.keep_last = 2;
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  SaveAndCommit(10);
  SaveAndCommit(20);
  EXPECT_THAT(CheckpointSteps(), ElementsAre(20, 10));
  SaveAndCommit(30);
  EXPECT_THAT(CheckpointSteps(), ElementsAre(30, 20));
  EXPECT_EQ(store_.TableSize(Table::kCheckpoints), 2u);
  EXPECT_EQ(LatestStep(), 30);
  ASSERT_THAT(committer_.retentions(), SizeIs(3));
  EXPECT_THAT(committer_.retentions().back().retire_steps, ElementsAre(10));
  EXPECT_EQ(committer_.retentions().back().committed_step, 30);
  EXPECT_EQ(committer_.retentions().back().job_dir, JobDir());

  // The records survive a restart as they are.
  RestartCoordinator();
  EXPECT_THAT(CheckpointSteps(), ElementsAre(30, 20));
  EXPECT_EQ(LatestStep(), 30);
}

// ---------------------------------------------------------------------------------------------
// Regressions (issue 11): each failed before the session core was split.

namespace regression {

// Writes every writer's data file into the session's temporary directory, long enough for the
// chunks ReportWrites reports, as agents do before they report PERSISTED.
void WriteDataFiles(Storage& storage, const std::string& tmp_dir,
                    const std::vector<v1::RankAssignment>& assignments) {
  ASSERT_TRUE(storage.CreateDirs(tmp_dir).ok());
  for (const v1::RankAssignment& a : assignments) {
    if (a.file().empty()) continue;
    uint64_t end = 4096;
    for (const v1::WriteItem& w : a.writes()) end += (w.nbytes() + 4095) / 4096 * 4096;
    absl::StatusOr<std::unique_ptr<WritableFile>> f = storage.OpenForWrite(JoinPath(tmp_dir, a.file()));
    ASSERT_TRUE(f.ok()) << f.status();
    std::string zeros(end, '\0');
    ASSERT_TRUE((*f)->WriteAt(0, zeros.data(), zeros.size()).ok());
    ASSERT_TRUE((*f)->Sync().ok());
    ASSERT_TRUE((*f)->Close().ok());
  }
}

}  // namespace regression

// Bug 1: the coordinator renamed the directory into place, but fsyncing its parent keeps
// failing past the COMMITTING deadline. The session must never be ABORTED while its
// checkpoint directory is in place; once the fsync works it commits.
TEST_F(SessionManagerTest, Regression_RenamedButParentFsyncFails_NeverAbortedWithDirInPlace) {
  const std::string root = MakeTempDir("commit_edge");
  ASSERT_FALSE(root.empty());
  PosixStorage posix;
  // Fsyncs of the job directory (the rename's parent) fail while `fail` is set; the temporary
  // directory's own fsyncs work, so the rename happens.
  class ParentSyncFails : public FaultInjectingStorage {
   public:
    using FaultInjectingStorage::FaultInjectingStorage;
    std::string parent;
    bool fail = false;
    absl::Status SyncDir(const std::string& path) override {
      if (fail && path == parent) return ErrnoToStatus(EIO, "fsync", path, "(directory)");
      return FaultInjectingStorage::SyncDir(path);
    }
  } storage(&posix);
  storage.parent = absl::StrCat(root, "/", kJob);
  StorageCommitEdge committer(&storage, root);
  committer_override_ = &committer;
  options_.storage_root = root;
  options_.committing_timeout = absl::Seconds(5);
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  const std::string id = DriveToPersisting(80);
  GatherAll(id);
  std::vector<v1::RankAssignment> assignments;
  for (uint32_t r = 0; r < world(); ++r) assignments.push_back(AssignmentOf(r, id));
  const std::string tmp = absl::StrCat(root, "/", kJob, "/", TmpDirName(80, id));
  const std::string final_dir = absl::StrCat(root, "/", kJob, "/", StepDirName(80));
  regression::WriteDataFiles(posix, tmp, assignments);
  storage.fail = true;
  PersistAll(id);
  ASSERT_EQ(State(id), v1::SESSION_STATE_COMMITTING);
  for (int i = 0; i < 10; ++i) {
    AdvanceAndTick(absl::Seconds(1));
    const bool in_place = posix.FileSize(JoinPath(final_dir, "manifest.pb")).ok();
    ASSERT_FALSE(in_place && State(id) == v1::SESSION_STATE_ABORTED)
        << "ABORTED with " << final_dir << " in place after " << i + 1 << " s";
  }
  EXPECT_EQ(State(id), v1::SESSION_STATE_COMMITTING);
  // Once the fsync works, the next attempt (after its backoff) proves the commit.
  storage.fail = false;
  for (int i = 0; i < 60 && State(id) == v1::SESSION_STATE_COMMITTING; ++i) {
    AdvanceAndTick(absl::Seconds(1));
  }
  EXPECT_EQ(State(id), v1::SESSION_STATE_COMMITTED);
  EXPECT_TRUE(posix.FileSize(JoinPath(final_dir, "manifest.pb")).ok());
  EXPECT_EQ(LatestStep(), 80);
}

// Bug 1: a committer agent renamed the directory, but its COMMIT_WRITTEN report was lost.
// The deadline must not abort the session: the committer is asked again, and its answer
// commits.
TEST_F(SessionManagerTest, Regression_CommitterReportLost_NotAbortedByTimer) {
  options_.committing_timeout = absl::Seconds(5);
  const std::string id = DriveToCommittingByRank2(81);
  ASSERT_EQ(State(id), v1::SESSION_STATE_COMMITTING);
  ASSERT_THAT(RanksSent(v1::Command::kCommit, id), ElementsAre(2));
  for (int i = 0; i < 10; ++i) AdvanceAndTick(absl::Seconds(1));
  EXPECT_EQ(State(id), v1::SESSION_STATE_COMMITTING);
  EXPECT_GE(RanksSent(v1::Command::kCommit, id).size(), 2u) << "the committer was not asked again";
  absl::StatusOr<v1::SessionState> written = Phase(2, id, v1::AGENT_PHASE_COMMIT_WRITTEN);
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_EQ(State(id), v1::SESSION_STATE_COMMITTED);
}

// Bug 1: the store failed to record COMMITTED after the committer agent's report. That must
// not abort the session (its checkpoint is in place): the report is refused as retryable, and
// its re-sending commits.
TEST_F(SessionManagerTest, Regression_StoreFailsRecordingCommit_NotAborted) {
  const std::string id = DriveToCommittingByRank2(82);
  ASSERT_EQ(State(id), v1::SESSION_STATE_COMMITTING);
  store_.FailNextCommit(absl::UnavailableError("disk full"));
  absl::StatusOr<v1::SessionState> first = Phase(2, id, v1::AGENT_PHASE_COMMIT_WRITTEN);
  EXPECT_NE(State(id), v1::SESSION_STATE_ABORTED);
  EXPECT_FALSE(first.ok() && *first == v1::SESSION_STATE_ABORTED);
  absl::StatusOr<v1::SessionState> again = Phase(2, id, v1::AGENT_PHASE_COMMIT_WRITTEN);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(State(id), v1::SESSION_STATE_COMMITTED);
}

// Bug 4: command sequence numbers came from the wall clock and were not persisted: after a
// restart with the clock set back, the replayed outcome had a lower seq than commands the
// agents had already handled, and they dropped it.
TEST_F(SessionManagerTest, Regression_ClockBackAcrossRestart_ReplayedOutcomeHasHigherSeq) {
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  const std::string id = SaveAndCommit(90);
  uint64_t max_seq = 0;
  for (const v1::Command& c : CommandsTo(0, id)) max_seq = std::max(max_seq, c.seq());
  ASSERT_GT(max_seq, 0u);
  clock_.Advance(-absl::Hours(1));
  RestartCoordinator();
  std::optional<v1::Command> replay = manager().CurrentCommand(kJob, 0);
  ASSERT_TRUE(replay.has_value());
  EXPECT_TRUE(replay->has_committed());
  EXPECT_GT(replay->seq(), max_seq);
}

// Bug 5: retention after a commit removed every temporary directory, also that of a session
// opened meanwhile.
TEST_F(SessionManagerTest, Regression_RetentionKeepsTmpDirOfSessionOpenedMeanwhile) {
  const std::string root = MakeTempDir("retention");
  ASSERT_FALSE(root.empty());
  PosixStorage posix;
  // The first listing of the job directory (retention's) happens right after a session of
  // step 110 opened and its agents created its temporary directory.
  class OpensSessionOnList : public FaultInjectingStorage {
   public:
    using FaultInjectingStorage::FaultInjectingStorage;
    std::function<void()> on_list;
    std::string job_dir;
    absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path) override {
      if (on_list && path == job_dir) std::exchange(on_list, nullptr)();
      return FaultInjectingStorage::ListDir(path);
    }
  } storage(&posix);
  storage.job_dir = absl::StrCat(root, "/", kJob);
  StorageCommitEdge committer(&storage, root);
  committer_override_ = &committer;
  options_.storage_root = root;
  options_.keep_last = 1;
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  const std::string id = DriveToPersisting(100);
  GatherAll(id);
  std::vector<v1::RankAssignment> assignments;
  for (uint32_t r = 0; r < world(); ++r) assignments.push_back(AssignmentOf(r, id));
  regression::WriteDataFiles(posix, absl::StrCat(root, "/", kJob, "/", TmpDirName(100, id)),
                             assignments);
  PersistAll(id);
  std::string next_tmp;
  storage.on_list = [&] {
    const std::string next = SubmitAll(110);
    next_tmp = absl::StrCat(root, "/", kJob, "/", TmpDirName(110, next));
    ASSERT_TRUE(posix.CreateDirs(next_tmp).ok());
  };
  AdvanceAndTick(absl::Seconds(1));
  ASSERT_EQ(State(id), v1::SESSION_STATE_COMMITTED);
  ASSERT_FALSE(next_tmp.empty()) << "retention did not list the job directory";
  EXPECT_TRUE(posix.ListDir(next_tmp).ok()) << next_tmp << " of the session in flight was removed";
}

// Found by tests/soak: a coordinator killed after recording a commit, before its retention
// ran, left the retired checkpoint on disk for good: its record was gone, and later commits
// retire only the records they drop. The retention is now pending in the job's record until
// done: re-applied after a restart, and with the next commit.
TEST_F(SessionManagerTest, Regression_RetentionNotCarriedOut_RedoneAfterRestart) {
  options_.keep_last = 1;
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  SaveAndCommit(10);
  committer_.FailRetentions(1);
  SaveAndCommit(20);
  ASSERT_THAT(committer_.retentions(), SizeIs(2));
  EXPECT_THAT(committer_.retentions().back().retire_steps, ElementsAre(10));

  RestartCoordinator();
  AdvanceAndTick(absl::Seconds(1));
  ASSERT_THAT(committer_.retentions(), SizeIs(3));
  EXPECT_THAT(committer_.retentions().back().retire_steps, ElementsAre(10));
  EXPECT_EQ(committer_.retentions().back().committed_step, 20);

  // Done now: neither another restart nor the next commit repeats it.
  RestartCoordinator();
  AdvanceAndTick(absl::Seconds(1));
  EXPECT_THAT(committer_.retentions(), SizeIs(3));
  SaveAndCommit(30);
  ASSERT_THAT(committer_.retentions(), SizeIs(4));
  EXPECT_THAT(committer_.retentions().back().retire_steps, ElementsAre(20));
}

TEST_F(SessionManagerTest, Regression_RetentionNotCarriedOut_RedoneWithNextCommit) {
  options_.keep_last = 1;
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  SaveAndCommit(10);
  committer_.FailRetentions(1);
  SaveAndCommit(20);
  SaveAndCommit(30);
  ASSERT_THAT(committer_.retentions(), SizeIs(3));
  EXPECT_THAT(committer_.retentions().back().retire_steps, UnorderedElementsAre(10, 20));
  SaveAndCommit(40);
  EXPECT_THAT(committer_.retentions().back().retire_steps, ElementsAre(30));
}

// Found by tests/sim (invariant I7): with agent commits, a committer whose retention failed
// still reported COMMIT_WRITTEN, and the retired checkpoint stayed on disk untracked. The
// steps stay pending until a committer says its retention removed them all; each COMMIT's
// retire_steps carries them.
TEST_F(SessionManagerTest, Regression_AgentRetentionIncomplete_RetiredAgainWithNextCommit) {
  options_.coordinator_commits = false;
  options_.keep_last = 1;
  StartJob("tp=2,dp=2", [](uint32_t r) {
    return AgentSetup{absl::StrCat("node-", r), 0, /*storage_root_mounted=*/true};
  });
  UseTpDpPlans();
  auto commit_through_agent = [&](int64_t step, bool retention_complete) {
    const std::string id = DriveToPersisting(step);
    GatherAll(id);
    PersistAll(id);
    EXPECT_EQ(State(id), v1::SESSION_STATE_COMMITTING);
    const std::vector<uint32_t> committers = RanksSent(v1::Command::kCommit, id);
    EXPECT_THAT(committers, SizeIs(1));
    const uint32_t committer = committers.empty() ? 0 : committers[0];
    const v1::Command commit = CommandsTo(committer, id).back();
    v1::ReportPhaseRequest written;
    written.set_job_id(kJob);
    written.set_rank(committer);
    written.set_incarnation(incarnations_[committer]);
    written.set_session_id(id);
    written.set_phase(v1::AGENT_PHASE_COMMIT_WRITTEN);
    written.set_retention_complete(retention_complete);
    EXPECT_TRUE(manager().ReportPhase(written).ok());
    EXPECT_EQ(State(id), v1::SESSION_STATE_COMMITTED);
    return std::vector<int64_t>(commit.commit().retire_steps().begin(),
                                commit.commit().retire_steps().end());
  };
  EXPECT_THAT(commit_through_agent(10, true), IsEmpty());
  EXPECT_THAT(commit_through_agent(20, false), ElementsAre(10));  // 10 stays on disk
  EXPECT_THAT(commit_through_agent(30, true), ElementsAre(10, 20));
  EXPECT_THAT(commit_through_agent(40, true), ElementsAre(30));
  // Pending survives a restart the same way.
  EXPECT_THAT(commit_through_agent(50, false), ElementsAre(40));
  RestartCoordinator();
  EXPECT_THAT(commit_through_agent(60, true), ElementsAre(40, 50));
}

// ---------------------------------------------------------------------------------------------
// Memory-only saves (server/session/memory_only.h)

class MemoryOnlyTest : public SessionManagerTest {
 protected:
  void AskMemoryOnly(bool on) {
    memory_only_.clear();
    if (on) {
      for (uint32_t r = 0; r < world(); ++r) memory_only_.insert(r);
    }
  }
  // A whole memory-only save of `step`: it commits once every chunk is reported, without Tick.
  std::string SaveInMemory(int64_t step) {
    AskMemoryOnly(true);
    const std::string id = SubmitAll(step);
    PhaseAll(id, v1::AGENT_PHASE_PINNED);
    PhaseAll(id, v1::AGENT_PHASE_STAGED);
    GatherAll(id);
    PersistAll(id);
    AskMemoryOnly(false);
    return id;
  }
  std::vector<v1::CheckpointInfo> List() {
    absl::StatusOr<std::vector<v1::CheckpointInfo>> list = manager().ListCheckpoints(kJob);
    EXPECT_TRUE(list.ok()) << list.status();
    return list.ok() ? *list : std::vector<v1::CheckpointInfo>{};
  }
  // Every agent says it handled the commit of `session_id`, each writer stating its memory
  // copy of its data file, in a heartbeat.
  void HeartbeatCopies(int64_t step, const std::string& session_id) {
    for (uint32_t r = 0; r < world(); ++r) {
      const v1::RankAssignment a = AssignmentOf(r, session_id);
      std::optional<v1::MemoryCopy> copy;
      if (!a.file().empty()) {
        copy.emplace();
        copy->set_step(step);
        copy->set_session_id(session_id);
        copy->set_file(a.file());
        copy->set_nbytes(4096);
      }
      ASSERT_TRUE(registry_->Heartbeat(kJob, r, incarnations_[r], 0, copy, {}, session_id).ok());
    }
  }
  // A memory-only save of `step`, committed, every agent stating its copy: held whole.
  std::string SaveHeldInMemory(int64_t step) {
    const std::string id = SaveInMemory(step);
    EXPECT_EQ(Status(id).state(), v1::SESSION_STATE_COMMITTED);
    HeartbeatCopies(step, id);
    return id;
  }
  // Every agent heartbeats without naming the commit of `session_id` (of `step`, the newest):
  // its copies are unknown; once they name it and state their copies, it is held whole.
  void ExpectUnknownUntilHandled(int64_t step, const std::string& session_id) {
    HeartbeatAll();
    std::vector<v1::CheckpointInfo> list = List();
    ASSERT_THAT(list, SizeIs(1));
    EXPECT_EQ(list[0].step(), step);
    EXPECT_TRUE(list[0].memory_copies_unknown());
    EXPECT_THAT(list[0].files_not_in_memory(), IsEmpty());
    HeartbeatCopies(step, session_id);
    list = List();
    EXPECT_FALSE(list[0].memory_copies_unknown());
    EXPECT_THAT(list[0].files_not_in_memory(), IsEmpty());
  }
  // Every agent says it handled the commit of `session_id` and holds no copy of it.
  void HeartbeatHandledNothingKept(const std::string& session_id) {
    for (uint32_t r = 0; r < world(); ++r) {
      ASSERT_TRUE(
          registry_->Heartbeat(kJob, r, incarnations_[r], 0, std::nullopt, {}, session_id).ok());
    }
  }
};

TEST_F(MemoryOnlyTest, MemoryOnly_EveryChunkReported_CommittedWithoutDiskNeverLatest) {
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  SaveAndCommit(1);
  ASSERT_THAT(committer_.commits(), SizeIs(1));

  const std::string id = SaveInMemory(2);

  // COMMITTED as soon as the last chunk is in: no COMMITTING, no disk commit, no retention.
  const v1::SessionStatus status = Status(id);
  EXPECT_EQ(status.state(), v1::SESSION_STATE_COMMITTED);
  EXPECT_TRUE(status.memory_only());
  EXPECT_TRUE(status.checkpoint_dir().empty());
  EXPECT_THAT(PhaseStates(status),
              ElementsAre(v1::SESSION_STATE_PLANNING, v1::SESSION_STATE_PINNING,
                          v1::SESSION_STATE_COPYING, v1::SESSION_STATE_PERSISTING,
                          v1::SESSION_STATE_COMMITTED));
  AdvanceAndTick(absl::Seconds(1));
  EXPECT_THAT(committer_.commits(), SizeIs(1));
  EXPECT_THAT(committer_.retentions(), SizeIs(1));  // step 1's only
  EXPECT_THAT(committer_.removed(), IsEmpty());
  // PERSIST named no directory; COMMITTED says memory-only.
  EXPECT_THAT(RanksSent(v1::Command::kPersist, id), ElementsAre(0, 1, 2, 3));
  for (const v1::Command& c : CommandsTo(0, id)) {
    if (c.has_persist()) {
      EXPECT_TRUE(c.persist().memory_only());
      EXPECT_TRUE(c.persist().tmp_dir().empty());
    }
    if (c.has_committed()) {
      EXPECT_TRUE(c.committed().memory_only());
      EXPECT_TRUE(c.committed().checkpoint_dir().empty());
    }
  }
  EXPECT_THAT(RanksSent(v1::Command::kCommitted, id), ElementsAre(0, 1, 2, 3));

  // The disk's latest and records stay step 1's; the listing shows step 2 as memory-only.
  EXPECT_EQ(LatestStep(), 1);
  EXPECT_EQ(store_.TableSize(Table::kCheckpoints), 1u);
  EXPECT_EQ(store_.TableSize(Table::kMemoryCheckpoints), 1u);
  const std::vector<v1::CheckpointInfo> list = List();
  ASSERT_THAT(list, SizeIs(2));
  EXPECT_EQ(list[0].step(), 2);
  EXPECT_TRUE(list[0].memory_only());
  EXPECT_TRUE(list[0].dir().empty());
  EXPECT_EQ(list[0].session_id(), id);
  EXPECT_EQ(list[0].chunks(), 3u);
  // No agent has said it handled the commit yet: where the files are is not known (not lost).
  EXPECT_TRUE(list[0].memory_copies_unknown());
  EXPECT_THAT(list[0].files_not_in_memory(), IsEmpty());
  EXPECT_EQ(list[1].step(), 1);
  EXPECT_FALSE(list[1].memory_only());
  EXPECT_EQ(list[1].dir(), FinalDir(1));

  // The manifest, with every block checksum, is kept by the coordinator.
  absl::StatusOr<v1::Manifest> manifest = manager().GetMemoryCheckpoint(kJob, 2);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->session_id(), id);
  EXPECT_EQ(manifest->step(), 2);
  ASSERT_THAT(manifest->tensors(), SizeIs(2));
  EXPECT_EQ(manifest->tensors(0).chunks(0).block_xxh3_size(), 4);
  absl::StatusOr<v1::Manifest> newest = manager().GetMemoryCheckpoint(kJob, -1);
  ASSERT_TRUE(newest.ok()) << newest.status();
  EXPECT_EQ(newest->step(), 2);

  // Heartbeats that do not say so leave it unknown, however many.
  HeartbeatAll();
  EXPECT_TRUE(List()[0].memory_copies_unknown());
  // Once the writers state their copies, every file is in memory.
  HeartbeatCopies(2, id);
  EXPECT_FALSE(List()[0].memory_copies_unknown());
  EXPECT_THAT(List()[0].files_not_in_memory(), IsEmpty());
  // Had they kept nothing, no file would be.
  HeartbeatHandledNothingKept(id);
  std::vector<std::string> files;
  for (uint32_t r : Writers(id)) files.push_back(DataFileName(r));
  ASSERT_THAT(files, SizeIs(3));
  EXPECT_THAT(List()[0].files_not_in_memory(), ::testing::ElementsAreArray(files));
}

// A coordinator that has not heard every agent say it handled a memory-only commit (nor,
// here, heard every agent since it started) cannot tell a step whose holders have not spoken
// yet from a lost one: it says it does not know.
TEST_F(MemoryOnlyTest, MemoryOnly_NoAgentSaidItHandledTheCommit_CopiesUnknownNotLost) {
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  const std::string id = SaveInMemory(2);
  ASSERT_EQ(Status(id).state(), v1::SESSION_STATE_COMMITTED);
  std::vector<v1::CheckpointInfo> list = List();
  ASSERT_THAT(list, SizeIs(1));
  EXPECT_TRUE(list[0].memory_only());
  EXPECT_TRUE(list[0].memory_copies_unknown());
  EXPECT_THAT(list[0].files_not_in_memory(), IsEmpty());

  // Every agent heartbeats, none stating a copy of the commit it handled: now the files are
  // known to be in none.
  HeartbeatHandledNothingKept(id);
  list = List();
  EXPECT_FALSE(list[0].memory_copies_unknown());
  EXPECT_THAT(list[0].files_not_in_memory(), SizeIs(3));
}

// A coordinator that restarts right after a memory-only commit tells it again (RESEND of the
// outcome): until the agents say they handled it, its copies are unknown, however soon they
// heartbeat — an agent heard before the replayed COMMITTED reaches it has not kept the step.
TEST_F(MemoryOnlyTest, MemoryOnly_CoordinatorRestartedAfterTheCommit_UnknownUntilHandledAgain) {
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  const std::string id = SaveHeldInMemory(2);
  ASSERT_FALSE(List()[0].memory_copies_unknown());
  ASSERT_THAT(List()[0].files_not_in_memory(), IsEmpty());

  RestartCoordinatorProcess();
  EXPECT_THAT(RanksSent(v1::Command::kCommitted, id), ElementsAre(0, 1, 2, 3));
  ExpectUnknownUntilHandled(2, id);  // heard before the replay reaches them
}

// Likewise when a later session ended (or is in flight) before the restart: the memory-only
// commit is still the newest, and an agent whose stream was down at its commit may not have
// kept it.
TEST_F(MemoryOnlyTest, MemoryOnly_CoordinatorRestartedAfterALaterAbort_UnknownUntilHandled) {
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  const std::string id = SaveHeldInMemory(2);
  SubmitAll(3);
  ASSERT_TRUE(manager().AbortSession(kJob, "test").ok());

  RestartCoordinatorProcess();
  ExpectUnknownUntilHandled(2, id);
}

// A memory-only PERSIST writes nothing to storage, so the writer bound (a bound on concurrent
// disk writers) does not hold it back: every rank gets its PERSIST at once.
TEST_F(MemoryOnlyTest, MemoryOnly_WriterBound_EveryPersistAtOnce) {
  options_.max_concurrent_writers = 1;
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  AskMemoryOnly(true);
  const std::string id = DriveToPersisting(2);
  ASSERT_GE(Writers(id).size(), 2u);
  GatherAll(id);

  EXPECT_THAT(RanksSent(v1::Command::kPersist, id), ElementsAre(0, 1, 2, 3));
  PersistAll(id);
  EXPECT_EQ(State(id), v1::SESSION_STATE_COMMITTED);

  // A disk save after it is bound as before: one writer at a time.
  AskMemoryOnly(false);
  const std::string disk = DriveToPersisting(3);
  GatherAll(disk);
  EXPECT_THAT(PersistSentTo(Writers(disk), disk), SizeIs(1));
}

// A memory-only save writes nothing and reports from staging when asked: no early write.
TEST_F(MemoryOnlyTest, MemoryOnly_AgentsThatWriteWhenStaged_NotTold) {
  options_.write_when_staged = true;
  StartJob("tp=2,dp=2", WritesWhenStaged);
  UseTpDpPlans();
  const std::string id = SaveInMemory(2);
  for (uint32_t r = 0; r < 4; ++r) EXPECT_FALSE(PinWritesWhenStaged(r, id)) << "rank " << r;
  EXPECT_EQ(State(id), v1::SESSION_STATE_COMMITTED);
}

TEST_F(MemoryOnlyTest, MemoryOnly_CoordinatorRestart_StillRecordedAsMemoryOnly) {
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  SaveAndCommit(1);
  const std::string id = SaveInMemory(2);
  absl::StatusOr<v1::Manifest> before = manager().GetMemoryCheckpoint(kJob, 2);
  ASSERT_TRUE(before.ok()) << before.status();

  RestartCoordinator();

  EXPECT_EQ(LatestStep(), 1);
  const std::vector<v1::CheckpointInfo> list = List();
  ASSERT_THAT(list, SizeIs(2));
  EXPECT_EQ(list[0].step(), 2);
  EXPECT_TRUE(list[0].memory_only());
  EXPECT_EQ(list[0].session_id(), id);
  absl::StatusOr<v1::Manifest> after = manager().GetMemoryCheckpoint(kJob, 2);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->SerializeAsString(), before->SerializeAsString());
  // A rank that missed the verdict is told memory-only COMMITTED again.
  std::optional<v1::Command> replay = manager().CurrentCommand(kJob, 3);
  ASSERT_TRUE(replay.has_value());
  ASSERT_TRUE(replay->has_committed());
  EXPECT_TRUE(replay->committed().memory_only());
}

// A coordinator restart while a memory-only save is in PERSISTING: the recovered session is
// still memory-only — the replayed commands say so, the re-reported chunks commit it without
// a disk commit, and the disk's latest does not move.
TEST_F(MemoryOnlyTest, MemoryOnly_RestartInPersisting_ResumedAsMemoryOnly) {
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  SaveAndCommit(1);
  ASSERT_THAT(committer_.commits(), SizeIs(1));
  AskMemoryOnly(true);
  const std::string id = SubmitAll(2);
  PhaseAll(id, v1::AGENT_PHASE_PINNED);
  PhaseAll(id, v1::AGENT_PHASE_STAGED);
  GatherAll(id);
  ASSERT_EQ(State(id), v1::SESSION_STATE_PERSISTING);
  ASSERT_TRUE(ReportWrites(0, id).ok());

  RestartCoordinator();
  const v1::SessionStatus recovered = Status(id);
  EXPECT_EQ(recovered.state(), v1::SESSION_STATE_PERSISTING);
  EXPECT_TRUE(recovered.memory_only());
  EXPECT_EQ(recovered.chunks_reported(), 0u);  // progress is re-reported, not persisted

  // The agents re-send what they had reported, then carry on; PERSIST still names no
  // directory.
  GatherAll(id);
  EXPECT_THAT(RanksSent(v1::Command::kPersist, id), ElementsAre(0, 1, 2, 3));
  for (const v1::Command& c : CommandsTo(0, id)) {
    if (c.has_persist()) {
      EXPECT_TRUE(c.persist().memory_only());
      EXPECT_TRUE(c.persist().tmp_dir().empty());
    }
  }
  PersistAll(id);
  EXPECT_EQ(State(id), v1::SESSION_STATE_COMMITTED);
  EXPECT_TRUE(Status(id).memory_only());
  AdvanceAndTick(absl::Seconds(1));
  EXPECT_THAT(committer_.commits(), SizeIs(1));  // step 1's only
  EXPECT_EQ(LatestStep(), 1);
  EXPECT_EQ(store_.TableSize(Table::kMemoryCheckpoints), 1u);
  absl::StatusOr<v1::Manifest> manifest = manager().GetMemoryCheckpoint(kJob, 2);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->session_id(), id);
}

TEST_F(MemoryOnlyTest, MemoryOnly_NewerCommits_Supersede) {
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  SaveAndCommit(1);
  SaveInMemory(2);
  const std::string three = SaveInMemory(3);

  // A newer memory-only commit replaces the older one.
  std::vector<v1::CheckpointInfo> list = List();
  ASSERT_THAT(list, SizeIs(2));
  EXPECT_EQ(list[0].step(), 3);
  EXPECT_TRUE(list[0].memory_only());
  EXPECT_EQ(manager().GetMemoryCheckpoint(kJob, 2).status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(manager().GetMemoryCheckpoint(kJob, 2).status().message()),
              HasSubstr("its memory-only commit is step 3"));
  // Neither a step nor -1: refused, not read as "whatever its step".
  const absl::Status bad = manager().GetMemoryCheckpoint(kJob, -7).status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << bad;
  EXPECT_THAT(std::string(bad.message()), HasSubstr("step -7"));

  // A disk commit deletes it: the agents' memory holds that one now.
  SaveAndCommit(4);
  list = List();
  EXPECT_THAT(Steps(list), ElementsAre(4, 1));
  EXPECT_FALSE(list[0].memory_only());
  EXPECT_EQ(LatestStep(), 4);
  EXPECT_EQ(store_.TableSize(Table::kMemoryCheckpoints), 0u);
  const absl::Status gone = manager().GetMemoryCheckpoint(kJob, -1).status();
  EXPECT_EQ(gone.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(GetErrorCode(gone), v1::ERROR_CODE_CHECKPOINT_NOT_FOUND);
  RestartCoordinator();
  EXPECT_THAT(CheckpointSteps(), ElementsAre(4, 1));
}

TEST_F(MemoryOnlyTest, MemoryOnly_AgentTierOff_RefusedBeforeStaging) {
  StartJob("tp=2,dp=2", [](uint32_t r) {
    AgentSetup setup{absl::StrCat("node-", r)};
    setup.memory_tier = r != 2;
    return setup;
  });
  UseTpDpPlans();
  SaveAndCommit(1);
  AskMemoryOnly(true);
  const std::string id = SubmitAll(2);
  EXPECT_THAT(RanksSent(v1::Command::kPin, id), IsEmpty());
  EXPECT_THAT(RanksSent(v1::Command::kAbort, id), ElementsAre(0, 1, 2, 3));
  const v1::ErrorDetail error = AbortErrorOf(0, id);
  EXPECT_EQ(error.code(), v1::ERROR_CODE_MEMORY_ONLY_REFUSED);
  EXPECT_THAT(error.message(), HasSubstr("rank 2 runs with --memory_tier=false"));
  EXPECT_THAT(Ranks(error), ElementsAre(2));
  EXPECT_EQ(State(id), v1::SESSION_STATE_ABORTED);
  EXPECT_EQ(LatestStep(), 1);
  EXPECT_THAT(CheckpointSteps(), ElementsAre(1));
  manager().Tick();
  EXPECT_THAT(committer_.removed(), IsEmpty());  // no directory was ever named
}

TEST_F(MemoryOnlyTest, MemoryOnly_RanksDisagree_Refused) {
  StartJob("tp=2,dp=2");
  UseTpDpPlans();
  memory_only_ = {0, 1, 3};  // rank 2 asks for a disk save
  const std::string id = SubmitAll(5);
  EXPECT_THAT(RanksSent(v1::Command::kPin, id), IsEmpty());
  const v1::ErrorDetail error = AbortErrorOf(1, id);
  EXPECT_EQ(error.code(), v1::ERROR_CODE_MEMORY_ONLY_REFUSED);
  EXPECT_THAT(error.message(), HasSubstr("rank 2 asked for a disk save"));
  EXPECT_THAT(Ranks(error), ElementsAre(2));
}

}  // namespace
}  // namespace tessera
