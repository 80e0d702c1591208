#include "server/session/job_core.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/ids.h"
#include "common/log.h"
#include "common/status.h"
#include "server/plan/fingerprint.h"
#include "server/session/memory_only.h"
#include "server/session/schema.h"
#include "server/session/status_view.h"

namespace tessera {
namespace {

constexpr int64_t kNoStep = -1;

v1::ErrorDetail Detail(v1::ErrorCode code, std::string message) {
  v1::ErrorDetail detail;
  detail.set_code(code);
  detail.set_message(std::move(message));
  return detail;
}

}  // namespace

JobCore::JobCore(JobContext context, std::string job_id)
    : context_(std::move(context)), job_id_(std::move(job_id)) {
  record_.set_job_id(job_id_);
  record_.set_latest_committed_step(kNoStep);
  if (!context_.new_session_id) context_.new_session_id = NewSessionId;
}

JobCore::JobCore(JobContext context, v1::JobRecord record,
                 std::vector<v1::CheckpointInfo> checkpoints)
    : context_(std::move(context)),
      job_id_(record.job_id()),
      record_(std::move(record)),
      checkpoints_(std::move(checkpoints)) {
  if (!context_.new_session_id) context_.new_session_id = NewSessionId;
}

JobCore::~JobCore() = default;

SessionContext JobCore::MakeSessionContext() {
  SessionContext c;
  c.options = context_.options;
  c.agents = &agents_;
  c.job_id = job_id_;
  c.mesh = *mesh_;
  c.layout = record_.layout();
  c.checkpoints = &checkpoints_;
  c.retention_pending = &record_.retention_pending();
  c.epoch = context_.epoch;
  c.commands_emitted = context_.commands_emitted;
  return c;
}

// ---------------------------------------------------------------------------------------------
// Events

Outcome<v1::SubmitLocalPlanResponse> JobCore::SubmitPlan(v1::SubmitLocalPlanRequest&& request,
                                                          const MeshLayout& layout,
                                                          absl::Time now) {
  Outcome<v1::SubmitLocalPlanResponse> result;
  Effects& out = result.effects;
  const SessionOptions& options = *context_.options;
  const int64_t step = request.step();
  const uint32_t world = current_ != nullptr ? mesh_->world_size() : layout.world_size();
  if (request.rank() >= world) {
    result.reply = MakeError(absl::StatusCode::kInvalidArgument, v1::ERROR_CODE_LAYOUT_MISMATCH,
                             absl::StrCat("rank ", request.rank(), " is outside the job's mesh of ",
                                          world, " ranks"));
    return result;
  }
  // A plan refused here is this rank's refusal of the step too: the other ranks are told.
  auto refuse_plan = [&](v1::ErrorCode code, std::string message) {
    v1::ErrorDetail error;
    error.set_code(code);
    error.set_message(message);
    result.reply = MakeError(absl::StatusCode::kInvalidArgument, error);
    error.set_message(absl::StrCat("the coordinator refused rank ", request.rank(),
                                   "'s plan of step ", step, ": ", message));
    RecordRefusal(request.rank(), step, std::move(error), mesh_.value_or(layout), now, out);
    return result;
  };
  if (static_cast<size_t>(request.shards_size()) > options.planner.max_shards_per_rank) {
    return refuse_plan(v1::ERROR_CODE_PLAN_TOO_LARGE,
                       absl::StrCat("rank ", request.rank(), " submitted ", request.shards_size(),
                                    " shards; the limit is ", options.planner.max_shards_per_rank));
  }
  if (request.shards_omitted() && request.shards_size() > 0) {
    return refuse_plan(v1::ERROR_CODE_MALFORMED_SHARD,
                       absl::StrCat("rank ", request.rank(), " sent ", request.shards_size(),
                                    " shards with shards_omitted set"));
  }
  for (const v1::CheckpointInfo& c : checkpoints_) {
    if (c.step() == step) {
      result.reply = MakeError(
          absl::StatusCode::kFailedPrecondition, v1::ERROR_CODE_STEP_EXISTS,
          absl::StrCat("job ", job_id_, " already has a committed checkpoint of step ", step));
      return result;
    }
  }
  // Also a step that retention deleted, or one older than the latest: its directory would be
  // the first retention removes, and "latest" could not move back to it.
  if (step <= record_.latest_committed_step()) {
    result.reply = MakeError(absl::StatusCode::kFailedPrecondition, v1::ERROR_CODE_STEP_EXISTS,
                             absl::StrCat("job ", job_id_, " has committed step ",
                                          record_.latest_committed_step(), "; step ", step,
                                          " is not newer"));
    return result;
  }
  if (std::optional<absl::Status> refused = TakeRefusal(request, layout, now, out);
      refused.has_value()) {
    if (refused->ok()) {
      result.reply = v1::SubmitLocalPlanResponse();  // the refusal is taken
    } else {
      result.reply = *std::move(refused);
    }
    return result;
  }
  // A late plan re-opened a step that had already aborted (an agent frozen past its lease
  // submits, after resuming, the step every other rank saw abort), and now a newer step
  // arrives: the others have moved on, so the re-opened session is superseded rather than
  // refusing every save until the planning timeout. Nothing of a PLANNING session is staged.
  if (current_ != nullptr && current_->state() == v1::SESSION_STATE_PLANNING &&
      step > current_->record().step() && last_ended_.has_value() &&
      last_ended_->state() == v1::SESSION_STATE_ABORTED &&
      last_ended_->step() == current_->record().step()) {
    const std::vector<uint32_t> submitted = current_->ranks_planned();
    v1::ErrorDetail superseded = Detail(
        v1::ERROR_CODE_SUPERSEDED,
        absl::StrCat("step ", current_->record().step(), " had already aborted (session ",
                     last_ended_->session_id(), ") when rank(s) ", absl::StrJoin(submitted, ", "),
                     " submitted it again; step ", step, " from rank ", request.rank(),
                     " supersedes it"));
    for (uint32_t r : submitted) AddRankRef(*mesh_, r, &superseded);
    current_->AbortPlanning(std::move(superseded), now, out);
    Fold(now, out);
  }
  if (current_ != nullptr && current_->record().step() != step) {
    result.reply = MakeError(
        absl::StatusCode::kFailedPrecondition, v1::ERROR_CODE_SESSION_IN_PROGRESS,
        absl::StrCat("job ", job_id_, " is saving step ", current_->record().step(),
                     " (session ", current_->record().session_id(), ", ",
                     StateName(current_->state()), "); step ", step, " must wait for it"));
    return result;
  }
  if (current_ == nullptr) {
    // The registry's layout is the job's now; a session in flight keeps the one it began with.
    *record_.mutable_layout() = layout.proto();
    mesh_ = layout;
    current_ = std::make_unique<SessionMachine>(MakeSessionContext(),
                                                context_.new_session_id(step), step,
                                                request.memory_only(), now, out);
    latest_.assign(layout.world_size(), std::nullopt);
    record_.set_current_session_id(current_->record().session_id());
    LogInfo("session ", current_->record().session_id(), " opened for job ", job_id_, " step ",
            step);
  }
  v1::SubmitLocalPlanResponse response;
  response.set_session_id(current_->record().session_id());
  if (current_->state() != v1::SESSION_STATE_PLANNING) {
    Fold(now, out);
    result.reply = std::move(response);
    return result;  // a re-submission after a restart or a lost reply
  }
  const uint32_t rank = request.rank();
  if (request.shards_omitted()) {
    // Only a fingerprint: usable if it is this rank's in the job's last plan; the cache may
    // still miss (evicted, or another rank changed), and then planning asks with SEND_PLAN.
    const uint64_t fingerprint = request.local_plan_fingerprint();
    if (rank >= last_plan_fingerprints_.size() || last_plan_fingerprints_[rank] != fingerprint) {
      response.set_send_full_plan(true);
    } else {
      current_->SubmitPlan(rank, std::nullopt, fingerprint, request.held_plan_fingerprint(),
                           request.memory_only(), now, out)
          .IgnoreError();
    }
  } else {
    LocalPlan plan;
    plan.rank = rank;
    plan.shards.reserve(request.shards_size());
    for (v1::ShardDesc& shard : *request.mutable_shards()) plan.shards.push_back(std::move(shard));
    request.clear_shards();
    const uint64_t fingerprint = FingerprintLocalPlan(plan);
    current_->SubmitPlan(rank, std::move(plan), fingerprint, request.held_plan_fingerprint(),
                         request.memory_only(), now, out)
        .IgnoreError();
  }
  Fold(now, out);
  result.reply = std::move(response);
  return result;
}

Effects JobCore::PlanDecided(const std::string& session_id, uint64_t attempt,
                             PlanVerdict verdict, absl::Time now) {
  Effects out;
  if (current_ == nullptr || current_->record().session_id() != session_id) return out;
  current_->PlanDecided(attempt, std::move(verdict), now, out);
  Fold(now, out);
  return out;
}

absl::StatusOr<SessionMachine*> JobCore::Find(const std::string& session_id, uint32_t rank,
                                              Effects& out) {
  if (current_ != nullptr && current_->record().session_id() == session_id) {
    return current_.get();
  }
  for (const v1::Command& final : recent_finals_) {
    if (final.session_id() != session_id) continue;
    // The rank still reports for a session that ended: it missed the verdict (its stream
    // broke, or the replay on reconnect is a later session's). Tell it again.
    v1::Command again = final;
    again.set_seq(CommandSeq(context_.epoch, ++*context_.commands_emitted));
    out.commands.push_back(Outgoing{rank, std::move(again), nullptr});
    return absl::FailedPreconditionError(
        absl::StrCat("session ", session_id, " already ended (",
                     final.has_committed() ? "COMMITTED" : "ABORTED", ")"));
  }
  return absl::NotFoundError(absl::StrCat("job ", job_id_, " has no session ", session_id));
}

void JobCore::RememberFinal(const v1::Command& final) {
  recent_finals_.push_back(final);
  while (recent_finals_.size() > kRecentFinals) recent_finals_.pop_front();
}

template <typename Request, typename Handle>
Outcome<v1::SessionState> JobCore::Report(const Request& request, absl::Time now,
                                          Handle handle) {
  Outcome<v1::SessionState> result;
  absl::StatusOr<SessionMachine*> session =
      Find(request.session_id(), request.rank(), result.effects);
  if (!session.ok()) {
    result.reply = session.status();
    return result;
  }
  result.reply = handle(**session, result.effects);
  Fold(now, result.effects);
  return result;
}

Outcome<v1::SessionState> JobCore::ReportPhase(const v1::ReportPhaseRequest& request,
                                               absl::Time now) {
  return Report(request, now, [&](SessionMachine& session, Effects& out) {
    return session.ReportPhase(request, now, out);
  });
}

Outcome<v1::SessionState> JobCore::ReportChunks(const v1::ReportChunksRequest& request,
                                                absl::Time now) {
  return Report(request, now, [&](SessionMachine& session, Effects& out) {
    return session.ReportChunks(request, now, out);
  });
}

std::optional<absl::Status> JobCore::TakeRefusal(const v1::SubmitLocalPlanRequest& request,
                                                 const MeshLayout& layout, absl::Time now,
                                                 Effects& out) {
  const int64_t step = request.step();
  const uint32_t rank = request.rank();
  const bool planning_this_step = current_ != nullptr && current_->record().step() == step &&
                                  current_->state() == v1::SESSION_STATE_PLANNING;
  const MeshLayout& mesh = mesh_.has_value() ? *mesh_ : layout;
  if (request.has_refusal()) {
    if (current_ != nullptr && current_->record().step() == step && !planning_this_step) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", rank, " refused step ", step, ", whose session ",
          current_->record().session_id(), " is already ", StateName(current_->state()),
          ": the refusal comes too late to change it"));
    }
    v1::ErrorDetail error = request.refusal();
    if (error.code() == v1::ERROR_CODE_UNSPECIFIED) error.set_code(v1::ERROR_CODE_MALFORMED_SHARD);
    error.set_message(absl::StrCat("rank ", rank, " refused its tensors for step ", step, ": ",
                                   request.refusal().message()));
    RecordRefusal(rank, step, std::move(error), mesh, now, out);
    return absl::OkStatus();
  }
  auto it = refusals_.find(step);
  if (it == refusals_.end()) return std::nullopt;
  RefusedStep& refused = it->second;
  if (refused.refusers.erase(rank) > 0 || refused.told.count(rank) > 0) {
    // It refused, or was told, this attempt already: this is a new one (a retry of the step).
    ForgetRefusalOnceAllKnow(step, mesh.world_size());
    return std::nullopt;
  }
  if (refused.refusers.empty()) return std::nullopt;
  const v1::ErrorDetail error = refused.refusers.begin()->second;  // the lowest rank's
  refused.told.insert(rank);
  ForgetRefusalOnceAllKnow(step, mesh.world_size());
  return MakeError(absl::StatusCode::kAborted, error);
}

