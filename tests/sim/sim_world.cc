#include "tests/sim/sim_world.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <queue>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "agent/peer/peer_transport.h"
#include "agent/save/save_core.h"
#include "agent/save/save_effects.h"
#include "agent/save/save_work.h"
#include "common/clock.h"
#include "common/ids.h"
#include "common/layout.h"
#include "common/status.h"
#include "format/manifest_io.h"
#include "format/verify.h"
#include "server/agent_registry.h"
#include "server/liveness_feed.h"
#include "agent/lease_keeper.h"
#include "server/plan/plan_cache.h"
#include "server/session/commit_driver.h"
#include "server/session/effects_carrier.h"
#include "server/session/job_core.h"
#include "server/session/plan_work.h"
#include "server/session/schema.h"
#include "tests/sim/sim_job.h"
#include "tests/sim/sim_state_store.h"
#include "tests/sim/sim_storage.h"

namespace tessera::sim {
namespace {

constexpr char kJob[] = "job";
constexpr char kRoot[] = "/ckpt";
constexpr absl::Duration kRpcDeadline = absl::Seconds(2);
constexpr absl::Duration kHeartbeat = absl::Seconds(1);
constexpr absl::Duration kLease = absl::Seconds(5);
// How long a schedule runs without faults after its saves ended, before I7 is checked: past a
// coordinator restart (at most 3 s) and its recovery.
constexpr absl::Duration kSettle = absl::Seconds(30);
// Events at one simulated instant beyond which a schedule is a livelock (a real one is a few
// hundred events long in all).
constexpr uint64_t kLivelockEvents = 100000;
constexpr absl::Duration kCoordinatorTick = absl::Milliseconds(200);
// I8: a refusal reaches every rank within this: the coordinator's next tick, and the network.
constexpr absl::Duration kRefusalBound = absl::Seconds(2);

// Memory for one session's staging, page-aligned as the pool's is.
struct AlignedBuffer {
  explicit AlignedBuffer(uint64_t n)
      : size(std::max<uint64_t>(n, 4096)),
        data(static_cast<uint8_t*>(std::aligned_alloc(4096, (size + 4095) / 4096 * 4096))) {
    std::memset(data, 0xA5, size);  // what a reused region could hold: never zero by luck
  }
  ~AlignedBuffer() { std::free(data); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  uint64_t size;
  uint8_t* data;
};

struct Staging {
  std::string name;
  std::unique_ptr<AlignedBuffer> buffer;
  std::shared_ptr<const StagingLayout> layout;
};

class World;

// DP slices between simulated agents: a leader takes each slice it receives straight from its
// sender's staging (where the sender's trainer staged it), as the real transports deliver the
// sender's staged bytes. Sends complete at once.
class SimPeers : public PeerTransport {
 public:
  SimPeers(World* world, uint32_t rank) : world_(world), rank_(rank) {}
  absl::Status Exchange(const std::string& session_id, absl::Span<const SliceSend> sends,
                        absl::Span<const SliceRecv> recvs, absl::Time deadline) override;
  void CancelSession(const std::string&) override {}

 private:
  World* const world_;
  const uint32_t rank_;
};

struct AgentProc {
  uint32_t rank = 0;
  uint64_t life = 0;  // bumped by every death and start: what an older life sent is dropped
  bool alive = false;
  absl::Time frozen_until = absl::InfinitePast();
  uint64_t incarnation = 0;
  std::unique_ptr<SaveCore> core;
  std::unique_ptr<SimPeers> peers;
  bool registered = false;
  bool registering = false;
  // Registers with another layout than the job's (a refused registration: kRegistrationRefused
  // and the random fault); `refusal` is the coordinator's last refusal, which its trainer's
  // calls are answered (agent/trainer_service.h admission).
  bool wrong_layout = false;
  absl::Status refusal;
  // The agent's view of its lease, by the rule the real Lifeline follows (agent/lease_keeper.h):
  // the generation moves on only when the coordinator says it did not keep the lease.
  LeaseKeeper lease;
  bool stream_up = false;
  bool stream_opening = false;
  uint64_t stream_epoch = 0;  // bumped by every break: commands of an older stream are lost
  absl::Time stream_free_at = absl::InfinitePast();  // FIFO delivery on the stream
  absl::Time link_down_until = absl::InfinitePast();
  std::map<std::string, Staging> staging;  // by session id
  std::set<uint64_t> open_rpcs;
  absl::Time tick_at = absl::InfiniteFuture();
};

// The coordinator's own clock: the simulation's, plus an offset a scenario may set (a
// machine whose wall clock stepped back across a restart).
class OffsetClock : public Clock {
 public:
  explicit OffsetClock(const Clock* base) : base_(base) {}
  absl::Time Now() const override { return base_->Now() + offset_; }
  void set_offset(absl::Duration d) { offset_ = d; }

 private:
  const Clock* const base_;
  absl::Duration offset_;
};

struct CoordProc {
  uint64_t life = 0;
  bool up = false;
  uint64_t incarnation = 0;
  uint64_t epoch = 0;
  std::unique_ptr<AgentRegistry> registry;
  std::unique_ptr<PlanCache> cache;
  std::unique_ptr<JobCore> job;
  LivenessFeed liveness;  // what `job` was told of its agents (server/liveness_feed.h)
  std::map<uint32_t, uint64_t> streams;  // rank -> the agent's stream epoch
  // Paused (SIGSTOP): until then nothing reaches it and it does nothing (AtCoordinator).
  absl::Time paused_until = absl::InfinitePast();
  std::atomic<uint64_t> commands_emitted{0};  // the process's (JobContext), reset by a start
};

struct TrainerCall {
  enum Kind { kBegin, kStaged, kWait } kind;
  uint32_t rank;
};

struct TrainerState {
  bool busy = false;
  std::string session;
  std::optional<absl::StatusOr<std::string>> outcome;
};

class World {
 public:
  explicit World(const SimConfig& config);
  SimResult Run();

  // For SimPeers.
  absl::Status Pull(uint32_t from_rank, const std::string& session_id, const SliceRecv& recv);

 private:
  // --- Events
  struct Event {
    absl::Time at;
    uint64_t seq;
    std::function<void()> fn;
    bool operator>(const Event& other) const {
      return at != other.at ? at > other.at : seq > other.seq;
    }
  };
  void At(absl::Duration delay, std::string what, std::function<void()> fn);
  void Trace(const std::string& line);
  bool InWindow() const { return now() < window_end_; }
  absl::Time now() const { return clock_.Now(); }
  absl::Time CoordNow() const { return coord_clock_.Now(); }
  // Records a scenario's step, once.
  void Mark(std::string what) {
    for (const std::string& m : result_.markers) {
      if (m == what) return;
    }
    Trace(absl::StrCat("scenario: ", what));
    result_.markers.push_back(std::move(what));
  }
  bool Is(Scenario s) const { return config_.scenario == s; }
  StorageFault ScenarioDiskFault(StorageOp op, const std::string& path);
  bool ScenarioStoreFailsAfter(const StoreBatch& batch);
  void ScenarioPersisted(v1::SessionState state);
  bool LaterTmpDirExists(int64_t committed_step) const;
  void RunLateCleanups(bool all);
  double Uniform() { return std::uniform_real_distribution<double>(0, 1)(rng_); }
  bool Chance(double p) { return p > 0 && Uniform() < p; }
  absl::Duration Jitter(absl::Duration lo, absl::Duration hi);
  void Fail(std::string why);

  // --- Network
  absl::Duration NetDelay();
  bool LinkDown(uint32_t rank) const;
  // Agent -> coordinator: a request, handled by the coordinator of the life it was sent to.
  void ToCoordinator(uint32_t rank, std::string what, std::function<void()> handle);
  // Runs `fn` on the coordinator after `delay`, or once its pause ends.
  void AtCoordinator(absl::Duration delay, std::string what, std::function<void()> fn);
  void PauseCoordinator(absl::Duration d, const std::string& why);
  // Coordinator -> agent (an RPC reply), for the agent's life it was sent to.
  void ToAgent(uint32_t rank, std::string what, std::function<void()> handle);
  // Coordinator -> agent on its command stream: ordered, lost with the stream.
  void OnStream(uint32_t rank, std::string what, std::function<void()> handle);
  void BreakStream(uint32_t rank, const std::string& why);

  // --- Coordinator
  class CoordPort;
  void StartCoordinator();
  void CrashCoordinator(const std::string& why);
  bool Carry(Effects effects);
  void ReloadJob();
  void CoordinatorTick();
  // Tells the job's core what the registry judged of its agents (LivenessFeed); with `tick`,
  // judges leases and ticks the core, as SessionManager's ticker does.
  void TellLiveness(bool tick);
  absl::Status HandleSubmit(std::shared_ptr<const v1::SubmitLocalPlanRequest> request,
                            v1::SubmitLocalPlanResponse* response);
  absl::Status HandleReportPhase(const v1::ReportPhaseRequest& request);
  absl::Status HandleReportChunks(const v1::ReportChunksRequest& request);

