#include "agent/save_executor.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "format/data_file.h"
#include "common/checksum.h"
#include "common/log.h"
#include "common/status.h"
#include "format/commit.h"

namespace tessera {
namespace {

v1::ErrorDetail DetailFor(v1::ErrorCode code, const absl::Status& cause) {
  std::optional<v1::ErrorDetail> detail = GetErrorDetail(cause);
  v1::ErrorDetail out = detail.has_value() ? *detail : v1::ErrorDetail();
  if (out.code() == v1::ERROR_CODE_UNSPECIFIED) out.set_code(code);
  if (out.message().empty()) out.set_message(std::string(cause.message()));
  return out;
}

bool Finished(const absl::Status& outcome, bool committed) { return committed || !outcome.ok(); }

}  // namespace

SaveExecutor::SaveExecutor(CoordinatorClient* coordinator, StagingPool* staging,
                           Storage* storage, PeerTransport* peers, SaveExecutorOptions options)
    : coordinator_(coordinator),
      staging_(staging),
      storage_(storage),
      peers_(peers),
      options_(std::move(options)) {
  worker_ = std::thread([this] { RunWorker(); });
}

SaveExecutor::~SaveExecutor() { Shutdown(); }

void SaveExecutor::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (stop_ && !worker_.joinable()) return;
    stop_ = true;
  }
  if (worker_.joinable()) worker_.join();
  std::vector<BeginSaveDone> begins;
  std::vector<CommitDone> waits;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, s] : sessions_) {
      if (s->begin_done) begins.push_back(std::move(s->begin_done));
      s->begin_done = nullptr;
      for (auto& [deadline, done] : s->waiters) waits.push_back(std::move(done));
      s->waiters.clear();
    }
  }
  const absl::Status down = absl::UnavailableError("the agent is shutting down");
  for (auto& done : begins) done(down);
  for (auto& done : waits) done(down);
}

uint64_t SaveExecutor::sessions_committed() const {
  absl::MutexLock lock(&mu_);
  return committed_;
}

// ---------------------------------------------------------------------------------------------
// Public entry points: enqueue.

void SaveExecutor::Post(Task task) {
  absl::MutexLock lock(&mu_);
  tasks_.push_back(std::move(task));
}

uint64_t SaveExecutor::BeginSave(v1::BeginSaveRequest request, BeginSaveDone done) {
  uint64_t ticket;
  {
    absl::MutexLock lock(&mu_);
    ticket = next_ticket_++;
  }
  Post([this, request = std::move(request), done = std::move(done), ticket]() mutable {
    DoBeginSave(std::move(request), std::move(done), ticket);
  });
  return ticket;
}

void SaveExecutor::TrainerGone(uint64_t ticket) {
  // Posted after the call's DoBeginSave, so its session exists by then (if the plan was
  // accepted at all).
  Post([this, ticket] {
    std::string session_id;
    {
      absl::MutexLock lock(&mu_);
      for (auto& [id, s] : sessions_) {
        if (s->begin_ticket == ticket && s->phase < Phase::kStaged) session_id = id;
      }
    }
    if (session_id.empty()) return;
    Fail(session_id, v1::ERROR_CODE_AGENT_LOST,
         absl::AbortedError(absl::StrCat("the trainer of rank ", options_.rank,
                                         " went away before its snapshot was staged")));
  });
}

void SaveExecutor::Staged(const std::string& session_id, uint64_t stall_ns, StatusDone done) {
  // Decided here, on the caller's thread, rather than after the worker's queue: the trainer
  // is blocked until `done`. The snapshot is in staging, so the trainer goes back to training
  // now, not after the STAGED report's round trip to the coordinator (which persists the state
  // change: a millisecond or more of blocked time, seconds while it is unreachable). What
  // becomes of the session from here (the report refused because the coordinator aborted it
  // meanwhile, or any later failure) reaches the trainer through WaitCommitted, as a failure
  // while persisting does.
  absl::Status refusal;
  {
    absl::MutexLock lock(&mu_);
    Session* s = FindLocked(session_id);
    if (s == nullptr) {
      refusal = absl::NotFoundError(absl::StrCat("no session ", session_id, " on this agent"));
    } else if (!s->outcome.ok()) {
      refusal = s->outcome;
    } else if (s->coordinator_abort.has_value()) {
      refusal = *s->coordinator_abort;  // its DoEnd is still queued
    } else if (s->phase != Phase::kCopying) {
      refusal = absl::FailedPreconditionError("Staged() before the slots were handed out");
    } else {
      s->phase = Phase::kStaged;
    }
  }
  done(refusal);
  if (refusal.ok()) Post([this, session_id, stall_ns] { DoStaged(session_id, stall_ns); });
}

