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
#include "server/session/schema.h"
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

// ---------------------------------------------------------------------------------------------
// Transitions

void SessionMachine::Advance(absl::Time now, Effects& out) {
  auto all = [&](auto pred) { return std::all_of(ranks_.begin(), ranks_.end(), pred); };
  switch (state()) {
    case v1::SESSION_STATE_PINNING:
      if (!all([](const RankProgress& p) { return p.reached >= v1::SESSION_STATE_PINNING; })) {
        break;
      }
      BeginCopying(now, out);
      // Trainers that copied when pinned may all be done already: on to PERSISTING.
      [[fallthrough]];
    case v1::SESSION_STATE_COPYING:
      if (all([](const RankProgress& p) { return p.reached >= v1::SESSION_STATE_COPYING; })) {
        BeginPersisting(now, out);
      }
      break;
    case v1::SESSION_STATE_PERSISTING:
      HandOutPersist(out);
      if (all([](const RankProgress& p) { return p.persisted; }) && ledger_->complete()) {
        BeginCommitting(now, out);
      }
      break;
    default:
      break;
  }
}

void SessionMachine::BeginPinning(std::shared_ptr<const GlobalPlan> plan, bool cached,
                                  absl::Time now, Effects& out) {
  submissions_.clear();
  awaiting_shards_.clear();
  plan_ = std::move(plan);
  ledger_ = std::make_unique<ChunkLedger>(plan_);
  record_.set_plan_fingerprint(plan_->fingerprint);
  record_.set_plan_cached(cached);
  record_.set_bytes_total(plan_->total_bytes);
  record_.set_chunks_total(ledger_->chunks_total());
  // Trainers copy when their own agent pinned if the coordinator allows it and every agent
  // follows that PIN field (RegisterAgentRequest.copies_when_pinned; an older one waits for
  // COPY). Decided once, kept in the record: a restart in PINNING sends the same PINs.
  record_.set_copy_when_pinned(
      context_.options->copy_when_pinned &&
      context_.agents->EveryRegistered(world(), &AgentLiveness::copies_when_pinned));
  // Ranks that exchange no DP slices write once their trainer's copy is staged, if the
  // coordinator allows it, the save goes to disk and every agent follows that PIN field: as
  // many writers as the writer bound admits at once. Decided once, kept in the record.
  const bool write_when_staged =
      context_.options->write_when_staged && !record_.memory_only() &&
      context_.agents->EveryRegistered(world(), &AgentLiveness::writes_when_staged);
  record_.set_write_when_staged_writers(
      write_when_staged ? context_.options->max_concurrent_writers : 0);
  MarkWritesWhenStaged();
  EnterState(v1::SESSION_STATE_PINNING, now, out);
  LogInfo("session ", record_.session_id(), ": plan ", cached ? "reused" : "validated", " (",
          ledger_->chunks_total(), " chunks, ", plan_->total_bytes, " bytes); PINNING");
  for (uint32_t r = 0; r < world(); ++r) EmitPin(r, out);
}

void SessionMachine::EmitPin(uint32_t rank, Effects& out) {
  v1::Command c;
  v1::PinCommand* pin = c.mutable_pin();
  pin->set_plan_cached(record_.plan_cached());
  pin->set_copy_when_pinned(record_.copy_when_pinned());
  pin->set_write_when_staged(ranks_[rank].writes_when_staged);
  pin->set_plan_fingerprint(plan_->fingerprint);
  if (plan_->fingerprint != 0 && held_[rank] == plan_->fingerprint) {
    pin->set_assignment_omitted(true);  // the agent holds it: 8 bytes instead of the plan
    Emit(rank, std::move(c), out);
  } else {
    Emit(rank, std::move(c), out, plan_);
  }
}

void SessionMachine::BeginCopying(absl::Time now, Effects& out) {
  EnterState(v1::SESSION_STATE_COPYING, now, out);
  if (record_.copy_when_pinned()) return;  // the PIN said so: trainers are copying
  v1::Command c;
  c.mutable_copy();
  Broadcast(c, out);
}