void JobCore::RecordRefusal(uint32_t rank, int64_t step, v1::ErrorDetail error,
                            const MeshLayout& mesh, absl::Time now, Effects& out) {
  error.clear_ranks();
  if (rank < mesh.world_size()) AddRankRef(mesh, rank, &error);
  LogWarning("job ", job_id_, ": ", error.message());
  RefusedStep& refused = refusals_[step];
  refused.refusers.insert_or_assign(rank, error);
  refused.told.erase(rank);
  while (refusals_.size() > kRecentFinals) refusals_.erase(refusals_.begin());
  if (current_ != nullptr && current_->record().step() == step &&
      current_->state() == v1::SESSION_STATE_PLANNING) {
    // Every rank in PLANNING hears it with the ABORT: told.
    for (uint32_t r : current_->ranks_planned()) refused.told.insert(r);
    current_->AbortPlanning(error, now, out);
    Fold(now, out);
  }
  ForgetRefusalOnceAllKnow(step, mesh.world_size());
}

void JobCore::ForgetRefusalOnceAllKnow(int64_t step, uint32_t world) {
  auto it = refusals_.find(step);
  if (it == refusals_.end()) return;
  const RefusedStep& refused = it->second;
  for (uint32_t r = 0; r < world; ++r) {
    if (refused.refusers.count(r) == 0 && refused.told.count(r) == 0) return;
  }
  refusals_.erase(it);
}