  // --- Agents
  void StartAgent(uint32_t rank);
  void KillAgent(uint32_t rank, const std::string& why);
  void FreezeAgent(uint32_t rank, absl::Duration d);
  // Restarts the agent of `rank` with another layout than the job's: refused until it
  // restarts with the job's, `d` later.
  void RestartAgentRefused(uint32_t rank, absl::Duration d);
  void CarryAgent(uint32_t rank, SaveEffects fx);
  void Register(uint32_t rank);
  void OpenStream(uint32_t rank);
  void AgentHeartbeat(uint32_t rank, uint64_t life);
  void SendRpc(uint32_t rank, const CoordinatorRpc& rpc);
  void RunWork(uint32_t rank, SaveWork work);
  // Runs `fn` for the agent of `rank` in `life` now, or when it thaws; dropped if it died.
  void ForAgent(uint32_t rank, uint64_t life, std::string what, std::function<void()> fn);

  // --- Trainers
  void StartStep(int index);
  void TrainerBegin(uint32_t rank);
  void TrainerReply(uint32_t rank, const tessera::TrainerReply& reply);
  void TrainerDone(uint32_t rank, absl::StatusOr<std::string> outcome);

  // --- Faults and invariants
  void MaybeFault();
  void CheckInvariants();
  void VerifyCommitted(const v1::SessionRecord& session, const std::string& dir);
  bool Quiet() const;
  // Runs the next event if one is due by `until`; false if none is or the schedule failed.
  bool RunNext(absl::Time until);
  // I7, after the schedule settled.
  void CheckSettled();

  const SimConfig config_;
  std::mt19937_64 rng_;
  FakeClock clock_;
  OffsetClock coord_clock_{&clock_};
  absl::Time start_;
  absl::Time window_end_;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events_;
  uint64_t next_seq_ = 0;
  SimResult result_;
  bool failed_ = false;

  SimJob job_;
  bool coordinator_commits_ = true;
  SessionOptions options_;
  SimStateStore store_;
  SimStorage disk_;
  StorageCommitEdge edge_{&disk_, kRoot};
  CoordProc coord_;
  uint64_t store_writes_ = 0;
  uint64_t session_counter_ = 0;
  std::vector<AgentProc> agents_;

  // Trainers.
  int step_index_ = -1;  // the step being saved: steps are (index + 1) * 10
  std::vector<TrainerState> trainers_;
  std::map<uint64_t, TrainerCall> calls_;
  uint64_t next_ticket_ = 1;
  bool training_done_ = false;

  // Fault intensities.
  double p_drop_ = 0, p_dup_ = 0, p_slow_ = 0, p_break_ = 0, p_store_ = 0, p_disk_ = 0;
  double p_crash_ = 0, p_crash_after_persist_ = 0, p_kill_ = 0, p_freeze_ = 0, p_cut_ = 0;
  double p_pause_ = 0, p_refuse_ = 0, p_withdraw_ = 0;
  // I8: when a registration was last refused (InfinitePast: none pending), and the step whose
  // trainers were busy then or started after.
  absl::Time refused_at_ = absl::InfinitePast();
  absl::Time step_started_at_ = absl::InfinitePast();

  // Invariant state.
  bool checking_ = false;  // inside the checks: no disk faults
  uint64_t at_this_instant_ = 0;  // events run since simulated time last moved
  uint64_t checked_store_writes_ = ~0ull;
  uint64_t checked_disk_ops_ = ~0ull;
  std::set<std::string> acknowledged_;  // sessions an agent or trainer was told COMMITTED
  std::set<std::string> verified_;      // committed sessions whose checkpoint verified
  std::set<std::string> withdrawn_;     // sessions a trainer withdrew its snapshot from (I9)
  int64_t max_latest_ = -1;
  std::map<std::string, uint32_t> writers_;  // data file path -> the rank that wrote it