void SessionMachine::BeginPersisting(absl::Time now, Effects& out) {
  for (uint32_t r = 0; r < world(); ++r) {
    if (const AgentLiveness& agent = (*context_.agents)[r]; agent.incarnation != 0) {
      (*record_.mutable_peer_addresses())[r] = agent.peer_address;
    }
  }
  EnterState(v1::SESSION_STATE_PERSISTING, now, out);
  EmitGathers(out);
}

void SessionMachine::BeginCommitting(absl::Time now, Effects& out) {
  v1::ErrorDetail diverged = ledger_->CheckReplicas(context_.mesh);
  if (diverged.code() != v1::ERROR_CODE_UNSPECIFIED) {
    Abort(std::move(diverged), now, out);
    return;
  }
  if (!record_.memory_only() && !context_.options->coordinator_commits) {
    record_.set_committer_is_agent(true);
    if (!PickCommitter()) {
      Abort(Detail(v1::ERROR_CODE_IO_ERROR,
                   "no live agent has the storage root mounted to commit the checkpoint"),
            now, out);
      return;
    }
  }
  manifest_ = std::make_shared<const v1::Manifest>(
      ledger_->BuildManifest(context_.job_id, record_.step(), record_.session_id(),
                             context_.layout, absl::ToUnixMillis(now)));
  if (record_.memory_only()) {
    // 8: nothing to write. JobCore records the manifest (MemoryCheckpointRecord) in the batch
    // that records COMMITTED.
    MarkCommitted(now, out);
    return;
  }
  retire_steps_ = DirectoriesToRetire();
  record_.set_checkpoint_dir(
      StepDirPath(context_.options->storage_root, context_.job_id, record_.step()));
  PutManifest(out.batch, *manifest_);
  EnterState(v1::SESSION_STATE_COMMITTING, now, out);
  RequestCommit(now, out);
}

void SessionMachine::MarkCommitted(absl::Time now, Effects& out) {
  ++out.stats.commits;
  out.stats.bytes_committed += record_.bytes_total();
  LogInfo("session ", record_.session_id(), ": COMMITTED step ", record_.step(),
          record_.memory_only() ? " in the agents' memory only"
                                : absl::StrCat(" at ", record_.checkpoint_dir()));
  v1::Command c;
  End(v1::SESSION_STATE_COMMITTED, std::move(c), now, out);
}

void SessionMachine::Abort(v1::ErrorDetail error, absl::Time now, Effects& out) {
  if (ended() || state() == v1::SESSION_STATE_COMMITTING) {
    // The commit edge: nothing but a proven rollback (EndRolledBack) ends COMMITTING.
    LogError("session ", record_.session_id(), ": refusing to abort in ", StateName(state()),
             ": ", error.message());
    return;
  }
  LogWarning("session ", record_.session_id(), " of job ", context_.job_id, " ABORTED in ",
             StateName(state()), ": ", ErrorCodeName(error.code()), ": ", error.message());
  if (context_.options->coordinator_commits && !record_.tmp_dir().empty()) {
    out.remove_dirs.push_back(record_.tmp_dir());
  }
  v1::Command c;
  *c.mutable_abort()->mutable_error() = error;
  *record_.mutable_error() = std::move(error);
  End(v1::SESSION_STATE_ABORTED, std::move(c), now, out);
}

void SessionMachine::EndRolledBack(v1::ErrorDetail error, absl::Time now, Effects& out) {
  if (state() != v1::SESSION_STATE_COMMITTING) return;
  LogWarning("session ", record_.session_id(), " of job ", context_.job_id,
             " rolled back in COMMITTING: ", ErrorCodeName(error.code()), ": ",
             error.message());
  // The coordinator renamed it back (or never renamed it); it is removed like any aborted
  // session's. A committer agent removes its own.
  if (!record_.committer_is_agent()) out.remove_dirs.push_back(record_.tmp_dir());
  v1::Command c;
  *c.mutable_abort()->mutable_error() = error;
  *record_.mutable_error() = std::move(error);
  End(v1::SESSION_STATE_ABORTED, std::move(c), now, out);
}

