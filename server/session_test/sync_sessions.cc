#include "server/session_test/sync_sessions.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "server/hand_out.h"
#include "server/relay.h"
#include "server/session/memory_only.h"
#include "server/session/plan_work.h"
#include "server/session/schema.h"
#include "server/session/status_view.h"

namespace tessera {

class SyncSessions::Port : public EffectsPort {
 public:
  Port(SyncSessions* s, std::string job_id) : s_(s), job_id_(std::move(job_id)) {}
  absl::Status Persist(const StoreBatch& batch) override { return s_->store_->Commit(batch); }
  void Recover() override { s_->Reload(job_id_); }
  void MemoryCommitted(const std::string& session_id) override {
    s_->registry_->NoteMemoryCommit(job_id_, session_id);
  }
  void Deliver(std::vector<Outgoing> commands) override {
    s_->Core(job_id_)->Delivered(commands);
    if (RelayFanOut(*s_->registry_, job_id_, s_->options_.relay_from, commands) > 0) {
      s_->relayed_[job_id_].Record(commands);
    }
    HandOut(*s_->sink_, job_id_, commands, /*max_threads=*/1);  // deterministic: one thread
  }
  void StartPlan(PlanWork work) override {
    PlanVerdict verdict = DecidePlan(work, s_->plan_cache_, *s_->registry_, s_->options_.planner);
    s_->Carry(job_id_, s_->Core(job_id_)->PlanDecided(work.session_id, work.attempt,
                                                      std::move(verdict), s_->clock_->Now()));
  }
  void StartCommit(CommitAttempt work) override {
    s_->commits_.emplace_back(job_id_, std::move(work));
  }
  void StartCleanup(std::optional<RetentionWork> retention,
                    std::vector<std::string> dirs) override {
    s_->cleanups_.push_back({job_id_, std::move(retention), std::move(dirs)});
  }
  void Observe(const Effects& effects) override { s_->stats_.Add(effects.stats); }

