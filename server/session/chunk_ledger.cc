#include "server/session/chunk_ledger.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "common/box.h"
#include "common/checksum.h"
#include "common/tensor_key.h"

namespace tessera {
namespace {

v1::ErrorDetail Diverged(std::string message) {
  v1::ErrorDetail detail;
  detail.set_code(v1::ERROR_CODE_REPLICA_DIVERGED);
  detail.set_message(std::move(message));
  return detail;
}

}  // namespace

void AddRankRef(const MeshLayout& mesh, uint32_t rank, v1::ErrorDetail* error) {
  v1::RankRef* ref = error->add_ranks();
  ref->set_rank(rank);
  if (rank < mesh.world_size()) ref->set_coords(mesh.CoordString(rank));
}

ChunkLedger::ChunkLedger(std::shared_ptr<const GlobalPlan> plan) : plan_(std::move(plan)) {
  chunks_.reserve(plan_->chunk_index.size());
  for (const v1::TensorEntry& t : plan_->tensors) {
    for (const v1::ChunkEntry& c : t.chunks()) chunks_.push_back(Entry{&c, &t.key(), nullptr});
  }
}

absl::StatusOr<bool> ChunkLedger::RecordChunk(uint32_t rank, const v1::ChunkReport& report) {
  auto it = plan_->chunk_index.find(ChunkId(report.key(), report.chunk().box()));
  const std::string name = ChunkName(report.key(), BoxFromProto(report.chunk().box()));
  if (it == plan_->chunk_index.end() || it->second >= chunks_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " reported chunk ", name, " which is not in the plan"));
  }
  Entry& chunk = chunks_[it->second];
  const v1::ChunkEntry& planned = *chunk.planned;
  if (planned.writer_rank() != rank || planned.nbytes() != report.chunk().nbytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank, " reported chunk ", name, " of ", report.chunk().nbytes(),
        " bytes; the plan has rank ", planned.writer_rank(), " writing ", planned.nbytes(),
        " bytes"));
  }
  const bool first = chunk.reported == nullptr;
  if (first) {
    ++reported_;
    chunk.reported = std::make_unique<v1::ChunkEntry>(report.chunk());
  } else {
    *chunk.reported = report.chunk();
  }
  chunk.reported->set_writer_rank(rank);
  return first;
}

void ChunkLedger::RecordHash(uint32_t rank, const v1::ReplicaHash& hash) {
  auto& hashes = hashes_[HashIdOf(hash.chunk(), hash.has_range(), hash.range())];
  for (auto& [r, digest] : hashes) {
    if (r == rank) {
      digest = hash.xxh3();
      return;
    }
  }
  hashes.emplace_back(rank, hash.xxh3());
}

v1::ErrorDetail ChunkLedger::CheckReplicas(const MeshLayout& mesh) const {
  for (uint32_t r = 0; r < plan_->assignments.size(); ++r) {
    absl::StatusOr<v1::RankAssignment> assignment = plan_->Assignment(r);
    if (!assignment.ok()) {
      // The plan is the coordinator's own: no rank is to blame for it.
      v1::ErrorDetail detail;
      detail.set_code(v1::ERROR_CODE_INTERNAL);
      detail.set_message(absl::StrCat("cannot read rank ", r,
                                      "'s assignment: ", assignment.status().message()));
      return detail;
    }
    for (const v1::HashItem& item : assignment->hashes()) {
      if (item.chunk() >= chunks_.size()) {
        v1::ErrorDetail detail;  // the plan is the coordinator's own, as above
        detail.set_code(v1::ERROR_CODE_INTERNAL);
        detail.set_message(absl::StrCat("rank ", r, "'s assignment names chunk ", item.chunk(),
                                        " of a plan of ", chunks_.size()));
        return detail;
      }
      const Entry& chunk = chunks_[item.chunk()];
      auto hashes = hashes_.find(HashIdOf(item.chunk(), item.has_range(), item.range()));
      std::optional<uint64_t> replica, reference;
      if (hashes != hashes_.end()) {
        for (const auto& [rank, digest] : hashes->second) {
          if (rank == r) replica = digest;
          if (rank == item.writer_rank()) reference = digest;
        }
      }
      const bool matches =
          replica.has_value() &&
          (item.has_range() ? reference == replica
                            : ChunkDigest({chunk.entry().block_xxh3().begin(),
                                           chunk.entry().block_xxh3().end()}) == *replica);
      if (matches) continue;
      const std::string name = ChunkName(*chunk.key, BoxFromProto(chunk.planned->box()));
      v1::ErrorDetail error = Diverged(
          replica.has_value()
              ? absl::StrCat("replica ", name, " on rank ", r, " differs from the copy rank ",
                             item.writer_rank(),
                             " wrote: these ranks do not hold the same bytes, so it is not a "
                             "replica (check replicated_over)")
              : absl::StrCat("rank ", r, " did not report the hash of its replica of ", name));
      error.add_fqns(*chunk.key);
      for (uint32_t rank : {item.writer_rank(), r}) AddRankRef(mesh, rank, &error);
      return error;
    }
  }
  return v1::ErrorDetail();
}

v1::Manifest ChunkLedger::BuildManifest(const std::string& job_id, int64_t step,
                                        const std::string& session_id,
                                        const v1::Layout& layout,
                                        int64_t committed_unix_ms) const {
  v1::Manifest manifest;
  manifest.set_format_version(1);
  manifest.set_job_id(job_id);
  manifest.set_step(step);
  manifest.set_session_id(session_id);
  *manifest.mutable_layout() = layout;
  manifest.set_committed_unix_ms(committed_unix_ms);
  manifest.set_total_bytes(plan_->total_bytes);
  manifest.mutable_tensors()->Reserve(static_cast<int>(plan_->tensors.size()));
  size_t next = 0;  // chunks_ is in the plan's order
  for (const v1::TensorEntry& planned : plan_->tensors) {
    v1::TensorEntry* t = manifest.add_tensors();
    *t = planned;
    for (v1::ChunkEntry& c : *t->mutable_chunks()) c = chunks_[next++].entry();
  }
  return manifest;
}

}  // namespace tessera
