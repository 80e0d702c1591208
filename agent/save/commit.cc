// SaveCore, part 4: the commit sub-machine of a committer agent (C1–C5): a COMMIT's paths
// (R4) and lease (R5 for commits), the attempt, and its resolution. C5's retry fires from
// Tick (save_core.cc). The contract: save_core.h.
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "agent/save/save_core.h"
#include "agent/save/save_core_internal.h"
#include "common/ids.h"

namespace tessera {

using save_core_internal::CheckSessionId;
using save_core_internal::DetailFor;
using save_core_internal::Live;
using save_core_internal::PhaseReport;
using save_core_internal::Severity;

void SaveCore::HandleCommit(Session& s, const v1::Command& command, SaveEffects& fx) {
  if (s.phase == SavePhase::kFailed) {
    // R4: it refused a COMMIT of this session. Asked again, the coordinator did not count
    // that refusal: say it again, with every report of the session.
    Log(fx, Severity::kWarning,
        absl::StrCat("COMMIT for ", Describe(s), ", which failed on this agent (",
                     s.outcome.message(), "); re-sending its reports"));
    s.reports.ResendAll();
    Pump(s, fx);
    return;
  }
  if (s.phase != SavePhase::kPersisted && s.phase != SavePhase::kCommitOnly) {
    if (Live(s.phase)) {
      Log(fx, Severity::kWarning,
          absl::StrCat("ignoring COMMIT for ", Describe(s), ", which is ",
                       SavePhaseName(s.phase), " on this agent"));
    }
    return;
  }
  const std::string tmp_dir = TmpDirPath(storage_root_, options_.job_id, s.step, s.id);
  const std::string final_dir = StepDirPath(storage_root_, options_.job_id, s.step);
  absl::Status bad = CheckSessionId(s.id);
  if (bad.ok()) bad = CheckPath("COMMIT's tmp_dir", command.commit().tmp_dir(), tmp_dir);
  if (bad.ok()) bad = CheckPath("COMMIT's final_dir", command.commit().final_dir(), final_dir);
  if (!bad.ok()) {
    Fail(s, v1::ERROR_CODE_IO_ERROR, bad, fx);
    return;
  }
  if (lease_known_ && !lease_.has_value()) {
    Log(fx, Severity::kWarning,
        absl::StrCat("ignoring COMMIT for ", Describe(s),
                     ": this agent's lease has lapsed; the coordinator asks again"));
    return;
  }
  if (!s.commit.has_value()) s.commit.emplace(options_.retry_backoff, NewSeed());
  Commit& c = *s.commit;
  c.latest = std::make_shared<const v1::CommitCommand>(command.commit());
  c.lease = lease_;
  c.tmp_dir = tmp_dir;
  c.final_dir = final_dir;
  c.job_dir = JobDirPath(storage_root_, options_.job_id);
  if (c.state == CommitState::kResolving) {
    c.run_again = true;
    return;
  }
  StartCommit(s, fx);  // C1, C5
}

void SaveCore::StartCommit(Session& s, SaveEffects& fx) {
  Commit& c = *s.commit;
  c.state = CommitState::kResolving;
  c.retry_at = absl::InfiniteFuture();
  c.run_again = false;
  StartWork(s, CommitWork{c.tmp_dir, c.final_dir, c.job_dir, s.step, c.latest}, fx);
}

SaveEffects SaveCore::OnCommitResolved(absl::Time now, uint64_t work_id,
                                       const CommitWorkResult& result) {
  SaveEffects fx;
  Session* s = TakeWork(work_id, std::nullopt, fx);
  if (s == nullptr || !s->commit.has_value()) return Done(now, std::move(fx));
  Commit& c = *s->commit;
  const bool retention_complete = result.retention.has_value() && result.retention->ok() &&
                                  (*result.retention)->failed.empty();
  if (result.retention.has_value()) {  // never fails the session: logged
    if (!result.retention->ok()) {
      Log(fx, Severity::kWarning,
          absl::StrCat("retention after committing step ", s->step,
                       " did not run: ", result.retention->status().ToString()));
    } else {
      for (const std::string& name : (*result.retention)->removed) {
        Log(fx, Severity::kInfo, absl::StrCat("retention removed ", name));
      }
      for (const auto& [name, error] : (*result.retention)->failed) {
        Log(fx, Severity::kWarning,
            absl::StrCat("retention could not remove ", name, ": ", error.ToString()));
      }
    }
  }
  switch (result.resolution.outcome) {
    case CommitOutcome::kCommitted:  // C2
      c.state = CommitState::kWritten;
      if (!c.reported) {
        c.reported = true;
        Log(fx, Severity::kInfo, absl::StrCat(Describe(*s), " committed at ", c.final_dir));
        v1::ReportPhaseRequest written = PhaseReport(v1::AGENT_PHASE_COMMIT_WRITTEN);
        written.set_retention_complete(retention_complete);
        AddPhaseReport(*s, std::move(written), fx);
      } else {
        // Asked again: the coordinator did not hear (or lost) the report. Say it all again.
        s->reports.ResendAll();
      }
      break;
    case CommitOutcome::kRolledBack:  // C3
      c.state = CommitState::kRolledBack;
      if (!c.reported) {
        c.reported = true;
        const v1::ErrorDetail why = DetailFor(v1::ERROR_CODE_IO_ERROR, result.resolution.status);
        Log(fx, Severity::kWarning,
            absl::StrCat("the commit of ", Describe(*s), " was rolled back: ", why.message()));
        v1::ReportPhaseRequest rolled_back = PhaseReport(v1::AGENT_PHASE_COMMIT_ROLLED_BACK);
        *rolled_back.mutable_error() = why;
        AddPhaseReport(*s, std::move(rolled_back), fx);
      }
      break;
    case CommitOutcome::kUnresolved:  // C4
      c.state = CommitState::kBackoff;
      c.retry_at = now + c.backoff.Next();
      Log(fx, Severity::kWarning,
          absl::StrCat("the commit of ", Describe(*s), " is unresolved (",
                       result.resolution.status.ToString(), "); retrying"));
      break;
  }
  if (c.run_again) StartCommit(*s, fx);
  return Done(now, std::move(fx));
}

bool SaveCore::CommitLeaseCurrent(const Commit& c) const {
  if (!lease_known_) return true;
  return lease_.has_value() && c.lease.has_value() && *lease_ == *c.lease;
}

}  // namespace tessera