void SaveExecutor::WaitCommitted(int64_t step, absl::Time deadline, CommitDone done) {
  absl::Status outcome;
  std::string dir;
  {
    absl::MutexLock lock(&mu_);
    Session* match = nullptr;
    for (auto& [id, s] : sessions_) {
      if (s->step == step && (match == nullptr || s->last_seq >= match->last_seq)) {
        match = s.get();
      }
    }
    if (match == nullptr) {
      outcome = absl::NotFoundError(absl::StrCat("no save of step ", step, " on this agent"));
    } else if (!Finished(match->outcome, match->phase == Phase::kCommitted)) {
      match->waiters.emplace_back(deadline, std::move(done));
      return;
    } else {
      outcome = match->outcome;
      dir = match->checkpoint_dir;
    }
  }
  if (outcome.ok()) {
    done(dir);
  } else {
    done(outcome);
  }
}

void SaveExecutor::OnCommand(const v1::Command& command) {
  const std::string id = command.session_id();
  {
    absl::MutexLock lock(&mu_);
    Session* s = FindLocked(id);
    if (s != nullptr) {
      if (command.seq() <= s->last_seq) return;  // already handled
      s->last_seq = command.seq();
    }
  }
  LogInfo("command ", v1::Command::descriptor()->FindFieldByNumber(command.body_case())
                          ? v1::Command::descriptor()->FindFieldByNumber(command.body_case())->name()
                          : "?",
          " for session ", id);
  switch (command.body_case()) {
    case v1::Command::kPin:
      Post([this, id, pin = command.pin()] { DoPin(id, pin); });
      break;
    case v1::Command::kCopy:
      // Handed out here, not after the worker's queue: the worker is usually still inside
      // the PINNED report's RPC when COPY arrives, and the trainer is blocked until then.
      DoCopy(id);
      break;
    case v1::Command::kGather:
      Post([this, id, gather = command.gather()] { DoGather(id, gather); });
      break;
    case v1::Command::kPersist:
      Post([this, id, dir = command.persist().tmp_dir()] { DoPersist(id, dir); });
      break;
    case v1::Command::kCommit:
      Post([this, id, commit = command.commit()] { DoCommit(id, commit); });
      break;
    case v1::Command::kCommitted:
      Post([this, id, dir = command.committed().checkpoint_dir()] {
        DoEnd(id, absl::OkStatus(), dir);
      });
      break;
    case v1::Command::kAbort:
      {
        absl::MutexLock lock(&mu_);
        if (Session* s = FindLocked(id); s != nullptr && !s->coordinator_abort.has_value()) {
          s->coordinator_abort = ErrorFromDetail(command.abort().error());
        }
      }
      peers_->CancelSession(id);  // wake an exchange in progress now, not after it
      Post([this, id, error = command.abort().error()] {
        DoEnd(id, ErrorFromDetail(error), "");
      });
      break;
    default:
      break;
  }
}

void SaveExecutor::OnRegistered(uint64_t coordinator_incarnation) {
  bool restarted;
  {
    absl::MutexLock lock(&mu_);
    restarted = coordinator_incarnation_ != 0 && coordinator_incarnation_ != coordinator_incarnation;
    coordinator_incarnation_ = coordinator_incarnation;
  }
  if (restarted) Post([this] { DoResend(); });
}

// ---------------------------------------------------------------------------------------------
// Worker

void SaveExecutor::RunWorker() {
  while (true) {
    Task task;
    std::vector<CommitDone> expired;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || !tasks_.empty();
      };
      mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Milliseconds(100));
      const absl::Time now = absl::Now();
      for (auto& [id, s] : sessions_) {
        for (auto it = s->waiters.begin(); it != s->waiters.end();) {
          if (it->first <= now) {
            expired.push_back(std::move(it->second));
            it = s->waiters.erase(it);
          } else {
            ++it;
          }
        }
      }
      if (stop_) return;
      if (!tasks_.empty()) {
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
    }
    for (CommitDone& done : expired) {
      done(absl::DeadlineExceededError("the save did not finish before the deadline"));
    }
    if (task) task();
  }
}

