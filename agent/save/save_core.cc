// SaveCore, part 1: construction, the effects every event ends with, the trainer's calls
// (edge 6, R2, R8), command dispatch (R1), the lease (R5) and R4's paths, time, shutdown, and
// the sessions kept. The class, its state diagram and rules R1–R13: save_core.h. The other
// parts: submission.cc, phases.cc, commit.cc, reports.cc, ending.cc.
#include "agent/save/save_core.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "agent/save/save_core_internal.h"
#include "common/ids.h"
#include "common/status.h"

namespace tessera {
namespace save_core_internal {

v1::ErrorDetail DetailFor(v1::ErrorCode code, const absl::Status& cause) {
  std::optional<v1::ErrorDetail> detail = GetErrorDetail(cause);
  v1::ErrorDetail out = detail.has_value() ? *detail : v1::ErrorDetail();
  if (out.code() == v1::ERROR_CODE_UNSPECIFIED) out.set_code(code);
  if (out.message().empty()) out.set_message(std::string(cause.message()));
  return out;
}

v1::ReportPhaseRequest PhaseReport(v1::AgentPhase phase) {
  v1::ReportPhaseRequest report;
  report.set_phase(phase);
  return report;
}

absl::Status CheckSessionId(const std::string& session_id) {
  // The job id's rule is exactly "one safe path component" (common/ids.h).
  if (IsValidJobId(session_id)) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("the coordinator named session id \"", session_id,
                                          "\", which is not a single safe path component"));
}

}  // namespace save_core_internal

using save_core_internal::Ended;
using save_core_internal::Live;
using save_core_internal::PhaseReport;
using save_core_internal::Severity;

absl::string_view SavePhaseName(SavePhase phase) {
  switch (phase) {
    case SavePhase::kPlanned:
      return "PLANNED";
    case SavePhase::kPinning:
      return "PINNING";
    case SavePhase::kPinned:
      return "PINNED";
    case SavePhase::kCopying:
      return "COPYING";
    case SavePhase::kStaged:
      return "STAGED";
    case SavePhase::kGathering:
      return "GATHERING";
    case SavePhase::kGathered:
      return "GATHERED";
    case SavePhase::kPersisting:
      return "PERSISTING";
    case SavePhase::kPersisted:
      return "PERSISTED";
    case SavePhase::kCommitOnly:
      return "COMMIT_ONLY";
    case SavePhase::kFailed:
      return "FAILED";
    case SavePhase::kEnding:
      return "ENDING";
    case SavePhase::kCommitted:
      return "COMMITTED";
    case SavePhase::kAborted:
      return "ABORTED";
  }
  return "?";
}

std::string CommandName(const v1::Command& command) {
  const google::protobuf::FieldDescriptor* body =
      v1::Command::descriptor()->FindFieldByNumber(command.body_case());
  return body != nullptr ? body->name() : "empty";
}

SaveCore::SaveCore(SaveCoreOptions options)
    : options_(std::move(options)), resend_backoff_(options_.retry_backoff, options_.seed) {}

// ---------------------------------------------------------------------------------------------
// Effects

SaveEffects SaveCore::Done(absl::Time now, SaveEffects fx) {
  Forget(fx);
  absl::Time next = resend_at_;
  for (const auto& [ticket, b] : begins_) {
    if (b->rpc == 0) next = std::min(next, b->retry_at);
  }
  for (const auto& [id, s] : sessions_) {
    if (s->commit.has_value() && s->commit->state == CommitState::kBackoff) {
      next = std::min(next, s->commit->retry_at);
    }
    if (AwaitingVerdict(*s)) next = std::min(next, s->remind_at);
    for (const Waiter& w : s->waiters) next = std::min(next, w.deadline);
    if (s->persist_awaiting_lease.has_value()) next = std::min(next, s->persist_wait_until);
  }
  fx.next_tick = stopped_ ? absl::InfiniteFuture() : next;
  return fx;
}

