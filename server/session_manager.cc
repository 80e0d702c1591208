#include "server/session_manager.h"

#include <algorithm>
#include <tuple>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/box.h"
#include "common/checksum.h"
#include "common/ids.h"
#include "common/log.h"
#include "common/status.h"
#include "common/tensor_key.h"
#include "server/store/keys.h"

namespace tessera {
namespace {

constexpr int64_t kNoStep = -1;

std::string SessionKey(const std::string& job_id, const std::string& session_id) {
  return KeyJoin({job_id, session_id});
}
std::string PlanKey(const std::string& job_id, uint64_t fingerprint) {
  return KeyJoin({job_id, EncodeOrderedUint64(fingerprint)});
}
std::string CheckpointKey(const std::string& job_id, int64_t step) {
  return KeyJoin({job_id, EncodeOrderedInt64(step)});
}

// Identifies a chunk within a session: key and box.
std::string ChunkId(absl::string_view key, const v1::Box& box) {
  return ChunkName(key, BoxFromProto(box)) + "|" + absl::StrJoin(box.lengths(), ",");
}

// Identifies what a replica hash covers: a chunk, or a flat-range slice of one.
std::string HashId(absl::string_view key, const v1::Box& box, bool has_range,
                   const v1::FlatRange& range) {
  std::string id = ChunkId(key, box);
  if (has_range) absl::StrAppend(&id, "[", range.begin(), ":", range.end(), ")");
  return id;
}

std::string StateName(v1::SessionState state) {
  std::string name = v1::SessionState_Name(state);
  constexpr absl::string_view kPrefix = "SESSION_STATE_";
  return absl::StartsWith(name, kPrefix) ? name.substr(kPrefix.size()) : name;
}

v1::ErrorDetail Detail(v1::ErrorCode code, std::string message) {
  v1::ErrorDetail detail;
  detail.set_code(code);
  detail.set_message(std::move(message));
  return detail;
}

std::shared_ptr<const GlobalPlan> PlanFromRecord(const v1::PlanRecord& record) {
  auto plan = std::make_shared<GlobalPlan>();
  plan->fingerprint = record.fingerprint();
  plan->assignments.assign(record.assignments().begin(), record.assignments().end());
  plan->tensors.assign(record.tensors().begin(), record.tensors().end());
  plan->bytes_written_by_rank.assign(record.bytes_written_by_rank().begin(),
                                     record.bytes_written_by_rank().end());
  plan->total_bytes = record.total_bytes();
  // Left empty if an assignment does not parse; the PIN replay reports that as DataLoss.
  FillPeers(plan.get()).IgnoreError();
  return plan;
}

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
      return v1::SESSION_STATE_COMMITTING;
    default:
      return v1::SESSION_STATE_UNSPECIFIED;
  }
}

}  // namespace

SessionManager::SessionManager(StateStore* store, AgentRegistry* registry, CommandSink* sink,
                               Committer* committer, const Clock* clock,
                               SessionManagerOptions options)
    : store_(store),
      registry_(registry),
      sink_(sink),
      committer_(committer),
      clock_(clock),
      options_(std::move(options)) {}

std::string SessionManager::JobDir(const std::string& job_id) const {
  return absl::StrCat(options_.storage_root, "/", job_id);
}

// ---------------------------------------------------------------------------------------------
// Recovery

