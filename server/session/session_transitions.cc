// SessionMachine, part 2 of 2: the transitions (what entering each state hands out) and the
// helpers they share. Part 1, session_machine.cc, holds construction, recovery and the events;
// the state diagram and the rules are in session_machine.h. One class in two files: the events
// decide when a transition happens, this file what it does.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/ids.h"
#include "common/log.h"
#include "common/status.h"
#include "server/session/schema.h"
#include "server/session/session_machine.h"
#include "server/session/status_view.h"

namespace tessera {
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
