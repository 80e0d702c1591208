// SessionMachine, part 1 of 2: construction, recovery and the events (what the shell tells the
// machine). Part 2, session_transitions.cc, holds the transitions and their helpers; the state
// diagram and the rules are in session_machine.h.
#include "server/session/session_machine.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/ids.h"
#include "common/log.h"
#include "common/status.h"
#include "server/session/memory_only.h"
#include "server/session/status_view.h"

namespace tessera {
namespace {

// The session state in which an agent reports `phase`.
v1::SessionState StateOfPhase(v1::AgentPhase phase) {
  switch (phase) {
    case v1::AGENT_PHASE_PINNED:
      return v1::SESSION_STATE_PINNING;
    case v1::AGENT_PHASE_STAGED:
      return v1::SESSION_STATE_COPYING;
    case v1::AGENT_PHASE_GATHERED:
    case v1::AGENT_PHASE_PERSISTED:
      return v1::SESSION_STATE_PERSISTING;
    case v1::AGENT_PHASE_COMMIT_WRITTEN:
    case v1::AGENT_PHASE_COMMIT_ROLLED_BACK:
      return v1::SESSION_STATE_COMMITTING;
    default:
      return v1::SESSION_STATE_UNSPECIFIED;
  }
}

bool HasError(const v1::ReportPhaseRequest& request) {
  return request.has_error() && request.error().code() != v1::ERROR_CODE_UNSPECIFIED;
}

}  // namespace

std::vector<int64_t> StepUnion(std::vector<int64_t> a, const std::vector<int64_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  std::sort(a.begin(), a.end());
  a.erase(std::unique(a.begin(), a.end()), a.end());
  return a;
}

void SetCommitted(const v1::SessionRecord& session, v1::Command* command) {
  v1::CommittedCommand* committed = command->mutable_committed();
  committed->set_checkpoint_dir(session.checkpoint_dir());
  committed->set_memory_only(session.memory_only());
}

std::vector<int64_t> RetireSteps(const std::vector<v1::CheckpointInfo>& checkpoints,
                                 int keep_last) {
  std::vector<int64_t> retire;
  if (keep_last <= 0) return retire;
  // The committing step becomes the newest: keep_last - 1 of the others stay.
  for (size_t i = static_cast<size_t>(keep_last) - 1; i < checkpoints.size(); ++i) {
    retire.push_back(checkpoints[i].step());
  }
  return retire;
}

std::vector<int64_t> SessionMachine::DirectoriesToRetire() const {
  std::vector<int64_t> pending;
  if (context_.retention_pending != nullptr) {
    pending.assign(context_.retention_pending->begin(), context_.retention_pending->end());
  }
  return StepUnion(RetireSteps(*context_.checkpoints, context_.options->keep_last), pending);
}

// ---------------------------------------------------------------------------------------------
// Construction and recovery

SessionMachine::SessionMachine(SessionContext context, v1::SessionRecord record, absl::Time now)
    : context_(std::move(context)),
      record_(std::move(record)),
      phase_started_(now),
      ranks_(context_.mesh.world_size()),
      held_(context_.mesh.world_size(), 0),
      commit_backoff_(context_.options->commit_retry_initial) {}

SessionMachine::SessionMachine(SessionContext context, std::string session_id, int64_t step,
                               bool memory_only, absl::Time now, Effects& out)
    : SessionMachine(std::move(context), v1::SessionRecord(), now) {
  record_.set_session_id(std::move(session_id));
  record_.set_job_id(context_.job_id);
  record_.set_step(step);
  record_.set_started_unix_ms(absl::ToUnixMillis(now));
  record_.set_memory_only(memory_only);
  if (!memory_only) {  // a memory-only save writes no directory
    record_.set_tmp_dir(
        TmpDirPath(context_.options->storage_root, context_.job_id, step, record_.session_id()));
  }
  EnterState(v1::SESSION_STATE_PLANNING, now, out);
}

absl::StatusOr<std::unique_ptr<SessionMachine>> SessionMachine::Recover(
    SessionContext context, v1::SessionRecord record, std::shared_ptr<const GlobalPlan> plan,
    std::shared_ptr<const v1::Manifest> manifest, absl::Time now, Effects& out) {
  const v1::SessionState state = record.state();
  std::unique_ptr<SessionMachine> s(new SessionMachine(std::move(context), std::move(record), now));
  const std::string& id = s->record_.session_id();
  if (state != v1::SESSION_STATE_PLANNING) {
    if (plan == nullptr || plan->assignments.size() != s->world() ||
        plan->peers.size() != s->world()) {
      return absl::DataLossError(
          absl::StrCat("the plan of session ", id, " does not match its job's mesh"));
    }
    s->plan_ = std::move(plan);
    s->ledger_ = std::make_unique<ChunkLedger>(s->plan_);
    // Everyone completed the phases before the current one.
    for (RankProgress& p : s->ranks_) {
      p.reached = static_cast<v1::SessionState>(static_cast<int>(state) - 1);
    }
    if (state != v1::SESSION_STATE_COMMITTING) s->MarkWritesWhenStaged();
  }
  if (state == v1::SESSION_STATE_COMMITTING) {
    if (manifest == nullptr || manifest->session_id() != id) {
      return absl::DataLossError(absl::StrCat("the manifest of session ", id, " is missing"));
    }
    s->manifest_ = std::move(manifest);
    s->retire_steps_ = s->DirectoriesToRetire();
  }
  s->EmitCurrentPhaseCommands(out);
  return s;
}

void SessionMachine::EmitCurrentPhaseCommands(Effects& out) {
  v1::Command resend;
  resend.mutable_resend();
  Broadcast(resend, out);
  switch (state()) {
    case v1::SESSION_STATE_PINNING:
      for (uint32_t r = 0; r < world(); ++r) EmitPin(r, out);
      break;
    case v1::SESSION_STATE_COPYING: {
      v1::Command c;
      c.mutable_copy();
      Broadcast(c, out);
      break;
    }
    case v1::SESSION_STATE_PERSISTING:
      EmitGathers(out);
      break;
    case v1::SESSION_STATE_COMMITTING:
      RequestCommit(phase_started_, out);
      break;
    default:
      break;
  }
}

// ---------------------------------------------------------------------------------------------
// Events

absl::Status SessionMachine::SubmitPlan(uint32_t rank, std::optional<LocalPlan> plan,
                                        uint64_t fingerprint, uint64_t held, bool memory_only,
                                        absl::Time now, Effects& out) {
  if (state() != v1::SESSION_STATE_PLANNING) {
    return absl::FailedPreconditionError(
        absl::StrCat("session ", record_.session_id(), " is past PLANNING"));
  }
  held_[rank] = held;
  auto [it, fresh] = submissions_.try_emplace(rank);
  Submission& sub = it->second;
  const bool changed = fresh || sub.fingerprint != fingerprint;
  const bool supplied = plan.has_value() && awaiting_shards_.erase(rank) > 0;
  const bool kind_changed = !fresh && sub.memory_only != memory_only;
  if (changed) sub.plan.reset();
  sub.fingerprint = fingerprint;
  if (plan.has_value()) sub.plan = std::move(plan);
  sub.memory_only = memory_only;
  out.changed = true;
  if (submissions_.size() < world() || !awaiting_shards_.empty()) return absl::OkStatus();
  // A repeated submission of the same plan (a re-send after a lost reply or a reconnection)
  // changes nothing: the attempt out, or the verdict given, stands.
  if (!changed && !supplied && !kind_changed && plan_attempt_ > 0) return absl::OkStatus();
  // Once per plan attempt, not per re-send: it looks at every rank's agent.
  std::map<uint32_t, bool> asked;
  for (const auto& [r, s] : submissions_) asked[r] = s.memory_only;
  if (std::optional<v1::ErrorDetail> refused =
          MemoryOnlyRefusal(record_.memory_only(), asked, *context_.agents, context_.mesh)) {
    Abort(*std::move(refused), now, out);
    return absl::OkStatus();
  }
  PlanWork work;
  work.job_id = context_.job_id;
  work.session_id = record_.session_id();
  work.attempt = ++plan_attempt_;
  work.layout = context_.mesh;
  // The shards move into the work, not copied (a million of them at scale); a verdict that
  // needs more shards gives them back.
  for (auto& [r, s] : submissions_) {
    work.fingerprints.push_back(s.fingerprint);
    if (s.plan.has_value()) {
      work.plans.push_back(*std::move(s.plan));
      s.plan.reset();
    }
  }
  planning_ = true;
  out.plan = std::move(work);
  return absl::OkStatus();
}

void SessionMachine::PlanDecided(uint64_t attempt, PlanVerdict verdict, absl::Time now,
                                 Effects& out) {
  if (state() != v1::SESSION_STATE_PLANNING || !planning_ || attempt != plan_attempt_) return;
  planning_ = false;
  if (!verdict.missing.empty()) {
    for (LocalPlan& p : verdict.plans) {
      auto it = submissions_.find(p.rank);
      if (it != submissions_.end() && !it->second.plan.has_value()) {
        it->second.plan = std::move(p);
      }
    }
    LogInfo("session ", record_.session_id(), ": no cached plan matches; asking ",
            verdict.missing.size(), " rank(s) that sent only a fingerprint for their shards");
    for (uint32_t r : verdict.missing) {
      awaiting_shards_.insert(r);
      v1::Command c;
      c.mutable_send_plan();
      Emit(r, std::move(c), out);
    }
    return;
  }
  if (!verdict.plan.ok()) {
    std::optional<v1::ErrorDetail> detail = GetErrorDetail(verdict.plan.status());
    LogWarning("plan of session ", record_.session_id(), " rejected: ",
               verdict.plan.status().message());
    Abort(detail.has_value()
              ? *detail
              : Detail(v1::ERROR_CODE_INTERNAL,
                       absl::StrCat("planning failed: ", verdict.plan.status().message())),
          now, out);
    return;
  }
  BeginPinning(*std::move(verdict.plan), verdict.cached, now, out);
}

absl::StatusOr<v1::SessionState> SessionMachine::ReportPhase(
    const v1::ReportPhaseRequest& request, absl::Time now, Effects& out) {
  const uint32_t rank = request.rank();
  if (rank >= world()) return absl::InvalidArgumentError("rank outside the mesh");
  const bool committing = state() == v1::SESSION_STATE_COMMITTING;
  const bool from_committer = record_.committer_is_agent() && record_.committer_rank() == rank;

  if (committing) {
    // COMMIT_WRITTEN is a fact about the disk (the final directory holds this session's
    // manifest, durably), whoever resolved it: a committer replaced meanwhile, or the one a
    // reloaded coordinator no longer remembers (the committer is not persisted when it
    // changes). A rollback counts only from the committer asked to do it.
    if (request.phase() == v1::AGENT_PHASE_COMMIT_WRITTEN && record_.committer_is_agent()) {
      retention_complete_ = request.retention_complete();
      MarkCommitted(now, out);
      return state();
    }
    if (!from_committer) {
      // Every chunk is written and reported; nothing else another rank says changes the commit.
      if (HasError(request)) {
        LogWarning("ignoring an error report of rank ", rank, " during COMMITTING: ",
                   request.error().message());
      }
      return state();
    }
    if (request.phase() == v1::AGENT_PHASE_COMMIT_ROLLED_BACK) {
      v1::ErrorDetail error = request.error();
      if (error.code() == v1::ERROR_CODE_UNSPECIFIED) error.set_code(v1::ERROR_CODE_IO_ERROR);
      AddRankRef(context_.mesh, rank, &error);
      EndRolledBack(std::move(error), now, out);
    } else if (HasError(request)) {
      // A committer retries an unresolved commit without a word; it reports an error only
      // when it refused the COMMIT (agent/save/save_core.h R4: a directory is not the one it
      // computes, so it touched nothing), and it acts on no later COMMIT of the session.
      // Another committer is asked, if there is one.
      refused_commit_.insert(rank);
      LogWarning("committer rank ", rank, " refused the commit of session ",
                 record_.session_id(), ": ", request.error().message());
      if (PickCommitter()) {
        LogWarning("rank ", record_.committer_rank(), " commits session ",
                   record_.session_id(), " instead");
        RequestCommit(now, out);
      } else {
        LogError("no other live agent with the storage root mounted can commit session ",
                 record_.session_id(), "; it stays COMMITTING until one registers or the "
                 "agent of rank ", rank, " restarts");
      }
    }
    return state();
  }

  if (HasError(request)) {
    v1::ErrorDetail error = request.error();
    if (error.ranks().empty()) AddRankRef(context_.mesh, rank, &error);
    Abort(std::move(error), now, out);
    return state();
  }
  const v1::SessionState phase_state = StateOfPhase(request.phase());
  if (phase_state == v1::SESSION_STATE_UNSPECIFIED) {
    return absl::InvalidArgumentError("phase is unspecified");
  }
  if (phase_state > state()) {
    const v1::SessionState after = AheadAfter(rank, request.phase());
    if (after == v1::SESSION_STATE_UNSPECIFIED) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", rank, " reported ", v1::AgentPhase_Name(request.phase()),
                       " while the session is ", StateName(state())));
    }
    // The agent re-sends its reports in order: one ahead of its predecessor comes again.
    if (ranks_[rank].reached < after) {
      return absl::UnavailableError(
          absl::StrCat("rank ", rank, " reported ", v1::AgentPhase_Name(request.phase()),
                       " before its ", StateName(after), " report was counted"));
    }
  }
  if (phase_state < state()) return state();  // an earlier phase re-reported: counted already
  RankProgress& p = ranks_[rank];
  switch (request.phase()) {
    case v1::AGENT_PHASE_PINNED:
      // A report re-sent after a later one that came ahead of the session does not move the
      // rank back.
      p.reached = std::max(p.reached, phase_state);
      p.pinned_bytes = request.pinned_bytes();
      break;
    case v1::AGENT_PHASE_STAGED:
      if (p.reached < phase_state) {
        ++out.stats.trainer_stall.count;
        out.stats.trainer_stall.seconds += request.trainer_stall_ns() / 1e9;
      }
      p.reached = std::max(p.reached, phase_state);
      p.stall_ns = request.trainer_stall_ns();
      break;
    case v1::AGENT_PHASE_GATHERED:
      p.gathered = true;
      break;
    case v1::AGENT_PHASE_PERSISTED:
      p.gathered = true;
      if (!p.persisted && p.persist_sent && CountsAsWriter(rank) && writers_active_ > 0) {
        --writers_active_;
      }
      p.persisted = true;
      p.reached = phase_state;
      p.write_ns = request.write_ns();
      if (request.write_started_unix_ms() > 0 &&
          (record_.writes_began_unix_ms() == 0 ||
           request.write_started_unix_ms() < record_.writes_began_unix_ms())) {
        record_.set_writes_began_unix_ms(request.write_started_unix_ms());
      }
      break;
    default:
      break;
  }
  out.changed = true;
  Advance(now, out);
  return state();
}

