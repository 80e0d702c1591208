// SaveCore, part 5: reports to the coordinator and their re-sending (R3): each session's
// ReportQueue fed and pumped; everything re-sent on registration, on the command stream's
// (re)connection and after a failed report; reminders while a verdict is awaited. The
// contract: save_core.h.
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "agent/save/save_core.h"
#include "agent/save/save_core_internal.h"

namespace tessera {

using save_core_internal::Live;
using save_core_internal::Severity;

// ---------------------------------------------------------------------------------------------
// Registration, the stream, reports (R3)

SaveEffects SaveCore::OnRegistered(absl::Time now, uint64_t coordinator_incarnation,
                                   const std::string& storage_root) {
  SaveEffects fx;
  if (stopped_) return Done(now, std::move(fx));
  storage_root_ = storage_root;
  ++connections_;
  ResendAll(absl::StrCat("registered with coordinator incarnation ", coordinator_incarnation),
            fx);
  return Done(now, std::move(fx));
}

SaveEffects SaveCore::OnStreamConnected(absl::Time now) {
  SaveEffects fx;
  if (!stopped_) {
    ++connections_;
    ResendAll("the command stream connected", fx);
  }
  return Done(now, std::move(fx));
}

void SaveCore::ResendAll(absl::string_view why, SaveEffects& fx) {
  resend_at_ = absl::InfiniteFuture();
  size_t reports = 0, plans = 0;
  for (auto& [id, s] : sessions_) {
    if (s->orphaned) continue;
    if (s->reports.closed()) {
      // Ended on the coordinator, its verdict not here yet: ask for it again (ReportQueue).
      if (AwaitingVerdict(*s)) {
        s->reports.Remind();
        Pump(*s, fx);
      }
      continue;
    }
    if (s->phase == SavePhase::kPlanned && s->plan != nullptr && s->resubmit_rpc == 0) {
      Resubmit(*s, fx);
      ++plans;
    }
    reports += s->reports.size();
    s->reports.ResendAll();
    Pump(*s, fx);
  }
  if (!why.empty() && reports + plans > 0) {
    Log(fx, Severity::kInfo,
        absl::StrCat(why, ": re-sending ", plans, " plan(s) and ", reports, " report(s)"));
  }
}

void SaveCore::Pump(Session& s, SaveEffects& fx) {
  std::optional<ReportQueue::Report> next = s.reports.Next(next_id_);
  if (!next.has_value()) return;
  const uint64_t rpc = next_id_++;
  rpcs_[rpc] = {RpcOwner::kReport, 0, s.id};
  if (next->chunks != nullptr) {
    fx.rpcs.push_back({rpc, std::move(next->chunks)});
  } else {
    fx.rpcs.push_back({rpc, std::move(next->phase)});
  }
}

void SaveCore::AddPhaseReport(Session& s, v1::ReportPhaseRequest report, SaveEffects& fx) {
  report.set_job_id(options_.job_id);
  report.set_rank(options_.rank);
  report.set_incarnation(options_.incarnation);
  report.set_session_id(s.id);
  s.reports.Add({nullptr, std::make_shared<const v1::ReportPhaseRequest>(std::move(report))});
  Pump(s, fx);
}

void SaveCore::AddChunkReport(Session& s, v1::ReportChunksRequest request, SaveEffects& fx) {
  request.set_job_id(options_.job_id);
  request.set_rank(options_.rank);
  request.set_incarnation(options_.incarnation);
  request.set_session_id(s.id);
  s.reports.Add({std::make_shared<const v1::ReportChunksRequest>(std::move(request)), nullptr});
  Pump(s, fx);
}

SaveEffects SaveCore::OnReportDone(absl::Time now, uint64_t rpc_id, const absl::Status& result) {
  SaveEffects fx;
  auto it = rpcs_.find(rpc_id);
  if (stopped_ || it == rpcs_.end()) return Done(now, std::move(fx));
  const RpcRef ref = it->second;
  rpcs_.erase(it);
  Session* s = Find(ref.session);
  if (s == nullptr) return Done(now, std::move(fx));
  switch (s->reports.OnResult(rpc_id, result.code())) {
    case ReportQueue::Result::kDelivered:
      resend_backoff_.Reset();
      if (reports_failing_) {
        reports_failing_ = false;
        Log(fx, Severity::kInfo, "reports are delivered again");
      }
      break;
    case ReportQueue::Result::kRefused:
      Log(fx, Severity::kError,
          absl::StrCat("a report of ", Describe(*s), " was refused: ", result.ToString()));
      break;
    case ReportQueue::Result::kSessionEnded:
      Log(fx, Severity::kInfo,
          absl::StrCat("the coordinator has ended ", Describe(*s), " (", result.message(),
                       "); waiting for its verdict"));
      // The coordinator sent the verdict again, to the stream it had then; if that was not
      // this agent's (a reconnection in between), ask again after a while (R3).
      s->remind_at = now + s->remind_backoff.Next();
      break;
    case ReportQueue::Result::kFailed:
      if (!reports_failing_) {
        reports_failing_ = true;
        Log(fx, Severity::kWarning,
            absl::StrCat("a report of ", Describe(*s), " was not delivered (",
                         result.ToString(), "); re-sending with backoff until it is"));
      }
      if (resend_at_ == absl::InfiniteFuture()) resend_at_ = now + resend_backoff_.Next();
      break;
    case ReportQueue::Result::kNotOurs:
      break;
  }
  Pump(*s, fx);
  return Done(now, std::move(fx));
}

bool SaveCore::AwaitingVerdict(const Session& s) const {
  return !s.orphaned && (Live(s.phase) || s.phase == SavePhase::kFailed) &&
         s.reports.closed() && s.reports.ended_on_coordinator();
}

}  // namespace tessera