void SaveExecutor::DoBeginSave(v1::BeginSaveRequest request, BeginSaveDone done,
                               uint64_t ticket) {
  v1::SubmitLocalPlanRequest submit;
  submit.set_job_id(options_.job_id);
  submit.set_rank(options_.rank);
  submit.set_incarnation(options_.incarnation);
  submit.set_step(request.step());
  submit.set_plan_fingerprint(request.plan_fingerprint());
  // The shards are lent to the request for the RPC and taken back (the session keeps them
  // for staging): no copy of every shard on the trainer's blocking path.
  submit.mutable_shards()->Swap(request.mutable_shards());
  absl::StatusOr<v1::SubmitLocalPlanResponse> submitted;
  RetryWhileUnavailable(options_.submit_retry_window, [&] {
    submitted = coordinator_->SubmitLocalPlan(submit);
    return submitted.status();
  }).IgnoreError();  // the outcome is in `submitted`
  request.mutable_shards()->Swap(submit.mutable_shards());
  if (!submitted.ok()) {
    done(submitted.status());
    return;
  }
  LogInfo("plan of step ", request.step(), " submitted: session ", submitted->session_id());
  absl::MutexLock lock(&mu_);
  std::unique_ptr<Session>& slot = sessions_[submitted->session_id()];
  if (slot != nullptr && slot->begin_done) {
    // The trainer retried while its first call is open: the newer call waits instead.
    slot->begin_done(absl::AbortedError("superseded by a newer BeginSave of the same step"));
  }
  if (slot == nullptr) slot = std::make_unique<Session>();
  slot->id = submitted->session_id();
  slot->step = request.step();
  slot->request = std::move(request);
  slot->begin_done = std::move(done);
  slot->begin_ticket = ticket;
  if (options_.lease_generation) slot->lease_generation = options_.lease_generation();
}

absl::Status SaveExecutor::CheckLease(const std::string& session_id, absl::string_view what) {
  if (!options_.lease_generation) return absl::OkStatus();
  const std::optional<uint64_t> now = options_.lease_generation();
  std::optional<uint64_t> began;
  {
    absl::MutexLock lock(&mu_);
    if (Session* s = FindLocked(session_id); s != nullptr) began = s->lease_generation;
  }
  if (now.has_value() && began.has_value() && *now == *began) return absl::OkStatus();
  return absl::AbortedError(absl::StrCat(
      "the lease of rank ", options_.rank, "'s agent lapsed during the save (the agent was frozen "
      "or cut off from the coordinator); it does not ", what, " for a save it was given up for"));
}

void SaveExecutor::DoPin(const std::string& session_id, const v1::PinCommand& pin) {
  // Only this worker thread adds or erases sessions, so `s` stays valid while unlocked; the
  // lock guards the fields other threads read.
  Session* s;
  {
    absl::MutexLock lock(&mu_);
    s = FindLocked(session_id);
    if (s == nullptr || s->phase != Phase::kSubmitted) return;
  }
  absl::Status failure;
  absl::StatusOr<StagingLayout> layout =
      ComputeStagingLayout(pin.assignment(), s->request.shards(), options_.rank);
  absl::StatusOr<std::vector<StagingSlot>> slots =
      layout.ok() ? staging_->Acquire({layout->total_bytes})
                  : absl::StatusOr<std::vector<StagingSlot>>(layout.status());
  if (!slots.ok()) {
    Fail(session_id,
         GetErrorCode(slots.status()) == v1::ERROR_CODE_ADMISSION_DENIED
             ? v1::ERROR_CODE_ADMISSION_DENIED
             : v1::ERROR_CODE_IO_ERROR,
         slots.status());
    return;
  }
  // A reused region holds the previous save's bytes; the file's padding must be zero.
  if (layout->file.has_value()) ZeroPadding(*layout->file, (*slots)[0].data);
  uint64_t pinned;
  {
    absl::MutexLock lock(&mu_);
    s->slot = (*slots)[0];
    s->has_slot = true;
    s->layout = *std::move(layout);
    s->phase = Phase::kPinned;
    s->plan_cached = pin.plan_cached();
    pinned = s->slot.capacity;
  }
  if (absl::Status r = ReportPhase(session_id, v1::AGENT_PHASE_PINNED, nullptr, pinned); !r.ok()) {
    LogWarning("PINNED report for ", session_id, " failed: ", r.ToString());
  }
}

