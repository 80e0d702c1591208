#include "server/session_manager.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "common/status.h"
#include "server/hand_out.h"
#include "server/relay.h"
#include "server/session/commit_driver.h"
#include "server/session/effects_carrier.h"
#include "server/session/memory_only.h"
#include "server/session/plan_work.h"
#include "server/session/schema.h"
#include "server/session/status_view.h"

namespace tessera {

// A job's slot: its strand and its core. The strand is the only writer of `core`; readers
// take `mu` briefly.
struct SessionManager::Job {
  Job(std::string id, ThreadPool* pool) : job_id(std::move(id)), strand(pool) {}
  const std::string job_id;
  Strand strand;
  mutable absl::Mutex mu;
  std::unique_ptr<JobCore> core ABSL_GUARDED_BY(mu);  // null while it must be recovered
  // The relays' commands of the last relayed fan-out: replayed with their relay_to.
  RelayedCommands relayed ABSL_GUARDED_BY(mu);
  // Whether the job's trainers are blocked in a save (JobCore::trainers_blocked), as last
  // counted in jobs_blocking_. The job's strand only (Carry).
  bool trainers_blocked = false;
  // What the core was told of its agents. The job's strand only, with `mu` (FeedLiveness).
  LivenessFeed liveness;
  // Disk clean-up of this job waiting for its turn (RunDueCleanups), oldest first.
  absl::Mutex cleanup_mu;
  std::deque<PendingCleanup> cleanups ABSL_GUARDED_BY(cleanup_mu);
  bool cleanup_posted ABSL_GUARDED_BY(cleanup_mu) = false;  // a RunDueCleanups is queued
};

SessionManager::SessionManager(StateStore* store, AgentRegistry* registry, CommandSink* sink,
                               CommitEdge* edge, const Clock* clock,
                               SessionManagerOptions options)
    : store_(store),
      registry_(registry),
      sink_(sink),
      edge_(edge),
      clock_(clock),
      options_(std::move(options)) {
  pool_ = std::make_unique<ThreadPool>(options_.threads);
  janitor_ = std::make_unique<ThreadPool>(1);
}

SessionManager::~SessionManager() {
  Stop();
  // The janitor first, while the jobs' strands still run what it posts to them; what is not
  // due yet, or asked of it later, is dropped (a restart re-applies pending retention, and
  // retention removes stale temporary directories).
  {
    absl::MutexLock lock(&janitor_mu_);
    janitor_open_ = false;
  }
  janitor_.reset();
  pool_.reset();  // finishes every queued task while the jobs still exist
}

// ---------------------------------------------------------------------------------------------
// Startup

absl::Status SessionManager::Recover() {
  ASSIGN_OR_RETURN(epoch_, NextEpoch(*store_));
  ASSIGN_OR_RETURN(std::vector<v1::JobRecord> records, ReadJobs(*store_));
  for (const v1::JobRecord& record : records) {
    Job* job = FindOrAddJob(record.job_id());
    if (job == nullptr) return absl::UnavailableError("the coordinator is stopping");
    Effects out;
    JobContext context = Context();
    ASSIGN_OR_RETURN(std::unique_ptr<JobCore> core,
                     JobCore::Recover(context, *store_, record.job_id(), clock_->Now(), out));
    {
      absl::MutexLock lock(&job->mu);
      job->core = std::move(core);
    }
    Busy(+1);
    job->strand.Post([this, job, out = std::move(out)]() mutable {
      if (Carry(job, std::move(out))) {
        Effects told;
        {
          absl::MutexLock lock(&job->mu);
          if (job->core != nullptr) told = FeedLiveness(job, *job->core, /*tick=*/false);
        }
        Carry(job, std::move(told));
      }
      Busy(-1);
    });
  }
  LogInfo("coordinator epoch ", epoch_, ": recovered ", records.size(), " job(s)");
  ticker_ = std::thread([this] { RunTicker(); });
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Jobs

SessionManager::Job* SessionManager::FindOrAddJob(const std::string& job_id) {
  absl::MutexLock lock(&jobs_mu_);
  if (stopped_) return nullptr;
  std::unique_ptr<Job>& slot = jobs_[job_id];
  if (slot == nullptr) slot = std::make_unique<Job>(job_id, pool_.get());
  return slot.get();
}

SessionManager::Job* SessionManager::FindJob(const std::string& job_id) const {
  absl::MutexLock lock(&jobs_mu_);
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : it->second.get();
}

template <typename T>
void SessionManager::Post(Job* job, std::function<Outcome<T>(JobCore&)> event, Done<T> done) {
  Busy(+1);
  job->strand.Post([this, job, event = std::move(event), done = std::move(done)] {
    Outcome<T> outcome;
    bool have_core = true;
    {
      absl::MutexLock lock(&job->mu);
      if (job->core == nullptr) {
        have_core = false;
      } else {
        outcome = event(*job->core);
      }
    }
    if (!have_core && !Reload(job)) {
      done(absl::UnavailableError(absl::StrCat(
          "job ", job->job_id, " is being recovered from the coordinator's state store")));
      Busy(-1);
      return;
    }
    if (!have_core) {
      absl::MutexLock lock(&job->mu);
      outcome = event(*job->core);
    }
    if (Carry(job, std::move(outcome.effects))) {
      done(std::move(outcome.reply));
    } else {
      done(absl::UnavailableError(
          absl::StrCat("the coordinator could not record this in its state store; retry")));
    }
    Busy(-1);
  });
}

void SessionManager::PostEffects(Job* job, std::function<Effects(JobCore&)> event) {
  Post<bool>(
      job,
      [event = std::move(event)](JobCore& core) {
        return Outcome<bool>{event(core), true};
      },
      [](absl::StatusOr<bool>) {});
}

// The manager's EffectsPort for one job, used on the job's strand.
class SessionManager::Port : public EffectsPort {
 public:
  Port(SessionManager* manager, Job* job) : m_(manager), job_(job) {}

  absl::Status Persist(const StoreBatch& batch) override {
    const absl::Time start = absl::Now();
    absl::Status committed = m_->store_->Commit(batch);
    if (batch.ByteSize() >= kLogWritesFrom) {  // a plan record: its time is a save's time
      LogInfo("job ", job_->job_id, ": ", batch.ByteSize(), " bytes written to the state store in ",
              absl::FormatDuration(absl::Now() - start));
    }
    return committed;
  }
  // A store write this large (a new plan's record) is logged with its duration.
  static constexpr size_t kLogWritesFrom = size_t{1} << 20;
  void Persisted(v1::SessionState state) override {
    if (m_->options_.on_state_persisted) m_->options_.on_state_persisted(state);
  }
  void Recover() override {
    LogError("job ", job_->job_id, ": recovering it from the state store");
    {
      absl::MutexLock lock(&job_->mu);
      job_->core.reset();
    }
    m_->Reload(job_);
  }
  void MemoryCommitted(const std::string& session_id) override {
    m_->registry_->NoteMemoryCommit(job_->job_id, session_id);
  }
  void Deliver(std::vector<Outgoing> commands) override {
    const absl::Time start = absl::Now();
    const size_t count = commands.size();
    {
      // Current before sent: a stream that connects now replays these (CommandStreams::Open).
      absl::MutexLock lock(&job_->mu);
      if (job_->core != nullptr) job_->core->Delivered(commands);
    }
    // Cached PINs go once per node (relay.h). After Delivered: each rank's current command
    // stays its own, so a stream that reconnects is replayed its PIN whoever relays it — a
    // relay's with the targets it names (RelayedCommands).
    const size_t relayed = RelayFanOut(*m_->registry_, job_->job_id,
                                       m_->options_.session.relay_from, commands);
    if (relayed > 0) {
      absl::MutexLock lock(&job_->mu);
      job_->relayed.Record(commands);
    }
    const size_t written = commands.size();
    HandOut(*m_->sink_, job_->job_id, commands, m_->options_.hand_out_threads);
    if (count >= kLogDeliveriesFrom || relayed > 0) {
      LogInfo("job ", job_->job_id, ": ", count, " commands handed to the streams in ",
              absl::FormatDuration(absl::Now() - start), " on ",
              HandOutThreads(written, m_->options_.hand_out_threads), " threads",
              relayed == 0 ? std::string()
                           : absl::StrCat(" (", written, " written, ", relayed,
                                          " of them relayed by agents)"));
    }
  }
  // A fan-out this large (a phase's command to every rank of a large job), or one relayed,
  // is logged with its duration.
  static constexpr size_t kLogDeliveriesFrom = 1024;
  void StartPlan(PlanWork work) override {
    SessionManager* m = m_;
    Job* job = job_;
    m->Busy(+1);
    job->strand.Post([m, job, work = std::move(work)]() mutable {
      if (m->options_.before_plan_decided) m->options_.before_plan_decided(work.job_id);
      PlanVerdict verdict = DecidePlan(work, m->plan_cache_, *m->registry_,
                                       m->options_.session.planner);
      if (!work.plans.empty()) {  // freed off the job's strand: the PINs do not wait for it
        m->pool_->Post([plans = std::move(work.plans)]() mutable {
          std::vector<LocalPlan>().swap(plans);
        });
      }
      m->PostEffects(job, [m, session = work.session_id, attempt = work.attempt,
                           verdict = std::move(verdict)](JobCore& core) mutable {
        return core.PlanDecided(session, attempt, std::move(verdict), m->clock_->Now());
      });
      m->Busy(-1);
    });
  }
  void StartCommit(CommitAttempt work) override {
    SessionManager* m = m_;
    Job* job = job_;
    m->Busy(+1);
    job->strand.Post([m, job, work = std::move(work)] {
      const CommitResolution resolution =
          m->edge_ != nullptr
              ? m->edge_->Commit(work)
              : CommitResolution{CommitOutcome::kUnresolved,
                                 absl::FailedPreconditionError(
                                     "the coordinator has no storage mounted")};
      m->PostEffects(job, [m, session = work.session_id, resolution](JobCore& core) {
        return core.CommitResolved(session, resolution, m->clock_->Now());
      });
      m->Busy(-1);
    });
  }
  void StartCleanup(std::optional<RetentionWork> retention,
                    std::vector<std::string> remove_dirs) override {
    if (m_->edge_ == nullptr) return;
    const absl::Time due = m_->clock_->Now() + m_->options_.cleanup_grace;
    {
      absl::MutexLock lock(&job_->cleanup_mu);
      job_->cleanups.push_back(PendingCleanup{std::move(retention), std::move(remove_dirs), due,
                                              due + m_->options_.cleanup_max_wait});
    }
    m_->Busy(+1);  // until it runs; Carry, which this step ends in, and every tick offer it
  }
  void Observe(const Effects& effects) override { m_->Changed(effects); }

 private:
  SessionManager* const m_;
  Job* const job_;
};

bool SessionManager::Carry(Job* job, Effects effects) {
  // A step that blocks the trainers is counted before its store write (the write a clean-up
  // must not overlap: a session's open, PINNING), one that lets them go after it.
  CountBlocked(job, /*opening_only=*/true);
  Port port(this, job);
  const bool carried = CarryEffects(std::move(effects), port);
  CountBlocked(job, /*opening_only=*/false);
  OfferCleanups(job);
  return carried;
}

void SessionManager::CountBlocked(Job* job, bool opening_only) {
  bool blocked = false;
  {
    absl::MutexLock lock(&job->mu);
    blocked = job->core != nullptr && job->core->trainers_blocked();
  }
  if (blocked == job->trainers_blocked || (opening_only && !blocked)) return;
  job->trainers_blocked = blocked;
  jobs_blocking_.fetch_add(blocked ? 1 : -1);
}

void SessionManager::OfferCleanups(Job* job) {
  {
    absl::MutexLock lock(&job->cleanup_mu);
    if (job->cleanups.empty() || job->cleanup_posted) return;
    job->cleanup_posted = true;
  }
  absl::MutexLock lock(&janitor_mu_);
  if (!janitor_open_) return;  // the manager is being destroyed
  janitor_->Post([this, job] { RunDueCleanups(job); });
}

int SessionManager::RunDueCleanups(Job* job) {
  std::vector<PendingCleanup> due;
  const absl::Time now = clock_->Now();
  const bool quiet = jobs_blocking_.load() == 0;
  {
    absl::MutexLock lock(&job->cleanup_mu);
    job->cleanup_posted = false;
    while (!job->cleanups.empty()) {
      const PendingCleanup& next = job->cleanups.front();
      if (now < next.give_up && (now < next.due || !quiet)) break;  // in order, or not at all
      due.push_back(std::move(job->cleanups.front()));
      job->cleanups.pop_front();
    }
  }
  for (PendingCleanup& c : due) {
    if (!quiet) {
      LogInfo("job ", job->job_id, ": disk clean-up goes ahead while trainers are in a save (it ",
              "waited ", absl::FormatDuration(options_.cleanup_max_wait), ")");
    }
    for (const std::string& dir : c.dirs) {
      if (absl::Status removed = edge_->Remove(dir); !removed.ok()) {
        LogWarning("cannot remove the aborted session's ", dir, ": ", removed.ToString());
      }
    }
    if (c.retention.has_value()) {
      if (absl::Status s = edge_->Retain(*c.retention); !s.ok()) {
        LogWarning("retention in ", c.retention->job_dir, " failed (tried again with the next "
                   "commit or restart): ", s.ToString());
      } else {
        PostEffects(job, [steps = c.retention->retire_steps](JobCore& core) {
          return core.RetentionDone(steps);
        });
      }
    }
    Busy(-1);
  }
  return static_cast<int>(due.size());
}

int SessionManager::RunDueCleanupsForTesting() {
  std::vector<Job*> jobs;
  {
    absl::MutexLock lock(&jobs_mu_);
    for (const auto& [id, job] : jobs_) jobs.push_back(job.get());
  }
  int ran = 0;
  for (Job* job : jobs) ran += RunDueCleanups(job);
  return ran;
}

JobContext SessionManager::Context() {
  return JobContext{&options_.session, epoch_, &commands_emitted_, nullptr};
}

bool SessionManager::Reload(Job* job) {
  Effects out;
  JobContext context = Context();
  absl::StatusOr<std::optional<v1::JobRecord>> record = ReadJob(*store_, job->job_id);
  absl::StatusOr<std::unique_ptr<JobCore>> core;
  if (!record.ok()) {
    core = record.status();
  } else if (!record->has_value()) {
    // The store never heard of it: the job's first session was never persisted.
    core = std::make_unique<JobCore>(context, job->job_id);
  } else {
    core = JobCore::Recover(context, *store_, job->job_id, clock_->Now(), out);
  }
  if (!core.ok()) {
    LogError("job ", job->job_id, ": cannot recover from the state store yet: ",
             core.status().ToString());
    return false;
  }
  Effects told;
  {
    absl::MutexLock lock(&job->mu);
    job->core = *std::move(core);
    job->liveness.Reset();  // a new core knows nothing of the agents yet
  }
  if (!Carry(job, std::move(out))) return false;
  {
    absl::MutexLock lock(&job->mu);
    if (job->core != nullptr) told = FeedLiveness(job, *job->core, /*tick=*/false);
  }
  return Carry(job, std::move(told));
}

Effects SessionManager::FeedLiveness(Job* job, JobCore& core, bool tick) {
  const absl::Time now = clock_->Now();
  std::optional<Effects> told = job->liveness.Feed(*registry_, core, /*judge_leases=*/tick, now);
  if (told.has_value()) return *std::move(told);  // AgentsChanged ticked the session too
  return tick ? core.Tick(now) : Effects();
}

void SessionManager::Changed(const Effects& effects) {
  {
    absl::MutexLock lock(&stats_mu_);
    stats_.Add(effects.stats);
  }
  if (effects.changed || effects.persisted_state != v1::SESSION_STATE_UNSPECIFIED) {
    absl::MutexLock lock(&version_mu_);
    ++version_;
  }
}

// ---------------------------------------------------------------------------------------------
// RPC-facing

void SessionManager::SubmitLocalPlan(v1::SubmitLocalPlanRequest&& request,
                                     Done<v1::SubmitLocalPlanResponse> done) {
  const std::string job_id = request.job_id();
  if (absl::Status s = registry_->CheckIncarnation(job_id, request.rank(), request.incarnation());
      !s.ok()) {
    done(s);
    return;
  }
  std::optional<MeshLayout> layout = registry_->JobLayout(job_id);
  if (!layout.has_value()) {
    done(absl::NotFoundError(absl::StrCat("unknown job ", job_id)));
    return;
  }
  Job* job = FindOrAddJob(job_id);
  if (job == nullptr) {
    done(absl::UnavailableError("the coordinator is stopping"));
    return;
  }
  // A job with no core yet (new here, or its recovery could not read the store) gets one in
  // Post, from the store: a blank one only for a job the store never heard of.
  auto shared = std::make_shared<v1::SubmitLocalPlanRequest>(std::move(request));
  Post<v1::SubmitLocalPlanResponse>(
      job,
      [this, shared, layout = *std::move(layout)](JobCore& core) {
        return core.SubmitPlan(std::move(*shared), layout, clock_->Now());
      },
      std::move(done));
}

template <typename T>
SessionManager::Job* SessionManager::ReportingJob(const std::string& job_id, uint32_t rank,
                                                  uint64_t incarnation, Done<T>& done) {
  if (absl::Status s = registry_->CheckIncarnation(job_id, rank, incarnation); !s.ok()) {
    done(s);
    return nullptr;
  }
  Job* job = FindJob(job_id);
  if (job == nullptr) done(absl::NotFoundError(absl::StrCat("unknown job ", job_id)));
  return job;
}

void SessionManager::ReportPhase(const v1::ReportPhaseRequest& request,
                                 Done<v1::SessionState> done) {
  Job* job = ReportingJob(request.job_id(), request.rank(), request.incarnation(), done);
  if (job == nullptr) return;
  Post<v1::SessionState>(
      job, [this, request](JobCore& core) { return core.ReportPhase(request, clock_->Now()); },
      std::move(done));
}

void SessionManager::ReportChunks(const v1::ReportChunksRequest& request,
                                  Done<v1::SessionState> done) {
  Job* job = ReportingJob(request.job_id(), request.rank(), request.incarnation(), done);
  if (job == nullptr) return;
  Post<v1::SessionState>(
      job, [this, request](JobCore& core) { return core.ReportChunks(request, clock_->Now()); },
      std::move(done));
}

void SessionManager::AgentsChanged(const std::string& job_id) {
  Job* job = FindJob(job_id);
  if (job == nullptr) return;  // no core yet: a new one is told everything
  PostEffects(job, [this, job](JobCore& core) { return FeedLiveness(job, core, /*tick=*/false); });
}

void SessionManager::AbortSession(const std::string& job_id, const std::string& reason,
                                  Done<v1::SessionStatus> done) {
  Job* job = FindJob(job_id);
  if (job == nullptr) {
    done(absl::NotFoundError(absl::StrCat("unknown job ", job_id)));
    return;
  }
  Post<v1::SessionStatus>(
      job, [this, reason](JobCore& core) { return core.OperatorAbort(reason, clock_->Now()); },
      std::move(done));
}

absl::Status SessionManager::RelayFailed(const v1::RelayFailedRequest& request) {
  RETURN_IF_ERROR(
      registry_->CheckIncarnation(request.job_id(), request.rank(), request.incarnation()));
  std::vector<uint32_t> sent;
  for (uint32_t rank : request.ranks()) {
    std::optional<v1::Command> current = CurrentCommand(request.job_id(), rank);
    // Another session's command went out on its own (only a session's PINs are relayed).
    if (!current.has_value() || current->session_id() != request.session_id()) continue;
    sink_->Send(request.job_id(), rank, *current);
    sent.push_back(rank);
  }
  LogWarning("job ", request.job_id(), ": rank ", request.rank(), " could not relay session ",
             request.session_id(), "'s command to ranks ", absl::StrJoin(request.ranks(), ","),
             "; sent on their own streams to ",
             sent.empty() ? std::string("none (the session moved on)") : absl::StrJoin(sent, ","));
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Reads

std::optional<v1::Command> SessionManager::CurrentCommand(const std::string& job_id,
                                                          uint32_t rank) const {
  Job* job = FindJob(job_id);
  if (job == nullptr) return std::nullopt;
  std::optional<Outgoing> current;
  {
    absl::MutexLock lock(&job->mu);
    if (job->core == nullptr) return std::nullopt;
    current = job->core->CurrentCommand(rank);
    if (current.has_value()) {
      current->command = job->relayed.Replay(rank, std::move(current->command));
    }
  }
  if (!current.has_value()) return std::nullopt;
  // A PIN is kept without its assignment (the plan has it); parsed here, off the lock.
  if (current->pin_plan != nullptr && rank < current->pin_plan->assignments.size() &&
      !current->command.mutable_pin()->mutable_assignment()->ParseFromString(
          current->pin_plan->assignments[rank])) {
    LogError("the PIN assignment of rank ", rank, " of job ", job_id, " does not parse");
  }
  return std::move(current->command);
}

absl::StatusOr<v1::SessionStatus> SessionManager::GetSession(
    const std::string& job_id, const std::string& session_id) const {
  Job* job = FindJob(job_id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("unknown job ", job_id));
  {
    absl::MutexLock lock(&job->mu);
    if (job->core != nullptr) {
      if (std::optional<v1::SessionStatus> status = job->core->GetSession(session_id)) {
        return *std::move(status);
      }
    }
  }
  if (!session_id.empty()) {
    absl::StatusOr<std::optional<v1::SessionRecord>> record =
        ReadSession(*store_, job_id, session_id);
    if (record.ok() && record->has_value()) return StatusFromRecord(**record);
  }
  return absl::NotFoundError(absl::StrCat("job ", job_id, " has no session ", session_id));
}

absl::StatusOr<std::vector<v1::CheckpointInfo>> SessionManager::ListCheckpoints(
    const std::string& job_id) const {
  Job* job = FindJob(job_id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("unknown job ", job_id));
  absl::MutexLock lock(&job->mu);
  if (job->core == nullptr) {
    return absl::UnavailableError(absl::StrCat("job ", job_id, " is being recovered"));
  }
  return ListCheckpointsWithMemory(job->core->checkpoints(), job->core->memory_checkpoint(),
                                   *registry_, job_id);
}

absl::StatusOr<v1::Manifest> SessionManager::GetMemoryCheckpoint(
    const v1::GetMemoryCheckpointRequest& request) const {
  RETURN_IF_ERROR(
      registry_->CheckIncarnation(request.job_id(), request.rank(), request.incarnation()));
  const std::string& job_id = request.job_id();
  const int64_t step = request.step();
  Job* job = FindJob(job_id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("unknown job ", job_id));
  absl::MutexLock lock(&job->mu);
  if (job->core == nullptr) {
    return absl::UnavailableError(absl::StrCat("job ", job_id, " is being recovered"));
  }
  return MemoryManifest(job->core->memory_checkpoint(), job_id, step);
}

std::vector<v1::JobInfo> SessionManager::ListJobs() const {
  std::vector<Job*> jobs;
  {
    absl::MutexLock lock(&jobs_mu_);
    for (const auto& [id, job] : jobs_) jobs.push_back(job.get());
  }
  std::vector<v1::JobInfo> infos;
  for (Job* job : jobs) {
    absl::MutexLock lock(&job->mu);
    if (job->core != nullptr) infos.push_back(job->core->Info());
  }
  return infos;
}

SessionStats SessionManager::Stats() const {
  SessionStats stats;
  {
    absl::MutexLock lock(&stats_mu_);
    stats = stats_;
  }
  for (const v1::JobInfo& job : ListJobs()) {
    stats.sessions_in_flight += job.current_session_id().empty() ? 0 : 1;
  }
  return stats;
}

uint64_t SessionManager::version() const {
  absl::MutexLock lock(&version_mu_);
  return version_;
}

uint64_t SessionManager::AwaitChange(uint64_t seen, absl::Time deadline) const {
  absl::MutexLock lock(&version_mu_);
  auto changed = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(version_mu_) {
    return version_ > seen || stop_;
  };
  version_mu_.AwaitWithDeadline(absl::Condition(&changed), deadline);
  return version_;
}

// ---------------------------------------------------------------------------------------------
// Time-driven work

void SessionManager::Tick() {
  registry_->RunningNow();  // every tick counts as running time (running_clock.h)
  std::vector<Job*> jobs;
  {
    absl::MutexLock lock(&jobs_mu_);
    if (stopped_) return;
    for (const auto& [id, job] : jobs_) jobs.push_back(job.get());
  }
  for (Job* job : jobs) {
    PostEffects(job, [this, job](JobCore& core) { return FeedLiveness(job, core, /*tick=*/true); });
  }
}

void SessionManager::RunTicker() {
  while (true) {
    {
      absl::MutexLock lock(&version_mu_);
      if (version_mu_.AwaitWithTimeout(absl::Condition(&stop_), options_.tick_period)) return;
    }
    Tick();
  }
}

void SessionManager::Stop() {
  {
    absl::MutexLock lock(&jobs_mu_);
    stopped_ = true;
  }
  {
    absl::MutexLock lock(&version_mu_);
    stop_ = true;
  }
  if (ticker_.joinable()) ticker_.join();
}

void SessionManager::TickForTesting() {
  Tick();
  WaitIdleForTesting();
}

void SessionManager::Busy(int delta) {
  absl::MutexLock lock(&idle_mu_);
  busy_ += delta;
}

void SessionManager::WaitIdleForTesting() {
  absl::MutexLock lock(&idle_mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(idle_mu_) { return busy_ == 0; };
  idle_mu_.Await(absl::Condition(&idle));
}

}  // namespace tessera
