#include "agent/save/save_work.h"

#include "absl/strings/str_cat.h"
#include "common/box.h"
#include "common/checksum.h"
#include "format/data_file.h"

namespace tessera {

absl::Status PrepareStaging(const StagingLayout& layout, const StagingMemory& memory) {
  if (memory.data == nullptr || memory.capacity < layout.total_bytes) {
    return absl::FailedPreconditionError(
        absl::StrCat("staging region ", memory.name, " holds ", memory.capacity,
                     " bytes; the layout needs ", layout.total_bytes));
  }
  if (layout.file.has_value()) ZeroPadding(*layout.file, memory.data);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::ReplicaHash>> GatherSlices(PeerTransport& peers,
                                                          const std::string& session_id,
                                                          const GatherWork& work) {
  const StagingLayout& layout = *work.layout;
  auto* base = static_cast<unsigned char*>(work.staging);
  std::vector<v1::ReplicaHash> hashes;
  for (const HashTask& t : layout.hashes) {
    v1::ReplicaHash& h = hashes.emplace_back();
    h.set_chunk(t.chunk);
    if (t.flat.has_value()) *h.mutable_range() = *t.flat;
    h.set_xxh3(ChunkDigest(BlockChecksums(base + t.range.offset, t.range.nbytes,
                                           kDefaultBlockSize)));
  }
  std::vector<SliceSend> sends;
  std::vector<SliceRecv> recvs;
  for (const SliceTask& t : layout.sends) {
    sends.push_back({t.key, BoxFromProto(t.box), t.begin, t.end, base + t.range.offset,
                     t.range.nbytes, t.peer});
  }
  for (const SliceTask& t : layout.recvs) {
    recvs.push_back({t.key, BoxFromProto(t.box), t.peer, t.begin, t.end, base + t.range.offset,
                     t.range.nbytes});
  }
  if (!sends.empty() || !recvs.empty()) {
    absl::Status exchanged = peers.Exchange(session_id, sends, recvs, work.deadline);
    if (!exchanged.ok()) return exchanged;
  }
  return hashes;
}

absl::StatusOr<std::vector<v1::ChunkReport>> WriteShards(Storage& storage,
                                                         const PersistWork& work,
                                                         const ShardWriterOptions& options) {
  const StagingLayout& layout = *work.layout;
  std::vector<v1::ChunkReport> chunks;
  if (!layout.file.has_value()) return chunks;
  absl::StatusOr<std::vector<v1::ChunkEntry>> entries;
  if (work.memory_only) {
    entries = ShardWriter::Describe(layout.file_name, *layout.file, work.staging, options);
  } else {
    if (absl::Status dirs = storage.CreateDirs(work.dir); !dirs.ok()) return dirs;
    absl::StatusOr<WrittenFile> written = ShardWriter::WriteFile(
        storage, work.dir, layout.file_name, *layout.file, work.staging, options);
    if (!written.ok()) return written.status();
    entries = std::move(written->chunks);
  }
  if (!entries.ok()) return entries.status();
  for (size_t i = 0; i < entries->size(); ++i) {
    v1::ChunkReport& report = chunks.emplace_back();
    report.set_key(layout.file->items[i].key);
    *report.mutable_chunk() = std::move((*entries)[i]);
  }
  return chunks;
}

CommitWorkResult ResolveAndRetain(Storage& storage, const CommitWork& work) {
  CommitWorkResult result;
  result.resolution = ResolveCommit(storage, work.tmp_dir, work.final_dir,
                                    work.commit->manifest(),
                                    work.commit->roll_back_unless_committed());
  if (result.resolution.outcome == CommitOutcome::kCommitted) {
    result.retention = ApplyRetention(
        storage, work.job_dir,
        {work.commit->retire_steps().begin(), work.commit->retire_steps().end()}, work.step);
  }
  return result;
}

absl::Status RemoveSessionDir(Storage& storage, const RemoveWork& work) {
  return storage.RemoveTree(work.dir);
}

}  // namespace tessera
