#include "server/session/chunk_ledger.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/box.h"
#include "common/checksum.h"
#include "common/tensor_key.h"

namespace tessera {
namespace {

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
  for (const v1::TensorEntry& t : plan_->tensors) {
    for (const v1::ChunkEntry& c : t.chunks()) chunks_[ChunkId(t.key(), c.box())].entry = c;
  }
}

absl::StatusOr<bool> ChunkLedger::RecordChunk(uint32_t rank, const v1::ChunkReport& report) {
  auto it = chunks_.find(ChunkId(report.key(), report.chunk().box()));
  const std::string name = ChunkName(report.key(), BoxFromProto(report.chunk().box()));
  if (it == chunks_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " reported chunk ", name, " which is not in the plan"));
  }
  Entry& chunk = it->second;
  if (chunk.entry.writer_rank() != rank || chunk.entry.nbytes() != report.chunk().nbytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank, " reported chunk ", name, " of ", report.chunk().nbytes(),
        " bytes; the plan has rank ", chunk.entry.writer_rank(), " writing ",
        chunk.entry.nbytes(), " bytes"));
  }
  const bool first = !chunk.reported;
  if (first) ++reported_;
  chunk.reported = true;
  chunk.entry = report.chunk();
  chunk.entry.set_writer_rank(rank);
  return first;
}

void ChunkLedger::RecordHash(uint32_t rank, const v1::ReplicaHash& hash) {
  auto& hashes = hashes_[HashId(hash.key(), hash.box(), hash.has_range(), hash.range())];
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
      auto chunk = chunks_.find(ChunkId(item.key(), item.box()));
      auto hashes = hashes_.find(HashId(item.key(), item.box(), item.has_range(), item.range()));
      std::optional<uint64_t> replica, reference;
      if (hashes != hashes_.end()) {
        for (const auto& [rank, digest] : hashes->second) {
          if (rank == r) replica = digest;
          if (rank == item.writer_rank()) reference = digest;
        }
      }
      const std::string name = ChunkName(item.key(), BoxFromProto(item.box()));
      v1::ErrorDetail error;
      if (!replica.has_value()) {
        error = Diverged(
            absl::StrCat("rank ", r, " did not report the hash of its replica of ", name));
      } else if (item.has_range() ? (!reference.has_value() || *reference != *replica)
                                  : (chunk == chunks_.end() ||
                                     ChunkDigest({chunk->second.entry.block_xxh3().begin(),
                                                  chunk->second.entry.block_xxh3().end()}) !=
                                         *replica)) {
        error = Diverged(absl::StrCat(
            "replica ", name, " on rank ", r, " differs from the copy rank ", item.writer_rank(),
            " wrote: these ranks do not hold the same bytes, so it is not a replica (check "
            "replicated_over)"));
      } else {
        continue;
      }
      error.add_fqns(item.key());
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
  for (const v1::TensorEntry& planned : plan_->tensors) {
    v1::TensorEntry* t = manifest.add_tensors();
    *t = planned;
    for (v1::ChunkEntry& c : *t->mutable_chunks()) {
      c = chunks_.at(ChunkId(t->key(), c.box())).entry;
    }
  }
  return manifest;
}

}  // namespace tessera