absl::Status SessionManager::Recover() {
  std::vector<v1::JobRecord> jobs;
  absl::Status parse_error;
  RETURN_IF_ERROR(store_->Scan(Table::kJobs, "", [&](absl::string_view, absl::string_view v) {
    v1::JobRecord record;
    if (!record.ParseFromString(std::string(v))) {
      parse_error = absl::DataLossError("a job record in the state store does not parse");
      return false;
    }
    jobs.push_back(std::move(record));
    return true;
  }));
  RETURN_IF_ERROR(parse_error);

  Outbox out;
  {
    absl::MutexLock lock(&mu_);
    for (v1::JobRecord& record : jobs) {
      const std::string job_id = record.job_id();
      Job& job = jobs_[job_id];
      job.record = std::move(record);
      absl::StatusOr<MeshLayout> mesh = MeshLayout::FromProto(job.record.layout());
      if (!mesh.ok()) {
        return absl::DataLossError(absl::StrCat("the layout of job ", job_id,
                                                " in the state store is invalid"));
      }
      job.mesh = *std::move(mesh);
      RETURN_IF_ERROR(store_->Scan(
          Table::kCheckpoints, KeyPrefix({job_id}),
          [&](absl::string_view, absl::string_view v) {
            v1::CheckpointInfo info;
            if (info.ParseFromString(std::string(v))) job.checkpoints.push_back(std::move(info));
            return true;
          }));
      std::reverse(job.checkpoints.begin(), job.checkpoints.end());  // newest first
      // The session in flight, or else the last one that ended (for its outcome).
      const std::string session_id = job.record.current_session_id().empty()
                                         ? job.record.last_session_id()
                                         : job.record.current_session_id();
      if (session_id.empty()) continue;

      ASSIGN_OR_RETURN(std::optional<std::string> raw,
                       store_->Get(Table::kSessions, SessionKey(job_id, session_id)));
      auto session = std::make_unique<Session>();
      if (!raw.has_value() || !session->record.ParseFromString(*raw)) {
        return absl::DataLossError(absl::StrCat("session ", session_id, " of job ", job_id,
                                                " is missing or corrupt"));
      }
      const v1::SessionState state = session->record.state();
      if (state == v1::SESSION_STATE_COMMITTED || state == v1::SESSION_STATE_ABORTED) {
        // The session ended just before the crash: its agents may not have heard the outcome.
        // Replay it to reconnecting agents as ended sessions are (CurrentCommand), or their
        // trainers would wait in WaitCommitted for a command that never comes.
        job.record.clear_current_session_id();
        v1::Command final;
        final.set_session_id(session->record.session_id());
        final.set_step(session->record.step());
        last_seq_ = std::max(last_seq_ + 1,
                             static_cast<uint64_t>(absl::ToUnixMicros(clock_->Now())));
        final.set_seq(last_seq_);
        if (state == v1::SESSION_STATE_COMMITTED) {
          final.mutable_committed()->set_checkpoint_dir(session->record.checkpoint_dir());
        } else {
          *final.mutable_abort()->mutable_error() = session->record.error();
        }
        job.last_final = std::move(final);
        session->ranks.resize(job.mesh->world_size());
        for (RankProgress& p : session->ranks) p.reached = state;  // for status
        job.last_ended = std::make_unique<v1::SessionStatus>(StatusLocked(job, *session));
        LogInfo("session ", session_id, " of job ", job_id, " step ", session->record.step(),
                " ended ", StateName(state), "; its outcome is replayed to reconnecting agents");
        continue;
      }
      session->phase_started = clock_->Now();
      session->ranks.resize(job.mesh->world_size());
      if (state != v1::SESSION_STATE_PLANNING) {
        ASSIGN_OR_RETURN(std::optional<std::string> plan_raw,
                         store_->Get(Table::kPlans,
                                     PlanKey(job_id, session->record.plan_fingerprint())));
        v1::PlanRecord plan_record;
        if (!plan_raw.has_value() || !plan_record.ParseFromString(*plan_raw)) {
          return absl::DataLossError(absl::StrCat("the plan of session ",
                                                  session->record.session_id(),
                                                  " is missing from the state store"));
        }
        session->plan = PlanFromRecord(plan_record);
        plan_cache_.Insert(job_id, session->plan);
        for (const v1::TensorEntry& t : session->plan->tensors) {
          for (const v1::ChunkEntry& c : t.chunks()) {
            session->chunks[ChunkId(t.key(), c.box())].entry = c;
          }
        }
        // Everyone completed the phases before the current one.
        for (RankProgress& p : session->ranks) {
          p.reached = static_cast<v1::SessionState>(static_cast<int>(state) - 1);
        }
      }
      LogInfo("recovered session ", session->record.session_id(), " of job ", job_id, " step ",
              session->record.step(), " in ", StateName(state));
      job.current = std::move(session);
      Session& s = *job.current;
      // Re-issue the current phase's command so reconnecting agents resume.
      if (state == v1::SESSION_STATE_PINNING) {
        if (s.plan->peers.size() != s.plan->assignments.size() ||
            s.plan->assignments.size() < s.ranks.size()) {
          return absl::DataLossError("a stored plan assignment does not parse");
        }
        for (uint32_t r = 0; r < s.ranks.size(); ++r) {
          v1::Command c;
          c.mutable_pin();  // the assignment goes out encoded, from s.plan
          EmitLocked(job, r, std::move(c), out, s.plan);
        }
      } else if (state == v1::SESSION_STATE_COPYING) {
        v1::Command c;
        c.mutable_copy();
        BroadcastLocked(job, c, out);
      } else if (state == v1::SESSION_STATE_PERSISTING) {
        for (uint32_t r = 0; r < s.ranks.size(); ++r) {
          EmitLocked(job, r, GatherCommandLocked(s, r), out);
        }
      } else if (state == v1::SESSION_STATE_COMMITTING) {
        s.commit_pending = options_.coordinator_commits;
        if (!options_.coordinator_commits) {
          v1::Command c;
          v1::CommitCommand* commit = c.mutable_commit();
          *commit->mutable_manifest() = s.record.manifest();
          commit->set_tmp_dir(s.record.tmp_dir());
          commit->set_final_dir(s.record.checkpoint_dir());
          EmitLocked(job, s.record.committer_rank(), std::move(c), out);
        }
        work_pending_ = true;
      }
    }
    ++version_;
  }
  Deliver(out);
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// RPC-facing methods

absl::StatusOr<std::string> SessionManager::SubmitLocalPlan(
    const v1::SubmitLocalPlanRequest& request) {
  return SubmitLocalPlan(v1::SubmitLocalPlanRequest(request));
}

absl::StatusOr<std::string> SessionManager::SubmitLocalPlan(
    v1::SubmitLocalPlanRequest&& request) {
  const std::string& job_id = request.job_id();
  RETURN_IF_ERROR(registry_->CheckIncarnation(job_id, request.rank(), request.incarnation()));
  std::optional<MeshLayout> layout = registry_->JobLayout(job_id);
  if (!layout.has_value()) return absl::NotFoundError(absl::StrCat("unknown job ", job_id));
  if (static_cast<size_t>(request.shards_size()) > options_.planner.max_shards_per_rank) {
    return MakeError(absl::StatusCode::kInvalidArgument, v1::ERROR_CODE_PLAN_TOO_LARGE,
                     absl::StrCat("rank ", request.rank(), " submitted ", request.shards_size(),
                                  " shards; the limit is ",
                                  options_.planner.max_shards_per_rank));
  }

  // Take and fingerprint the plan before taking the lock every rank's RPCs share. The shards
  // are moved out of the request, not copied: at 1,000 shards per rank a copy of every plan
  // would be half a GiB more for a moment, and a second of allocation.
  LocalPlan plan;
  plan.rank = request.rank();
  plan.shards.reserve(request.shards_size());
  for (v1::ShardDesc& shard : *request.mutable_shards()) plan.shards.push_back(std::move(shard));
  request.clear_shards();
  const uint64_t plan_fingerprint = FingerprintLocalPlan(plan);
  uint64_t plan_bytes = 0;
  for (const v1::ShardDesc& shard : plan.shards) plan_bytes += shard.nbytes();

  Outbox out;
  // Also on the error returns below: a superseded session's ABORT must reach its agents.
  absl::Cleanup deliver = [this, &out] { Deliver(out); };
  std::string session_id;
  {
    absl::MutexLock lock(&mu_);
    auto [it, inserted] = jobs_.try_emplace(job_id);
    Job& job = it->second;
    if (inserted || !job.record.has_layout()) {
      job.record.set_job_id(job_id);
      job.record.set_latest_committed_step(kNoStep);
    }
    // The registry's layout is the job's now (a job may resume on another mesh); a session in
    // flight keeps the layout it started with.
    if (job.current == nullptr) {
      *job.record.mutable_layout() = layout->proto();
      job.mesh = *layout;
    }
    for (const v1::CheckpointInfo& c : job.checkpoints) {
      if (c.step() == request.step()) {
        return MakeError(absl::StatusCode::kFailedPrecondition, v1::ERROR_CODE_STEP_EXISTS,
                         absl::StrCat("job ", job_id, " already has a committed checkpoint of step ",
                                      request.step()));
      }
    }
    // Also a step that retention deleted, or one older than the latest: its directory would
    // be the first retention removes, and "latest" could not move back to it.
    if (request.step() <= job.record.latest_committed_step()) {
      return MakeError(absl::StatusCode::kFailedPrecondition, v1::ERROR_CODE_STEP_EXISTS,
                       absl::StrCat("job ", job_id, " has committed step ",
                                    job.record.latest_committed_step(), "; step ",
                                    request.step(), " is not newer"));
    }
    // A late plan re-opened a step that had already aborted (an agent frozen past its lease
    // submits, after resuming, the step every other rank saw abort), and now a newer step
    // arrives: the others have moved on, so the re-opened session is superseded rather than
    // refusing every save until the planning timeout. Only then: otherwise a newer step while
    // one is PLANNING is a trainer out of step, refused with SESSION_IN_PROGRESS below.
    // Nothing of a PLANNING session is staged or written.
    if (job.current != nullptr && job.current->record.state() == v1::SESSION_STATE_PLANNING &&
        request.step() > job.current->record.step() && job.last_ended != nullptr &&
        job.last_ended->state() == v1::SESSION_STATE_ABORTED &&
        job.last_ended->step() == job.current->record.step()) {
      std::vector<std::string> submitted;
      for (const auto& [r, unused] : job.current->plans) submitted.push_back(absl::StrCat(r));
      v1::ErrorDetail superseded = Detail(
          v1::ERROR_CODE_SUPERSEDED,
          absl::StrCat("step ", job.current->record.step(), " had already aborted (session ",
                       job.last_ended->session_id(), ") when rank(s) ",
                       absl::StrJoin(submitted, ", "), " submitted it again; step ",
                       request.step(), " from rank ", request.rank(), " supersedes it"));
      for (const auto& [r, unused] : job.current->plans) AddRankRef(job, r, &superseded);
      AbortLocked(job, superseded, out);
      *job.record.mutable_layout() = layout->proto();
      job.mesh = *layout;
    }
    if (job.current != nullptr) {
      Session& s = *job.current;
      if (s.record.step() != request.step()) {
        return MakeError(absl::StatusCode::kFailedPrecondition,
                         v1::ERROR_CODE_SESSION_IN_PROGRESS,
                         absl::StrCat("job ", job_id, " is saving step ", s.record.step(),
                                      " (session ", s.record.session_id(), ", ",
                                      StateName(s.record.state()), "); step ", request.step(),
                                      " must wait for it"));
      }
      if (s.record.state() != v1::SESSION_STATE_PLANNING) {
        return s.record.session_id();  // a re-submission after a restart or a lost reply
      }
    } else {
      auto session = std::make_unique<Session>();
      session->record.set_session_id(NewSessionId(request.step()));
      session->record.set_job_id(job_id);
      session->record.set_step(request.step());
      session->record.set_started_unix_ms(absl::ToUnixMillis(clock_->Now()));
      session->record.set_tmp_dir(absl::StrCat(
          JobDir(job_id), "/", TmpDirName(request.step(), session->record.session_id())));
      session->ranks.resize(layout->world_size());
      job.current = std::move(session);
      EnterStateLocked(*job.current, v1::SESSION_STATE_PLANNING);
      job.record.set_current_session_id(job.current->record.session_id());
      absl::Status persisted = PersistSessionLocked(job, StoreBatch());
      if (!persisted.ok()) {
        job.current.reset();
        job.record.clear_current_session_id();
        return persisted;
      }
      LogInfo("session ", job.record.current_session_id(), " opened for job ", job_id,
              " step ", request.step());
    }
    Session& s = *job.current;
    s.plans[request.rank()] = std::move(plan);
    s.plan_fingerprints[request.rank()] = plan_fingerprint;
    s.plan_bytes[request.rank()] = plan_bytes;
    session_id = s.record.session_id();
    ++version_;
    if (s.plans.size() == s.ranks.size()) AdvanceLocked(job, out);
  }
  return session_id;
}

absl::StatusOr<v1::SessionState> SessionManager::ReportPhase(
    const v1::ReportPhaseRequest& request) {
  RETURN_IF_ERROR(
      registry_->CheckIncarnation(request.job_id(), request.rank(), request.incarnation()));
  Outbox out;
  v1::SessionState result;
  {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(Session * s, FindSessionLocked(request.job_id(), request.session_id()));
    Job& job = jobs_[request.job_id()];
    const uint32_t rank = request.rank();
    if (rank >= s->ranks.size()) return absl::InvalidArgumentError("rank outside the mesh");
    const bool committing = s->record.state() == v1::SESSION_STATE_COMMITTING;
    const bool from_committer =
        s->record.committer_is_agent() && s->record.committer_rank() == rank;
    if (request.has_error() && request.error().code() != v1::ERROR_CODE_UNSPECIFIED &&
        committing && !from_committer) {
      // Every chunk is written and reported; a rank that fails now cannot hurt the commit.
      LogWarning("ignoring an error report of rank ", rank, " during COMMITTING: ",
                 request.error().message());
      result = s->record.state();
    } else if (request.has_error() && request.error().code() != v1::ERROR_CODE_UNSPECIFIED) {
      v1::ErrorDetail error = request.error();
      if (error.ranks().empty()) AddRankRef(job, rank, &error);
      AbortLocked(job, error, out);
      result = v1::SESSION_STATE_ABORTED;
    } else {
      const v1::SessionState state = s->record.state();
      const v1::SessionState phase_state = StateOfPhase(request.phase());
      if (phase_state == v1::SESSION_STATE_UNSPECIFIED) {
        return absl::InvalidArgumentError("phase is unspecified");
      }
      if (phase_state > state) {
        return absl::InvalidArgumentError(
            absl::StrCat("rank ", rank, " reported ", v1::AgentPhase_Name(request.phase()),
                         " while the session is ", StateName(state)));
      }
      RankProgress& p = s->ranks[rank];
      if (phase_state == state) {
        switch (request.phase()) {
          case v1::AGENT_PHASE_PINNED:
            p.reached = state;
            p.pinned_bytes = request.pinned_bytes();
            break;
          case v1::AGENT_PHASE_STAGED:
            if (p.reached < state) {
              ++stats_.trainer_stall.count;
              stats_.trainer_stall.seconds += request.trainer_stall_ns() / 1e9;
            }
            p.reached = state;
            p.stall_ns = request.trainer_stall_ns();
            break;
          case v1::AGENT_PHASE_GATHERED:
            p.gathered = true;
            break;
          case v1::AGENT_PHASE_PERSISTED:
            p.gathered = true;
            if (!p.persisted && p.persist_sent && s->writers_active > 0) --s->writers_active;
            p.persisted = true;
            p.reached = state;
            break;
          case v1::AGENT_PHASE_COMMIT_WRITTEN:
            if (s->record.committer_is_agent() && s->record.committer_rank() == rank) {
              p.reached = state;
            }
            break;
          default:
            break;
        }
        ++version_;
        AdvanceLocked(job, out);
      }  // an earlier phase re-reported after a restart: already counted
      result = StateAfterLocked(job, s);
    }
  }
  Deliver(out);
  return result;
}

absl::StatusOr<v1::SessionState> SessionManager::ReportChunks(
    const v1::ReportChunksRequest& request) {
  RETURN_IF_ERROR(
      registry_->CheckIncarnation(request.job_id(), request.rank(), request.incarnation()));
  Outbox out;
  v1::SessionState result;
  {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(Session * s, FindSessionLocked(request.job_id(), request.session_id()));
    Job& job = jobs_[request.job_id()];
    const uint32_t rank = request.rank();
    if (rank >= s->ranks.size()) return absl::InvalidArgumentError("rank outside the mesh");
    if (s->record.state() != v1::SESSION_STATE_PERSISTING &&
        s->record.state() != v1::SESSION_STATE_COMMITTING) {
      return absl::FailedPreconditionError(absl::StrCat(
          "chunks reported while the session is ", StateName(s->record.state())));
    }
    if (s->record.state() == v1::SESSION_STATE_PERSISTING) {
      for (const v1::ChunkReport& report : request.chunks()) {
        auto it = s->chunks.find(ChunkId(report.key(), report.chunk().box()));
        if (it == s->chunks.end()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "rank ", rank, " reported chunk ",
              ChunkName(report.key(), BoxFromProto(report.chunk().box())),
              " which is not in the plan"));
        }
        ChunkReportState& chunk = it->second;
        if (chunk.entry.writer_rank() != rank || chunk.entry.nbytes() != report.chunk().nbytes()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "rank ", rank, " reported chunk ",
              ChunkName(report.key(), BoxFromProto(report.chunk().box())), " of ",
              report.chunk().nbytes(), " bytes; the plan has rank ", chunk.entry.writer_rank(),
              " writing ", chunk.entry.nbytes(), " bytes"));
        }
        if (!chunk.reported) {
          ++s->chunks_reported;
          s->ranks[rank].bytes_written += chunk.entry.nbytes();
          ++s->ranks[rank].chunks_reported;
        }
        chunk.reported = true;
        chunk.entry = report.chunk();
        chunk.entry.set_writer_rank(rank);
      }
      for (const v1::ReplicaHash& hash : request.hashes()) {
        auto& hashes =
            s->replica_hashes[HashId(hash.key(), hash.box(), hash.has_range(), hash.range())];
        bool known = false;
        for (auto& [r, digest] : hashes) {
          if (r == rank) {
            digest = hash.xxh3();
            known = true;
          }
        }
        if (!known) hashes.emplace_back(rank, hash.xxh3());
      }
      ++version_;
      AdvanceLocked(job, out);
    }
    result = StateAfterLocked(job, s);
  }
  Deliver(out);
  return result;
}