void SessionMachine::End(v1::SessionState state, v1::Command final, absl::Time now,
                         Effects& out) {
  if (state == v1::SESSION_STATE_ABORTED) {
    ++out.stats.aborts_by_reason[ErrorCodeName(record_.error().code())];
  }
  EnterState(state, now, out);
  for (RankProgress& p : ranks_) p.reached = state;  // for status
  if (manifest_ != nullptr && !record_.memory_only()) {
    DeleteManifest(out.batch, context_.job_id, record_.session_id());
  }
  if (state == v1::SESSION_STATE_COMMITTED) SetCommitted(record_, &final);
  Broadcast(final, out);
}

// ---------------------------------------------------------------------------------------------
// Helpers

bool SessionMachine::CountsAsWriter(uint32_t rank) const {
  // A memory-only PERSIST writes nothing to storage, nor does a rank with no chunk to write:
  // the writer bound does not apply to them.
  return !record_.memory_only() && plan_->bytes_written_by_rank[rank] > 0;
}

void SessionMachine::MarkWritesWhenStaged() {
  const uint32_t writers_allowed = record_.write_when_staged_writers();
  if (writers_allowed == 0) return;
  uint32_t writers = 0;
  for (uint32_t r = 0; r < world(); ++r) {
    if (!plan_->peers[r].empty()) continue;  // it waits for its peers' slices: GATHER
    const bool writes = CountsAsWriter(r);
    if (writes && writers == writers_allowed) continue;
    RankProgress& p = ranks_[r];
    p.writes_when_staged = true;
    p.persist_sent = true;  // its PIN is its write permit
    if (writes) {
      ++writers;
      ++writers_active_;
    }
  }
}

v1::SessionState SessionMachine::AheadAfter(uint32_t rank, v1::AgentPhase phase) const {
  const v1::SessionState s = state();
  if (phase == v1::AGENT_PHASE_STAGED && s == v1::SESSION_STATE_PINNING &&
      record_.copy_when_pinned()) {
    return v1::SESSION_STATE_PINNING;
  }
  if ((phase == v1::AGENT_PHASE_GATHERED || phase == v1::AGENT_PHASE_PERSISTED) &&
      WritingAhead(rank)) {
    return v1::SESSION_STATE_COPYING;
  }
  return v1::SESSION_STATE_UNSPECIFIED;
}

bool SessionMachine::WritingAhead(uint32_t rank) const {
  return (state() == v1::SESSION_STATE_PINNING || state() == v1::SESSION_STATE_COPYING) &&
         ranks_[rank].writes_when_staged;
}

void SessionMachine::EmitGathers(Effects& out) {
  // Each rank gets the addresses of the ranks it exchanges slices with, not all of them:
  // all of them to every rank is ranks^2 entries (a million at 1,024 ranks). A rank told
  // write_when_staged gathered on its own.
  for (uint32_t r = 0; r < world(); ++r) {
    if (!ranks_[r].writes_when_staged) Emit(r, GatherCommand(r), out);
  }
}

void SessionMachine::HandOutPersist(Effects& out) {
  if (!std::all_of(ranks_.begin(), ranks_.end(),
                   [](const RankProgress& p) { return p.gathered; })) {
    return;
  }
  for (uint32_t r = 0; r < world(); ++r) {
    RankProgress& p = ranks_[r];
    if (p.persist_sent || p.persisted) continue;
    const bool writes = CountsAsWriter(r);
    if (writes && writers_active_ >= context_.options->max_concurrent_writers) continue;
    if (writes) ++writers_active_;
    p.persist_sent = true;
    v1::Command c;
    c.mutable_persist()->set_tmp_dir(record_.tmp_dir());
    c.mutable_persist()->set_memory_only(record_.memory_only());
    Emit(r, std::move(c), out);
  }
}