void SaveExecutor::DoCopy(const std::string& session_id) {
  BeginSaveDone done;
  v1::BeginSaveResponse response;
  {
    absl::MutexLock lock(&mu_);
    Session* s = FindLocked(session_id);
    if (s == nullptr || s->phase != Phase::kPinned) return;
    s->phase = Phase::kCopying;
    response.set_session_id(s->id);
    response.set_shm_name(s->slot.name);
    response.set_shm_size(s->slot.capacity);
    response.set_plan_cached(s->plan_cached);
    for (const StagingRange& range : s->layout->shards) {
      v1::StagingSlot* slot = response.add_slots();
      slot->set_offset(range.offset);
      slot->set_nbytes(range.nbytes);
    }
    done = std::move(s->begin_done);
    s->begin_done = nullptr;
  }
  if (done) {
    done(std::move(response));
  } else {
    Post([this, session_id] {
      Fail(session_id, v1::ERROR_CODE_AGENT_LOST,
           absl::AbortedError(absl::StrCat("no trainer of rank ", options_.rank,
                                           " is waiting to copy its snapshot")));
    });
  }
}

void SaveExecutor::DoStaged(const std::string& session_id, uint64_t stall_ns) {
  {
    absl::MutexLock lock(&mu_);
    Session* s = FindLocked(session_id);
    if (s == nullptr || s->phase != Phase::kStaged) return;  // ended meanwhile
  }
  absl::Status reported = ReportPhase(session_id, v1::AGENT_PHASE_STAGED, nullptr, 0, stall_ns);
  if (reported.code() == absl::StatusCode::kUnavailable ||
      reported.code() == absl::StatusCode::kDeadlineExceeded) {
    // Kept, and re-sent when the agent re-registers.
    LogWarning("STAGED report for ", session_id, " not delivered (", reported.message(),
               "); will re-send after reconnecting");
  } else if (!reported.ok()) {
    LogWarning("STAGED report for ", session_id, " refused: ", reported.ToString());
  }
}

void SaveExecutor::DoGather(const std::string& session_id, const v1::GatherCommand& gather) {
  std::vector<SliceSend> sends;
  std::vector<SliceRecv> recvs;
  v1::ReportChunksRequest hashes;
  {
    absl::MutexLock lock(&mu_);
    Session* s = FindLocked(session_id);
    if (s == nullptr || s->phase != Phase::kStaged) return;
    auto* base = static_cast<unsigned char*>(s->slot.data);
    for (const SliceTask& t : s->layout->sends) {
      sends.push_back({t.key, BoxFromProto(t.box), t.begin, t.end, base + t.range.offset,
                       t.range.nbytes, t.peer});
    }
    for (const SliceTask& t : s->layout->recvs) {
      recvs.push_back({t.key, BoxFromProto(t.box), t.peer, t.begin, t.end, base + t.range.offset,
                       t.range.nbytes});
    }
    for (const HashTask& t : s->layout->hashes) {
      v1::ReplicaHash* h = hashes.add_hashes();
      h->set_key(t.key);
      *h->mutable_box() = t.box;
      if (t.flat.has_value()) *h->mutable_range() = *t.flat;
      h->set_xxh3(ChunkDigest(BlockChecksums(base + t.range.offset, t.range.nbytes,
                                             kDefaultBlockSize)));
    }
  }
  if (options_.on_peer_addresses) {
    options_.on_peer_addresses(session_id, {gather.peer_addresses().begin(),
                                            gather.peer_addresses().end()});
  }
  if (!sends.empty() || !recvs.empty()) {
    absl::Status exchanged =
        peers_->Exchange(session_id, sends, recvs, absl::Now() + options_.gather_timeout);
    if (!exchanged.ok()) {
      if (exchanged.code() == absl::StatusCode::kAborted) return;  // the session is over
      Fail(session_id,
           exchanged.code() == absl::StatusCode::kDeadlineExceeded ? v1::ERROR_CODE_TIMEOUT
                                                                   : v1::ERROR_CODE_AGENT_LOST,
           exchanged);
      return;
    }
  }
  if (hashes.hashes_size() > 0) {
    if (absl::Status s = ReportChunks(session_id, std::move(hashes)); !s.ok()) {
      LogWarning("hash report for ", session_id, " failed: ", s.ToString());
      return;
    }
  }
  AdvanceAndReport(session_id, Phase::kStaged, Phase::kGathered, v1::AGENT_PHASE_GATHERED);
}