std::optional<v1::Command> SessionManager::CurrentCommand(const std::string& job_id,
                                                          uint32_t rank) const {
  std::optional<v1::Command> command;
  std::shared_ptr<const GlobalPlan> plan;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) return std::nullopt;
    if (it->second.current == nullptr) return it->second.last_final;
    for (const auto& [r, latest] : it->second.current->latest) {
      if (r == rank) command = latest;
    }
    plan = it->second.current->plan;
  }
  // A PIN is kept without its assignment (see Session::latest); parsed here, off the lock.
  if (command.has_value() && command->has_pin() && plan != nullptr &&
      rank < plan->assignments.size() &&
      !command->mutable_pin()->mutable_assignment()->ParseFromString(plan->assignments[rank])) {
    LogError("the PIN assignment of rank ", rank, " of job ", job_id, " does not parse");
  }
  return command;
}

void SessionManager::OnAgentRegistered(const std::string& job_id, uint32_t rank,
                                       std::optional<uint64_t> replaced_incarnation) {
  if (!replaced_incarnation.has_value()) return;
  Outbox out;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(job_id);
    if (it == jobs_.end() || it->second.current == nullptr) return;
    Job& job = it->second;
    // COMMITTING needs no agent but the committer, and a restarted committer can simply
    // commit again (the commit is idempotent); everything before needs every rank's staging.
    if (job.current->record.state() == v1::SESSION_STATE_COMMITTING) {
      if (job.current->record.committer_is_agent() &&
          job.current->record.committer_rank() == rank) {
        SendCommitLocked(job, out);
      }
    } else {
      v1::ErrorDetail error = Detail(
          v1::ERROR_CODE_AGENT_LOST,
          absl::StrCat("the agent of rank ", rank, " restarted during ",
                       StateName(job.current->record.state()), "; its staged data is gone"));
      AddRankRef(job, rank, &error);
      AbortLocked(job, error, out);
    }
  }
  Deliver(out);
}