void SessionMachine::EnterState(v1::SessionState state, absl::Time now, Effects& out) {
  if (!record_.phases().empty()) {
    v1::PhaseTiming* last = record_.mutable_phases(record_.phases_size() - 1);
    last->set_duration_ms(absl::ToUnixMillis(now) - last->entered_unix_ms());
    SessionStats::Timing& t = out.stats.phase_seconds[StateName(last->state())];
    ++t.count;
    t.seconds += last->duration_ms() / 1000.0;
  }
  v1::PhaseTiming* timing = record_.add_phases();
  timing->set_state(state);
  timing->set_entered_unix_ms(absl::ToUnixMillis(now));
  record_.set_state(state);
  phase_started_ = now;
  PutSession(out.batch, record_);
  out.persisted_state = state;
  out.changed = true;
}

void SessionMachine::Emit(uint32_t rank, v1::Command command, Effects& out,
                          std::shared_ptr<const GlobalPlan> pin_plan) {
  command.set_session_id(record_.session_id());
  command.set_step(record_.step());
  command.set_seq(CommandSeq(context_.epoch, ++*context_.commands_emitted));
  out.commands.push_back(Outgoing{rank, std::move(command), std::move(pin_plan)});
}

void SessionMachine::Broadcast(const v1::Command& command, Effects& out) {
  for (uint32_t r = 0; r < world(); ++r) Emit(r, command, out);
}

v1::Command SessionMachine::GatherCommand(uint32_t rank) const {
  v1::Command c;
  v1::GatherCommand* gather = c.mutable_gather();
  const auto& all = record_.peer_addresses();
  for (uint32_t peer : plan_->peers[rank]) {
    auto it = all.find(peer);
    if (it != all.end()) (*gather->mutable_peer_addresses())[peer] = it->second;
  }
  return c;
}

void SessionMachine::RequestCommit(absl::Time now, Effects& out) {
  const bool roll_back = now >= deadline();
  if (!record_.committer_is_agent()) {
    CommitAttempt work;
    work.job_id = context_.job_id;
    work.session_id = record_.session_id();
    work.manifest = manifest_;
    work.tmp_dir = record_.tmp_dir();
    work.final_dir = record_.checkpoint_dir();
    work.roll_back_unless_committed = roll_back;
    commit_in_flight_ = true;
    out.commit = std::move(work);
    return;
  }
  v1::Command c;
  v1::CommitCommand* commit = c.mutable_commit();
  *commit->mutable_manifest() = *manifest_;
  commit->set_tmp_dir(record_.tmp_dir());
  commit->set_final_dir(record_.checkpoint_dir());
  commit->set_roll_back_unless_committed(roll_back);
  for (int64_t step : retire_steps_) commit->add_retire_steps(step);
  roll_back_requested_ = roll_back;
  next_commit_attempt_ = now + context_.options->commit_retry_max;
  Emit(record_.committer_rank(), std::move(c), out);
}

bool SessionMachine::PickCommitter() {
  for (uint32_t r = 0; r < world(); ++r) {
    if (refused_commit_.count(r) > 0) continue;
    const AgentLiveness& agent = (*context_.agents)[r];
    if (agent.incarnation != 0 && agent.storage_root_mounted &&
        agent.state != AgentLiveness::State::kLost) {
      record_.set_committer_rank(r);
      return true;
    }
  }
  return false;
}

bool SessionMachine::CommitterLost() const {
  const uint32_t rank = record_.committer_rank();
  const AgentLiveness& agent = (*context_.agents)[rank];
  if (refused_commit_.count(rank) > 0 || agent.unavailable()) return true;
  // Registered again without the storage: another agent of that rank (a job resumed on
  // another mesh), or the same one restarted without the mount.
  return agent.incarnation != 0 && !agent.storage_root_mounted;
}

void SessionMachine::ScheduleCommitRetry(absl::Time now) {
  next_commit_attempt_ = now + commit_backoff_;
  commit_backoff_ = std::min(commit_backoff_ * 2, context_.options->commit_retry_max);
}

absl::Duration SessionMachine::PhaseTimeout() const {
  const SessionOptions& o = *context_.options;
  switch (state()) {
    case v1::SESSION_STATE_PLANNING:
      return o.planning_timeout;
    case v1::SESSION_STATE_PINNING:
      return o.pinning_timeout;
    case v1::SESSION_STATE_COPYING:
      return o.copying_timeout;
    case v1::SESSION_STATE_PERSISTING:
      return o.persisting_timeout;
    case v1::SESSION_STATE_COMMITTING:
      return o.committing_timeout;
    default:
      return absl::InfiniteDuration();
  }
}

