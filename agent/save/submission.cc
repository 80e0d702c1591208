// SaveCore, part 2: plan submission (edges 1, 2): BeginSave and its retries, the commands
// held while a plan is out (R1), the re-submission of a PLANNED session and its move to
// another session (R3), and plans submitted as a fingerprint (R10). The contract: save_core.h.
#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "agent/save/save_core.h"
#include "agent/save/save_core_internal.h"
#include "common/plan_fingerprint.h"

namespace tessera {

using save_core_internal::CheckSessionId;
using save_core_internal::Ended;
using save_core_internal::Severity;

namespace {

// Plan submissions are retried while the coordinator is unreachable or does not know this
// agent yet (it restarted and the agent has not registered again).
// Transport failures (the call may or may not have arrived: a submission is idempotent) and
// a coordinator that does not know this agent yet.
bool SubmissionRetriable(absl::StatusCode code) {
  return code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kNotFound ||
         code == absl::StatusCode::kDeadlineExceeded;
}

}  // namespace

SaveEffects SaveCore::BeginSave(absl::Time now, uint64_t ticket, v1::BeginSaveRequest request) {
  SaveEffects fx;
  if (stopped_) {
    Reply(fx, ticket, BeginSaveReply{absl::UnavailableError("the agent is shutting down")});
    return Done(now, std::move(fx));
  }
  // Everything but the shards; the fingerprint-only submission is this alone (R10).
  v1::SubmitLocalPlanRequest header;
  header.set_job_id(options_.job_id);
  header.set_rank(options_.rank);
  header.set_incarnation(options_.incarnation);
  header.set_step(request.step());
  header.set_memory_only(request.memory_only());
  header.set_local_plan_fingerprint(FingerprintShards(options_.rank, request.shards()));
  const bool held = held_plan_.has_value() &&
                    held_plan_->local_fingerprint == header.local_plan_fingerprint();
  if (held) header.set_held_plan_fingerprint(held_plan_->plan_fingerprint);
  auto plan = std::make_shared<v1::SubmitLocalPlanRequest>(header);
  // Moved, not copied: a plan can hold thousands of shards, on the trainer's blocking path.
  plan->mutable_shards()->Swap(request.mutable_shards());
  std::shared_ptr<v1::SubmitLocalPlanRequest> slim;
  if (held) {
    slim = std::make_shared<v1::SubmitLocalPlanRequest>(std::move(header));
    slim->set_shards_omitted(true);
  }
  auto begin = std::make_unique<PendingBegin>(options_.retry_backoff, NewSeed());
  begin->ticket = ticket;
  begin->step = request.step();
  begin->plan = std::move(plan);
  begin->slim = std::move(slim);
  begin->give_up_at = now + options_.submit_retry_window;
  PendingBegin& b = *begin;
  begins_[ticket] = std::move(begin);
  SendSubmission(b, fx);
  return Done(now, std::move(fx));
}

void SaveCore::SendSubmission(PendingBegin& begin, SaveEffects& fx) {
  const uint64_t id = next_id_++;
  begin.rpc = id;
  begin.retry_at = absl::InfiniteFuture();
  begin.sent_at_connection = connections_;
  rpcs_[id] = {RpcOwner::kBegin, begin.ticket, ""};
  fx.rpcs.push_back({id, begin.slim != nullptr ? begin.slim : begin.plan});
}

void SaveCore::Resubmit(Session& s, SaveEffects& fx) {
  const uint64_t rpc = next_id_++;
  s.resubmit_rpc = rpc;
  s.resubmit_sent_at_connection = connections_;
  rpcs_[rpc] = {RpcOwner::kResubmit, 0, s.id};
  fx.rpcs.push_back({rpc, s.slim != nullptr ? s.slim : s.plan});
}

SaveEffects SaveCore::OnPlanSubmitted(absl::Time now, uint64_t rpc_id,
                                      const absl::StatusOr<v1::SubmitLocalPlanResponse>& result) {
  SaveEffects fx;
  auto it = rpcs_.find(rpc_id);
  if (stopped_ || it == rpcs_.end()) return Done(now, std::move(fx));
  const RpcRef ref = it->second;
  rpcs_.erase(it);

  if (ref.owner == RpcOwner::kResubmit) {  // R3
    Session* s = Find(ref.session);
    if (s == nullptr) return Done(now, std::move(fx));
    const bool latest = s->resubmit_rpc == rpc_id;
    if (latest) s->resubmit_rpc = 0;
    if (s->phase != SavePhase::kPlanned) {
      if (result.ok()) DisownMovedPlan(*s, result->session_id(), fx);
      PruneHeld(fx);
      return Done(now, std::move(fx));
    }
    if (result.ok() && result->send_full_plan() && s->slim != nullptr) {  // R10
      Log(fx, Severity::kInfo,
          absl::StrCat("the coordinator asked for the shards of ", Describe(*s)));
      s->slim = nullptr;
      Resubmit(*s, fx);
      return Done(now, std::move(fx));
    }
    if (!result.ok()) {
      if (SubmissionRetriable(result.status().code())) {
        if (resend_at_ == absl::InfiniteFuture()) resend_at_ = now + resend_backoff_.Next();
      } else {
        // Refused for good (STEP_EXISTS, SESSION_IN_PROGRESS ...): the coordinator holds no
        // session of this plan any more, so none will bring a verdict; the refusal is it.
        BeginEnding(*s,
                    absl::Status(result.status().code(),
                                 absl::StrCat("re-submitting the plan of ", Describe(*s),
                                              " was refused: ", result.status().message())),
                    fx);
      }
    } else if (result->session_id() != s->id) {
      if (!CheckSessionId(result->session_id()).ok() || Find(result->session_id()) != nullptr) {
        Log(fx, Severity::kError,
            absl::StrCat("re-submitting the plan of ", Describe(*s), " named session \"",
                         result->session_id(), "\", which this agent cannot take"));
      } else {
        Log(fx, Severity::kWarning,
            absl::StrCat("the coordinator moved the plan of ", Describe(*s), " to session ",
                         result->session_id()));
        auto node = sessions_.extract(s->id);
        node.key() = result->session_id();
        node.mapped()->id = result->session_id();
        node.mapped()->last_seq = 0;
        sessions_.insert(std::move(node));
      }
    }
    // R1: commands for the session this reply names that arrived before it.
    if (result.ok() && latest) {
      if (Session* named = Find(result->session_id()); named != nullptr) {
        for (const v1::Command& command : TakeHeld(named->id)) Dispatch(now, *named, command, fx);
        if (named->resubmit_sent_at_connection != connections_) {
          AskAgainAfterReconnect(*named, fx);
        }
      }
    }
    PruneHeld(fx);
    return Done(now, std::move(fx));
  }

  auto b_it = begins_.find(ref.ticket);
  if (b_it == begins_.end()) return Done(now, std::move(fx));
  PendingBegin& b = *b_it->second;
  b.rpc = 0;
  if (result.ok() && result->send_full_plan() && b.trainer_gone) {
    EndPendingBegin(b.ticket, fx);  // nothing was recorded; nobody waits for the session
    return Done(now, std::move(fx));
  }
  if (result.ok() && result->send_full_plan() && b.slim != nullptr) {  // R10
    Log(fx, Severity::kInfo,
        absl::StrCat("the coordinator does not know the plan of step ", b.step,
                     " by its fingerprint; submitting its shards"));
    b.slim = nullptr;
    SendSubmission(b, fx);
    return Done(now, std::move(fx));
  }
  if (result.ok() && result->send_full_plan()) {
    // Asked for the shards the submission carried: the coordinator recorded nothing.
    Log(fx, Severity::kError,
        absl::StrCat("the coordinator asked for the shards of step ", b.step,
                     " although they were sent"));
    Reply(fx, b.ticket,
          BeginSaveReply{absl::InternalError(
              "the coordinator did not take this rank's plan although its shards were sent")});
    EndPendingBegin(b.ticket, fx);
    return Done(now, std::move(fx));
  }
  if (result.ok()) {
    if (absl::Status bad = CheckSessionId(result->session_id()); !bad.ok()) {
      Log(fx, Severity::kError, std::string(bad.message()));
      if (!b.trainer_gone) Reply(fx, b.ticket, BeginSaveReply{bad});
      EndPendingBegin(b.ticket, fx);
    } else {
      AcceptPlan(now, b, result->session_id(), fx);
    }
  } else if (SubmissionRetriable(result.status().code()) && now < b.give_up_at &&
             !b.trainer_gone) {
    b.retry_at = std::min(now + b.backoff.Next(), b.give_up_at);
  } else {
    Log(fx, Severity::kWarning,
        absl::StrCat("the plan of step ", b.step, " was not accepted: ",
                     result.status().ToString()));
    if (!b.trainer_gone) Reply(fx, b.ticket, BeginSaveReply{result.status()});
    EndPendingBegin(b.ticket, fx);
  }
  return Done(now, std::move(fx));
}

void SaveCore::AcceptPlan(absl::Time now, PendingBegin& begin, const std::string& session_id,
                          SaveEffects& fx) {
  const uint64_t ticket = begin.ticket;
  const bool gone = begin.trainer_gone;
  // R9: the coordinator runs one session of a job at a time.
  for (auto& [id, other] : sessions_) {
    if (id == session_id || other->orphaned || Ended(other->phase)) continue;
    other->orphaned = true;
    other->reports.Close();
    if (other->commit.has_value()) other->commit->retry_at = absl::InfiniteFuture();
    // Its exchange would hold the executor's worker (and the new session's PIN behind it)
    // until the gather's deadline: its peers stopped with the verdict this agent missed.
    if (other->phase == SavePhase::kGathering) fx.cancel_exchanges.push_back(id);
    finished_.push_back(id);
    Log(fx, Severity::kWarning,
        absl::StrCat(Describe(*other), " is over on the coordinator (session ", session_id,
                     " began); its outcome has not reached this agent"));
  }
  Log(fx, Severity::kInfo,
      absl::StrCat("plan of step ", begin.step, " submitted: session ", session_id));
  Session* s = Find(session_id);
  if (s == nullptr) {
    s = &NewSession(session_id, begin.step);
    s->plan = begin.plan;
    s->slim = begin.slim;
    s->lease = lease_.has_value() ? lease_ : last_lease_;
    s->begin_ticket = ticket;
    s->begin_waiting = !gone;
  } else if (s->phase == SavePhase::kPlanned || s->phase == SavePhase::kPinning ||
             s->phase == SavePhase::kPinned) {
    // The trainer retried while its first call is open: the newer call waits instead.
    if (s->begin_waiting) {
      Reply(fx, s->begin_ticket,
            BeginSaveReply{absl::AbortedError("superseded by a newer BeginSave of the same step")});
    }
    if (s->phase == SavePhase::kPlanned) {  // what the coordinator holds
      s->plan = begin.plan;
      s->slim = begin.slim;
    }
    s->begin_ticket = ticket;
    s->begin_waiting = !gone;
  } else if (!gone) {
    absl::StatusOr<v1::BeginSaveResponse> answer;
    if (s->phase == SavePhase::kCopying) {
      answer = SlotsOf(*s);
      s->begin_ticket = ticket;
    } else if (s->phase == SavePhase::kCommitted) {
      answer = absl::FailedPreconditionError(
          absl::StrCat("step ", s->step, " is already committed (", Describe(*s), ")"));
    } else if (!s->outcome.ok()) {
      answer = s->outcome;
    } else {
      answer = absl::FailedPreconditionError(absl::StrCat(
          Describe(*s), " is already ", SavePhaseName(s->phase), " on this agent"));
    }
    Reply(fx, ticket, BeginSaveReply{std::move(answer)});
  }
  // R1: commands that arrived before this reply.
  std::vector<v1::Command> mine = TakeHeld(session_id);
  const bool reconnected = begin.sent_at_connection != connections_;
  EndPendingBegin(ticket, fx);
  // R8: the trainer left while its plan was being submitted.
  if (gone && s->begin_ticket == ticket && s->phase < SavePhase::kStaged) {
    Fail(*s, v1::ERROR_CODE_AGENT_LOST,
         absl::AbortedError(absl::StrCat("the trainer of rank ", options_.rank,
                                         " went away before its snapshot was staged")),
         fx);
  }
  for (const v1::Command& command : mine) Dispatch(now, *s, command, fx);
  if (reconnected) AskAgainAfterReconnect(*s, fx);
}

void SaveCore::DisownMovedPlan(const Session& s, const std::string& moved_to, SaveEffects& fx) {
  // R3: the coordinator moved this rank's plan to `moved_to` after `s` had ended here (its
  // ABORT arrived first, and the trainer was answered). No trainer waits for that session:
  // fail it now, or it waits for its PINNING deadline for this rank.
  if (moved_to == s.id || !(s.phase == SavePhase::kEnding || Ended(s.phase)) ||
      !CheckSessionId(moved_to).ok() || Find(moved_to) != nullptr) {
    return;
  }
  Session& moved = NewSession(moved_to, s.step);
  moved.lease = lease_.has_value() ? lease_ : last_lease_;
  Fail(moved, v1::ERROR_CODE_AGENT_LOST,
       absl::AbortedError(absl::StrCat(
           "the save of step ", s.step, " by rank ", options_.rank, " ended on its agent (",
           s.outcome.message(), ") before the coordinator moved its plan to session ",
           moved_to, "; no trainer waits for that session")),
       fx);
}

void SaveCore::AskAgainAfterReconnect(Session& s, SaveEffects& fx) {
  // R3: the stream (re)connected while the plan was out, so the session's verdict may have
  // gone to a stream this agent no longer had, and that reconnection's re-submission came
  // before the session was known here. Submit again: the coordinator names the session that
  // holds the plan now (the same one while it is planning: a repeated plan changes nothing).
  if (s.phase != SavePhase::kPlanned || s.plan == nullptr) return;
  Log(fx, Severity::kInfo,
      absl::StrCat("the command stream reconnected while the plan of ", Describe(s),
                   " was being submitted: submitting it again"));
  Resubmit(s, fx);
}

bool SaveCore::SubmittingStep(int64_t step) const {
  return std::any_of(begins_.begin(), begins_.end(),
                     [&](const auto& b) { return b.second->step == step; }) ||
         std::any_of(sessions_.begin(), sessions_.end(), [&](const auto& s) {
           return s.second->step == step && s.second->phase == SavePhase::kPlanned &&
                  s.second->resubmit_rpc != 0;
         });
}

std::vector<v1::Command> SaveCore::TakeHeld(const std::string& session_id) {
  std::vector<v1::Command> mine;
  for (auto it = held_.begin(); it != held_.end();) {
    if (it->session_id() == session_id) {
      mine.push_back(std::move(*it));
      it = held_.erase(it);
    } else {
      ++it;
    }
  }
  return mine;
}

void SaveCore::EndPendingBegin(uint64_t ticket, SaveEffects& fx) {
  begins_.erase(ticket);
  PruneHeld(fx);
}

void SaveCore::PruneHeld(SaveEffects& fx) {
  for (auto it = held_.begin(); it != held_.end();) {
    if (SubmittingStep(it->step())) {
      ++it;
      continue;
    }
    Log(fx, Severity::kInfo,
        absl::StrCat("ignoring command ", CommandName(*it), " for session ", it->session_id(),
                     ", which this agent does not have"));
    it = held_.erase(it);
  }
}

v1::BeginSaveResponse SaveCore::SlotsOf(const Session& s) const {
  v1::BeginSaveResponse response;
  response.set_session_id(s.id);
  response.set_shm_name(s.memory.name);
  response.set_shm_size(s.memory.capacity);
  response.set_plan_cached(s.plan_cached);
  for (const StagingRange& range : s.layout->shards) {
    v1::StagingSlot* slot = response.add_slots();
    slot->set_offset(range.offset);
    slot->set_nbytes(range.nbytes);
  }
  return response;
}

}  // namespace tessera