absl::StatusOr<v1::SessionStatus> SessionManager::AbortSession(const std::string& job_id,
                                                               const std::string& reason) {
  Outbox out;
  v1::SessionStatus status;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("unknown job ", job_id));
    Job& job = it->second;
    if (job.current == nullptr) {
      if (job.last_ended != nullptr) {
        return absl::FailedPreconditionError(
            absl::StrCat("session ", job.last_ended->session_id(), " already ended (",
                         StateName(job.last_ended->state()), ")"));
      }
      return absl::NotFoundError(absl::StrCat("job ", job_id, " has no session"));
    }
    if (job.current->record.state() == v1::SESSION_STATE_COMMITTING) {
      // The commit may be renaming the directory into place right now (Tick does it without
      // the lock): an abort would leave a complete checkpoint recorded as ABORTED.
      return absl::FailedPreconditionError(absl::StrCat(
          "session ", job.current->record.session_id(),
          " is COMMITTING: its checkpoint may already be in place, so it can no longer be "
          "aborted"));
    }
    AbortLocked(job,
                Detail(v1::ERROR_CODE_ABORTED_BY_USER,
                       reason.empty() ? "aborted by an operator"
                                      : absl::StrCat("aborted by an operator: ", reason)),
                out);
    status = *job.last_ended;
  }
  Deliver(out);
  return status;
}

absl::StatusOr<v1::SessionStatus> SessionManager::GetSession(
    const std::string& job_id, const std::string& session_id) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("unknown job ", job_id));
  const Job& job = it->second;
  if (job.current != nullptr &&
      (session_id.empty() || job.current->record.session_id() == session_id)) {
    return StatusLocked(job, *job.current);
  }
  if (job.last_ended != nullptr &&
      (session_id.empty() || job.last_ended->session_id() == session_id)) {
    return *job.last_ended;
  }
  if (!session_id.empty()) {
    absl::StatusOr<std::optional<std::string>> raw =
        store_->Get(Table::kSessions, SessionKey(job_id, session_id));
    v1::SessionRecord record;
    if (raw.ok() && raw->has_value() && record.ParseFromString(**raw)) {
      v1::SessionStatus status;
      status.set_session_id(record.session_id());
      status.set_job_id(record.job_id());
      status.set_step(record.step());
      status.set_state(record.state());
      *status.mutable_error() = record.error();
      status.set_started_unix_ms(record.started_unix_ms());
      *status.mutable_phases() = record.phases();
      status.set_bytes_total(record.bytes_total());
      status.set_chunks_total(record.chunks_total());
      status.set_checkpoint_dir(record.checkpoint_dir());
      return status;
    }
  }
  return absl::NotFoundError(absl::StrCat("job ", job_id, " has no session ", session_id));
}

absl::StatusOr<std::vector<v1::CheckpointInfo>> SessionManager::ListCheckpoints(
    const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("unknown job ", job_id));
  return it->second.checkpoints;
}

std::vector<v1::JobInfo> SessionManager::ListJobs() const {
  std::vector<v1::JobInfo> jobs;
  absl::MutexLock lock(&mu_);
  for (const auto& [id, job] : jobs_) {
    v1::JobInfo info;
    info.set_job_id(id);
    *info.mutable_layout() = job.record.layout();
    if (job.mesh.has_value()) info.set_world_size(job.mesh->world_size());
    info.set_latest_committed_step(job.record.latest_committed_step());
    if (job.current != nullptr) {
      info.set_current_session_id(job.current->record.session_id());
      info.set_current_state(job.current->record.state());
    }
    jobs.push_back(std::move(info));
  }
  return jobs;
}

SessionStats SessionManager::Stats() const {
  absl::MutexLock lock(&mu_);
  SessionStats stats = stats_;
  stats.sessions_in_flight = 0;
  for (const auto& [id, job] : jobs_) stats.sessions_in_flight += job.current != nullptr ? 1 : 0;
  return stats;
}

uint64_t SessionManager::version() const {
  absl::MutexLock lock(&mu_);
  return version_;
}

uint64_t SessionManager::AwaitChange(uint64_t seen, absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  auto changed = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return version_ > seen || stop_;
  };
  mu_.AwaitWithDeadline(absl::Condition(&changed), deadline);
  return version_;
}

// ---------------------------------------------------------------------------------------------
// Time-driven work