 private:
  SyncSessions* const s_;
  const std::string job_id_;
};

SyncSessions::SyncSessions(StateStore* store, AgentRegistry* registry, CommandSink* sink,
                           CommitEdge* edge, const Clock* clock, SessionOptions options)
    : store_(store),
      registry_(registry),
      sink_(sink),
      edge_(edge),
      clock_(clock),
      options_(std::move(options)) {}

SyncSessions::~SyncSessions() = default;

JobCore* SyncSessions::Core(const std::string& job_id) {
  std::unique_ptr<JobCore>& core = jobs_[job_id];
  if (core == nullptr) {
    core = std::make_unique<JobCore>(JobContext{&options_, epoch_, &commands_emitted_, nullptr},
                                     job_id);
    liveness_[job_id].Reset();
    Told(job_id, /*tick=*/false);  // a new core is told every verdict, as SessionManager's
  }
  return jobs_.at(job_id).get();
}

JobCore* SyncSessions::Told(const std::string& job_id, bool tick) {
  JobCore* core = Core(job_id);
  std::optional<Effects> told =
      liveness_[job_id].Feed(*registry_, *core, /*judge_leases=*/tick, clock_->Now());
  if (told.has_value()) {
    Carry(job_id, *std::move(told));
  } else if (tick) {
    Carry(job_id, core->Tick(clock_->Now()));
  }
  return Core(job_id);  // a new one if a refused write recovered the job away
}

bool SyncSessions::Carry(const std::string& job_id, Effects effects) {
  Port port(this, job_id);
  return CarryEffects(std::move(effects), port);
}

void SyncSessions::Reload(const std::string& job_id) {
  Effects out;
  absl::StatusOr<std::optional<v1::JobRecord>> record = ReadJob(*store_, job_id);
  if (record.ok() && !record->has_value()) {
    jobs_.erase(job_id);
    return;
  }
  absl::StatusOr<std::unique_ptr<JobCore>> core = JobCore::Recover(
      JobContext{&options_, epoch_, &commands_emitted_, nullptr}, *store_, job_id, clock_->Now(), out);
  if (!core.ok()) {
    jobs_.erase(job_id);
    return;
  }
  jobs_[job_id] = *std::move(core);
  liveness_[job_id].Reset();
  if (Carry(job_id, std::move(out)) && jobs_.count(job_id)) Told(job_id, /*tick=*/false);
}

absl::Status SyncSessions::Recover() {
  absl::StatusOr<uint64_t> epoch = NextEpoch(*store_);
  if (!epoch.ok()) return epoch.status();
  epoch_ = *epoch;
  absl::StatusOr<std::vector<v1::JobRecord>> records = ReadJobs(*store_);
  if (!records.ok()) return records.status();
  for (const v1::JobRecord& record : *records) {
    Effects out;
    absl::StatusOr<std::unique_ptr<JobCore>> core =
        JobCore::Recover(JobContext{&options_, epoch_, &commands_emitted_, nullptr}, *store_,
                         record.job_id(), clock_->Now(), out);
    if (!core.ok()) return core.status();
    jobs_[record.job_id()] = *std::move(core);
    liveness_[record.job_id()].Reset();
    if (Carry(record.job_id(), std::move(out)) && jobs_.count(record.job_id())) {
      Told(record.job_id(), /*tick=*/false);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::SubmitLocalPlanResponse> SyncSessions::SubmitLocalPlan(
    v1::SubmitLocalPlanRequest request) {
  if (absl::Status s =
          registry_->CheckIncarnation(request.job_id(), request.rank(), request.incarnation());
      !s.ok()) {
    return s;
  }
  std::optional<MeshLayout> layout = registry_->JobLayout(request.job_id());
  if (!layout.has_value()) return absl::NotFoundError("unknown job");
  const std::string job_id = request.job_id();
  Outcome<v1::SubmitLocalPlanResponse> outcome =
      Core(job_id)->SubmitPlan(std::move(request), *layout, clock_->Now());
  if (!Carry(job_id, std::move(outcome.effects))) {
    return absl::UnavailableError("the state store refused the write");
  }
  return outcome.reply;
}

absl::StatusOr<v1::SessionState> SyncSessions::ReportPhase(
    const v1::ReportPhaseRequest& request) {
  if (absl::Status s =
          registry_->CheckIncarnation(request.job_id(), request.rank(), request.incarnation());
      !s.ok()) {
    return s;
  }
  if (!jobs_.count(request.job_id())) return absl::NotFoundError("unknown job");
  Outcome<v1::SessionState> outcome = Core(request.job_id())->ReportPhase(request, clock_->Now());
  if (!Carry(request.job_id(), std::move(outcome.effects))) {
    return absl::UnavailableError("the state store refused the write");
  }
  return outcome.reply;
}

absl::StatusOr<v1::SessionState> SyncSessions::ReportChunks(
    const v1::ReportChunksRequest& request) {
  if (absl::Status s =
          registry_->CheckIncarnation(request.job_id(), request.rank(), request.incarnation());
      !s.ok()) {
    return s;
  }
  if (!jobs_.count(request.job_id())) return absl::NotFoundError("unknown job");
  Outcome<v1::SessionState> outcome =
      Core(request.job_id())->ReportChunks(request, clock_->Now());
  if (!Carry(request.job_id(), std::move(outcome.effects))) {
    return absl::UnavailableError("the state store refused the write");
  }
  return outcome.reply;
}

void SyncSessions::AgentsChanged(const std::string& job_id) {
  if (jobs_.count(job_id)) Told(job_id, /*tick=*/false);
}

absl::StatusOr<v1::SessionStatus> SyncSessions::AbortSession(const std::string& job_id,
                                                             const std::string& reason) {
  if (!jobs_.count(job_id)) return absl::NotFoundError(absl::StrCat("unknown job ", job_id));
  Outcome<v1::SessionStatus> outcome = Core(job_id)->OperatorAbort(reason, clock_->Now());
  if (!Carry(job_id, std::move(outcome.effects))) {
    return absl::UnavailableError("the state store refused the write");
  }
  return outcome.reply;
}

void SyncSessions::Tick() {
  std::vector<std::string> ids;
  for (const auto& [id, core] : jobs_) ids.push_back(id);
  for (const std::string& id : ids) {
    if (jobs_.count(id)) Told(id, /*tick=*/true);
  }
  // The commits due now; one that a result leads to (a retry, a recovery) waits for the next.
  for (size_t due = commits_.size(); due > 0 && !commits_.empty(); --due) {
    auto [job_id, work] = std::move(commits_.front());
    commits_.pop_front();
    const CommitResolution resolution = edge_->Commit(work);
    if (jobs_.count(job_id)) {
      Carry(job_id, Core(job_id)->CommitResolved(work.session_id, resolution, clock_->Now()));
    }
  }
  while (!cleanups_.empty()) {
    Cleanup cleanup = std::move(cleanups_.front());
    cleanups_.pop_front();
    for (const std::string& dir : cleanup.dirs) edge_->Remove(dir).IgnoreError();
    if (cleanup.retention.has_value() && edge_->Retain(*cleanup.retention).ok() &&
        jobs_.count(cleanup.job_id)) {
      Carry(cleanup.job_id,
            Core(cleanup.job_id)->RetentionDone(cleanup.retention->retire_steps));
    }
  }
}

std::optional<v1::Command> SyncSessions::CurrentCommand(const std::string& job_id,
                                                        uint32_t rank) const {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return std::nullopt;
  std::optional<Outgoing> current = it->second->CurrentCommand(rank);
  if (!current.has_value()) return std::nullopt;
  if (current->pin_plan != nullptr) {
    current->command.mutable_pin()->mutable_assignment()->ParseFromString(
        current->pin_plan->assignments[rank]);
  }
  auto relayed = relayed_.find(job_id);
  if (relayed != relayed_.end()) return relayed->second.Replay(rank, std::move(current->command));
  return std::move(current->command);
}

absl::StatusOr<v1::SessionStatus> SyncSessions::GetSession(const std::string& job_id,
                                                           const std::string& session_id) const {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("unknown job ", job_id));
  if (std::optional<v1::SessionStatus> status = it->second->GetSession(session_id)) {
    return *status;
  }
  if (!session_id.empty()) {
    absl::StatusOr<std::optional<v1::SessionRecord>> record =
        ReadSession(*store_, job_id, session_id);
    if (record.ok() && record->has_value()) return StatusFromRecord(**record);
  }
  return absl::NotFoundError(absl::StrCat("job ", job_id, " has no session ", session_id));
}

absl::StatusOr<std::vector<v1::CheckpointInfo>> SyncSessions::ListCheckpoints(
    const std::string& job_id) const {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("unknown job ", job_id));
  return ListCheckpointsWithMemory(it->second->checkpoints(), it->second->memory_checkpoint(),
                                   *registry_, job_id);
}

absl::StatusOr<v1::Manifest> SyncSessions::GetMemoryCheckpoint(const std::string& job_id,
                                                               int64_t step) const {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("unknown job ", job_id));
  return MemoryManifest(it->second->memory_checkpoint(), job_id, step);
}

std::vector<v1::JobInfo> SyncSessions::ListJobs() const {
  std::vector<v1::JobInfo> jobs;
  for (const auto& [id, core] : jobs_) jobs.push_back(core->Info());
  return jobs;
}

bool SyncSessions::TrainersBlocked(const std::string& job_id) const {
  auto it = jobs_.find(job_id);
  return it != jobs_.end() && it->second != nullptr && it->second->trainers_blocked();
}

}  // namespace tessera
