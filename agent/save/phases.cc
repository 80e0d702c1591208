// SaveCore, part 3: a session's phases (edges 3–10): the commands that start its work (PIN,
// COPY, GATHER, PERSIST, each at once instead where the PIN said so), the write's wait for the
// lease (R5), and the work's results. The contract: save_core.h.
#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "agent/save/save_core.h"
#include "agent/save/save_core_internal.h"
#include "common/ids.h"
#include "common/status.h"

namespace tessera {

using save_core_internal::Live;
using save_core_internal::PhaseReport;
using save_core_internal::Severity;

void SaveCore::HandlePin(Session& s, const v1::PinCommand& pin, SaveEffects& fx) {
  if (s.phase != SavePhase::kPlanned) return;  // R1
  const uint64_t local = s.plan->local_plan_fingerprint();
  if (pin.assignment_omitted()) {  // R10
    if (!held_plan_.has_value() || held_plan_->plan_fingerprint != pin.plan_fingerprint() ||
        held_plan_->local_fingerprint != local) {
      Fail(s, v1::ERROR_CODE_INTERNAL,
           absl::InternalError(absl::StrCat(
               "the PIN of ", Describe(s), " left out the assignment of plan ",
               absl::Hex(pin.plan_fingerprint()), ", which this agent does not hold")),
           fx);
      return;
    }
    s.layout = held_plan_->layout;
  } else {
    absl::StatusOr<StagingLayout> layout =
        ComputeStagingLayout(pin.assignment(), s.plan->shards(), options_.rank);
    if (!layout.ok()) {
      Fail(s, v1::ERROR_CODE_IO_ERROR, layout.status(), fx);
      return;
    }
    s.layout = std::make_shared<const StagingLayout>(*std::move(layout));
    if (pin.plan_fingerprint() != 0) held_plan_ = HeldPlan{local, pin.plan_fingerprint(), s.layout};
  }
  s.plan_cached = pin.plan_cached();
  s.copy_when_pinned = pin.copy_when_pinned();
  s.write_when_staged = pin.write_when_staged();
  s.phase = SavePhase::kPinning;  // edge 3
  StartWork(s, PinWork{s.layout}, fx);
}

void SaveCore::HandleCopy(Session& s, SaveEffects& fx) {
  if (s.phase != SavePhase::kPinned) return;  // R1
  s.phase = SavePhase::kCopying;              // edge 5
  if (s.begin_waiting) {
    s.begin_waiting = false;
    Log(fx, Severity::kInfo, absl::StrCat("slots handed to the trainer for ", Describe(s)));
    Reply(fx, s.begin_ticket, BeginSaveReply{SlotsOf(s)});
    return;
  }
  Fail(s, v1::ERROR_CODE_AGENT_LOST,  // R8
       absl::AbortedError(absl::StrCat("no trainer of rank ", options_.rank,
                                       " is waiting to copy its snapshot")),
       fx);
}

void SaveCore::HandleGather(absl::Time now, Session& s, const v1::GatherCommand& gather,
                            SaveEffects& fx) {
  if (s.phase != SavePhase::kStaged) return;  // R1
  StartGather(now, s, {gather.peer_addresses().begin(), gather.peer_addresses().end()}, fx);
}

void SaveCore::StartGather(absl::Time now, Session& s,
                           std::map<uint32_t, std::string> peer_addresses, SaveEffects& fx) {
  s.phase = SavePhase::kGathering;  // edge 7
  GatherWork work;
  work.peer_addresses = std::move(peer_addresses);
  work.layout = s.layout;
  work.staging = s.memory.data;
  work.deadline = now + options_.gather_timeout;
  StartWork(s, std::move(work), fx);
}

void SaveCore::HandlePersist(absl::Time now, Session& s, const v1::PersistCommand& persist,
                             SaveEffects& fx) {
  if (s.phase != SavePhase::kGathered) return;  // R1
  // R12: a memory-only save names no directory and writes nothing.
  const std::string dir = persist.memory_only()
                              ? std::string()
                              : TmpDirPath(storage_root_, options_.job_id, s.step, s.id);
  if (absl::Status bad = CheckPath("PERSIST's tmp_dir", persist.tmp_dir(), dir); !bad.ok()) {
    Fail(s, v1::ERROR_CODE_IO_ERROR, bad, fx);
    return;
  }
  StartPersist(now, s, dir, persist.memory_only(), fx);
}

void SaveCore::StartPersist(absl::Time now, Session& s, std::string dir, bool memory_only,
                            SaveEffects& fx) {
  if (lease_known_ && !lease_.has_value() && s.lease.has_value() && s.lease == last_lease_) {
    // R5: not current, not moved on: wait for the lifeline's next word.
    Log(fx, Severity::kInfo,
        absl::StrCat("the write of ", Describe(s), " waits for this agent's lease to be renewed"));
    s.persist_awaiting_lease = std::make_pair(std::move(dir), memory_only);
    s.persist_wait_until = now + options_.lease_wait;
    return;
  }
  if (!LeaseAllows(s)) {
    Fail(s, v1::ERROR_CODE_AGENT_LOST, LeaseLapsed("write its shards"), fx);
    return;
  }
  s.phase = SavePhase::kPersisting;  // edge 9
  s.write_started = now;
  if (s.layout->file.has_value()) s.written_dir = dir;
  StartWork(s, PersistWork{std::move(dir), s.layout, s.memory.data, memory_only}, fx);
}

void SaveCore::StartWork(Session& s, WorkItem item, SaveEffects& fx) {
  const uint64_t id = next_id_++;
  s.work = id;
  work_[id] = s.id;
  fx.work.push_back({id, s.id, std::move(item)});
}

// ---------------------------------------------------------------------------------------------
// Work results

SaveCore::Session* SaveCore::TakeWork(uint64_t work_id, std::optional<SavePhase> expected,
                                      SaveEffects& fx) {
  if (stopped_) return nullptr;
  auto it = work_.find(work_id);
  if (it == work_.end()) return nullptr;
  Session* s = Find(it->second);
  work_.erase(it);
  if (s == nullptr || s->work != work_id) return nullptr;
  s->work = 0;
  if (s->phase == SavePhase::kEnding) {
    ContinueEnding(*s, fx);
    return nullptr;
  }
  if (!Live(s->phase) || (expected.has_value() && s->phase != *expected)) return nullptr;
  return s;
}

SaveEffects SaveCore::OnStagingReady(absl::Time now, uint64_t work_id,
                                     absl::StatusOr<StagingMemory> memory) {
  SaveEffects fx;
  Session* s = TakeWork(work_id, SavePhase::kPinning, fx);
  if (s == nullptr) return Done(now, std::move(fx));
  if (!memory.ok()) {
    Fail(*s,
         GetErrorCode(memory.status()) == v1::ERROR_CODE_ADMISSION_DENIED
             ? v1::ERROR_CODE_ADMISSION_DENIED
             : v1::ERROR_CODE_IO_ERROR,
         memory.status(), fx);
    return Done(now, std::move(fx));
  }
  s->memory = *std::move(memory);
  s->phase = SavePhase::kPinned;  // edge 4
  v1::ReportPhaseRequest pinned = PhaseReport(v1::AGENT_PHASE_PINNED);
  pinned.set_pinned_bytes(s->memory.capacity);
  AddPhaseReport(*s, std::move(pinned), fx);
  if (s->copy_when_pinned) HandleCopy(*s, fx);  // edge 5 without waiting for COPY
  return Done(now, std::move(fx));
}

SaveEffects SaveCore::OnGathered(absl::Time now, uint64_t work_id,
                                 absl::StatusOr<std::vector<v1::ReplicaHash>> hashes) {
  SaveEffects fx;
  Session* s = TakeWork(work_id, SavePhase::kGathering, fx);
  if (s == nullptr) return Done(now, std::move(fx));
  if (!hashes.ok()) {
    const absl::StatusCode code = hashes.status().code();
    if (code == absl::StatusCode::kAborted) {  // R6: cancelled for the session's ABORT
      s->phase = SavePhase::kFailed;
      s->outcome = hashes.status();
      Log(fx, Severity::kWarning,
          absl::StrCat("the exchange of ", Describe(*s),
                       " was cancelled; waiting for the coordinator's verdict"));
    } else {
      Fail(*s,
           code == absl::StatusCode::kDeadlineExceeded ? v1::ERROR_CODE_TIMEOUT
                                                       : v1::ERROR_CODE_AGENT_LOST,
           hashes.status(), fx);
    }
    return Done(now, std::move(fx));
  }
  if (!hashes->empty()) {
    v1::ReportChunksRequest report;
    for (v1::ReplicaHash& h : *hashes) *report.add_hashes() = std::move(h);
    AddChunkReport(*s, std::move(report), fx);
  }
  s->phase = SavePhase::kGathered;  // edge 8
  AddPhaseReport(*s, PhaseReport(v1::AGENT_PHASE_GATHERED), fx);
  if (s->write_when_staged) {  // edge 9 without PERSIST: the PIN was the permit
    std::string dir = TmpDirPath(storage_root_, options_.job_id, s->step, s->id);
    // R4: the session's own directory under the root the coordinator gave (none: fail).
    if (absl::Status bad = CheckPath("the tmp_dir to write when staged", dir, dir); !bad.ok()) {
      Fail(*s, v1::ERROR_CODE_IO_ERROR, bad, fx);
    } else {
      StartPersist(now, *s, std::move(dir), /*memory_only=*/false, fx);
    }
  }
  return Done(now, std::move(fx));
}

SaveEffects SaveCore::OnPersisted(absl::Time now, uint64_t work_id,
                                  absl::StatusOr<std::vector<v1::ChunkReport>> chunks) {
  SaveEffects fx;
  Session* s = TakeWork(work_id, SavePhase::kPersisting, fx);
  if (s == nullptr) return Done(now, std::move(fx));
  if (!chunks.ok()) {
    Fail(*s, v1::ERROR_CODE_IO_ERROR, chunks.status(), fx);
    return Done(now, std::move(fx));
  }
  const size_t batch = std::max<size_t>(1, options_.report_batch);
  for (size_t i = 0; i < chunks->size(); i += batch) {
    v1::ReportChunksRequest report;
    for (size_t j = i; j < std::min(chunks->size(), i + batch); ++j) {
      *report.add_chunks() = std::move((*chunks)[j]);
    }
    AddChunkReport(*s, std::move(report), fx);
  }
  s->phase = SavePhase::kPersisted;  // edge 10
  Log(fx, Severity::kInfo,
      absl::StrCat(Describe(*s), ": ", chunks->size(), " chunks persisted",
                   s->write_when_staged ? " (when staged)" : "", " in ",
                   absl::FormatDuration(now - s->write_started)));
  v1::ReportPhaseRequest persisted = PhaseReport(v1::AGENT_PHASE_PERSISTED);
  persisted.set_write_started_unix_ms(absl::ToUnixMillis(s->write_started));
  persisted.set_write_ns(absl::ToInt64Nanoseconds(now - s->write_started));
  AddPhaseReport(*s, std::move(persisted), fx);
  return Done(now, std::move(fx));
}

}  // namespace tessera