void SessionManager::Tick() {
  struct CommitWork {
    std::string job_id, session_id, tmp_dir, final_dir;
    v1::Manifest manifest;
  };
  std::vector<CommitWork> commits;
  std::vector<std::string> removals;
  Outbox out;
  {
    absl::MutexLock lock(&mu_);
    work_pending_ = false;
    const absl::Time now = clock_->Now();
    for (auto& [job_id, job] : jobs_) {
      if (job.current == nullptr) continue;
      Session& s = *job.current;
      const v1::SessionState state = s.record.state();

      // Lease expiry. In COMMITTING no rank's staging is needed any more; a lost committer
      // agent is replaced by another one that has the storage mounted.
      std::vector<uint32_t> lost;
      for (uint32_t r : registry_->ExpiredRanks(job_id)) {
        if (state == v1::SESSION_STATE_COMMITTING) {
          if (s.record.committer_is_agent() && s.record.committer_rank() == r) {
            if (PickCommitterLocked(job)) {
              LogWarning("committer rank ", r, " lost; rank ", s.record.committer_rank(),
                         " commits session ", s.record.session_id());
              SendCommitLocked(job, out);
            } else {
              lost.push_back(r);
            }
          }
          continue;
        }
        if (r < s.ranks.size()) lost.push_back(r);
      }
      // A rank that never registered cannot be waited for past planning either; it is
      // covered by the phase timeout.
      if (!lost.empty()) {
        v1::ErrorDetail error =
            Detail(v1::ERROR_CODE_AGENT_LOST,
                   absl::StrCat("lost the agent of rank", lost.size() > 1 ? "s " : " ",
                                absl::StrJoin(lost, ", "), " during ", StateName(state),
                                " (no heartbeat within the lease)"));
        for (uint32_t r : lost) AddRankRef(job, r, &error);
        AbortLocked(job, error, out);
        continue;
      }
      if (now - s.phase_started > PhaseTimeoutLocked(state)) {
        v1::ErrorDetail error = Detail(
            v1::ERROR_CODE_TIMEOUT,
            absl::StrCat(StateName(state), " did not finish within ",
                         absl::FormatDuration(PhaseTimeoutLocked(state))));
        std::vector<uint32_t> waiting;
        for (uint32_t r = 0; r < s.ranks.size(); ++r) {
          bool done = s.ranks[r].reached >= state;
          if (state == v1::SESSION_STATE_PLANNING) {
            done = s.plans.count(r) > 0;
          } else if (state == v1::SESSION_STATE_COMMITTING) {
            // Only a committer agent has work in COMMITTING; the coordinator's own commit
            // failing is no rank's fault.
            done = done || !s.record.committer_is_agent() || s.record.committer_rank() != r;
          }
          if (!done) waiting.push_back(r);
        }
        if (!waiting.empty()) {
          absl::StrAppend(error.mutable_message(), "; waiting for rank",
                          waiting.size() > 1 ? "s " : " ", absl::StrJoin(waiting, ", "));
          for (uint32_t r : waiting) AddRankRef(job, r, &error);
        }
        AbortLocked(job, error, out);
        continue;
      }
      if (state == v1::SESSION_STATE_COMMITTING && s.commit_pending) {
        commits.push_back({job_id, s.record.session_id(), s.record.tmp_dir(),
                           s.record.checkpoint_dir(), s.record.manifest()});
      }
    }
  }
  Deliver(out);
  {
    absl::MutexLock lock(&mu_);
    removals.swap(removals_);
  }
  for (const std::string& dir : removals) {
    if (absl::Status removed = committer_->RemoveDir(dir); !removed.ok()) {
      LogWarning("cannot remove the aborted session's ", dir, ": ", removed.ToString());
    }
  }

  // Commit I/O, outside the lock.
  struct GcWork {
    std::string job_dir;
  };
  std::vector<GcWork> gcs;
  for (CommitWork& work : commits) {
    absl::Status committed = committer_->Commit(work.manifest, work.tmp_dir, work.final_dir);
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(work.job_id);
    if (it == jobs_.end() || it->second.current == nullptr ||
        it->second.current->record.session_id() != work.session_id) {
      continue;
    }
    Job& job = it->second;
    if (committed.ok()) {
      absl::Status marked = MarkCommittedLocked(job, out);
      if (!marked.ok()) {
        LogError("cannot record commit of ", work.session_id, ": ", marked.ToString());
        continue;  // retried by the next Tick
      }
      gcs.push_back({JobDir(work.job_id)});
    } else if (GetErrorCode(committed) == v1::ERROR_CODE_STEP_EXISTS) {
      AbortLocked(job, *GetErrorDetail(committed), out);
    } else if (committed.code() == absl::StatusCode::kInvalidArgument) {
      // Retrying cannot fix a manifest or directory the commit refuses.
      AbortLocked(job,
                  Detail(v1::ERROR_CODE_IO_ERROR,
                         absl::StrCat("the commit was refused: ", committed.message())),
                  out);
    } else {
      LogWarning("commit of ", work.session_id, " failed, will retry: ", committed.ToString());
    }
  }
  Deliver(out);
  for (const GcWork& gc : gcs) {
    if (absl::Status s = committer_->CollectGarbage(gc.job_dir, options_.keep_last, "");
        !s.ok()) {
      LogWarning("retention in ", gc.job_dir, " failed: ", s.ToString());
    }
  }
}

void SessionManager::RunUntilStopped(absl::Duration period) {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || work_pending_; };
      mu_.AwaitWithTimeout(absl::Condition(&wake), period);
      if (stop_) return;
    }
    Tick();
  }
}

void SessionManager::Stop() {
  absl::MutexLock lock(&mu_);
  stop_ = true;
}

// ---------------------------------------------------------------------------------------------
// Transitions

void SessionManager::AdvanceLocked(Job& job, Outbox& out) {
  Session* s = job.current.get();
  if (s == nullptr) return;
  auto all = [&](auto pred) {
    return std::all_of(s->ranks.begin(), s->ranks.end(), pred);
  };
  absl::Status status;
  switch (s->record.state()) {
    case v1::SESSION_STATE_PLANNING:
      if (s->plans.size() == s->ranks.size()) status = BeginPinningLocked(job, out);
      break;
    case v1::SESSION_STATE_PINNING:
      if (all([](const RankProgress& p) { return p.reached >= v1::SESSION_STATE_PINNING; })) {
        status = BeginCopyingLocked(job, out);
      }
      break;
    case v1::SESSION_STATE_COPYING:
      if (all([](const RankProgress& p) { return p.reached >= v1::SESSION_STATE_COPYING; })) {
        status = BeginPersistingLocked(job, out);
      }
      break;
    case v1::SESSION_STATE_PERSISTING:
      HandOutPersistLocked(job, out);
      if (all([](const RankProgress& p) { return p.persisted; }) &&
          s->chunks_reported == s->chunks.size()) {
        status = BeginCommittingLocked(job, out);
      }
      break;
    case v1::SESSION_STATE_COMMITTING:
      if (s->record.committer_is_agent() &&
          s->ranks[s->record.committer_rank()].reached >= v1::SESSION_STATE_COMMITTING) {
        status = MarkCommittedLocked(job, out);
      }
      break;
    default:
      break;
  }
  if (!status.ok() && job.current != nullptr) {
    std::optional<v1::ErrorDetail> detail = GetErrorDetail(status);
    AbortLocked(job,
                detail.has_value()
                    ? *detail
                    : Detail(v1::ERROR_CODE_IO_ERROR,
                             absl::StrCat("coordinator state store failed: ", status.message())),
                out);
  }
}