absl::StatusOr<v1::SessionState> SessionMachine::ReportChunks(
    const v1::ReportChunksRequest& request, absl::Time now, Effects& out) {
  const uint32_t rank = request.rank();
  if (rank >= world()) return absl::InvalidArgumentError("rank outside the mesh");
  if (state() == v1::SESSION_STATE_COMMITTING) return state();  // a re-send: all are in
  if (state() != v1::SESSION_STATE_PERSISTING && !WritingAhead(rank)) {
    return absl::FailedPreconditionError(
        absl::StrCat("chunks reported while the session is ", StateName(state())));
  }
  for (const v1::ChunkReport& report : request.chunks()) {
    ASSIGN_OR_RETURN(bool first, ledger_->RecordChunk(rank, report));
    if (first) {
      ranks_[rank].bytes_written += report.chunk().nbytes();
      ++ranks_[rank].chunks_reported;
    }
  }
  for (const v1::ReplicaHash& hash : request.hashes()) ledger_->RecordHash(rank, hash);
  out.changed = true;
  Advance(now, out);
  return state();
}

void SessionMachine::AgentRestarted(uint32_t rank, absl::Time now, Effects& out) {
  if (ended() || rank >= world()) return;
  if (state() == v1::SESSION_STATE_COMMITTING) {
    // A new process checks a COMMIT afresh, whatever its previous life refused.
    refused_commit_.erase(rank);
    // A restarted committer can simply commit again (the commit is idempotent).
    if (record_.committer_is_agent() && record_.committer_rank() == rank) {
      RequestCommit(now, out);
    }
    return;
  }
  v1::ErrorDetail error =
      Detail(v1::ERROR_CODE_AGENT_LOST,
             absl::StrCat("the agent of rank ", rank, " restarted during ", StateName(state()),
                          "; its staged data is gone"));
  AddRankRef(context_.mesh, rank, &error);
  Abort(std::move(error), now, out);
}

