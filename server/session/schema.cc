#include "server/session/schema.h"

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/peer_auth.h"
#include "common/status.h"
#include "server/store/keys.h"

namespace tessera {
namespace {

constexpr absl::string_view kEpochKey = "epoch";
constexpr absl::string_view kPeerKeyKey = "peer_key";
constexpr int kSeqEpochShift = 40;

std::string SessionKey(const std::string& job_id, const std::string& session_id) {
  return KeyJoin({job_id, session_id});
}
std::string PlanKey(const std::string& job_id, uint64_t fingerprint) {
  return KeyJoin({job_id, EncodeOrderedUint64(fingerprint)});
}
std::string CheckpointKey(const std::string& job_id, int64_t step) {
  return KeyJoin({job_id, EncodeOrderedInt64(step)});
}

template <typename Message>
absl::StatusOr<std::optional<Message>> GetMessage(const StateStore& store, Table table,
                                                 const std::string& key,
                                                 absl::string_view what) {
  ASSIGN_OR_RETURN(std::optional<std::string> raw, store.Get(table, key));
  if (!raw.has_value()) return std::optional<Message>();
  Message message;
  if (!message.ParseFromString(*raw)) {
    return absl::DataLossError(absl::StrCat("the ", what, " in the state store does not parse"));
  }
  return std::optional<Message>(std::move(message));
}

}  // namespace

void PutJob(StoreBatch& batch, const v1::JobRecord& job) {
  batch.Put(Table::kJobs, job.job_id(), job.SerializeAsString());
}

void PutSession(StoreBatch& batch, const v1::SessionRecord& session) {
  batch.Put(Table::kSessions, SessionKey(session.job_id(), session.session_id()),
            session.SerializeAsString());
}

void PutPlan(StoreBatch& batch, const std::string& job_id, const GlobalPlan& plan) {
  batch.DeletePrefix(Table::kPlans, KeyPrefix({job_id}));
  batch.Put(Table::kPlans, PlanKey(job_id, plan.fingerprint), EncodePlanRecord(plan));
}

void PutManifest(StoreBatch& batch, const v1::Manifest& manifest) {
  batch.Put(Table::kRegistry, SessionKey(manifest.job_id(), manifest.session_id()),
            manifest.SerializeAsString());
}

void DeleteManifest(StoreBatch& batch, const std::string& job_id,
                    const std::string& session_id) {
  batch.Delete(Table::kRegistry, SessionKey(job_id, session_id));
}

void PutCheckpoint(StoreBatch& batch, const std::string& job_id,
                   const v1::CheckpointInfo& info) {
  batch.Put(Table::kCheckpoints, CheckpointKey(job_id, info.step()), info.SerializeAsString());
}

void DeleteCheckpoint(StoreBatch& batch, const std::string& job_id, int64_t step) {
  batch.Delete(Table::kCheckpoints, CheckpointKey(job_id, step));
}

absl::StatusOr<std::vector<v1::JobRecord>> ReadJobs(const StateStore& store) {
  std::vector<v1::JobRecord> jobs;
  absl::Status parse_error;
  RETURN_IF_ERROR(store.Scan(Table::kJobs, "", [&](absl::string_view key, absl::string_view v) {
    v1::JobRecord record;
    if (!record.ParseFromArray(v.data(), static_cast<int>(v.size()))) {
      parse_error = absl::DataLossError(
          absl::StrCat("the record of job ", key, " in the state store does not parse"));
      return false;
    }
    jobs.push_back(std::move(record));
    return true;
  }));
  RETURN_IF_ERROR(parse_error);
  return jobs;
}

absl::StatusOr<std::optional<v1::JobRecord>> ReadJob(const StateStore& store,
                                                     const std::string& job_id) {
  return GetMessage<v1::JobRecord>(store, Table::kJobs, job_id,
                                   absl::StrCat("record of job ", job_id));
}

absl::StatusOr<std::optional<v1::SessionRecord>> ReadSession(const StateStore& store,
                                                             const std::string& job_id,
                                                             const std::string& session_id) {
  return GetMessage<v1::SessionRecord>(
      store, Table::kSessions, SessionKey(job_id, session_id),
      absl::StrCat("record of session ", session_id, " of job ", job_id));
}

absl::StatusOr<std::shared_ptr<const GlobalPlan>> ReadPlan(const StateStore& store,
                                                           const std::string& job_id,
                                                           uint64_t fingerprint) {
  const std::string what = absl::StrCat("plan ", absl::Hex(fingerprint), " of job ", job_id);
  ASSIGN_OR_RETURN(std::optional<v1::PlanRecord> record,
                   GetMessage<v1::PlanRecord>(store, Table::kPlans, PlanKey(job_id, fingerprint),
                                              what));
  if (!record.has_value()) {
    return absl::DataLossError(absl::StrCat("the ", what, " is missing from the state store"));
  }
  if (record->assignment_format() != kAssignmentFormat) {
    return absl::DataLossError(absl::StrCat(
        "the ", what, " was stored in assignment format ", record->assignment_format(),
        " (this coordinator reads format ", kAssignmentFormat, ") and cannot be used"));
  }
  auto plan = std::make_shared<GlobalPlan>();
  plan->fingerprint = record->fingerprint();
  plan->assignments.assign(record->assignments().begin(), record->assignments().end());
  plan->tensors.assign(record->tensors().begin(), record->tensors().end());
  plan->bytes_written_by_rank.assign(record->bytes_written_by_rank().begin(),
                                     record->bytes_written_by_rank().end());
  plan->total_bytes = record->total_bytes();
  plan->rank_fingerprints.assign(record->rank_fingerprints().begin(),
                                 record->rank_fingerprints().end());
  plan->staged_bytes_by_rank.assign(record->staged_bytes_by_rank().begin(),
                                    record->staged_bytes_by_rank().end());
  if (absl::Status derived = FillDerived(plan.get()); !derived.ok()) {
    return absl::DataLossError(absl::StrCat("the ", what, " cannot be read back: ",
                                            derived.message()));
  }
  return std::shared_ptr<const GlobalPlan>(std::move(plan));
}

absl::StatusOr<std::shared_ptr<const v1::Manifest>> ReadStoredManifest(
    const StateStore& store, const std::string& job_id, const std::string& session_id) {
  const std::string what = absl::StrCat("manifest of session ", session_id, " of job ", job_id);
  ASSIGN_OR_RETURN(std::optional<v1::Manifest> manifest,
                   GetMessage<v1::Manifest>(store, Table::kRegistry,
                                            SessionKey(job_id, session_id), what));
  if (!manifest.has_value()) {
    return absl::DataLossError(absl::StrCat("the ", what, " is missing from the state store"));
  }
  return std::make_shared<const v1::Manifest>(*std::move(manifest));
}

void PutMemoryCheckpoint(StoreBatch& batch, const std::string& job_id,
                         const v1::MemoryCheckpointRecord& record) {
  batch.Put(Table::kMemoryCheckpoints, job_id, record.SerializeAsString());
}

void DeleteMemoryCheckpoint(StoreBatch& batch, const std::string& job_id) {
  batch.Delete(Table::kMemoryCheckpoints, job_id);
}

absl::StatusOr<std::optional<v1::MemoryCheckpointRecord>> ReadMemoryCheckpoint(
    const StateStore& store, const std::string& job_id) {
  return GetMessage<v1::MemoryCheckpointRecord>(
      store, Table::kMemoryCheckpoints, job_id,
      absl::StrCat("memory-only checkpoint record of job ", job_id));
}

absl::StatusOr<std::vector<v1::CheckpointInfo>> ReadCheckpoints(const StateStore& store,
                                                                const std::string& job_id) {
  std::vector<v1::CheckpointInfo> checkpoints;
  absl::Status parse_error;
  RETURN_IF_ERROR(store.Scan(Table::kCheckpoints, KeyPrefix({job_id}),
                             [&](absl::string_view, absl::string_view v) {
                               v1::CheckpointInfo info;
                               if (!info.ParseFromArray(v.data(), static_cast<int>(v.size()))) {
                                 parse_error = absl::DataLossError(absl::StrCat(
                                     "a checkpoint record of job ", job_id, " does not parse"));
                                 return false;
                               }
                               checkpoints.push_back(std::move(info));
                               return true;
                             }));
  RETURN_IF_ERROR(parse_error);
  std::reverse(checkpoints.begin(), checkpoints.end());  // keys ascend by step
  return checkpoints;
}

absl::StatusOr<uint64_t> NextEpoch(StateStore& store) {
  ASSIGN_OR_RETURN(std::optional<std::string> raw, store.Get(Table::kMeta, kEpochKey));
  uint64_t epoch = 0;
  if (raw.has_value() && !absl::SimpleAtoi(*raw, &epoch)) {
    return absl::DataLossError(absl::StrCat("the coordinator epoch \"", *raw,
                                            "\" in the state store is not a number"));
  }
  ++epoch;
  RETURN_IF_ERROR(store.Commit(StoreBatch().Put(Table::kMeta, kEpochKey, absl::StrCat(epoch))));
  return epoch;
}

absl::StatusOr<std::string> PeerKey(StateStore& store) {
  ASSIGN_OR_RETURN(std::optional<std::string> stored, store.Get(Table::kMeta, kPeerKeyKey));
  if (stored.has_value()) {
    if (stored->size() != kPeerSecretBytes) {
      return absl::DataLossError(absl::StrCat("the peer key in the state store has ",
                                              stored->size(), " bytes, not ", kPeerSecretBytes));
    }
    return *std::move(stored);
  }
  ASSIGN_OR_RETURN(std::string key, RandomBytes(kPeerSecretBytes));
  RETURN_IF_ERROR(store.Commit(StoreBatch().Put(Table::kMeta, kPeerKeyKey, key)));
  return key;
}

uint64_t CommandSeq(uint64_t epoch, uint64_t n) { return (epoch << kSeqEpochShift) + n; }

}  // namespace tessera