absl::Status SessionManager::BeginPinningLocked(Job& job, Outbox& out) {
  Session& s = *job.current;
  const MeshLayout& layout = *job.mesh;
  std::vector<LocalPlan> plans;
  std::vector<uint64_t> per_rank;
  plans.reserve(s.plans.size());
  for (auto& [rank, plan] : s.plans) {
    plans.push_back(std::move(plan));
    per_rank.push_back(s.plan_fingerprints[rank]);
  }
  s.plans.clear();
  s.plan_fingerprints.clear();
  const absl::btree_map<uint32_t, uint64_t> staged = std::move(s.plan_bytes);
  s.plan_bytes.clear();

  const uint64_t fingerprint = CombineFingerprints(layout, per_rank);
  std::shared_ptr<const GlobalPlan> plan = plan_cache_.Lookup(job.record.job_id(), fingerprint);
  const bool cached = plan != nullptr;
  if (!cached) {
    absl::StatusOr<GlobalPlan> built = BuildGlobalPlan(layout, plans, options_.planner);
    if (!built.ok()) {
      LogWarning("plan of session ", s.record.session_id(), " rejected: ",
                 built.status().message());
      return built.status();
    }
    plan = std::make_shared<const GlobalPlan>(*std::move(built));
  }
  // The local plans are in the global plan now: free them before its record and the PINs
  // are built, which would otherwise add to the coordinator's peak.
  std::vector<LocalPlan>().swap(plans);

  // Host-RAM admission: the staging every rank of a node pins must fit the node's budget.
  absl::flat_hash_map<std::string, std::pair<uint64_t, uint64_t>> node_need;  // need, budget
  for (const auto& [r, shard_bytes] : staged) {
    if (r >= plan->bytes_written_by_rank.size()) continue;
    uint64_t need = shard_bytes;
    need += plan->bytes_written_by_rank[r];  // a leader's whole gathered boxes
    std::optional<v1::RegisterAgentRequest> reg = registry_->Get(job.record.job_id(), r);
    if (!reg.has_value()) continue;
    auto& [total, budget] = node_need[reg->node_id()];
    total += need;
    budget = std::max(budget, reg->node_host_ram_budget());
  }
  for (const auto& [node, need] : node_need) {
    if (need.second != 0 && need.first > need.second) {
      return MakeError(absl::StatusCode::kResourceExhausted, v1::ERROR_CODE_ADMISSION_DENIED,
                       absl::StrCat("node ", node, " would pin ", need.first,
                                    " bytes of staging for this save; its budget is ",
                                    need.second, " bytes"));
    }
  }

  s.plan = plan;
  s.chunks.clear();
  s.chunks_reported = 0;
  uint32_t chunk_count = 0;
  for (const v1::TensorEntry& t : plan->tensors) {
    for (const v1::ChunkEntry& c : t.chunks()) {
      s.chunks[ChunkId(t.key(), c.box())].entry = c;
      ++chunk_count;
    }
  }
  s.record.set_plan_fingerprint(fingerprint);
  s.record.set_plan_cached(cached);
  s.record.set_bytes_total(plan->total_bytes);
  s.record.set_chunks_total(chunk_count);
  EnterStateLocked(s, v1::SESSION_STATE_PINNING);

  StoreBatch batch;
  const uint64_t stored_fingerprint = job.record.plan_fingerprint();
  if (stored_fingerprint != fingerprint) {
    batch.DeletePrefix(Table::kPlans, KeyPrefix({job.record.job_id()}));
    batch.Put(Table::kPlans, PlanKey(job.record.job_id(), fingerprint),
              EncodePlanRecord(*plan));
    job.record.set_plan_fingerprint(fingerprint);
  }
  if (absl::Status persisted = PersistSessionLocked(job, std::move(batch)); !persisted.ok()) {
    // The plan was not stored: the job must not claim it was, or the next session with the
    // same plans would skip storing it and could not be recovered.
    job.record.set_plan_fingerprint(stored_fingerprint);
    return persisted;
  }
  if (!cached) plan_cache_.Insert(job.record.job_id(), plan);
  LogInfo("session ", s.record.session_id(), ": plan ", cached ? "reused" : "validated", " (",
          chunk_count, " chunks, ", plan->total_bytes, " bytes); PINNING");
  // Each PIN carries its assignment as the plan's encoded bytes (CommandSink::SendPin): a
  // million-piece plan parsed back into messages would cost more than planning it.
  for (uint32_t r = 0; r < s.ranks.size(); ++r) {
    v1::Command c;
    c.mutable_pin()->set_plan_cached(cached);
    EmitLocked(job, r, std::move(c), out, plan);
  }
  return absl::OkStatus();
}

absl::Status SessionManager::BeginCopyingLocked(Job& job, Outbox& out) {
  EnterStateLocked(*job.current, v1::SESSION_STATE_COPYING);
  RETURN_IF_ERROR(PersistSessionLocked(job, StoreBatch()));
  v1::Command c;
  c.mutable_copy();
  BroadcastLocked(job, c, out);
  return absl::OkStatus();
}

absl::Status SessionManager::BeginPersistingLocked(Job& job, Outbox& out) {
  Session& s = *job.current;
  for (uint32_t r = 0; r < s.ranks.size(); ++r) {
    if (auto reg = registry_->Get(job.record.job_id(), r)) {
      (*s.record.mutable_peer_addresses())[r] = reg->peer_address();
    }
  }
  EnterStateLocked(s, v1::SESSION_STATE_PERSISTING);
  RETURN_IF_ERROR(PersistSessionLocked(job, StoreBatch()));
  // Each rank gets the addresses of the ranks it exchanges slices with, not all of them:
  // all of them to every rank is ranks^2 entries (a million at 1,024 ranks).
  for (uint32_t r = 0; r < s.ranks.size(); ++r) EmitLocked(job, r, GatherCommandLocked(s, r), out);
  return absl::OkStatus();
}

v1::Command SessionManager::GatherCommandLocked(const Session& session, uint32_t rank) const {
  v1::Command c;
  v1::GatherCommand* gather = c.mutable_gather();
  const auto& all = session.record.peer_addresses();
  if (session.plan == nullptr || session.plan->peers.size() != session.plan->assignments.size() ||
      rank >= session.plan->peers.size()) {
    *gather->mutable_peer_addresses() = all;  // whom it talks to is unknown: everyone
    return c;
  }
  for (uint32_t peer : session.plan->peers[rank]) {
    auto it = all.find(peer);
    if (it != all.end()) (*gather->mutable_peer_addresses())[peer] = it->second;
  }
  return c;
}

void SessionManager::HandOutPersistLocked(Job& job, Outbox& out) {
  Session& s = *job.current;
  if (!std::all_of(s.ranks.begin(), s.ranks.end(),
                   [](const RankProgress& p) { return p.gathered; })) {
    return;
  }
  for (uint32_t r = 0; r < s.ranks.size(); ++r) {
    RankProgress& p = s.ranks[r];
    if (p.persist_sent || p.persisted) continue;
    const bool writes = s.plan->bytes_written_by_rank[r] > 0;
    if (writes && s.writers_active >= options_.max_concurrent_writers) continue;
    if (writes) ++s.writers_active;
    p.persist_sent = true;
    v1::Command c;
    c.mutable_persist()->set_tmp_dir(s.record.tmp_dir());
    EmitLocked(job, r, std::move(c), out);
  }
}

v1::ErrorDetail SessionManager::CheckReplicaHashesLocked(const Job& job,
                                                         const Session& session) const {
  for (uint32_t r = 0; r < session.plan->assignments.size(); ++r) {
    absl::StatusOr<v1::RankAssignment> assignment = session.plan->Assignment(r);
    if (!assignment.ok()) {
      return Detail(v1::ERROR_CODE_REPLICA_DIVERGED,
                    absl::StrCat("cannot read rank ", r, "'s assignment: ",
                                 assignment.status().message()));
    }
    for (const v1::HashItem& item : assignment->hashes()) {
      const std::string id = ChunkId(item.key(), item.box());
      auto chunk = session.chunks.find(id);
      auto hashes = session.replica_hashes.find(
          HashId(item.key(), item.box(), item.has_range(), item.range()));
      std::optional<uint64_t> replica, reference;
      if (hashes != session.replica_hashes.end()) {
        for (const auto& [rank, digest] : hashes->second) {
          if (rank == r) replica = digest;
          if (rank == item.writer_rank()) reference = digest;
        }
      }
      const std::string name = ChunkName(item.key(), BoxFromProto(item.box()));
      v1::ErrorDetail error;
      if (!replica.has_value()) {
        error = Detail(v1::ERROR_CODE_REPLICA_DIVERGED,
                       absl::StrCat("rank ", r, " did not report the hash of its replica of ",
                                    name));
      } else if (item.has_range() ? (!reference.has_value() || *reference != *replica)
                                  : (chunk == session.chunks.end() ||
                                     ChunkDigest({chunk->second.entry.block_xxh3().begin(),
                                                  chunk->second.entry.block_xxh3().end()}) !=
                                         *replica)) {
        error = Detail(v1::ERROR_CODE_REPLICA_DIVERGED,
                       absl::StrCat("replica ", name, " on rank ", r,
                                    " differs from the copy rank ", item.writer_rank(),
                                    " wrote: these ranks do not hold the same bytes, so it is "
                                    "not a replica (check replicated_over)"));
      } else {
        continue;
      }
      error.add_fqns(item.key());
      for (uint32_t rank : {item.writer_rank(), r}) AddRankRef(job, rank, &error);
      return error;
    }
  }
  return v1::ErrorDetail();
}

