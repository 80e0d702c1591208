// JobCore::Recover: a job as the state store holds it. The one path from the store back to a
// running job — after a coordinator restart, and after a write the store refused.
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status.h"
#include "server/session/job_core.h"
#include "server/session/schema.h"
#include "server/session/status_view.h"

namespace tessera {

absl::StatusOr<std::unique_ptr<JobCore>> JobCore::Recover(JobContext context,
                                                          const StateStore& store,
                                                          const std::string& job_id,
                                                          absl::Time now, Effects& out) {
  ASSIGN_OR_RETURN(std::optional<v1::JobRecord> record, ReadJob(store, job_id));
  if (!record.has_value()) {
    return absl::DataLossError(absl::StrCat("job ", job_id, " has no record in the state store"));
  }
  ASSIGN_OR_RETURN(std::vector<v1::CheckpointInfo> checkpoints, ReadCheckpoints(store, job_id));
  std::unique_ptr<JobCore> job(
      new JobCore(std::move(context), *std::move(record), std::move(checkpoints)));
  ASSIGN_OR_RETURN(job->memory_checkpoint_, ReadMemoryCheckpoint(store, job_id));
  // Its COMMITTED may not have reached every agent (a stream down at the commit, the outcome
  // replayed below or on reconnection; a later session need not have involved that agent's
  // stream): they may not have kept it yet (Effects::memory_committed). Agents that did name
  // it in every heartbeat; a registry that noted it already keeps its note.
  if (job->memory_checkpoint_.has_value()) {
    out.memory_committed = job->memory_checkpoint_->info().session_id();
  }
  if (job->record_.has_layout()) {
    absl::StatusOr<MeshLayout> mesh = MeshLayout::FromProto(job->record_.layout());
    if (!mesh.ok()) {
      return absl::DataLossError(
          absl::StrCat("the layout of job ", job_id, " in the state store is invalid"));
    }
    job->mesh_ = *std::move(mesh);
  }

  // The outcomes of the last sessions that ended, for ranks that missed them.
  for (const std::string& id : job->record_.recent_session_ids()) {
    ASSIGN_OR_RETURN(std::optional<v1::SessionRecord> ended, ReadSession(store, job_id, id));
    if (ended.has_value() && (ended->state() == v1::SESSION_STATE_COMMITTED ||
                              ended->state() == v1::SESSION_STATE_ABORTED)) {
      job->RememberFinal(job->Final(*ended));
    }
  }

  // A retention that a crash (or an I/O error) left undone.
  if (job->context_.options->coordinator_commits && !job->record_.retention_pending().empty()) {
    out.retention = job->PendingRetention(job->record_.latest_committed_step());
  }

  // The session in flight, or else the last one that ended (for its outcome).
  const std::string session_id = job->record_.current_session_id().empty()
                                     ? job->record_.last_session_id()
                                     : job->record_.current_session_id();
  if (session_id.empty()) return job;
  ASSIGN_OR_RETURN(std::optional<v1::SessionRecord> session,
                   ReadSession(store, job_id, session_id));
  if (!session.has_value()) {
    return absl::DataLossError(
        absl::StrCat("session ", session_id, " of job ", job_id, " is missing"));
  }
  const v1::SessionState state = session->state();
  if (state == v1::SESSION_STATE_COMMITTED || state == v1::SESSION_STATE_ABORTED) {
    // It ended just before: its agents may not have heard the outcome. It is replayed to
    // agents whose command stream reconnects, or their trainers would wait for it forever.
    job->record_.clear_current_session_id();
    job->last_final_ = job->Final(*session);
    if (job->recent_finals_.empty() ||
        job->recent_finals_.back().session_id() != session->session_id()) {
      job->RememberFinal(*job->last_final_);
    }
    job->last_ended_ = StatusFromRecord(*session);
    // Told at once as well: after a refused write that still reached the disk, the agents'
    // streams did not break, so nothing would make them ask (found by tests/sim).
    if (job->mesh_.has_value()) {
      for (uint32_t r = 0; r < job->mesh_->world_size(); ++r) {
        out.commands.push_back(Outgoing{r, *job->last_final_, nullptr});
      }
    }
    return job;
  }
  if (!job->mesh_.has_value()) {
    return absl::DataLossError(absl::StrCat("job ", job_id, " has a session but no layout"));
  }
  std::shared_ptr<const GlobalPlan> plan;
  if (state != v1::SESSION_STATE_PLANNING) {
    ASSIGN_OR_RETURN(plan, ReadPlan(store, job_id, session->plan_fingerprint()));
  }
  std::shared_ptr<const v1::Manifest> manifest;
  if (state == v1::SESSION_STATE_COMMITTING) {
    ASSIGN_OR_RETURN(manifest, ReadStoredManifest(store, job_id, session_id));
  }
  job->latest_.assign(job->mesh_->world_size(), std::nullopt);
  ASSIGN_OR_RETURN(job->current_,
                   SessionMachine::Recover(job->MakeSessionContext(), *std::move(session),
                                           std::move(plan), std::move(manifest), now, out));
  LogInfo("recovered session ", session_id, " of job ", job_id, " in ", StateName(state));
  return job;
}

}  // namespace tessera