void SaveCore::Log(SaveEffects& fx, Severity severity, std::string text) {
  fx.logs.push_back({severity, std::move(text)});
}

void SaveCore::Reply(SaveEffects& fx, uint64_t ticket, BeginSaveReply reply) {
  fx.replies.push_back({ticket, std::move(reply)});
}
void SaveCore::Reply(SaveEffects& fx, uint64_t ticket, StagedReply reply) {
  fx.replies.push_back({ticket, std::move(reply)});
}
void SaveCore::Reply(SaveEffects& fx, uint64_t ticket, WaitCommittedReply reply) {
  fx.replies.push_back({ticket, std::move(reply)});
}

uint64_t SaveCore::NewSeed() {
  return options_.seed ^ (0x9e3779b97f4a7c15ull * ++seeds_drawn_);
}

std::string SaveCore::Describe(const Session& s) const {
  return absl::StrCat("session ", s.id, " (step ", s.step, ")");
}

// ---------------------------------------------------------------------------------------------
// The trainer

SaveEffects SaveCore::TrainerGone(absl::Time now, uint64_t ticket) {
  SaveEffects fx;
  if (stopped_) return Done(now, std::move(fx));
  const absl::Status cancelled = absl::CancelledError("the trainer went away");
  if (auto it = begins_.find(ticket); it != begins_.end()) {
    if (!it->second->trainer_gone) Reply(fx, ticket, BeginSaveReply{cancelled});
    it->second->trainer_gone = true;
    return Done(now, std::move(fx));
  }
  for (auto& [id, s] : sessions_) {
    if (s->begin_ticket != ticket || s->plan == nullptr) continue;
    if (s->begin_waiting) {
      s->begin_waiting = false;
      Reply(fx, ticket, BeginSaveReply{cancelled});
    }
    if (Live(s->phase) && s->phase < SavePhase::kStaged) {
      Fail(*s, v1::ERROR_CODE_AGENT_LOST,
           absl::AbortedError(absl::StrCat("the trainer of rank ", options_.rank,
                                           " went away before its snapshot was staged")),
           fx);
    }
  }
  return Done(now, std::move(fx));
}

SaveEffects SaveCore::Staged(absl::Time now, uint64_t ticket, const std::string& session_id,
                             uint64_t stall_ns, const v1::ErrorDetail* withdrawn) {
  SaveEffects fx;
  Session* s = Find(session_id);
  absl::Status answer;
  if (stopped_) {
    answer = absl::UnavailableError("the agent is shutting down");
  } else if (s == nullptr) {
    answer = absl::NotFoundError(absl::StrCat("no session ", session_id, " on this agent"));
  } else if (s->phase == SavePhase::kCopying && withdrawn != nullptr) {
    Fail(*s, withdrawn->code(),
         absl::AbortedError(absl::StrCat("rank ", options_.rank, " withdrew its snapshot: ",
                                         withdrawn->message())),
         fx);
  } else if (s->phase == SavePhase::kCopying) {
    s->phase = SavePhase::kStaged;  // edge 6
    v1::ReportPhaseRequest staged = PhaseReport(v1::AGENT_PHASE_STAGED);
    staged.set_trainer_stall_ns(stall_ns);
    AddPhaseReport(*s, std::move(staged), fx);
    // The PIN said this rank exchanges no slices and may write: edge 7 without GATHER.
    if (s->write_when_staged) StartGather(now, *s, {}, fx);
  } else if (!s->outcome.ok()) {
    answer = s->outcome;
  } else {
    answer = absl::FailedPreconditionError(absl::StrCat(
        Describe(*s), " is ", SavePhaseName(s->phase), ", not waiting for the trainer's copy"));
  }
  Reply(fx, ticket, StagedReply{answer});
  return Done(now, std::move(fx));
}