absl::Time SessionMachine::next_tick() const {
  if (ended()) return absl::InfiniteFuture();
  absl::Time next = deadline();
  if (state() == v1::SESSION_STATE_COMMITTING) next = std::min(next, next_commit_attempt_);
  return next;
}

std::vector<uint32_t> SessionMachine::ranks_planned() const {
  std::vector<uint32_t> ranks;
  for (const auto& [r, unused] : submissions_) ranks.push_back(r);
  return ranks;
}

v1::ErrorDetail SessionMachine::LostError(const std::vector<uint32_t>& lost,
                                          v1::SessionState s) const {
  // Ranks by reason, in the order of their lowest rank: "lost the agent of ranks 0, 1 during
  // PERSISTING (no heartbeat within the lease)", one such clause per reason.
  std::vector<std::pair<std::string, std::vector<uint32_t>>> by_reason;
  for (uint32_t r : lost) {
    const std::string& why = (*context_.agents)[r].lost.message();
    auto it = std::find_if(by_reason.begin(), by_reason.end(),
                           [&](const auto& group) { return group.first == why; });
    if (it == by_reason.end()) {
      by_reason.push_back({why, {r}});
    } else {
      it->second.push_back(r);
    }
  }
  std::vector<std::string> clauses;
  for (const auto& [why, ranks] : by_reason) {
    clauses.push_back(absl::StrCat("the agent of rank", ranks.size() > 1 ? "s " : " ",
                                   absl::StrJoin(ranks, ", "), " during ", StateName(s), " (",
                                   why, ")"));
  }
  // The code of the lowest rank's reason: AGENT_LOST, or a refusal's own (LAYOUT_MISMATCH).
  v1::ErrorCode code = (*context_.agents)[lost.front()].lost.code();
  if (code == v1::ERROR_CODE_UNSPECIFIED) code = v1::ERROR_CODE_AGENT_LOST;
  v1::ErrorDetail error = Detail(code, absl::StrCat("lost ", absl::StrJoin(clauses, "; ")));
  for (uint32_t r : lost) AddRankRef(context_.mesh, r, &error);
  return error;
}

v1::ErrorDetail SessionMachine::Detail(v1::ErrorCode code, std::string message) const {
  v1::ErrorDetail detail;
  detail.set_code(code);
  detail.set_message(std::move(message));
  return detail;
}

v1::SessionStatus SessionMachine::Status() const {
  v1::SessionStatus status = StatusFromRecord(record_);
  status.set_chunks_reported(ledger_ != nullptr ? ledger_->chunks_reported() : 0);
  const v1::SessionState s = state();
  uint64_t written = 0;
  for (uint32_t r = 0; r < world(); ++r) {
    const RankProgress& p = ranks_[r];
    v1::RankProgress* rp = status.add_ranks();
    rp->set_rank(r);
    rp->set_coords(context_.mesh.CoordString(r));
    rp->set_reached(p.reached);
    rp->set_bytes_staged(p.reached >= v1::SESSION_STATE_COPYING ? p.pinned_bytes : 0);
    rp->set_bytes_planned(plan_ != nullptr && r < plan_->bytes_written_by_rank.size()
                              ? plan_->bytes_written_by_rank[r]
                              : 0);
    rp->set_bytes_written(p.bytes_written);
    rp->set_chunks_reported(p.chunks_reported);
    rp->set_trainer_stall_ns(p.stall_ns);
    rp->set_write_ns(p.write_ns);
    const bool in_flight =
        s >= v1::SESSION_STATE_PINNING && s <= v1::SESSION_STATE_PERSISTING;
    rp->set_straggler(in_flight && (s == v1::SESSION_STATE_PERSISTING ? !p.persisted
                                                                       : p.reached < s));
    written += p.bytes_written;
  }
  status.set_bytes_written(written);
  return status;
}

}  // namespace tessera