void SaveExecutor::DoPersist(const std::string& session_id, const std::string& tmp_dir) {
  const StagingLayout* layout = nullptr;
  const void* data = nullptr;
  bool already_persisted = false;
  {
    absl::MutexLock lock(&mu_);
    Session* s = FindLocked(session_id);
    if (s == nullptr) return;
    already_persisted = s->phase == Phase::kPersisted;
    if (!already_persisted) {
      if (s->phase != Phase::kGathered) return;
      s->tmp_dir = tmp_dir;
      layout = &*s->layout;  // stable: only this worker thread changes the layout
      data = s->slot.data;
    }
  }
  if (already_persisted) {  // a repeated PERSIST (coordinator restart): just say so again
    ReportPhase(session_id, v1::AGENT_PHASE_PERSISTED, nullptr).IgnoreError();
    return;
  }
  if (absl::Status lease = CheckLease(session_id, "write its shards"); !lease.ok()) {
    Fail(session_id, v1::ERROR_CODE_AGENT_LOST, lease);
    return;
  }
  if (layout->file.has_value()) {
    absl::Status dirs = storage_->CreateDirs(tmp_dir);
    if (!dirs.ok()) {
      Fail(session_id, v1::ERROR_CODE_IO_ERROR, dirs);
      return;
    }
    absl::StatusOr<WrittenFile> written = ShardWriter::WriteFile(
        *storage_, tmp_dir, layout->file_name, *layout->file, data, options_.writer);
    if (!written.ok()) {
      Fail(session_id, v1::ERROR_CODE_IO_ERROR, written.status());
      return;
    }
    v1::ReportChunksRequest batch;
    for (size_t i = 0; i < written->chunks.size(); ++i) {
      v1::ChunkReport* report = batch.add_chunks();
      report->set_key(layout->file->items[i].key);
      *report->mutable_chunk() = written->chunks[i];
      report->mutable_chunk()->set_writer_rank(options_.rank);
      if (static_cast<size_t>(batch.chunks_size()) >= options_.report_batch ||
          i + 1 == written->chunks.size()) {
        if (absl::Status s = ReportChunks(session_id, std::move(batch)); !s.ok()) {
          LogWarning("chunk report for ", session_id, " failed: ", s.ToString());
          return;
        }
        batch = v1::ReportChunksRequest();
      }
    }
  }
  AdvanceAndReport(session_id, Phase::kGathered, Phase::kPersisted, v1::AGENT_PHASE_PERSISTED);
}

void SaveExecutor::AdvanceAndReport(const std::string& session_id, Phase from, Phase to,
                                    v1::AgentPhase report) {
  {
    absl::MutexLock lock(&mu_);
    Session* s = FindLocked(session_id);
    if (s == nullptr || s->phase != from) return;  // aborted meanwhile
    s->phase = to;
  }
  if (absl::Status s = ReportPhase(session_id, report, nullptr); !s.ok()) {
    LogWarning(v1::AgentPhase_Name(report), " report for ", session_id, " failed: ", s.ToString());
  }
}

void SaveExecutor::DoCommit(const std::string& session_id, const v1::CommitCommand& commit) {
  if (absl::Status lease = CheckLease(session_id, "commit"); !lease.ok()) {
    Fail(session_id, v1::ERROR_CODE_AGENT_LOST, lease);
    return;
  }
  absl::Status committed =
      CommitCheckpoint(*storage_, commit.tmp_dir(), commit.final_dir(), commit.manifest());
  if (!committed.ok()) {
    Fail(session_id, v1::ERROR_CODE_IO_ERROR, committed);
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    if (Session* s = FindLocked(session_id); s != nullptr) s->phase = Phase::kCommitWritten;
  }
  ReportPhase(session_id, v1::AGENT_PHASE_COMMIT_WRITTEN, nullptr).IgnoreError();
}