SaveEffects SaveCore::WaitCommitted(absl::Time now, uint64_t ticket, int64_t step,
                                    absl::Time deadline) {
  SaveEffects fx;
  Session* match = nullptr;
  for (auto& [id, s] : sessions_) {
    if (s->step == step && (match == nullptr || s->created > match->created)) match = s.get();
  }
  if (stopped_) {
    Reply(fx, ticket, WaitCommittedReply{absl::UnavailableError("the agent is shutting down")});
  } else if (match == nullptr) {
    Reply(fx, ticket,
          WaitCommittedReply{absl::NotFoundError(
              absl::StrCat("no save of step ", step, " on this agent"))});
  } else if (match->phase == SavePhase::kCommitted) {
    Reply(fx, ticket, WaitCommittedReply{match->checkpoint_dir});
  } else if (match->phase == SavePhase::kAborted) {
    Reply(fx, ticket, WaitCommittedReply{match->outcome});
  } else if (deadline <= now) {
    Reply(fx, ticket,
          WaitCommittedReply{absl::DeadlineExceededError(
              "the save did not finish before the deadline")});
  } else {
    match->waiters.push_back({ticket, deadline});
  }
  return Done(now, std::move(fx));
}

// ---------------------------------------------------------------------------------------------
// Commands (R1)

SaveEffects SaveCore::OnCommand(absl::Time now, const v1::Command& command) {
  SaveEffects fx;
  if (stopped_) return Done(now, std::move(fx));
  Session* s = Find(command.session_id());
  if (command.has_resend()) {  // idempotent: handled whatever its seq (R3)
    if (s != nullptr) s->last_seq = std::max(s->last_seq, command.seq());
    ResendAll(absl::StrCat("RESEND for session ", command.session_id()), fx);
    return Done(now, std::move(fx));
  }
  if (s == nullptr) {
    if (command.has_commit()) {  // edge 11
      s = &NewSession(command.session_id(), command.step());
      s->phase = SavePhase::kCommitOnly;
      s->lease = lease_;
    } else if (SubmittingStep(command.step())) {
      held_.push_back(command);
      return Done(now, std::move(fx));
    } else {
      Log(fx, Severity::kInfo,
          absl::StrCat("ignoring command ", CommandName(command), " for session ",
                       command.session_id(),
                       ", which this agent does not have"));
      return Done(now, std::move(fx));
    }
  }
  Dispatch(now, *s, command, fx);
  return Done(now, std::move(fx));
}

void SaveCore::Dispatch(absl::Time now, Session& s, const v1::Command& command,
                        SaveEffects& fx) {
  if (command.seq() <= s.last_seq) return;  // already handled
  s.last_seq = command.seq();
  Log(fx, Severity::kInfo, absl::StrCat("command ", CommandName(command), " for ", Describe(s)));
  switch (command.body_case()) {
    case v1::Command::kPin:
      HandlePin(s, command.pin(), fx);
      break;
    case v1::Command::kCopy:
      HandleCopy(s, fx);
      break;
    case v1::Command::kGather:
      HandleGather(now, s, command.gather(), fx);
      break;
    case v1::Command::kPersist:
      HandlePersist(now, s, command.persist(), fx);
      break;
    case v1::Command::kCommit:
      HandleCommit(s, command, fx);
      break;
    case v1::Command::kSendPlan:  // R10
      if (s.phase == SavePhase::kPlanned && s.plan != nullptr) {
        s.slim = nullptr;
        Resubmit(s, fx);
      }
      break;
    case v1::Command::kCommitted:  // edge 16
      if (Live(s.phase) || s.phase == SavePhase::kFailed) {
        End(s, absl::OkStatus(), command.committed().checkpoint_dir(), fx);
      }
      break;
    case v1::Command::kAbort:  // edge 14
      if (Live(s.phase) || s.phase == SavePhase::kFailed) {
        BeginEnding(s, ErrorFromDetail(command.abort().error()), fx);
      }
      break;
    default:
      break;
  }
}

// ---------------------------------------------------------------------------------------------
// The lease (R5)