absl::Status SessionManager::BeginCommittingLocked(Job& job, Outbox& out) {
  Session& s = *job.current;
  v1::ErrorDetail diverged = CheckReplicaHashesLocked(job, s);
  if (diverged.code() != v1::ERROR_CODE_UNSPECIFIED) {
    return MakeError(absl::StatusCode::kAborted, diverged);
  }
  v1::Manifest* manifest = s.record.mutable_manifest();
  manifest->Clear();
  manifest->set_format_version(1);
  manifest->set_job_id(job.record.job_id());
  manifest->set_step(s.record.step());
  manifest->set_session_id(s.record.session_id());
  *manifest->mutable_layout() = job.record.layout();
  manifest->set_committed_unix_ms(absl::ToUnixMillis(clock_->Now()));
  manifest->set_total_bytes(s.plan->total_bytes);
  for (const v1::TensorEntry& planned : s.plan->tensors) {
    v1::TensorEntry* t = manifest->add_tensors();
    *t = planned;
    for (v1::ChunkEntry& c : *t->mutable_chunks()) {
      c = s.chunks[ChunkId(t->key(), c.box())].entry;
    }
  }
  s.record.set_checkpoint_dir(
      absl::StrCat(JobDir(job.record.job_id()), "/", StepDirName(s.record.step())));

  if (!options_.coordinator_commits) {
    s.record.set_committer_is_agent(true);
    if (!PickCommitterLocked(job)) {
      return MakeError(absl::StatusCode::kAborted, v1::ERROR_CODE_IO_ERROR,
                       "no live agent has the storage root mounted to commit the checkpoint");
    }
  }
  EnterStateLocked(s, v1::SESSION_STATE_COMMITTING);
  RETURN_IF_ERROR(PersistSessionLocked(job, StoreBatch()));
  if (s.record.committer_is_agent()) {
    SendCommitLocked(job, out);
  } else {
    s.commit_pending = true;
    work_pending_ = true;
  }
  return absl::OkStatus();
}

absl::Status SessionManager::MarkCommittedLocked(Job& job, Outbox& out) {
  Session& s = *job.current;
  EnterStateLocked(s, v1::SESSION_STATE_COMMITTED);
  s.commit_pending = false;

  v1::CheckpointInfo info;
  info.set_step(s.record.step());
  info.set_dir(s.record.checkpoint_dir());
  info.set_session_id(s.record.session_id());
  info.set_bytes(s.record.manifest().total_bytes());
  info.set_tensors(s.record.manifest().tensors_size());
  info.set_chunks(s.record.chunks_total());
  info.set_committed_unix_ms(s.record.manifest().committed_unix_ms());

  const int64_t previous_latest = job.record.latest_committed_step();
  job.record.set_latest_committed_step(std::max(previous_latest, s.record.step()));
  const std::string previous_last_session = job.record.last_session_id();
  job.record.clear_current_session_id();
  job.record.set_last_session_id(s.record.session_id());
  std::vector<v1::CheckpointInfo> checkpoints = job.checkpoints;
  checkpoints.push_back(info);
  std::sort(checkpoints.begin(), checkpoints.end(),
            [](const v1::CheckpointInfo& a, const v1::CheckpointInfo& b) {
              return a.step() > b.step();
            });
  StoreBatch batch;
  batch.Put(Table::kCheckpoints, CheckpointKey(job.record.job_id(), info.step()),
            info.SerializeAsString());
  if (options_.keep_last > 0 && checkpoints.size() > static_cast<size_t>(options_.keep_last)) {
    for (size_t i = options_.keep_last; i < checkpoints.size(); ++i) {
      batch.Delete(Table::kCheckpoints,
                   CheckpointKey(job.record.job_id(), checkpoints[i].step()));
    }
    checkpoints.resize(options_.keep_last);
  }
  absl::Status persisted = PersistSessionLocked(job, std::move(batch));
  if (!persisted.ok()) {
    // Stay COMMITTING; the next Tick retries the (idempotent) commit and this record.
    s.record.set_state(v1::SESSION_STATE_COMMITTING);
    s.record.mutable_phases()->RemoveLast();
    s.commit_pending = !s.record.committer_is_agent();
    job.record.set_latest_committed_step(previous_latest);
    job.record.set_current_session_id(s.record.session_id());
    job.record.set_last_session_id(previous_last_session);
    return persisted;
  }
  job.checkpoints = std::move(checkpoints);
  for (RankProgress& p : s.ranks) p.reached = v1::SESSION_STATE_COMMITTED;  // for status
  ++stats_.commits;
  stats_.bytes_committed += s.record.manifest().total_bytes();
  LogInfo("session ", s.record.session_id(), ": COMMITTED step ", s.record.step(), " at ",
          s.record.checkpoint_dir());
  v1::Command c;
  c.mutable_committed()->set_checkpoint_dir(s.record.checkpoint_dir());
  BroadcastLocked(job, c, out);
  job.last_final = s.latest.empty() ? std::nullopt : std::optional(s.latest.front().second);
  job.last_ended = std::make_unique<v1::SessionStatus>(StatusLocked(job, s));
  job.current.reset();
  ++version_;
  return absl::OkStatus();
}

void SessionManager::AbortLocked(Job& job, const v1::ErrorDetail& error, Outbox& out) {
  Session& s = *job.current;
  LogWarning("session ", s.record.session_id(), " of job ", job.record.job_id(), " ABORTED in ",
             StateName(s.record.state()), ": ", ErrorCodeName(error.code()), ": ",
             error.message());
  *s.record.mutable_error() = error;
  ++stats_.aborts_by_reason[ErrorCodeName(error.code())];
  EnterStateLocked(s, v1::SESSION_STATE_ABORTED);
  job.record.clear_current_session_id();
  job.record.set_last_session_id(s.record.session_id());
  absl::Status persisted = PersistSessionLocked(job, StoreBatch());
  if (!persisted.ok()) {
    // The session is gone from memory either way; after a restart it is recovered in its
    // last persisted state and, lacking its agents' staging, aborts again.
    LogError("cannot persist the abort of ", s.record.session_id(), ": ", persisted.ToString());
  }
  v1::Command c;
  *c.mutable_abort()->mutable_error() = error;
  BroadcastLocked(job, c, out);
  job.last_final = s.latest.empty() ? std::nullopt : std::optional(s.latest.front().second);
  if (options_.coordinator_commits && !s.record.tmp_dir().empty()) {
    removals_.push_back(s.record.tmp_dir());  // removed by Tick, outside the lock
    work_pending_ = true;
  }
  job.last_ended = std::make_unique<v1::SessionStatus>(StatusLocked(job, s));
  job.current.reset();
  ++version_;
}

// ---------------------------------------------------------------------------------------------
// Helpers

absl::StatusOr<SessionManager::Session*> SessionManager::FindSessionLocked(
    const std::string& job_id, const std::string& session_id) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("unknown job ", job_id));
  Job& job = it->second;
  if (job.current != nullptr && job.current->record.session_id() == session_id) {
    return job.current.get();
  }
  if (job.last_ended != nullptr && job.last_ended->session_id() == session_id) {
    return absl::FailedPreconditionError(absl::StrCat(
        "session ", session_id, " already ended (", StateName(job.last_ended->state()), ")"));
  }
  return absl::NotFoundError(absl::StrCat("job ", job_id, " has no session ", session_id));
}