  // Scenarios.
  bool scenario_fired_ = false;
  // kRetentionWhileNextSaveWrites: the coordinator's retention, held until a later save
  // creates its temp directory (or training ends), by the step it followed.
  std::vector<std::pair<int64_t, std::function<void()>>> late_cleanups_;
  absl::Time fsync_fails_until_ = absl::InfinitePast();
  bool clock_back_at_restart_ = false;
};

absl::Status SimPeers::Exchange(const std::string& session_id, absl::Span<const SliceSend>,
                                absl::Span<const SliceRecv> recvs, absl::Time) {
  for (const SliceRecv& recv : recvs) {
    if (absl::Status pulled = world_->Pull(recv.from_rank, session_id, recv); !pulled.ok()) {
      return pulled;
    }
  }
  (void)rank_;
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Setup and the event loop

World::World(const SimConfig& config) : config_(config), rng_(config.seed) {
  start_ = clock_.Now();
  window_end_ = start_ + config_.fault_window;
  const uint32_t worlds[] = {1, 2, 4};
  const uint32_t world = config_.world != 0 ? config_.world : worlds[rng_() % 3];
  // Both save paths, by seed, without a draw (each seed's other choices stay as they were):
  // ranks that write once staged need a job whose ranks exchange no slices.
  options_.write_when_staged = (config_.seed >> 3) % 2 == 1;
  job_ = MakeSimJob(world, /*dp_sliced_state=*/!options_.write_when_staged);
  coordinator_commits_ =
      config_.coordinator_commits >= 0 ? config_.coordinator_commits == 1 : (rng_() % 2 == 0);
  options_.storage_root = kRoot;
  options_.coordinator_commits = coordinator_commits_;
  options_.planning_timeout = absl::Seconds(30);
  options_.pinning_timeout = absl::Seconds(30);
  options_.copying_timeout = absl::Seconds(60);
  options_.persisting_timeout = absl::Seconds(60);
  options_.committing_timeout = absl::Seconds(20);
  options_.commit_retry_initial = absl::Milliseconds(500);
  options_.commit_retry_max = absl::Seconds(5);
  options_.keep_last = static_cast<int>(rng_() % 3);  // 0 keeps all
  if (Is(Scenario::kRetentionWhileNextSaveWrites)) options_.keep_last = 1;
  const double f = config_.faults;
  p_drop_ = 0.02 * f;
  p_dup_ = 0.02 * f;
  p_slow_ = 0.02 * f;
  p_break_ = 0.005 * f;
  p_store_ = 0.02 * f;
  p_disk_ = 0.01 * f;
  p_crash_ = 0.001 * f;
  p_crash_after_persist_ = 0.02 * f;
  p_kill_ = 0.0005 * f;
  p_freeze_ = 0.0005 * f;
  p_cut_ = 0.001 * f;
  p_pause_ = 0.0003 * f;
  p_refuse_ = 0.0003 * f;
  p_withdraw_ = 0.01 * f;

  store_.set_fault_hook([this](const StoreBatch& batch) {
    ++store_writes_;
    if (ScenarioStoreFailsAfter(batch)) return SimStateStore::Fault::kAfter;
    if (!InWindow() || !Chance(p_store_)) return SimStateStore::Fault::kNone;
    Trace("fault: the store refuses a write");
    return Chance(0.5) ? SimStateStore::Fault::kBefore : SimStateStore::Fault::kAfter;
  });
  disk_.set_fault_hook([this](StorageOp op, const std::string& path) {
    if (config_.scenario != Scenario::kRandom && !checking_) return ScenarioDiskFault(op, path);
    if (checking_ || !InWindow() || !Chance(p_disk_)) return StorageFault{};
    const bool after = (op == StorageOp::kRename || op == StorageOp::kSyncDir ||
                        op == StorageOp::kRemoveTree || op == StorageOp::kWrite) &&
                       Chance(0.5);
    const int err = Chance(0.7) ? EIO : ENOSPC;
    Trace(absl::StrCat("fault: disk ", static_cast<int>(op), " ", path, " errno ", err,
                       after ? " after it took effect" : ""));
    return StorageFault{err, after};
  });

  agents_.resize(job_.world);
  trainers_.resize(job_.world);
  for (uint32_t r = 0; r < job_.world; ++r) agents_[r].rank = r;
}

void World::At(absl::Duration delay, std::string what, std::function<void()> fn) {
  if (config_.trace) {
    fn = [this, what = std::move(what), fn = std::move(fn)] {
      Trace(what);
      fn();
    };
  }
  events_.push(Event{now() + std::max(delay, absl::ZeroDuration()), next_seq_++, std::move(fn)});
}

void World::Trace(const std::string& line) {
  if (!config_.trace) return;
  result_.trace.push_back(
      absl::StrCat(absl::FormatDuration(now() - start_), " ", line));
}

absl::Duration World::Jitter(absl::Duration lo, absl::Duration hi) {
  return lo + (hi - lo) * Uniform();
}

void World::Fail(std::string why) {
  if (failed_) return;
  failed_ = true;
  result_.ok = false;
  result_.failure = absl::StrCat("seed ", config_.seed, " at ",
                                 absl::FormatDuration(now() - start_), ": ", why);
  Trace(absl::StrCat("INVARIANT VIOLATED: ", why));
}

SimResult World::Run() {
  // Deadlock detection graphs every lock ever taken: a large share of a schedule's time, and
  // the simulation is single-threaded.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  StartCoordinator();
  for (uint32_t r = 0; r < job_.world; ++r) StartAgent(r);
  At(absl::Seconds(1), "training starts", [this] { StartStep(0); });
  At(kCoordinatorTick, "coordinator tick", [this] { CoordinatorTick(); });
  const absl::Time give_up = window_end_ + config_.quiet_bound;
  while (RunNext(give_up)) {
    if (training_done_ && Quiet()) break;  // every save ended
  }
  if (!failed_) {
    // I6: with faults over, everything ends within the bound.
    if (!training_done_) {
      Fail(absl::StrCat("hang: faults stopped at ", absl::FormatDuration(config_.fault_window),
                        " but the saves of step index ", step_index_, " did not end within ",
                        absl::FormatDuration(config_.quiet_bound)));
    } else if (!Quiet()) {
      Fail("hang: the trainers finished but a session is still in flight");
    }
  }
  if (!failed_) {
    // I7: once it settles without faults, the job's directory holds the checkpoints the store
    // lists, and besides them only steps pending removal (JobRecord.retention_pending):
    // retention leaked nothing untracked and removed nothing listed.
    window_end_ = std::min(window_end_, now());
    const absl::Time settled = now() + kSettle;
    while (RunNext(settled)) {
    }
    if (!failed_) CheckSettled();
  }
  result_.simulated = now() - start_;
  result_.job_dir = disk_.Children(JobDirPath(kRoot, kJob));
  return result_;
}

bool World::RunNext(absl::Time until) {
  if (events_.empty() || failed_ || events_.top().at > until) return false;
  Event e = events_.top();
  events_.pop();
  if (e.at > now()) {
    clock_.Set(e.at);
    at_this_instant_ = 0;
  } else if (++at_this_instant_ > kLivelockEvents) {
    Fail(absl::StrCat("livelock: ", kLivelockEvents, " events without time passing"));
    return false;
  }
  ++result_.events;
  e.fn();
  if (failed_) return false;
  CheckInvariants();
  if (InWindow()) MaybeFault();
  return true;
}

void World::CheckSettled() {
  absl::StatusOr<std::vector<v1::CheckpointInfo>> listed = ReadCheckpoints(store_, kJob);
  if (!listed.ok()) {
    Fail(absl::StrCat("I7: cannot read the checkpoint records: ", listed.status().ToString()));
    return;
  }
  absl::StatusOr<std::optional<v1::JobRecord>> job = ReadJob(store_, kJob);
  if (!job.ok()) {
    Fail(absl::StrCat("I7: cannot read the job record: ", job.status().ToString()));
    return;
  }
  std::set<int64_t> in_store, pending, on_disk;
  for (const v1::CheckpointInfo& c : *listed) in_store.insert(c.step());
  if (job->has_value()) {
    pending.insert((*job)->retention_pending().begin(), (*job)->retention_pending().end());
  }
  for (const std::string& name : disk_.Children(JobDirPath(kRoot, kJob))) {
    if (std::optional<int64_t> step = ParseStepDirName(name)) on_disk.insert(*step);
  }
  std::set<int64_t> untracked, missing;
  for (int64_t s : on_disk) {
    if (!in_store.count(s) && !pending.count(s)) untracked.insert(s);
  }
  for (int64_t s : in_store) {
    if (!on_disk.count(s)) missing.insert(s);
  }
  if (!untracked.empty() || !missing.empty()) {
    Fail(absl::StrCat("I7: settled, the store lists steps {", absl::StrJoin(in_store, ","),
                      "} and pending removal {", absl::StrJoin(pending, ","),
                      "} but the job directory holds {", absl::StrJoin(on_disk, ","), "}"));
  }
}

bool World::Quiet() const {
  return coord_.up && coord_.job != nullptr && !coord_.job->in_flight();
}

// ---------------------------------------------------------------------------------------------
// Network

absl::Duration World::NetDelay() {
  absl::Duration d = Jitter(absl::Microseconds(100), absl::Milliseconds(3));
  if (InWindow() && Chance(p_slow_)) d += Jitter(absl::Milliseconds(50), absl::Seconds(3));
  return d;
}

bool World::LinkDown(uint32_t rank) const { return agents_[rank].link_down_until > now(); }

void World::ToCoordinator(uint32_t rank, std::string what, std::function<void()> handle) {
  if (LinkDown(rank) || !coord_.up) return;
  if (InWindow() && Chance(p_drop_)) {
    Trace(absl::StrCat("net: dropped ", what));
    return;
  }
  const int copies = InWindow() && Chance(p_dup_) ? 2 : 1;
  const uint64_t life = coord_.life;
  auto shared = std::make_shared<std::function<void()>>(std::move(handle));
  for (int i = 0; i < copies; ++i) {
    At(NetDelay(), absl::StrCat("to coordinator: ", what), [this, rank, life, shared, what] {
      if (!coord_.up || coord_.life != life || LinkDown(rank)) return;
      // Arrived: a paused coordinator reads it from its socket once it resumes.
      AtCoordinator(absl::ZeroDuration(), what, [this, life, shared] {
        if (coord_.up && coord_.life == life) (*shared)();
      });
    });
  }
}

void World::AtCoordinator(absl::Duration delay, std::string what, std::function<void()> fn) {
  At(delay, what, [this, what, fn = std::move(fn)] {
    if (now() < coord_.paused_until) {
      At(coord_.paused_until - now(), absl::StrCat("(resumed) ", what), fn);
      return;
    }
    fn();
  });
}

void World::PauseCoordinator(absl::Duration d, const std::string& why) {
  if (!coord_.up || now() < coord_.paused_until) return;
  Trace(absl::StrCat("fault: coordinator paused for ", absl::FormatDuration(d), " (", why, ")"));
  coord_.paused_until = now() + d;
}

void World::ToAgent(uint32_t rank, std::string what, std::function<void()> handle) {
  if (LinkDown(rank)) return;
  if (InWindow() && Chance(p_drop_)) {
    Trace(absl::StrCat("net: dropped ", what));
    return;
  }
  const uint64_t life = agents_[rank].life;
  At(NetDelay(), absl::StrCat("to agent ", rank, ": ", what),
     [this, rank, life, handle = std::move(handle), what] {
       if (LinkDown(rank)) return;
       ForAgent(rank, life, what, handle);
     });
}

void World::OnStream(uint32_t rank, std::string what, std::function<void()> handle) {
  AgentProc& a = agents_[rank];
  auto it = coord_.streams.find(rank);
  if (it == coord_.streams.end() || LinkDown(rank)) return;
  if (InWindow() && Chance(p_break_)) {
    BreakStream(rank, "the stream broke");
    return;
  }
  const uint64_t epoch = it->second;
  const uint64_t life = a.life;
  // FIFO: a stream never reorders.
  const absl::Time at = std::max(now() + NetDelay(), a.stream_free_at);
  a.stream_free_at = at;
  At(at - now(), absl::StrCat("stream to ", rank, ": ", what),
     [this, rank, epoch, life, what, handle = std::move(handle)] {
       if (agents_[rank].stream_epoch != epoch || LinkDown(rank)) return;
       ForAgent(rank, life, what, handle);
     });
}

void World::BreakStream(uint32_t rank, const std::string& why) {
  AgentProc& a = agents_[rank];
  coord_.streams.erase(rank);
  ++a.stream_epoch;
  if (!a.stream_up && !a.stream_opening) return;
  a.stream_up = false;
  a.stream_opening = false;
  Trace(absl::StrCat("stream of rank ", rank, " broke: ", why));
  const uint64_t life = a.life;
  // The agent notices and reconnects (re-registering first if it must).
  At(Jitter(absl::Milliseconds(10), absl::Milliseconds(300)), "agent reconnects",
     [this, rank, life] {
       ForAgent(rank, life, "reconnect", [this, rank] {
         if (agents_[rank].registered) OpenStream(rank);
       });
     });
}

// ---------------------------------------------------------------------------------------------
// The coordinator

class World::CoordPort : public EffectsPort {
 public:
  explicit CoordPort(World* w) : w_(w), life_(w->coord_.life) {}

  absl::Status Persist(const StoreBatch& batch) override { return w_->store_.Commit(batch); }
  void Persisted(v1::SessionState state) override {
    w_->ScenarioPersisted(state);
    if (!alive()) return;
    // A crash right after a transition is durable, before any of its commands goes out.
    if (w_->InWindow() && w_->Chance(w_->p_crash_after_persist_)) {
      w_->CrashCoordinator(absl::StrCat("crash after persisting ", v1::SessionState_Name(state)));
    }
  }
  void Recover() override {
    if (alive()) w_->ReloadJob();
  }
  void Deliver(std::vector<Outgoing> commands) override {
    if (!alive() || w_->coord_.job == nullptr) return;
    w_->coord_.job->Delivered(commands);
    for (Outgoing& o : commands) {
      if (o.command.has_committed()) w_->acknowledged_.insert(o.command.session_id());
      if (o.command.has_pin() && o.command.pin().assignment_omitted()) {
        ++w_->result_.pins_without_assignment;
      }
      if (o.command.has_pin() && o.command.pin().write_when_staged()) {
        ++w_->result_.pins_writing_when_staged;
      }
      if (o.pin_plan != nullptr) {
        o.command.mutable_pin()->mutable_assignment()->ParseFromString(
            o.pin_plan->assignments[o.rank]);
      }
      const uint32_t rank = o.rank;
      auto command = std::make_shared<v1::Command>(std::move(o.command));
      w_->OnStream(rank, CommandName(*command), [w = w_, rank, command] {
        AgentProc& a = w->agents_[rank];
        if (a.stream_up) w->CarryAgent(rank, a.core->OnCommand(w->now(), *command));
      });
    }
  }
  void StartPlan(PlanWork work) override {
    if (!alive()) return;
    auto shared = std::make_shared<PlanWork>(std::move(work));
    World* w = w_;
    const uint64_t life = life_;
    w->AtCoordinator(w->Jitter(absl::Microseconds(100), absl::Milliseconds(50)), "planning done",
          [w, life, shared] {
            if (!w->coord_.up || w->coord_.life != life || w->coord_.job == nullptr) return;
            PlanVerdict verdict =
                DecidePlan(*shared, *w->coord_.cache, *w->coord_.registry, w->options_.planner);
            w->Carry(w->coord_.job->PlanDecided(shared->session_id, shared->attempt,
                                                std::move(verdict), w->CoordNow()));
          });
  }
  void StartCommit(CommitAttempt work) override {
    if (!alive()) return;
    World* w = w_;
    const uint64_t life = life_;
    w->AtCoordinator(w->Jitter(absl::Microseconds(100), absl::Milliseconds(30)),
                     "coordinator commits",
          [w, life, work = std::move(work)] {
            if (!w->coord_.up || w->coord_.life != life || w->coord_.job == nullptr) return;
            const CommitResolution resolution = w->edge_.Commit(work);
            w->Trace(absl::StrCat("commit of ", work.session_id, ": ",
                                  static_cast<int>(resolution.outcome), " ",
                                  resolution.status.ToString()));
            w->Carry(w->coord_.job->CommitResolved(work.session_id, resolution, w->CoordNow()));
          });
  }
  void StartCleanup(std::optional<RetentionWork> retention,
                    std::vector<std::string> dirs) override {
    if (!alive()) return;
    World* w = w_;
    const uint64_t life = life_;
    const bool held = retention.has_value() && w->Is(Scenario::kRetentionWhileNextSaveWrites);
    const int64_t step = retention.has_value() ? retention->committed_step : 0;
    std::function<void()> cleanup = [w, life, retention = std::move(retention),
                                     dirs = std::move(dirs)] {
      for (const std::string& dir : dirs) w->edge_.Remove(dir).IgnoreError();
      if (retention.has_value() && w->edge_.Retain(*retention).ok() && w->coord_.up &&
          w->coord_.life == life && w->coord_.job != nullptr) {
        w->Carry(w->coord_.job->RetentionDone(retention->retire_steps));
      }
    };
    if (held) {
      w->late_cleanups_.push_back({step, std::move(cleanup)});
      return;
    }
    w->AtCoordinator(w->Jitter(absl::Microseconds(100), absl::Milliseconds(30)),
                     "coordinator cleans up", std::move(cleanup));
  }

 private:
  bool alive() const { return w_->coord_.up && w_->coord_.life == life_; }
  World* const w_;
  const uint64_t life_;
};

bool World::Carry(Effects effects) {
  CoordPort port(this);
  return CarryEffects(std::move(effects), port);
}

void World::StartCoordinator() {
  CoordProc& c = coord_;
  ++c.life;
  absl::StatusOr<uint64_t> epoch = NextEpoch(store_);
  if (!epoch.ok()) {  // the store refused: try again shortly
    At(absl::Milliseconds(200), "coordinator start retried", [this] { StartCoordinator(); });
    return;
  }
  c.up = true;
  c.epoch = *epoch;
  c.incarnation = rng_() | 1;
  AgentRegistryOptions registry_options;
  registry_options.lease = kLease;
  registry_options.heartbeat_interval = kHeartbeat;
  if (clock_back_at_restart_) {
    coord_clock_.set_offset(-absl::Hours(1));
    Mark("the coordinator restarted with its clock an hour behind");
  }
  c.registry = std::make_unique<AgentRegistry>(&coord_clock_, registry_options);
  c.cache = std::make_unique<PlanCache>();
  c.streams.clear();
  c.commands_emitted = 0;
  c.job.reset();
  Trace(absl::StrCat("coordinator starts, epoch ", c.epoch));
  ReloadJob();
}

void World::ReloadJob() {
  CoordProc& c = coord_;
  c.job.reset();
  JobContext context{&options_, c.epoch, &c.commands_emitted,
                     [this](int64_t step) { return absl::StrCat("s", step, "-", ++session_counter_); }};
  absl::StatusOr<std::optional<v1::JobRecord>> record = ReadJob(store_, kJob);
  if (!record.ok()) return;  // the next tick retries
  c.liveness.Reset();
  if (!record->has_value()) {
    c.job = std::make_unique<JobCore>(context, kJob);
    TellLiveness(/*tick=*/false);
    return;
  }
  Effects out;
  absl::StatusOr<std::unique_ptr<JobCore>> job =
      JobCore::Recover(context, store_, kJob, CoordNow(), out);
  if (!job.ok()) {
    Fail(absl::StrCat("the coordinator cannot recover the job: ", job.status().ToString()));
    return;
  }
  c.job = *std::move(job);
  Trace("coordinator recovered the job from its store");
  if (Carry(std::move(out))) TellLiveness(/*tick=*/false);
}

void World::TellLiveness(bool tick) {
  if (!coord_.up || coord_.job == nullptr) return;
  std::optional<Effects> told =
      coord_.liveness.Feed(*coord_.registry, *coord_.job, /*judge_leases=*/tick, CoordNow());
  if (told.has_value()) {
    Carry(*std::move(told));
  } else if (tick) {
    Effects effects = coord_.job->Tick(CoordNow());
    if (config_.trace && !effects.commands.empty()) {
      Trace(absl::StrCat("coordinator tick: ", effects.commands.size(), " command(s), state ",
                         v1::SessionState_Name(coord_.job->Info().current_state())));
    }
    Carry(std::move(effects));
  }
}

void World::CrashCoordinator(const std::string& why) {
  if (!coord_.up) return;
  Trace(absl::StrCat("fault: coordinator crash (", why, ")"));
  coord_.up = false;
  ++coord_.life;
  coord_.job.reset();
  coord_.registry.reset();
  std::vector<uint32_t> ranks;
  for (const auto& [rank, epoch] : coord_.streams) ranks.push_back(rank);
  coord_.streams.clear();
  for (uint32_t r : ranks) {
    ++agents_[r].stream_epoch;
    const uint64_t life = agents_[r].life;
    At(Jitter(absl::Milliseconds(1), absl::Milliseconds(50)), "agent sees its stream end",
       [this, r, life] {
         ForAgent(r, life, "stream ended", [this, r] {
           AgentProc& a = agents_[r];
           a.stream_up = false;
           a.stream_opening = false;
         });
       });
  }
  At(Jitter(absl::Milliseconds(200), absl::Seconds(3)), "coordinator restarts",
     [this] { StartCoordinator(); });
}

void World::CoordinatorTick() {
  At(kCoordinatorTick, "coordinator tick", [this] { CoordinatorTick(); });
  if (!coord_.up || now() < coord_.paused_until) return;
  if (coord_.job == nullptr) {
    ReloadJob();
    return;
  }
  TellLiveness(/*tick=*/true);
}

absl::Status World::HandleSubmit(std::shared_ptr<const v1::SubmitLocalPlanRequest> request,
                                 v1::SubmitLocalPlanResponse* response) {
  RETURN_IF_ERROR(coord_.registry->CheckIncarnation(request->job_id(), request->rank(),
                                                    request->incarnation()));
  std::optional<MeshLayout> layout = coord_.registry->JobLayout(kJob);
  if (!layout.has_value()) return absl::NotFoundError("unknown job");
  if (coord_.job == nullptr) return absl::UnavailableError("recovering");
  Outcome<v1::SubmitLocalPlanResponse> outcome =
      coord_.job->SubmitPlan(v1::SubmitLocalPlanRequest(*request), *layout, CoordNow());
  if (!Carry(std::move(outcome.effects))) return absl::UnavailableError("store refused");
  if (outcome.reply.ok()) *response = *outcome.reply;
  if (outcome.reply.ok() && outcome.reply->send_full_plan()) ++result_.full_plans_asked;
  return outcome.reply.status();
}

absl::Status World::HandleReportPhase(const v1::ReportPhaseRequest& request) {
  RETURN_IF_ERROR(
      coord_.registry->CheckIncarnation(request.job_id(), request.rank(), request.incarnation()));
  if (coord_.job == nullptr) return absl::UnavailableError("recovering");
  Outcome<v1::SessionState> outcome = coord_.job->ReportPhase(request, CoordNow());
  if (!Carry(std::move(outcome.effects))) return absl::UnavailableError("store refused");
  return outcome.reply.status();
}

absl::Status World::HandleReportChunks(const v1::ReportChunksRequest& request) {
  RETURN_IF_ERROR(
      coord_.registry->CheckIncarnation(request.job_id(), request.rank(), request.incarnation()));
  if (coord_.job == nullptr) return absl::UnavailableError("recovering");
  Outcome<v1::SessionState> outcome = coord_.job->ReportChunks(request, CoordNow());
  if (!Carry(std::move(outcome.effects))) return absl::UnavailableError("store refused");
  return outcome.reply.status();
}

// ---------------------------------------------------------------------------------------------
// Agents

void World::ForAgent(uint32_t rank, uint64_t life, std::string what, std::function<void()> fn) {
  AgentProc& a = agents_[rank];
  if (!a.alive || a.life != life) return;
  if (a.frozen_until > now()) {
    // A frozen process handles nothing; what arrived waits for it to thaw.
    At(a.frozen_until - now(), absl::StrCat("(thawed) ", what),
       [this, rank, life, what, fn = std::move(fn)] { ForAgent(rank, life, what, fn); });
    return;
  }
  fn();
}

void World::StartAgent(uint32_t rank) {
  AgentProc& a = agents_[rank];
  ++a.life;
  a.alive = true;
  a.frozen_until = absl::InfinitePast();
  a.incarnation = rng_() | 1;
  SaveCoreOptions options;
  options.job_id = kJob;
  options.rank = rank;
  options.incarnation = a.incarnation;
  options.seed = rng_();
  options.gather_timeout = absl::Seconds(30);
  a.core = std::make_unique<SaveCore>(options);
  a.peers = std::make_unique<SimPeers>(this, rank);
  a.registered = false;
  a.registering = false;
  a.refusal = absl::OkStatus();  // a new process
  a.stream_up = false;
  a.stream_opening = false;
  ++a.stream_epoch;
  a.staging.clear();
  a.open_rpcs.clear();
  a.tick_at = absl::InfiniteFuture();
  Trace(absl::StrCat("agent ", rank, " starts, incarnation ", a.incarnation));
  Register(rank);
  const uint64_t life = a.life;
  At(kHeartbeat, "heartbeat", [this, rank, life] { AgentHeartbeat(rank, life); });
}

void World::KillAgent(uint32_t rank, const std::string& why) {
  AgentProc& a = agents_[rank];
  if (!a.alive) return;
  Trace(absl::StrCat("fault: agent ", rank, " dies (", why, ")"));
  a.alive = false;
  ++a.life;
  a.core.reset();
  a.staging.clear();
  coord_.streams.erase(rank);
  ++a.stream_epoch;
  // Its trainer's save fails with the connection, whatever step of it the trainer was at.
  std::vector<uint64_t> tickets;
  for (const auto& [ticket, call] : calls_) {
    if (call.rank == rank) tickets.push_back(ticket);
  }
  for (uint64_t t : tickets) calls_.erase(t);
  TrainerDone(rank, absl::UnavailableError("the agent died"));
  At(Jitter(absl::Milliseconds(300), absl::Seconds(3)), "agent restarts",
     [this, rank] { StartAgent(rank); });
}

void World::RestartAgentRefused(uint32_t rank, absl::Duration d) {
  AgentProc& a = agents_[rank];
  if (!a.alive || a.wrong_layout) return;
  a.wrong_layout = true;
  KillAgent(rank, "restarted with another layout");
  At(d, "agent restarts with the job's layout", [this, rank] {
    AgentProc& a = agents_[rank];
    if (!a.wrong_layout) return;
    a.wrong_layout = false;
    KillAgent(rank, "restarted with the job's layout");
  });
}

void World::FreezeAgent(uint32_t rank, absl::Duration d) {
  AgentProc& a = agents_[rank];
  if (!a.alive || a.frozen_until > now()) return;
  Trace(absl::StrCat("fault: agent ", rank, " frozen for ", absl::FormatDuration(d)));
  a.frozen_until = now() + d;
}

void World::Register(uint32_t rank) {
  AgentProc& a = agents_[rank];
  if (a.registering) return;
  a.registering = true;
  const uint64_t life = a.life;
  v1::RegisterAgentRequest request;
  request.set_copies_when_pinned(true);  // as tessera-agent does
  request.set_writes_when_staged(true);
  request.set_job_id(kJob);
  request.mutable_coord()->set_rank(rank);
  *request.mutable_layout() = *ParseLayoutSpec(job_.layout_spec);
  if (a.wrong_layout) {  // another mesh than the job's: twice the ranks, a dim of its own
    v1::MeshDim* extra = request.mutable_layout()->add_dims();
    extra->set_name("cp");
    extra->set_degree(2);
  }
  request.set_incarnation(a.incarnation);
  request.set_node_id(absl::StrCat("node-", rank));
  request.set_peer_address(absl::StrCat("sim:", rank));
  request.set_storage_root_mounted(true);
  // Give up on this attempt after the RPC deadline and try again.
  auto answered = std::make_shared<bool>(false);
  At(kRpcDeadline, "register deadline", [this, rank, life, answered] {
    if (*answered) return;
    *answered = true;
    ForAgent(rank, life, "register again", [this, rank] {
      agents_[rank].registering = false;
      Register(rank);
    });
  });
  ToCoordinator(rank, "RegisterAgent", [this, rank, life, request, answered, sent = now()] {
    absl::StatusOr<AgentRegistry::Registered> registered = coord_.registry->Register(request);
    if (absl::IsInvalidArgument(registered.status()) && refused_at_ == absl::InfinitePast()) {
      refused_at_ = now();  // I8 counts from the first refusal
    }
    TellLiveness(/*tick=*/false);  // as CoordinatorService does, refused or not
    const uint64_t coordinator = coord_.incarnation;
    const bool kept = registered.ok() && registered->lease_kept;
    ToAgent(rank, "RegisterAgent reply",
            [this, rank, life, status = registered.status(), kept, sent, coordinator, answered] {
              const bool ok = status.ok();
              if (*answered) return;
              *answered = true;
              AgentProc& a = agents_[rank];
              a.registering = false;
              if (absl::IsInvalidArgument(status)) a.refusal = status;
              if (ok) a.refusal = absl::OkStatus();
              if (!ok) {
                At(absl::Milliseconds(500), "register again", [this, rank, life] {
                  ForAgent(rank, life, "register", [this, rank] { Register(rank); });
                });
                return;
              }
              a.registered = true;
              a.lease.Renewed(sent, kLease, kept, coordinator);
              CarryAgent(rank, a.core->OnLease(now(), a.lease.Generation(now())));
              if (!agents_[rank].alive) return;
              CarryAgent(rank, a.core->OnRegistered(now(), coordinator, kRoot));
              if (!agents_[rank].alive) return;
              if (!a.stream_up) OpenStream(rank);
            });
  });
}

void World::OpenStream(uint32_t rank) {
  AgentProc& a = agents_[rank];
  if (a.stream_opening || a.stream_up) return;
  a.stream_opening = true;
  const uint64_t life = a.life;
  const uint64_t epoch = ++a.stream_epoch;
  At(kRpcDeadline, "stream open deadline", [this, rank, life, epoch] {
    ForAgent(rank, life, "stream open timed out", [this, rank, epoch] {
      AgentProc& a = agents_[rank];
      if (a.stream_epoch == epoch && a.stream_opening) {
        a.stream_opening = false;
        if (a.registered) OpenStream(rank);
      }
    });
  });
  ToCoordinator(rank, "Commands (open)", [this, rank, life, epoch, incarnation = a.incarnation] {
    if (!coord_.registry->CheckIncarnation(kJob, rank, incarnation).ok()) return;
    // A newer stream replaces the one the coordinator had, which it finishes UNAVAILABLE
    // (CommandStreams): if that was the agent's live one, the agent reconnects.
    auto previous = coord_.streams.find(rank);
    if (previous != coord_.streams.end() && previous->second != epoch) {
      // The end of a stream reaches the agent (its connection ends), late but never lost.
      const uint64_t replaced = previous->second;
      const uint64_t life = agents_[rank].life;
      At(NetDelay(), "stream replaced", [this, rank, life, replaced] {
        ForAgent(rank, life, "stream replaced", [this, rank, replaced] {
          if (agents_[rank].stream_epoch == replaced) BreakStream(rank, "replaced by a newer one");
        });
      });
    }
    coord_.streams[rank] = epoch;
    std::optional<Outgoing> replay =
        coord_.job != nullptr ? coord_.job->CurrentCommand(rank) : std::nullopt;
    OnStream(rank, "stream opened", [this, rank, epoch] {
      AgentProc& a = agents_[rank];
      if (a.stream_epoch != epoch) return;
      a.stream_opening = false;
      a.stream_up = true;
      CarryAgent(rank, a.core->OnStreamConnected(now()));
    });
    if (replay.has_value()) {
      if (replay->pin_plan != nullptr) {
        replay->command.mutable_pin()->mutable_assignment()->ParseFromString(
            replay->pin_plan->assignments[rank]);
      }
      auto command = std::make_shared<v1::Command>(std::move(replay->command));
      OnStream(rank, absl::StrCat("replayed ", CommandName(*command)), [this, rank, command] {
        AgentProc& a = agents_[rank];
        if (a.stream_up) CarryAgent(rank, a.core->OnCommand(now(), *command));
      });
    }
    (void)life;
  });
}

void World::AgentHeartbeat(uint32_t rank, uint64_t life) {
  AgentProc& a = agents_[rank];
  if (!a.alive || a.life != life) return;
  At(kHeartbeat, "heartbeat", [this, rank, life] { AgentHeartbeat(rank, life); });
  ForAgent(rank, life, "heartbeat", [this, rank, life] {
    AgentProc& a = agents_[rank];
    // The agent's own clock says its lease lapsed (frozen, cut off): it gives the lease up
    // and registers again under a new one (the coordinator has given up on it by now).
    if (a.registered && a.lease.Lapsed(now())) {
      Trace(absl::StrCat("agent ", rank, " sees its lease lapsed"));
      a.registered = false;
      a.lease.Unregistered(now());
      CarryAgent(rank, a.core->OnLease(now(), std::nullopt));
      if (!agents_[rank].alive) return;
      Register(rank);
      return;
    }
    if (!a.registered) {
      Register(rank);
      return;
    }
    ToCoordinator(rank, "Heartbeat", [this, rank, life, incarnation = a.incarnation,
                                      sent = now()] {
      absl::StatusOr<AgentRegistry::Renewal> renewal =
          coord_.registry->Heartbeat(kJob, rank, incarnation, 0);
      const absl::Status s = renewal.status();
      const bool kept = renewal.ok() && renewal->lease_kept;
      const uint64_t coordinator = coord_.incarnation;
      ToAgent(rank, "Heartbeat reply", [this, rank, s, kept, sent, coordinator] {
        AgentProc& a = agents_[rank];
        if (s.ok()) {
          if (!a.registered) return;  // it gave the lease up meanwhile and registers again
          const std::optional<uint64_t> before = a.lease.Generation(now());
          a.lease.Renewed(sent, kLease, kept, coordinator);
          if (a.lease.Generation(now()) != before) {
            CarryAgent(rank, a.core->OnLease(now(), a.lease.Generation(now())));
          }
        } else if (absl::IsNotFound(s) || absl::IsFailedPrecondition(s)) {
          a.registered = false;  // a restarted coordinator does not know it: register again
          a.lease.Unregistered(now());
          CarryAgent(rank, a.core->OnLease(now(), std::nullopt));
          if (!agents_[rank].alive) return;
          BreakStream(rank, "the coordinator does not know this agent");
          Register(rank);
        }
      });
      (void)life;
    });
  });
}

void World::CarryAgent(uint32_t rank, SaveEffects fx) {
  AgentProc& a = agents_[rank];
  if (!a.alive) return;
  for (const CoordinatorRpc& rpc : fx.rpcs) SendRpc(rank, rpc);
  for (SaveWork& work : fx.work) RunWork(rank, std::move(work));
  for (const tessera::TrainerReply& reply : fx.replies) TrainerReply(rank, reply);
  if (config_.trace) {
    for (const LogLine& line : fx.logs) Trace(absl::StrCat("agent ", rank, ": ", line.text));
  }
  if (!agents_[rank].alive) return;
  if (fx.next_tick < a.tick_at) {
    a.tick_at = fx.next_tick;
    const uint64_t life = a.life;
    At(fx.next_tick - now(), "agent tick", [this, rank, life, at = fx.next_tick] {
      ForAgent(rank, life, "agent tick", [this, rank, at] {
        AgentProc& a = agents_[rank];
        if (a.tick_at != at) return;
        a.tick_at = absl::InfiniteFuture();
        CarryAgent(rank, a.core->Tick(now()));
      });
    });
  }
}

void World::SendRpc(uint32_t rank, const CoordinatorRpc& rpc) {
  AgentProc& a = agents_[rank];
  const uint64_t life = a.life;
  const uint64_t id = rpc.id;
  a.open_rpcs.insert(id);
  auto kind = std::make_shared<int>(static_cast<int>(rpc.request.index()));
  // Exactly one result per RPC: the reply, or DeadlineExceeded at the deadline.
  auto deliver = [this, rank, life, id, kind](absl::Status status,
                                               v1::SubmitLocalPlanResponse response) {
    ForAgent(rank, life, "rpc result", [this, rank, id, kind, status, response] {
      AgentProc& a = agents_[rank];
      if (a.open_rpcs.erase(id) == 0) return;
      if (*kind == 0) {
        absl::StatusOr<v1::SubmitLocalPlanResponse> result = response;
        if (!status.ok()) result = status;
        CarryAgent(rank, a.core->OnPlanSubmitted(now(), id, result));
      } else {
        CarryAgent(rank, a.core->OnReportDone(now(), id, status));
      }
    });
  };
  At(kRpcDeadline, "rpc deadline", [deliver] {
    deliver(absl::DeadlineExceededError("simulated RPC deadline"), {});
  });
  std::function<void()> handle;
  std::string what;
  if (auto* submit = std::get_if<std::shared_ptr<const v1::SubmitLocalPlanRequest>>(&rpc.request)) {
    what = "SubmitLocalPlan";
    handle = [this, rank, request = *submit, deliver] {
      v1::SubmitLocalPlanResponse response;
      absl::Status s = HandleSubmit(request, &response);
      ToAgent(rank, "SubmitLocalPlan reply", [deliver, s, response] { deliver(s, response); });
    };
  } else if (auto* phase = std::get_if<std::shared_ptr<const v1::ReportPhaseRequest>>(&rpc.request)) {
    what = absl::StrCat("ReportPhase ", v1::AgentPhase_Name((*phase)->phase()));
    handle = [this, rank, request = *phase, deliver] {
      absl::Status s = HandleReportPhase(*request);
      ToAgent(rank, "ReportPhase reply", [deliver, s] { deliver(s, {}); });
    };
  } else {
    auto chunks = std::get<std::shared_ptr<const v1::ReportChunksRequest>>(rpc.request);
    what = "ReportChunks";
    handle = [this, rank, request = chunks, deliver] {
      absl::Status s = HandleReportChunks(*request);
      ToAgent(rank, "ReportChunks reply", [deliver, s] { deliver(s, {}); });
    };
  }
  ToCoordinator(rank, what, std::move(handle));
}

void World::RunWork(uint32_t rank, SaveWork work) {
  const uint64_t life = agents_[rank].life;
  auto shared = std::make_shared<SaveWork>(std::move(work));
  At(Jitter(absl::Microseconds(50), absl::Milliseconds(20)), "agent work",
     [this, rank, life, shared] {
       ForAgent(rank, life, "agent work", [this, rank, shared] {
         AgentProc& a = agents_[rank];
         const SaveWork& w = *shared;
         if (const auto* pin = std::get_if<PinWork>(&w.item)) {
           Staging& s = a.staging[w.session_id];
           s.name = absl::StrCat("sim-r", rank, "-", w.session_id);
           s.buffer = std::make_unique<AlignedBuffer>(pin->layout->total_bytes);
           s.layout = pin->layout;
           StagingMemory memory{s.name, s.buffer->data, s.buffer->size};
           absl::Status prepared = PrepareStaging(*pin->layout, memory);
           absl::StatusOr<StagingMemory> result = memory;
           if (!prepared.ok()) result = prepared;
           CarryAgent(rank, a.core->OnStagingReady(now(), w.id, result));
         } else if (const auto* gather = std::get_if<GatherWork>(&w.item)) {
           CarryAgent(rank, a.core->OnGathered(now(), w.id,
                                               GatherSlices(*a.peers, w.session_id, *gather)));
         } else if (const auto* persist = std::get_if<PersistWork>(&w.item)) {
           if (persist->layout->file.has_value()) {
             // I5: one writer per data file (and so per chunk) of a session.
             const std::string path = absl::StrCat(persist->dir, "/", persist->layout->file_name);
             auto [it, inserted] = writers_.try_emplace(path, rank);
             if (!inserted && it->second != rank) {
               Fail(absl::StrCat("I5: ", path, " is written by rank ", rank, " and rank ",
                                 it->second));
               return;
             }
           }
           ShardWriterOptions options;
           options.writer_rank = rank;
           options.overlap_checksums = false;  // no threads in a deterministic world
           CarryAgent(rank, a.core->OnPersisted(now(), w.id, WriteShards(disk_, *persist, options)));
         } else if (const auto* commit = std::get_if<CommitWork>(&w.item)) {
           const CommitWorkResult result = ResolveAndRetain(disk_, *commit);
           Trace(absl::StrCat("agent ", rank, " commit of ", w.session_id, ": ",
                              static_cast<int>(result.resolution.outcome), " ",
                              result.resolution.status.ToString()));
           CarryAgent(rank, a.core->OnCommitResolved(now(), w.id, result));
         } else if (const auto* remove = std::get_if<RemoveWork>(&w.item)) {
           CarryAgent(rank, a.core->OnRemoved(now(), w.id, RemoveSessionDir(disk_, *remove)));
         }
       });
     });
}

absl::Status World::Pull(uint32_t from_rank, const std::string& session_id,
                         const SliceRecv& recv) {
  if (from_rank >= agents_.size()) return absl::InvalidArgumentError("no such peer");
  AgentProc& peer = agents_[from_rank];
  if (!peer.alive || peer.frozen_until > now()) {
    return absl::UnavailableError(absl::StrCat("peer ", from_rank, " is unreachable"));
  }
  auto it = peer.staging.find(session_id);
  if (it == peer.staging.end()) {
    return absl::UnavailableError(absl::StrCat("peer ", from_rank, " has no staging for ",
                                               session_id));
  }
  for (const SliceTask& t : it->second.layout->sends) {
    if (t.key == recv.key && BoxFromProto(t.box) == recv.box && t.begin == recv.begin &&
        t.end == recv.end) {
      if (t.range.nbytes != recv.nbytes) {
        return absl::InvalidArgumentError("slice size differs between sender and leader");
      }
      std::memcpy(recv.dest, it->second.buffer->data + t.range.offset, recv.nbytes);
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("peer ", from_rank, " sends no such slice"));
}

// ---------------------------------------------------------------------------------------------
// Trainers: every rank saves every step, in lockstep, as a training loop does.

void World::StartStep(int index) {
  step_index_ = index;
  step_started_at_ = now();
  Trace(absl::StrCat("training: save of step ", (index + 1) * 10));
  for (uint32_t r = 0; r < job_.world; ++r) {
    trainers_[r] = TrainerState{true, "", std::nullopt};
    At(Jitter(absl::Microseconds(10), absl::Milliseconds(20)), "trainer calls save",
       [this, r] { TrainerBegin(r); });
  }
}

void World::TrainerBegin(uint32_t rank) {
  AgentProc& a = agents_[rank];
  if (!a.alive) {
    TrainerDone(rank, absl::UnavailableError("no agent"));
    return;
  }
  if (!a.refusal.ok()) {  // the agent's admission: it answers its refusal, and serves nothing
    TrainerDone(rank, absl::UnavailableError(a.refusal.message()));
    return;
  }
  const uint64_t ticket = next_ticket_++;
  calls_[ticket] = {TrainerCall::kBegin, rank};
  v1::BeginSaveRequest request;
  request.set_step((step_index_ + 1) * 10);
  for (const v1::ShardDesc& s : job_.shards[rank]) *request.add_shards() = s;
  const uint64_t life = a.life;
  ForAgent(rank, life, "BeginSave", [this, rank, ticket, request] {
    CarryAgent(rank, agents_[rank].core->BeginSave(now(), ticket, request));
  });
}

void World::TrainerReply(uint32_t rank, const tessera::TrainerReply& reply) {
  auto it = calls_.find(reply.ticket);
  if (it == calls_.end()) return;
  const TrainerCall call = it->second;
  calls_.erase(it);
  const int64_t step = (step_index_ + 1) * 10;
  if (const auto* begin = std::get_if<BeginSaveReply>(&reply.reply)) {
    if (!begin->result.ok()) {
      TrainerDone(rank, begin->result.status());
      return;
    }
    const v1::BeginSaveResponse slots = *begin->result;
    trainers_[rank].session = slots.session_id();
    const uint64_t life = agents_[rank].life;
    // The trainer copies its snapshot, then says so.
    At(Jitter(absl::Microseconds(50), absl::Milliseconds(10)), "trainer copies",
       [this, rank, life, slots, step] {
         AgentProc& a = agents_[rank];
         if (!a.alive || a.life != life) return;  // the agent's death answered the trainer
         auto s = a.staging.find(slots.session_id());
         if (s == a.staging.end() || s->second.name != slots.shm_name()) {
           Fail(absl::StrCat("trainer ", rank, " got slots of ", slots.session_id(),
                             " whose staging the agent does not have"));
           return;
         }
         for (int i = 0; i < slots.slots_size(); ++i) {
           const v1::StagingSlot& slot = slots.slots(i);
           if (slot.nbytes() == 0) continue;
           FillShard(job_.shards[rank][i], rank, step, s->second.buffer->data + slot.offset());
         }
         const uint64_t ticket = next_ticket_++;
         calls_[ticket] = {TrainerCall::kStaged, rank};
         if (InWindow() && Chance(p_withdraw_)) {
           // An overlapped save whose fence found the state written during the copy: the
           // staging holds a torn snapshot, and the trainer withdraws it (I9).
           for (int i = 0; i < slots.slots_size(); ++i) {
             if (slots.slots(i).nbytes() == 0) continue;
             s->second.buffer->data[slots.slots(i).offset()] ^= 0x5a;
             break;
           }
           withdrawn_.insert(slots.session_id());
           v1::ErrorDetail withdrawn;
           withdrawn.set_code(v1::ERROR_CODE_STATE_CHANGED);
           withdrawn.set_message("the state was written before the fence");
           ForAgent(rank, life, "Staged (withdrawn)",
                    [this, rank, ticket, withdrawn, session = slots.session_id()] {
                      CarryAgent(rank, agents_[rank].core->Staged(now(), ticket, session, 1000,
                                                                  &withdrawn));
                    });
           return;
         }
         ForAgent(rank, life, "Staged", [this, rank, ticket, session = slots.session_id()] {
           CarryAgent(rank, agents_[rank].core->Staged(now(), ticket, session, 1000));
         });
       });
    return;
  }
  if (const auto* staged = std::get_if<StagedReply>(&reply.reply)) {
    if (!staged->result.ok()) {
      TrainerDone(rank, staged->result);
      return;
    }
    const uint64_t ticket = next_ticket_++;
    calls_[ticket] = {TrainerCall::kWait, rank};
    CarryAgent(rank, agents_[rank].core->WaitCommitted(now(), ticket, step,
                                                       now() + absl::Minutes(30)));
    return;
  }
  const auto& wait = std::get<WaitCommittedReply>(reply.reply);
  (void)call;
  TrainerDone(rank, wait.result);
}

void World::TrainerDone(uint32_t rank, absl::StatusOr<std::string> outcome) {
  TrainerState& t = trainers_[rank];
  if (!t.busy) return;
  t.busy = false;
  if (outcome.ok() && !t.session.empty()) acknowledged_.insert(t.session);
  t.outcome = std::move(outcome);
  for (const TrainerState& other : trainers_) {
    if (other.busy) return;
  }
  // Every rank of the step is answered. They agree: told COMMITTED, it is committed.
  const int64_t step = (step_index_ + 1) * 10;
  bool any_committed = false;
  for (uint32_t r = 0; r < trainers_.size(); ++r) {
    const auto& o = *trainers_[r].outcome;
    if (!o.ok()) continue;
    any_committed = true;
    if (*o != StepDirPath(kRoot, kJob, step)) {
      Fail(absl::StrCat("trainer ", r, " was told step ", step, " committed at ", *o));
    }
  }
  if (any_committed) {
    ++result_.committed;
  } else {
    ++result_.aborted;
  }
  Trace(absl::StrCat("training: step ", step, any_committed ? " committed" : " not saved"));
  absl::Duration pause_before_next = Jitter(absl::Milliseconds(10), absl::Milliseconds(500));
  if (refused_at_ != absl::InfinitePast()) {
    // I8: from the refusal (or this save's start, if later) to its last rank's answer. Checked
    // where nothing else can delay the answer: the scenario's schedule, without other faults.
    const absl::Duration answered = now() - std::max(refused_at_, step_started_at_);
    result_.longest_refusal_answer = std::max(result_.longest_refusal_answer, answered);
    if (Is(Scenario::kRegistrationRefused) && answered > kRefusalBound) {
      Fail(absl::StrCat("I8: a refused registration reached the last rank of step ", step,
                        " after ", absl::FormatDuration(answered), ", over ",
                        absl::FormatDuration(kRefusalBound)));
    }
    refused_at_ = absl::InfinitePast();
  }
  if (Is(Scenario::kRegistrationRefused) && !scenario_fired_ && step_index_ == 0) {
    // Before the second save: the last rank's agent comes back with another layout, refused.
    scenario_fired_ = true;
    Mark("the last rank's agent restarted with another layout and was refused");
    agents_[job_.world - 1].wrong_layout = true;
    KillAgent(job_.world - 1, "restarted with another layout");
    pause_before_next = absl::Seconds(4);  // it is up, and refused, before the save starts
  } else if (Is(Scenario::kRegistrationRefused) && agents_[job_.world - 1].wrong_layout) {
    for (uint32_t r = 0; r + 1 < job_.world; ++r) {
      const absl::Status told = trainers_[r].outcome->status();
      if (GetErrorCode(told) != v1::ERROR_CODE_LAYOUT_MISMATCH) {
        Fail(absl::StrCat("trainer ", r, " was told ", told.ToString(),
                          ", not the refusal of rank ", job_.world - 1, "'s registration"));
      }
    }
    Mark("every rank of the save was answered with the refusal's reason");
    agents_[job_.world - 1].wrong_layout = false;
    KillAgent(job_.world - 1, "restarted with the job's layout");
    pause_before_next = absl::Seconds(4);  // registered again before the next save
  }
  if (step_index_ + 1 < config_.steps) {
    const int next = step_index_ + 1;
    At(pause_before_next, "next step", [this, next] { StartStep(next); });
  } else {
    training_done_ = true;
    RunLateCleanups(true);
  }
}

// ---------------------------------------------------------------------------------------------
// Scenarios (sim_world.h): each fires once, at the event its bug needs.

StorageFault World::ScenarioDiskFault(StorageOp op, const std::string& path) {
  if (op == StorageOp::kCreateDirs && !late_cleanups_.empty()) {
    // Once the directory exists (the next event), a held retention whose later save has begun
    // writing runs.
    At(absl::ZeroDuration(), "held retention", [this] { RunLateCleanups(false); });
  }
  if (!Is(Scenario::kRenamedThenParentFsyncFails)) return StorageFault{};
  const std::string job_dir = JobDirPath(kRoot, kJob);
  const size_t slash = path.rfind('/');
  if (op == StorageOp::kRename && !scenario_fired_ && path.substr(0, slash) == job_dir &&
      ParseTmpDirName(path.substr(slash + 1)).has_value()) {
    scenario_fired_ = true;
    fsync_fails_until_ = now() + absl::Seconds(25);
    Mark("a commit renamed its temp directory");
  }
  if (op == StorageOp::kSyncDir && path == job_dir && now() < fsync_fails_until_) {
    Mark("then the job directory's fsync failed past the COMMITTING deadline");
    return StorageFault{EIO, false};
  }
  return StorageFault{};
}

bool World::ScenarioStoreFailsAfter(const StoreBatch& batch) {
  if (!Is(Scenario::kCommittedWriteFailsAfterApplying) || scenario_fired_) return false;
  for (const StoreBatch::Op& op : batch.ops()) {
    v1::SessionRecord session;
    if (op.kind == StoreBatch::OpKind::kPut && op.table == Table::kSessions &&
        session.ParseFromString(op.value) && session.state() == v1::SESSION_STATE_COMMITTED) {
      scenario_fired_ = true;
      Mark("the store applied the COMMITTED write and reported it failed");
      return true;
    }
  }
  return false;
}

void World::ScenarioPersisted(v1::SessionState state) {
  if (scenario_fired_) return;
  if (Is(Scenario::kLinkBlipInPersisting) && state == v1::SESSION_STATE_PERSISTING) {
    scenario_fired_ = true;
    Mark("every agent's link was cut for 3 s (the lease is 5 s) as the save entered PERSISTING");
    for (uint32_t r = 0; r < job_.world; ++r) {
      agents_[r].link_down_until = now() + absl::Seconds(3);
      BreakStream(r, "link cut");
    }
  } else if (Is(Scenario::kCoordinatorPausedPastTheLease) &&
             state == v1::SESSION_STATE_PERSISTING) {
    scenario_fired_ = true;
    Mark("the coordinator was paused for 2.5 leases as the save entered PERSISTING");
    PauseCoordinator(kLease * 5 / 2, "scenario");
  } else if (Is(Scenario::kClockBackAcrossRestart) && state == v1::SESSION_STATE_COMMITTED) {
    scenario_fired_ = true;
    clock_back_at_restart_ = true;
    Mark("the coordinator crashed right after COMMITTED was durable");
    CrashCoordinator("scenario");
  }
}

void World::RunLateCleanups(bool all) {
  std::vector<std::pair<int64_t, std::function<void()>>> held;
  held.swap(late_cleanups_);
  for (auto& [step, cleanup] : held) {
    if (LaterTmpDirExists(step)) {
      Mark("retention ran while the next save's temp directory existed");
    } else if (!all) {
      late_cleanups_.push_back({step, std::move(cleanup)});
      continue;
    }
    cleanup();
  }
}

bool World::LaterTmpDirExists(int64_t committed_step) const {
  for (const std::string& name : disk_.Children(JobDirPath(kRoot, kJob))) {
    const auto tmp = ParseTmpDirName(name);
    if (tmp.has_value() && tmp->first > committed_step) return true;
  }
  return false;
}

// ---------------------------------------------------------------------------------------------
// Faults

void World::MaybeFault() {
  if (Chance(p_crash_)) CrashCoordinator("random");
  const uint32_t rank = static_cast<uint32_t>(rng_() % job_.world);
  if (Chance(p_kill_)) KillAgent(rank, "random");
  if (Chance(p_freeze_)) {
    FreezeAgent(rank, Chance(0.5) ? Jitter(absl::Milliseconds(100), absl::Seconds(2))
                                  : Jitter(kLease, kLease * 2));
  }
  if (Chance(p_pause_)) {
    PauseCoordinator(Chance(0.5) ? Jitter(absl::Milliseconds(500), kLease)
                                 : Jitter(kLease, kLease * 3),
                     "random");
  }
  if (Chance(p_refuse_)) RestartAgentRefused(rank, Jitter(absl::Seconds(1), absl::Seconds(8)));
  if (Chance(p_cut_)) {
    AgentProc& a = agents_[rank];
    const absl::Duration d = Jitter(absl::Milliseconds(200), absl::Seconds(6));
    Trace(absl::StrCat("fault: link of rank ", rank, " cut for ", absl::FormatDuration(d)));
    a.link_down_until = now() + d;
    BreakStream(rank, "link cut");
  }
}

// ---------------------------------------------------------------------------------------------
// Invariants

void World::CheckInvariants() {
  if (store_writes_ == checked_store_writes_ && disk_.operations() == checked_disk_ops_) return;
  checking_ = true;
  checked_store_writes_ = store_writes_;
  absl::StatusOr<std::optional<v1::JobRecord>> job = ReadJob(store_, kJob);
  std::vector<v1::SessionRecord> sessions;
  store_.Scan(Table::kSessions, "", [&](absl::string_view, absl::string_view v) {
        v1::SessionRecord record;
        if (record.ParseFromArray(v.data(), static_cast<int>(v.size()))) {
          sessions.push_back(std::move(record));
        }
        return true;
      })
      .IgnoreError();
  for (const v1::SessionRecord& session : sessions) {
    const std::string dir = StepDirPath(kRoot, kJob, session.step());
    std::optional<std::string> holder;  // the session whose manifest the final dir holds
    if (const std::string* raw = disk_.Contents(dir + "/manifest.pb")) {
      v1::Manifest m;
      if (m.ParseFromString(*raw)) holder = m.session_id();
    }
    const bool in_place = holder == session.session_id();
    if (session.state() == v1::SESSION_STATE_COMMITTED) {
      // I1. Retention may remove a committed checkpoint, but only once keep_last newer ones
      // are committed on the disk.
      int newer = 0;
      for (const v1::SessionRecord& other : sessions) {
        if (other.step() <= session.step()) continue;
        if (const std::string* raw =
                disk_.Contents(StepDirPath(kRoot, kJob, other.step()) + "/manifest.pb")) {
          v1::Manifest m;
          if (m.ParseFromString(*raw) && m.session_id() == other.session_id()) ++newer;
        }
      }
      if (!in_place && (options_.keep_last == 0 || newer < options_.keep_last)) {
        Fail(absl::StrCat("I1: ", session.session_id(), " is COMMITTED but ", dir,
                          " does not hold its manifest (", newer, " newer committed, keep_last ",
                          options_.keep_last, ")"));
      }
      if (in_place && !verified_.count(session.session_id())) VerifyCommitted(session, dir);
    } else if (session.state() == v1::SESSION_STATE_ABORTED && in_place) {
      Fail(absl::StrCat("I1: ", session.session_id(), " is ABORTED (",
                        session.error().message(), ") with ", dir, " in place"));
    }
    if (acknowledged_.count(session.session_id()) &&
        session.state() != v1::SESSION_STATE_COMMITTED) {
      Fail(absl::StrCat("I2: ", session.session_id(), " was acknowledged as committed, but the "
                        "store says ", v1::SessionState_Name(session.state())));
    }
  }
  for (const std::string& id : acknowledged_) {
    bool found = false;
    for (const v1::SessionRecord& s : sessions) found = found || s.session_id() == id;
    if (!found) Fail(absl::StrCat("I2: acknowledged commit ", id, " is not in the store"));
  }
  if (job.ok() && job->has_value()) {
    const int64_t latest = (*job)->latest_committed_step();
    if (latest < max_latest_) {
      Fail(absl::StrCat("I3: latest went back from ", max_latest_, " to ", latest));
    }
    max_latest_ = std::max(max_latest_, latest);
  }
  checked_disk_ops_ = disk_.operations();
  checking_ = false;
}

void World::VerifyCommitted(const v1::SessionRecord& session, const std::string& dir) {
  if (withdrawn_.count(session.session_id()) > 0) {
    Fail(absl::StrCat("I9: session ", session.session_id(), " of step ", session.step(),
                      " committed although a trainer withdrew its snapshot"));
    return;
  }
  VerifyOptions options;
  options.parallelism = 1;
  const VerifyReport report = VerifyCheckpoint(disk_, dir, options);
  if (!report.ok()) {
    Fail(absl::StrCat("I4: committed ", dir, " does not verify: ",
                      report.problems.empty() ? "problems dropped" : report.problems[0].message));
    return;
  }
  absl::StatusOr<v1::Manifest> manifest = ReadManifest(disk_, dir);
  if (!manifest.ok()) {
    Fail(absl::StrCat("I4: ", manifest.status().ToString()));
    return;
  }
  for (const v1::TensorEntry& t : manifest->tensors()) {
    const uint64_t element = t.dtype() == v1::DTYPE_U8 ? 1 : 4;
    for (const v1::ChunkEntry& c : t.chunks()) {
      const std::string* file = disk_.Contents(dir + "/" + c.file());
      if (file == nullptr || file->size() < c.offset() + c.nbytes()) {
        Fail(absl::StrCat("I4: chunk of ", t.key(), " is outside ", c.file()));
        return;
      }
      const uint64_t first = static_cast<uint64_t>(c.box().offsets(0)) * element;
      for (uint64_t i = 0; i < c.nbytes(); ++i) {
        if (static_cast<uint8_t>((*file)[c.offset() + i]) !=
            ExpectedByte(t.key(), session.step(), first + i)) {
          Fail(absl::StrCat("I4: committed ", t.key(), " of step ", session.step(),
                            " differs from what the trainers staged at byte ", first + i));
          return;
        }
      }
    }
  }
  verified_.insert(session.session_id());
}

}  // namespace

SimResult RunSchedule(const SimConfig& config) {
  World world(config);
  return world.Run();
}

}  // namespace tessera::sim