void SaveExecutor::DoEnd(const std::string& session_id, absl::Status outcome,
                         std::string checkpoint_dir) {
  BeginSaveDone begin;
  std::vector<CommitDone> waiters;
  std::string tmp_dir;
  {
    absl::MutexLock lock(&mu_);
    Session* s = FindLocked(session_id);
    if (s == nullptr || s->phase == Phase::kCommitted || s->phase == Phase::kAborted) return;
    s->phase = outcome.ok() ? Phase::kCommitted : Phase::kAborted;
    s->outcome = outcome;
    s->checkpoint_dir = checkpoint_dir;
    begin = std::move(s->begin_done);
    s->begin_done = nullptr;
    for (auto& [deadline, done] : s->waiters) waiters.push_back(std::move(done));
    s->waiters.clear();
    tmp_dir = std::move(s->tmp_dir);
    s->layout.reset();
    // The region stays in the pool for the next save (and mapped in the trainer): recreating
    // and re-faulting a gigabyte of shared memory per save would land in the trainer's stall.
    s->has_slot = false;
    s->phase_reports.clear();
    s->chunk_reports.clear();
    if (outcome.ok()) ++committed_;
    finished_.push_back(session_id);
    ForgetOldLocked();
  }
  if (outcome.ok()) {
    LogInfo("session ", session_id, " committed at ", checkpoint_dir);
  } else {
    LogWarning("session ", session_id, " aborted: ", outcome.message());
    // This rank wrote (or began writing) into the session's temporary directory. The
    // coordinator removes it too, but it may have done so before this rank's write created
    // it again: an aborted session leaves nothing behind either way.
    if (!tmp_dir.empty()) {
      if (absl::Status removed = storage_->RemoveTree(tmp_dir); !removed.ok()) {
        LogWarning("could not remove ", tmp_dir, " of the aborted session: ", removed.ToString());
      }
    }
  }
  if (begin) begin(outcome.ok() ? absl::InternalError("committed before the copy") : outcome);
  for (CommitDone& done : waiters) {
    if (outcome.ok()) {
      done(checkpoint_dir);
    } else {
      done(outcome);
    }
  }
}

void SaveExecutor::DoResend() {
  std::vector<std::pair<std::string, v1::BeginSaveRequest>> resubmit;
  std::vector<v1::ReportChunksRequest> chunks;
  std::vector<v1::ReportPhaseRequest> phases;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, s] : sessions_) {
      if (s->phase == Phase::kCommitted || s->phase == Phase::kAborted) continue;
      if (s->phase == Phase::kSubmitted) resubmit.emplace_back(id, s->request);
      chunks.insert(chunks.end(), s->chunk_reports.begin(), s->chunk_reports.end());
      phases.insert(phases.end(), s->phase_reports.begin(), s->phase_reports.end());
    }
  }
  LogInfo("coordinator restarted: re-sending ", resubmit.size(), " plan(s), ", chunks.size(),
          " chunk report(s), ", phases.size(), " phase report(s)");
  for (auto& [id, request] : resubmit) {
    v1::SubmitLocalPlanRequest submit;
    submit.set_job_id(options_.job_id);
    submit.set_rank(options_.rank);
    submit.set_incarnation(options_.incarnation);
    submit.set_step(request.step());
    *submit.mutable_shards() = request.shards();
    submit.set_plan_fingerprint(request.plan_fingerprint());
    coordinator_->SubmitLocalPlan(submit).IgnoreError();
  }
  // Chunks before phases: PERSISTED must not arrive before the chunks it vouches for.
  for (const auto& c : chunks) coordinator_->ReportChunks(c).IgnoreError();
  for (const auto& p : phases) coordinator_->ReportPhase(p).IgnoreError();
}

// ---------------------------------------------------------------------------------------------
// Reports