v1::SessionState SessionManager::StateAfterLocked(const Job& job, const Session* session) const {
  // `session` may have ended (and been destroyed) during the report; compare pointers only.
  return job.current != nullptr && job.current.get() == session ? job.current->record.state()
                                                                : job.last_ended->state();
}

void SessionManager::EmitLocked(Job& job, uint32_t rank, v1::Command command, Outbox& out,
                                std::shared_ptr<const GlobalPlan> pin_plan) {
  Session& s = *job.current;
  command.set_session_id(s.record.session_id());
  command.set_step(s.record.step());
  // Microseconds of the wall clock: strictly increasing across coordinator restarts too.
  const uint64_t now_us = static_cast<uint64_t>(absl::ToUnixMicros(clock_->Now()));
  last_seq_ = std::max(last_seq_ + 1, now_us);
  command.set_seq(last_seq_);
  bool replaced = false;
  for (auto& [r, latest] : s.latest) {
    if (r == rank) {
      latest = command;
      replaced = true;
    }
  }
  if (!replaced) s.latest.emplace_back(rank, command);
  out.push_back(Outgoing{job.record.job_id(), rank, std::move(command), std::move(pin_plan)});
}

void SessionManager::AddRankRef(const Job& job, uint32_t rank, v1::ErrorDetail* error) {
  v1::RankRef* ref = error->add_ranks();
  ref->set_rank(rank);
  if (job.mesh.has_value()) ref->set_coords(job.mesh->CoordString(rank));
}

bool SessionManager::PickCommitterLocked(Job& job) {
  Session& s = *job.current;
  const std::vector<uint32_t> expired = registry_->ExpiredRanks(job.record.job_id());
  for (uint32_t r = 0; r < s.ranks.size(); ++r) {
    std::optional<v1::RegisterAgentRequest> reg = registry_->Get(job.record.job_id(), r);
    if (reg.has_value() && reg->storage_root_mounted() &&
        std::find(expired.begin(), expired.end(), r) == expired.end()) {
      s.record.set_committer_rank(r);
      return true;
    }
  }
  return false;
}

void SessionManager::SendCommitLocked(Job& job, Outbox& out) {
  Session& s = *job.current;
  v1::Command c;
  v1::CommitCommand* commit = c.mutable_commit();
  *commit->mutable_manifest() = s.record.manifest();
  commit->set_tmp_dir(s.record.tmp_dir());
  commit->set_final_dir(s.record.checkpoint_dir());
  EmitLocked(job, s.record.committer_rank(), std::move(c), out);
}

void SessionManager::BroadcastLocked(Job& job, const v1::Command& command, Outbox& out) {
  for (uint32_t r = 0; r < job.current->ranks.size(); ++r) EmitLocked(job, r, command, out);
}

void SessionManager::EnterStateLocked(Session& session, v1::SessionState state) {
  const absl::Time now = clock_->Now();
  if (!session.record.phases().empty()) {
    v1::PhaseTiming* last = session.record.mutable_phases(session.record.phases_size() - 1);
    last->set_duration_ms(absl::ToUnixMillis(now) - last->entered_unix_ms());
    SessionStats::Timing& t = stats_.phase_seconds[StateName(last->state())];
    ++t.count;
    t.seconds += last->duration_ms() / 1000.0;
  }
  v1::PhaseTiming* timing = session.record.add_phases();
  timing->set_state(state);
  timing->set_entered_unix_ms(absl::ToUnixMillis(now));
  session.record.set_state(state);
  session.phase_started = now;
  ++version_;
}

absl::Status SessionManager::PersistSessionLocked(Job& job, StoreBatch batch) {
  const Session& s = *job.current;
  batch.Put(Table::kSessions, SessionKey(job.record.job_id(), s.record.session_id()),
            s.record.SerializeAsString());
  batch.Put(Table::kJobs, job.record.job_id(), job.record.SerializeAsString());
  RETURN_IF_ERROR(store_->Commit(batch));
  if (options_.on_state_persisted) options_.on_state_persisted(s.record.state());
  return absl::OkStatus();
}

absl::Duration SessionManager::PhaseTimeoutLocked(v1::SessionState state) const {
  switch (state) {
    case v1::SESSION_STATE_PLANNING:
      return options_.planning_timeout;
    case v1::SESSION_STATE_PINNING:
      return options_.pinning_timeout;
    case v1::SESSION_STATE_COPYING:
      return options_.copying_timeout;
    case v1::SESSION_STATE_PERSISTING:
      return options_.persisting_timeout;
    case v1::SESSION_STATE_COMMITTING:
      return options_.committing_timeout;
    default:
      return absl::InfiniteDuration();
  }
}

v1::SessionStatus SessionManager::StatusLocked(const Job& job, const Session& s) const {
  v1::SessionStatus status;
  status.set_session_id(s.record.session_id());
  status.set_job_id(job.record.job_id());
  status.set_step(s.record.step());
  status.set_state(s.record.state());
  *status.mutable_error() = s.record.error();
  status.set_started_unix_ms(s.record.started_unix_ms());
  *status.mutable_phases() = s.record.phases();
  status.set_bytes_total(s.record.bytes_total());
  status.set_chunks_total(s.record.chunks_total());
  status.set_chunks_reported(s.chunks_reported);
  status.set_checkpoint_dir(s.record.state() == v1::SESSION_STATE_COMMITTED
                                ? s.record.checkpoint_dir()
                                : "");
  status.set_plan_cached(s.record.plan_cached());
  const v1::SessionState state = s.record.state();
  uint64_t written = 0;
  for (uint32_t r = 0; r < s.ranks.size(); ++r) {
    const RankProgress& p = s.ranks[r];
    v1::RankProgress* rp = status.add_ranks();
    rp->set_rank(r);
    if (job.mesh.has_value()) rp->set_coords(job.mesh->CoordString(r));
    rp->set_reached(p.reached);
    rp->set_bytes_staged(p.reached >= v1::SESSION_STATE_COPYING ? p.pinned_bytes : 0);
    rp->set_bytes_planned(s.plan != nullptr && r < s.plan->bytes_written_by_rank.size()
                              ? s.plan->bytes_written_by_rank[r]
                              : 0);
    rp->set_bytes_written(p.bytes_written);
    rp->set_chunks_reported(p.chunks_reported);
    rp->set_trainer_stall_ns(p.stall_ns);
    const bool in_flight = state >= v1::SESSION_STATE_PINNING &&
                           state <= v1::SESSION_STATE_PERSISTING;
    rp->set_straggler(in_flight && (state == v1::SESSION_STATE_PERSISTING ? !p.persisted
                                                                           : p.reached < state));
    written += p.bytes_written;
  }
  status.set_bytes_written(written);
  return status;
}

void SessionManager::Deliver(Outbox& out) {
  for (Outgoing& o : out) {
    if (o.pin_plan != nullptr && o.rank < o.pin_plan->assignments.size()) {
      sink_->SendPin(o.job_id, o.rank, o.command, o.pin_plan->assignments[o.rank]);
    } else {
      sink_->Send(o.job_id, o.rank, o.command);
    }
    o = Outgoing();  // free each command as soon as it is handed over
  }
  out.clear();
}

void CommandSink::SendPin(const std::string& job_id, uint32_t rank, const v1::Command& command,
                          absl::string_view assignment) {
  v1::Command c = command;
  if (!c.mutable_pin()->mutable_assignment()->ParseFromArray(
          assignment.data(), static_cast<int>(assignment.size()))) {
    LogError("the PIN assignment of rank ", rank, " of job ", job_id, " does not parse");
  }
  Send(job_id, rank, c);
}

}  // namespace tessera
