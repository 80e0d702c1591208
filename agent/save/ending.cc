// SaveCore, part 6: the end of sessions (edges 13–16): a local failure (R6); an ABORT's
// ending, which waits for the session's work and removes the tmp dir this rank wrote into
// (R7); and the end itself: the verdict to the trainer and what the shell keeps (R11). The
// contract: save_core.h.
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "agent/save/save_core.h"
#include "agent/save/save_core_internal.h"
#include "common/status.h"

namespace tessera {

using save_core_internal::DetailFor;
using save_core_internal::Live;
using save_core_internal::PhaseReport;
using save_core_internal::Severity;

// ---------------------------------------------------------------------------------------------
// Failure and the end (R6, R7)

void SaveCore::Fail(Session& s, v1::ErrorCode code, const absl::Status& cause,
                    SaveEffects& fx) {
  const v1::ErrorDetail detail = DetailFor(code, cause);
  if (!Live(s.phase)) {
    Log(fx, Severity::kWarning,
        absl::StrCat(Describe(s), " failed on this rank after it was ", SavePhaseName(s.phase),
                     ": ", detail.message()));
    return;
  }
  Log(fx, Severity::kError,
      absl::StrCat(Describe(s), " failed on this rank: ", ErrorCodeName(detail.code()), ": ",
                   detail.message()));
  s.phase = SavePhase::kFailed;  // edge 13
  s.outcome = ErrorFromDetail(detail);
  if (s.commit.has_value()) s.commit->retry_at = absl::InfiniteFuture();
  v1::ReportPhaseRequest failed = PhaseReport(v1::AGENT_PHASE_UNSPECIFIED);
  *failed.mutable_error() = detail;
  AddPhaseReport(s, std::move(failed), fx);
}

void SaveCore::BeginEnding(Session& s, absl::Status verdict, SaveEffects& fx) {
  Log(fx, Severity::kWarning, absl::StrCat(Describe(s), " aborted: ", verdict.message()));
  s.phase = SavePhase::kEnding;  // edge 14
  s.outcome = std::move(verdict);
  s.reports.Close();
  if (s.commit.has_value()) s.commit->retry_at = absl::InfiniteFuture();
  fx.cancel_exchanges.push_back(s.id);  // wake an exchange in progress now, not after it
  if (s.begin_waiting) {
    s.begin_waiting = false;
    Reply(fx, s.begin_ticket, BeginSaveReply{s.outcome});
  }
  ContinueEnding(s, fx);
}

void SaveCore::ContinueEnding(Session& s, SaveEffects& fx) {
  if (s.work != 0) return;  // its result continues the ending
  // This rank wrote (or began writing) into the session's temporary directory. The
  // coordinator removes it too, but it may have done so before this rank's write created it
  // again: an aborted session leaves nothing behind either way.
  if (!s.written_dir.empty() && !s.removed) {
    s.removed = true;
    StartWork(s, RemoveWork{s.written_dir}, fx);
    return;
  }
  End(s, s.outcome, "", fx);  // edge 15
}

void SaveCore::End(Session& s, absl::Status outcome, std::string checkpoint_dir,
                   SaveEffects& fx) {
  // R11: this rank wrote its data file from staging, and nothing was staged since.
  if (outcome.ok() && s.phase == SavePhase::kPersisted && s.layout != nullptr &&
      s.layout->file.has_value() && s.memory.data != nullptr) {
    fx.resident = ResidentSave{s.step, s.id, s.layout->file_name, s.layout->file->data_start,
                               s.layout->file->data_size, s.memory};
  }
  s.phase = outcome.ok() ? SavePhase::kCommitted : SavePhase::kAborted;
  s.outcome = std::move(outcome);
  s.checkpoint_dir = std::move(checkpoint_dir);
  s.reports.Close();
  if (s.commit.has_value()) s.commit->retry_at = absl::InfiniteFuture();
  // The staging region stays in the pool for the next save (and mapped in the trainer):
  // recreating and re-faulting a gigabyte of shared memory per save would land in the
  // trainer's stall.
  s.layout.reset();
  s.memory = StagingMemory();
  if (s.begin_waiting) {
    s.begin_waiting = false;
    Reply(fx, s.begin_ticket,
          BeginSaveReply{s.outcome.ok() ? absl::InternalError("committed before the copy")
                                        : s.outcome});
  }
  for (const Waiter& w : s.waiters) {
    Reply(fx, w.ticket,
          s.outcome.ok() ? WaitCommittedReply{s.checkpoint_dir} : WaitCommittedReply{s.outcome});
  }
  s.waiters.clear();
  if (s.phase == SavePhase::kCommitted) {
    ++committed_;
    fx.committed = s.id;
    Log(fx, Severity::kInfo,
        absl::StrCat(Describe(s), s.checkpoint_dir.empty()
                                      ? std::string(" committed in memory only")
                                      : absl::StrCat(" committed at ", s.checkpoint_dir)));
  }
  if (!s.orphaned) finished_.push_back(s.id);
}

SaveEffects SaveCore::OnRemoved(absl::Time now, uint64_t work_id, const absl::Status& result) {
  SaveEffects fx;
  if (auto it = work_.find(work_id); it != work_.end() && !result.ok()) {
    Log(fx, Severity::kWarning,
        absl::StrCat("could not remove the directory of aborted session ", it->second, ": ",
                     result.ToString()));
  }
  TakeWork(work_id, std::nullopt, fx);  // the ending goes on (edge 15)
  return Done(now, std::move(fx));
}

}  // namespace tessera
