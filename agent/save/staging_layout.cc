#include "agent/save/staging_layout.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/box.h"
#include "common/dtype.h"
#include "common/tensor_key.h"

namespace tessera {
namespace {

uint64_t AlignUp(uint64_t v) { return (v + kDataAlignment - 1) / kDataAlignment * kDataAlignment; }

absl::Status Place(std::vector<StagingRange>& shards, std::vector<bool>& placed,
                   const google::protobuf::RepeatedPtrField<v1::ShardDesc>& local, int32_t index, StagingRange range) {
  if (index < 0 || static_cast<size_t>(index) >= local.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the assignment names local shard ", index, " of ", local.size()));
  }
  if (placed[index]) {
    return absl::InvalidArgumentError(
        absl::StrCat("the assignment places local shard ", index, " twice"));
  }
  if (range.nbytes != local[index].nbytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the assignment gives local shard ", index, " (", local[index].fqn(), ") ", range.nbytes,
        " bytes; it has ", local[index].nbytes()));
  }
  placed[index] = true;
  shards[index] = range;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<StagingLayout> ComputeStagingLayout(const v1::RankAssignment& assignment,
                                                   const google::protobuf::RepeatedPtrField<v1::ShardDesc>& shards,
                                                   uint32_t rank) {
  StagingLayout layout;
  layout.file_name = assignment.file();
  layout.shards.resize(shards.size());
  std::vector<bool> placed(shards.size(), false);
  uint64_t tail = 0;

  if (!assignment.writes().empty()) {
    absl::StatusOr<FileLayout> file =
        ComputeFileLayout(ChunkSpecsFromWriteItems(assignment.writes()));
    if (!file.ok()) return file.status();
    layout.file = *std::move(file);
    tail = layout.file->data_size;
    for (int i = 0; i < assignment.writes_size(); ++i) {
      const v1::WriteItem& item = assignment.writes(i);
      const uint64_t base = layout.file->items[i].staging_offset;
      const uint64_t elem = DTypeSize(item.dtype());
      if (elem == 0) return absl::InvalidArgumentError(absl::StrCat("chunk ", item.key(), " has no dtype"));
      for (const v1::ChunkSource& source : item.sources()) {
        int64_t begin = 0;
        int64_t end = static_cast<int64_t>(item.nbytes() / elem);
        if (source.has_range()) {
          begin = source.range().begin();
          end = source.range().end();
        }
        if (begin < 0 || end < begin || static_cast<uint64_t>(end) * elem > item.nbytes()) {
          return absl::InvalidArgumentError(
              absl::StrCat("chunk ", item.key(), " has a source outside it"));
        }
        StagingRange range{base + static_cast<uint64_t>(begin) * elem,
                           static_cast<uint64_t>(end - begin) * elem};
        if (source.rank() == rank) {
          if (absl::Status s = Place(layout.shards, placed, shards, source.local_shard(), range);
              !s.ok()) {
            return s;
          }
        } else if (range.nbytes > 0) {
          layout.recvs.push_back({item.key(), item.box(), begin, end, source.rank(), range});
        }
      }
    }
  }
  // Slices that are sent or written are placed first, so a replicated slice's hash can read
  // them where they are (below).
  std::vector<const v1::HashItem*> ranged;
  for (const v1::HashItem& item : assignment.hashes()) {
    if (item.has_range()) {
      ranged.push_back(&item);
      continue;
    }
    const int32_t i = item.local_shard();
    StagingRange range{tail, i >= 0 && static_cast<size_t>(i) < shards.size() ? shards[i].nbytes()
                                                                              : 0};
    if (absl::Status s = Place(layout.shards, placed, shards, i, range); !s.ok()) return s;
    layout.hashes.push_back({item.chunk(), range, std::nullopt});
    tail += AlignUp(range.nbytes);
  }
  for (const v1::GatherSend& send : assignment.sends()) {
    const int32_t i = send.local_shard();
    StagingRange range{tail, i >= 0 && static_cast<size_t>(i) < shards.size() ? shards[i].nbytes()
                                                                              : 0};
    if (absl::Status s = Place(layout.shards, placed, shards, i, range); !s.ok()) return s;
    layout.sends.push_back({TensorKeyOf(shards[i], rank), shards[i].box(), send.range().begin(),
                            send.range().end(), send.leader_rank(), range});
    tail += AlignUp(range.nbytes);
  }
  for (const v1::HashItem* item : ranged) {
    const int32_t i = item->local_shard();
    if (i < 0 || i >= shards.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the assignment names local shard ", i, " of ", shards.size()));
    }
    if (!placed[i]) {  // a replica of the slice that nobody reads from this rank
      StagingRange range{tail, shards[i].nbytes()};
      if (absl::Status s = Place(layout.shards, placed, shards, i, range); !s.ok()) return s;
      tail += AlignUp(range.nbytes);
    }
    layout.hashes.push_back({item->chunk(), layout.shards[i], item->range()});
  }
  for (size_t i = 0; i < shards.size(); ++i) {
    if (!placed[i] && shards[i].nbytes() > 0 && !shards[i].state_absent()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the assignment does not place local shard ", i, " (", shards[i].fqn(), ")"));
    }
  }
  layout.total_bytes = std::max<uint64_t>(AlignUp(tail), kDataAlignment);
  return layout;
}

uint64_t StagingBytesBound(uint64_t bytes, uint64_t tensors) {
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  const uint64_t slack_per_tensor = kDataAlignment - 1;
  if (tensors > (kMax - kDataAlignment) / slack_per_tensor) return kMax;
  const uint64_t slack = tensors * slack_per_tensor;
  if (bytes > kMax - slack - kDataAlignment) return kMax;
  // As ComputeStagingLayout's total: whole alignment units, at least one.
  return std::max<uint64_t>(AlignUp(bytes + slack), kDataAlignment);
}

absl::StatusOr<uint64_t> ReservedStagingBytes(uint64_t bytes, uint64_t gather_bytes,
                                              uint64_t tensors) {
  if (bytes == 0) {
    return absl::InvalidArgumentError(
        "ReserveStaging: bytes is 0; declare the bytes a save stages (the sum of the tensors' "
        "sizes)");
  }
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  return StagingBytesBound(bytes + std::min(gather_bytes, kMax - bytes), tensors);
}

}  // namespace tessera