SaveEffects SaveCore::OnLease(absl::Time now, std::optional<uint64_t> generation) {
  lease_known_ = true;
  lease_ = generation;
  SaveEffects fx;
  if (generation.has_value()) {
    last_lease_ = generation;
    for (auto& [id, s] : sessions_) {
      if (!s->lease.has_value()) s->lease = generation;  // begun before any lease was held
    }
    // R5: writes that waited for the lease: the same generation writes, another fails.
    for (auto& [id, s] : sessions_) {
      if (!s->persist_awaiting_lease.has_value() || Ended(s->phase) || s->orphaned) continue;
      auto [dir, memory_only] = *std::exchange(s->persist_awaiting_lease, std::nullopt);
      s->persist_wait_until = absl::InfiniteFuture();
      StartPersist(now, *s, std::move(dir), memory_only, fx);
    }
  }
  return Done(now, std::move(fx));
}

// ---------------------------------------------------------------------------------------------
// R4, R5

absl::Status SaveCore::CheckPath(const std::string& what, const std::string& received,
                                 const std::string& expected) const {
  if (!storage_root_.empty() && received == expected) return absl::OkStatus();
  v1::ErrorDetail detail;
  detail.set_code(v1::ERROR_CODE_IO_ERROR);
  detail.set_path(received);
  detail.set_message(
      storage_root_.empty()
          ? absl::StrCat(what, " is ", received,
                         "; this agent has no storage root from the coordinator to check it "
                         "against, so it writes nothing there")
          : absl::StrCat(what, " is ", received, ", expected ", expected,
                         ": the agent writes, commits and removes only its session's own "
                         "directories"));
  return MakeError(absl::StatusCode::kInvalidArgument, detail);
}

bool SaveCore::LeaseAllows(const Session& s) const {
  if (!lease_known_) return true;
  return lease_.has_value() && s.lease.has_value() && *lease_ == *s.lease;
}

absl::Status SaveCore::LeaseLapsed(absl::string_view what) const {
  return absl::AbortedError(absl::StrCat(
      "the lease of rank ", options_.rank, "'s agent lapsed during the save (the agent was "
      "frozen or cut off from the coordinator); it does not ", what,
      " for a save it was given up for"));
}

// ---------------------------------------------------------------------------------------------
// Time and the end of the agent

SaveEffects SaveCore::Tick(absl::Time now) {
  SaveEffects fx;
  if (stopped_) return Done(now, std::move(fx));
  if (resend_at_ <= now) ResendAll("", fx);  // R3: the failure was logged when it happened
  for (auto& [ticket, b] : begins_) {
    if (b->rpc == 0 && b->retry_at <= now) SendSubmission(*b, fx);
  }
  for (auto& [id, s] : sessions_) {
    if (s->commit.has_value() && s->commit->state == CommitState::kBackoff &&
        s->commit->retry_at <= now && Live(s->phase)) {  // C5
      if (CommitLeaseCurrent(*s->commit)) {
        StartCommit(*s, fx);
      } else {
        // R5: not retried under another lease; the coordinator's next COMMIT runs.
        s->commit->state = CommitState::kIdle;
        Log(fx, Severity::kWarning,
            absl::StrCat("not retrying the commit of ", Describe(*s),
                         ": the lease it was asked under has lapsed"));
      }
    }
    if (s->persist_awaiting_lease.has_value() && s->persist_wait_until <= now) {  // R5
      s->persist_awaiting_lease.reset();
      s->persist_wait_until = absl::InfiniteFuture();
      if (!Ended(s->phase) && !s->orphaned) {  // ended meanwhile: nothing to fail
        Fail(*s, v1::ERROR_CODE_AGENT_LOST,
             absl::AbortedError(absl::StrCat(
                 "the lease of rank ", options_.rank, "'s agent was not renewed within ",
                 absl::FormatDuration(options_.lease_wait),
                 " of its write being asked for; it does not write its shards")),
             fx);
      }
    }
    if (AwaitingVerdict(*s) && s->remind_at <= now) {  // R3
      s->remind_at = now + s->remind_backoff.Next();
      s->reports.Remind();
      Pump(*s, fx);
    }
    for (auto w = s->waiters.begin(); w != s->waiters.end();) {
      if (w->deadline > now) {
        ++w;
        continue;
      }
      Reply(fx, w->ticket,
            WaitCommittedReply{
                absl::DeadlineExceededError("the save did not finish before the deadline")});
      w = s->waiters.erase(w);
    }
  }
  return Done(now, std::move(fx));
}