absl::Status SessionMachine::OperatorAbort(const std::string& reason, absl::Time now,
                                           Effects& out) {
  if (ended()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "session ", record_.session_id(), " already ended (", StateName(state()), ")"));
  }
  if (state() == v1::SESSION_STATE_COMMITTING) {
    return absl::FailedPreconditionError(absl::StrCat(
        "session ", record_.session_id(),
        " is COMMITTING: its checkpoint may already be in place, so it can no longer be "
        "aborted; it ends COMMITTED, or ABORTED once the commit is rolled back"));
  }
  Abort(Detail(v1::ERROR_CODE_ABORTED_BY_USER,
               reason.empty() ? "aborted by an operator"
                              : absl::StrCat("aborted by an operator: ", reason)),
        now, out);
  return absl::OkStatus();
}

void SessionMachine::AbortPlanning(v1::ErrorDetail error, absl::Time now, Effects& out) {
  if (state() == v1::SESSION_STATE_PLANNING) Abort(std::move(error), now, out);
}

void SessionMachine::Tick(absl::Time now, Effects& out) {
  if (ended()) return;
  const v1::SessionState s = state();

  if (s == v1::SESSION_STATE_COMMITTING) {
    if (record_.committer_is_agent()) {
      const uint32_t before = record_.committer_rank();
      if (CommitterLost() && PickCommitter() && record_.committer_rank() != before) {
        LogWarning("committer rank ", before, " lost; rank ", record_.committer_rank(),
                   " commits session ", record_.session_id());
        RequestCommit(now, out);
      } else if (now >= deadline() && !roll_back_requested_) {
        RequestCommit(now, out);  // asks for a roll-back unless the commit completes
      } else if (now >= next_commit_attempt_) {
        RequestCommit(now, out);  // in case the committer lost the command
      }
    } else if (!commit_in_flight_ && now >= next_commit_attempt_) {
      RequestCommit(now, out);
    }
    return;
  }

  if (std::vector<uint32_t> lost = context_.agents->Lost(world()); !lost.empty()) {
    Abort(LostError(lost, s), now, out);
    return;
  }
  if (now > deadline()) {
    v1::ErrorDetail error =
        Detail(v1::ERROR_CODE_TIMEOUT, absl::StrCat(StateName(s), " did not finish within ",
                                                    absl::FormatDuration(PhaseTimeout())));
    std::vector<uint32_t> waiting;
    for (uint32_t r = 0; r < world(); ++r) {
      const bool done = s == v1::SESSION_STATE_PLANNING ? submissions_.count(r) > 0
                        : s == v1::SESSION_STATE_PERSISTING ? ranks_[r].persisted
                                                            : ranks_[r].reached >= s;
      if (!done) waiting.push_back(r);
    }
    if (!waiting.empty()) {
      absl::StrAppend(error.mutable_message(), "; waiting for rank",
                      waiting.size() > 1 ? "s " : " ", absl::StrJoin(waiting, ", "));
      for (uint32_t r : waiting) AddRankRef(context_.mesh, r, &error);
    }
    Abort(std::move(error), now, out);
  }
}

