#include "server/session/memory_only.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "server/session/chunk_ledger.h"

namespace tessera {

std::optional<v1::ErrorDetail> MemoryOnlyRefusal(bool memory_only,
                                                 const std::map<uint32_t, bool>& asked,
                                                 const AgentRoster& agents,
                                                 const MeshLayout& mesh) {
  std::vector<uint32_t> other_kind, tier_off;
  for (const auto& [rank, rank_memory_only] : asked) {
    if (rank_memory_only != memory_only) other_kind.push_back(rank);
  }
  if (memory_only) {
    for (uint32_t r = 0; r < mesh.world_size(); ++r) {
      const AgentLiveness& agent = agents[r];
      if (agent.incarnation == 0 || !agent.memory_tier) tier_off.push_back(r);
    }
  }
  if (other_kind.empty() && tier_off.empty()) return std::nullopt;
  v1::ErrorDetail error;
  error.set_code(v1::ERROR_CODE_MEMORY_ONLY_REFUSED);
  if (!other_kind.empty()) {
    error.set_message(absl::StrCat(
        "the ranks disagree on a memory-only save: rank", other_kind.size() > 1 ? "s " : " ",
        absl::StrJoin(other_kind, ", "), " asked for a ", memory_only ? "disk" : "memory-only",
        " save, the first rank for a ", memory_only ? "memory-only" : "disk", " save"));
    for (uint32_t r : other_kind) AddRankRef(mesh, r, &error);
  } else {
    error.set_message(absl::StrCat(
        "a memory-only save needs every agent's memory tier; the agent of rank",
        tier_off.size() > 1 ? "s " : " ", absl::StrJoin(tier_off, ", "),
        " runs with --memory_tier=false; nothing was staged"));
    for (uint32_t r : tier_off) AddRankRef(mesh, r, &error);
  }
  return error;
}

v1::MemoryCheckpointRecord MakeMemoryCheckpoint(const v1::Manifest& manifest,
                                                const v1::SessionRecord& session,
                                                uint32_t tensors, int64_t committed_unix_ms) {
  v1::MemoryCheckpointRecord record;
  v1::CheckpointInfo* info = record.mutable_info();
  info->set_step(session.step());
  info->set_session_id(session.session_id());
  info->set_bytes(session.bytes_total());
  info->set_tensors(tensors);
  info->set_chunks(session.chunks_total());
  info->set_committed_unix_ms(committed_unix_ms);
  info->set_memory_only(true);
  *record.mutable_manifest() = manifest;
  return record;
}

std::vector<std::string> FilesNotInMemory(const v1::Manifest& manifest,
                                          const std::vector<v1::MemoryCopy>& copies) {
  std::set<std::string> held;
  for (const v1::MemoryCopy& c : copies) held.insert(c.file());
  std::set<std::string> missing;
  for (const v1::TensorEntry& tensor : manifest.tensors()) {
    for (const v1::ChunkEntry& chunk : tensor.chunks()) {
      if (held.count(chunk.file()) == 0) missing.insert(chunk.file());
    }
  }
  return {missing.begin(), missing.end()};
}

std::vector<v1::CheckpointInfo> ListCheckpointsWithMemory(
    const std::vector<v1::CheckpointInfo>& disk,
    const std::optional<v1::MemoryCheckpointRecord>& memory, const AgentRegistry& registry,
    const std::string& job_id) {
  std::vector<v1::CheckpointInfo> list;
  list.reserve(disk.size() + 1);
  if (memory.has_value()) {
    v1::CheckpointInfo info = memory->info();
    bool may_miss = false;
    const std::vector<v1::MemoryCopy> copies =
        registry.MemoryCopies(job_id, info.step(), info.session_id(), {}, &may_miss);
    const std::vector<std::string> missing = FilesNotInMemory(memory->manifest(), copies);
    if (!missing.empty() && may_miss) {
      info.set_memory_copies_unknown(true);  // not "lost": their holders may not have spoken
    } else {
      for (const std::string& file : missing) info.add_files_not_in_memory(file);
    }
    list.push_back(std::move(info));
  }
  list.insert(list.end(), disk.begin(), disk.end());
  std::stable_sort(list.begin(), list.end(), [](const v1::CheckpointInfo& a,
                                                const v1::CheckpointInfo& b) {
    return a.step() > b.step();
  });
  return list;
}

absl::StatusOr<v1::Manifest> MemoryManifest(const std::optional<v1::MemoryCheckpointRecord>& memory,
                                            const std::string& job_id, int64_t step) {
  if (step < -1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step ", step, " is neither a step nor -1 (the memory-only commit, whatever its step)"));
  }
  if (memory.has_value() && (step < 0 || memory->info().step() == step)) {
    return memory->manifest();
  }
  return MakeError(
      absl::StatusCode::kNotFound, v1::ERROR_CODE_CHECKPOINT_NOT_FOUND,
      absl::StrCat("job ", job_id, " has no memory-only commit",
                   step < 0 ? "" : absl::StrCat(" of step ", step),
                   memory.has_value()
                       ? absl::StrCat(" (its memory-only commit is step ", memory->info().step(), ")")
                       : " (none, or a newer commit superseded it)"));
}

}  // namespace tessera