SaveEffects SaveCore::Shutdown(absl::Time now) {
  SaveEffects fx;
  if (stopped_) return Done(now, std::move(fx));
  stopped_ = true;
  const absl::Status down = absl::UnavailableError("the agent is shutting down");
  for (auto& [ticket, b] : begins_) {
    if (!b->trainer_gone) Reply(fx, ticket, BeginSaveReply{down});
  }
  begins_.clear();
  held_.clear();
  for (auto& [id, s] : sessions_) {
    if (s->begin_waiting) Reply(fx, s->begin_ticket, BeginSaveReply{down});
    s->begin_waiting = false;
    for (const Waiter& w : s->waiters) Reply(fx, w.ticket, WaitCommittedReply{down});
    s->waiters.clear();
    if (s->phase == SavePhase::kGathering) fx.cancel_exchanges.push_back(id);
    s->reports.Close();
  }
  resend_at_ = absl::InfiniteFuture();
  return Done(now, std::move(fx));
}

// ---------------------------------------------------------------------------------------------
// Sessions

SaveCore::Session* SaveCore::Find(const std::string& session_id) {
  auto it = sessions_.find(session_id);
  return it == sessions_.end() ? nullptr : it->second.get();
}

const SaveCore::Session* SaveCore::Find(const std::string& session_id) const {
  auto it = sessions_.find(session_id);
  return it == sessions_.end() ? nullptr : it->second.get();
}

SaveCore::Session& SaveCore::NewSession(const std::string& id, int64_t step) {
  auto session = std::make_unique<Session>();
  session->id = id;
  session->step = step;
  session->created = next_created_++;
  Session& s = *session;
  sessions_[id] = std::move(session);
  return s;
}

void SaveCore::Forget(SaveEffects& fx) {
  while (finished_.size() > options_.remember_sessions) {
    const std::string id = finished_.front();
    finished_.pop_front();
    Session* s = Find(id);
    if (s == nullptr) continue;
    if (!Ended(s->phase)) {  // R9: an orphan whose verdict never came
      const absl::Status unknown = absl::DeadlineExceededError(
          absl::StrCat("the outcome of ", Describe(*s), " never reached this agent"));
      if (s->begin_waiting) Reply(fx, s->begin_ticket, BeginSaveReply{unknown});
      for (const Waiter& w : s->waiters) Reply(fx, w.ticket, WaitCommittedReply{unknown});
    }
    sessions_.erase(id);
  }
}

SessionView SaveCore::ViewOf(const Session& s) const {
  SessionView view;
  view.id = s.id;
  view.step = s.step;
  view.phase = s.phase;
  view.commit = s.commit.has_value() ? s.commit->state : CommitState::kIdle;
  view.outcome = s.outcome;
  view.written_dir = s.written_dir;
  view.reports = s.reports.size();
  view.reports_closed = s.reports.closed();
  return view;
}

std::optional<SessionView> SaveCore::View(const std::string& session_id) const {
  const Session* s = Find(session_id);
  if (s == nullptr) return std::nullopt;
  return ViewOf(*s);
}

std::vector<SessionView> SaveCore::Sessions() const {
  std::vector<SessionView> views;
  for (const auto& [id, s] : sessions_) views.push_back(ViewOf(*s));
  return views;
}

bool SaveCore::AnyCopying() const {
  for (const auto& [id, s] : sessions_) {
    if (s->phase == SavePhase::kCopying) return true;
  }
  return false;
}

}  // namespace tessera