absl::Status SaveExecutor::ReportPhase(const std::string& session_id, v1::AgentPhase phase,
                                       const v1::ErrorDetail* error, uint64_t pinned_bytes,
                                       uint64_t stall_ns) {
  v1::ReportPhaseRequest request;
  request.set_job_id(options_.job_id);
  request.set_rank(options_.rank);
  request.set_incarnation(options_.incarnation);
  request.set_session_id(session_id);
  request.set_phase(phase);
  if (error != nullptr) *request.mutable_error() = *error;
  request.set_pinned_bytes(pinned_bytes);
  request.set_trainer_stall_ns(stall_ns);
  if (error == nullptr) {
    absl::MutexLock lock(&mu_);
    if (Session* s = FindLocked(session_id); s != nullptr) s->phase_reports.push_back(request);
  }
  return RetryWhileUnavailable(options_.report_retry_window,
                               [&] { return coordinator_->ReportPhase(request).status(); });
}

absl::Status SaveExecutor::ReportChunks(const std::string& session_id,
                                        v1::ReportChunksRequest request) {
  request.set_job_id(options_.job_id);
  request.set_rank(options_.rank);
  request.set_incarnation(options_.incarnation);
  request.set_session_id(session_id);
  {
    absl::MutexLock lock(&mu_);
    if (Session* s = FindLocked(session_id); s != nullptr) s->chunk_reports.push_back(request);
  }
  return RetryWhileUnavailable(options_.report_retry_window,
                               [&] { return coordinator_->ReportChunks(request).status(); });
}

void SaveExecutor::Fail(const std::string& session_id, v1::ErrorCode code,
                        const absl::Status& cause) {
  v1::ErrorDetail detail = DetailFor(code, cause);
  auto aborted = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Session* s = FindLocked(session_id);
    return s != nullptr && s->coordinator_abort.has_value();
  };
  std::optional<absl::Status> prior;
  {
    absl::MutexLock lock(&mu_);
    if (aborted()) prior = FindLocked(session_id)->coordinator_abort;
  }
  if (prior.has_value()) {
    // Already aborted by the coordinator (which may have removed the directory this rank was
    // writing to): that reason stands, this failure is a consequence.
    LogWarning("session ", session_id, " failed on this rank after the coordinator aborted it: ",
               detail.message());
    DoEnd(session_id, *prior, "");
    return;
  }
  LogError("session ", session_id, " failed on this rank: ", ErrorCodeName(detail.code()), ": ",
           detail.message());
  absl::Status reported = ReportPhase(session_id, v1::AGENT_PHASE_UNSPECIFIED, &detail);
  absl::Status outcome = ErrorFromDetail(detail);
  if (reported.code() == absl::StatusCode::kFailedPrecondition) {
    // The session already ended on the coordinator: its ABORT (with the real reason) is on
    // the way. Wait for it a little (the command stream records it without this thread), so
    // the trainer hears the cause, not this consequence.
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&aborted), absl::Seconds(2));
    if (aborted()) outcome = *FindLocked(session_id)->coordinator_abort;
  }
  // Whether or not the coordinator heard it, this rank is out of the session.
  DoEnd(session_id, outcome, "");
  if (!reported.ok()) LogWarning("could not report the failure: ", reported.ToString());
}

absl::Status SaveExecutor::RetryWhileUnavailable(absl::Duration window,
                                                 const std::function<absl::Status()>& call) {
  const absl::Time give_up = absl::Now() + window;
  Backoff backoff(BackoffOptions{absl::Milliseconds(100), absl::Seconds(2), 2.0, 0.5});
  while (true) {
    absl::Status status = call();
    // NotFound: a restarted coordinator does not know this agent until it re-registers.
    const bool retriable = status.code() == absl::StatusCode::kUnavailable ||
                           status.code() == absl::StatusCode::kNotFound;
    if (!retriable || absl::Now() >= give_up) return status;
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&stop_), std::min(backoff.Next(), give_up - absl::Now()));
    if (stop_) return status;
  }
}

SaveExecutor::Session* SaveExecutor::FindLocked(const std::string& session_id) {
  auto it = sessions_.find(session_id);
  return it == sessions_.end() ? nullptr : it->second.get();
}

void SaveExecutor::ForgetOldLocked() {
  while (finished_.size() > options_.remember_sessions) {
    sessions_.erase(finished_.front());
    finished_.erase(finished_.begin());
  }
}

}  // namespace tessera