Effects JobCore::AgentsChanged(const std::vector<AgentLiveness>& verdicts, absl::Time now) {
  Effects out;
  const std::vector<uint32_t> restarted = agents_.Apply(verdicts);
  // A restarted agent is a new trainer run: what an earlier one refused is no reason now.
  if (!restarted.empty()) refusals_.clear();
  if (current_ == nullptr) return out;
  for (uint32_t rank : restarted) current_->AgentRestarted(rank, now, out);
  current_->Tick(now, out);
  Fold(now, out);
  return out;
}

Outcome<v1::SessionStatus> JobCore::OperatorAbort(const std::string& reason, absl::Time now) {
  Outcome<v1::SessionStatus> result;
  if (current_ == nullptr) {
    result.reply = last_ended_.has_value()
                       ? absl::FailedPreconditionError(
                             absl::StrCat("session ", last_ended_->session_id(),
                                          " already ended (", StateName(last_ended_->state()),
                                          ")"))
                       : absl::NotFoundError(absl::StrCat("job ", job_id_, " has no session"));
    return result;
  }
  if (absl::Status aborted = current_->OperatorAbort(reason, now, result.effects); !aborted.ok()) {
    result.reply = aborted;
    return result;
  }
  Fold(now, result.effects);
  result.reply = *last_ended_;
  return result;
}