void SessionMachine::CommitResolved(const CommitResolution& resolution, absl::Time now,
                                    Effects& out) {
  if (state() != v1::SESSION_STATE_COMMITTING || record_.committer_is_agent()) return;
  commit_in_flight_ = false;
  switch (resolution.outcome) {
    case CommitOutcome::kCommitted:
      MarkCommitted(now, out);
      return;
    case CommitOutcome::kRolledBack: {
      std::optional<v1::ErrorDetail> detail = GetErrorDetail(resolution.status);
      v1::ErrorDetail error = detail.has_value() ? *detail : v1::ErrorDetail();
      if (error.code() == v1::ERROR_CODE_UNSPECIFIED) error.set_code(v1::ERROR_CODE_IO_ERROR);
      error.set_message(now >= deadline()
                            ? absl::StrCat("COMMITTING did not finish within ",
                                           absl::FormatDuration(PhaseTimeout()), ": ",
                                           resolution.status.message())
                            : std::string(resolution.status.message()));
      if (now >= deadline() && error.code() == v1::ERROR_CODE_IO_ERROR) {
        error.set_code(v1::ERROR_CODE_TIMEOUT);
      }
      EndRolledBack(std::move(error), now, out);
      return;
    }
    case CommitOutcome::kUnresolved:
      LogWarning("commit of ", record_.session_id(), " unresolved, will retry: ",
                 resolution.status.ToString());
      ScheduleCommitRetry(now);
      return;
  }
}

}  // namespace tessera