Effects JobCore::Tick(absl::Time now) {
  Effects out;
  if (current_ == nullptr) return out;
  current_->Tick(now, out);
  Fold(now, out);
  return out;
}

Effects JobCore::CommitResolved(const std::string& session_id,
                                const CommitResolution& resolution, absl::Time now) {
  Effects out;
  if (current_ == nullptr || current_->record().session_id() != session_id) return out;
  current_->CommitResolved(resolution, now, out);
  Fold(now, out);
  return out;
}

void JobCore::Delivered(const std::vector<Outgoing>& commands) {
  for (const Outgoing& o : commands) {
    if (last_final_.has_value() && o.command.session_id() == last_final_->session_id()) {
      last_final_durable_ = true;  // delivered after the write that ended the session
    }
    if (current_ == nullptr || o.command.session_id() != current_->record().session_id() ||
        o.rank >= latest_.size() || o.command.has_resend()) {
      continue;  // an ended session's commands are replayed as last_final_
    }
    if (!latest_[o.rank].has_value() || latest_[o.rank]->command.seq() < o.command.seq()) {
      latest_[o.rank] = o;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Folding session transitions into the job

void JobCore::Fold(absl::Time now, Effects& out) {
  if (current_ == nullptr) return;
  const v1::SessionRecord& session = current_->record();
  const bool transitioned = out.persisted_state != v1::SESSION_STATE_UNSPECIFIED;
  if (!transitioned) return;
  if (out.persisted_state == v1::SESSION_STATE_PINNING) {
    last_plan_fingerprints_ = current_->plan()->rank_fingerprints;
    if (record_.plan_fingerprint() != session.plan_fingerprint()) {
      PutPlan(out.batch, job_id_, *current_->plan());
      record_.set_plan_fingerprint(session.plan_fingerprint());
    }
  }
  if (current_->ended()) {
    record_.clear_current_session_id();
    record_.set_last_session_id(session.session_id());
    if (session.state() == v1::SESSION_STATE_COMMITTED && session.memory_only()) {
      // The newest commit, in memory only: the disk's records stay as they are.
      memory_checkpoint_ = MakeMemoryCheckpoint(
          *current_->manifest(), session,
          static_cast<uint32_t>(current_->plan()->tensors.size()), absl::ToUnixMillis(now));
      PutMemoryCheckpoint(out.batch, job_id_, *memory_checkpoint_);
      out.memory_committed = session.session_id();
    } else if (session.state() == v1::SESSION_STATE_COMMITTED) {
      if (memory_checkpoint_.has_value()) {
        // Superseded: the agents' memory holds this newer commit now.
        DeleteMemoryCheckpoint(out.batch, job_id_);
        memory_checkpoint_.reset();
      }
      v1::CheckpointInfo info;
      info.set_step(session.step());
      info.set_dir(session.checkpoint_dir());
      info.set_session_id(session.session_id());
      info.set_bytes(session.bytes_total());
      info.set_tensors(static_cast<uint32_t>(current_->plan()->tensors.size()));
      info.set_chunks(session.chunks_total());
      info.set_committed_unix_ms(absl::ToUnixMillis(now));
      const std::vector<int64_t> retire = RetireSteps(checkpoints_, context_.options->keep_last);
      record_.set_latest_committed_step(std::max(record_.latest_committed_step(), session.step()));
      PutCheckpoint(out.batch, job_id_, info);
      for (int64_t step : retire) DeleteCheckpoint(out.batch, job_id_, step);
      checkpoints_.erase(std::remove_if(checkpoints_.begin(), checkpoints_.end(),
                                        [&](const v1::CheckpointInfo& c) {
                                          return std::find(retire.begin(), retire.end(),
                                                           c.step()) != retire.end();
                                        }),
                         checkpoints_.end());
      checkpoints_.insert(checkpoints_.begin(), std::move(info));
      // Pending until a retention says it removed them: with what earlier retentions left
      // undone (a crash, an I/O error). The commit's retire_steps already included those.
      std::vector<int64_t> pending =
          StepUnion({record_.retention_pending().begin(), record_.retention_pending().end()},
                    retire);
      if (!context_.options->coordinator_commits && current_->retention_complete()) {
        pending.clear();  // the committer agent removed them all
      }
      *record_.mutable_retention_pending() = {pending.begin(), pending.end()};
      if (context_.options->coordinator_commits) out.retention = PendingRetention(session.step());
    }
    last_final_ = Final(session);
    last_final_durable_ = false;  // until the shell delivers it, after this batch's write
    RememberFinal(*last_final_);
    last_final_seqs_.assign(latest_.size(), 0);
    for (const Outgoing& o : out.commands) {
      if (o.command.session_id() == session.session_id() && o.rank < last_final_seqs_.size() &&
          (o.command.has_abort() || o.command.has_committed())) {
        last_final_seqs_[o.rank] = o.command.seq();
      }
    }
    record_.add_recent_session_ids(session.session_id());
    while (static_cast<size_t>(record_.recent_session_ids_size()) > kRecentFinals) {
      record_.mutable_recent_session_ids()->erase(record_.mutable_recent_session_ids()->begin());
    }
    last_ended_ = current_->Status();
    current_.reset();
    latest_.clear();
  }
  PutJob(out.batch, record_);
}

RetentionWork JobCore::PendingRetention(int64_t committed_step) const {
  return RetentionWork{JobDirPath(context_.options->storage_root, job_id_),
                       {record_.retention_pending().begin(), record_.retention_pending().end()},
                       committed_step};
}

Effects JobCore::RetentionDone(const std::vector<int64_t>& retired) {
  Effects out;
  auto* pending = record_.mutable_retention_pending();
  const int before = pending->size();
  pending->erase(std::remove_if(pending->begin(), pending->end(),
                                [&](int64_t step) {
                                  return std::find(retired.begin(), retired.end(), step) !=
                                         retired.end();
                                }),
                 pending->end());
  if (pending->size() != before) PutJob(out.batch, record_);
  return out;
}

v1::Command JobCore::Final(const v1::SessionRecord& session) {
  v1::Command final;
  final.set_session_id(session.session_id());
  final.set_step(session.step());
  final.set_seq(CommandSeq(context_.epoch, ++*context_.commands_emitted));
  if (session.state() == v1::SESSION_STATE_COMMITTED) {
    SetCommitted(session, &final);
  } else {
    *final.mutable_abort()->mutable_error() = session.error();
  }
  return final;
}

// ---------------------------------------------------------------------------------------------
// Reads

std::optional<Outgoing> JobCore::CurrentCommand(uint32_t rank) const {
  if (current_ == nullptr) {
    if (!last_final_.has_value() || !last_final_durable_) return std::nullopt;
    Outgoing replay{rank, *last_final_, nullptr};
    if (rank < last_final_seqs_.size() && last_final_seqs_[rank] != 0) {
      replay.command.set_seq(last_final_seqs_[rank]);
    }
    return replay;
  }
  if (rank >= latest_.size()) return std::nullopt;
  return latest_[rank];
}

std::optional<v1::SessionStatus> JobCore::GetSession(const std::string& session_id) const {
  if (current_ != nullptr &&
      (session_id.empty() || current_->record().session_id() == session_id)) {
    return current_->Status();
  }
  if (last_ended_.has_value() && (session_id.empty() || last_ended_->session_id() == session_id)) {
    return *last_ended_;
  }
  return std::nullopt;
}

v1::JobInfo JobCore::Info() const {
  v1::JobInfo info;
  info.set_job_id(job_id_);
  *info.mutable_layout() = record_.layout();
  if (mesh_.has_value()) info.set_world_size(mesh_->world_size());
  info.set_latest_committed_step(record_.latest_committed_step());
  if (current_ != nullptr) {
    info.set_current_session_id(current_->record().session_id());
    info.set_current_state(current_->state());
  }
  return info;
}

bool JobCore::trainers_blocked() const {
  if (current_ == nullptr) return false;
  switch (current_->state()) {
    case v1::SESSION_STATE_PLANNING:
    case v1::SESSION_STATE_PINNING:
    case v1::SESSION_STATE_COPYING:
      return true;
    default:
      return false;
  }
}

absl::Time JobCore::next_tick() const {
  return current_ != nullptr ? current_->next_tick() : absl::InfiniteFuture();
}

}  // namespace tessera
