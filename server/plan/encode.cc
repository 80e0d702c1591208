// The global plan's bytes, written field by field in protobuf's wire format (plan_wire.h):
// the manifest skeleton and every rank's assignment (Planner::Emit), and the plan record
// (EncodePlanRecord).
#include "server/plan/planner_internal.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "common/plan_fingerprint.h"
#include "common/threads.h"
#include "server/plan/plan_wire.h"
#include "server/plan/planner.h"
#include "tessera/v1/coordinator.pb.h"
#include "tessera/v1/coordinator_state.pb.h"

namespace tessera {
namespace plan_internal {

// What one rank does for one chunk.
enum class Planner::ItemKind : uint8_t { kWrite, kHash, kSend };
struct Planner::Item {  // with its piece's fields copied, so encoding reads items sequentially
  uint32_t chunk;
  int32_t local;  // kHash, kSend: the rank's piece
  int64_t begin;  // kSend, ranged kHash: its flat range
  int64_t end;
  ItemKind kind;
  bool ranged = false;     // kHash of a replicated flat-range slice
  uint32_t reference = 0;  // ranged kHash: the rank whose slice is gathered
};

// Calls fn(rank, Item) for every item of every rank, in chunk order.
template <typename Fn>
void Planner::ForEachItem(Fn fn) const {
  for (uint32_t c = 0; c < chunks_.size(); ++c) {
    const Chunk& chunk = chunks_[c];
    fn(chunk.writer, Item{c, 0, 0, 0, ItemKind::kWrite});
    if (chunk.gathered) {
      for (uint32_t x = chunk.sources_begin; x < chunk.sources_end; ++x) {
        const Piece& p = piece(sources_[x]);
        if (p.rank != chunk.writer) fn(p.rank, Item{c, p.local, p.begin, p.end, ItemKind::kSend});
      }
      // A slice held by several ranks (replicas of a flat range): every holder hashes it,
      // so the coordinator can check them against the one that is gathered.
      uint32_t group = chunk.sources_begin;
      for (uint32_t x = chunk.begin; x < chunk.end; ++group) {
        uint32_t y = x + 1;
        while (y < chunk.end && SamePiece(piece(x), piece(y))) ++y;
        if (y - x > 1) {
          const uint32_t reference = piece(sources_[group]).rank;
          for (uint32_t z = x; z < y; ++z) {
            const Piece& p = piece(z);
            fn(p.rank, Item{c, p.local, p.begin, p.end, ItemKind::kHash, true, reference});
          }
        }
        x = y;
      }
    } else {
      for (uint32_t x = chunk.begin; x < chunk.end; ++x) {
        const Piece& p = piece(x);
        if (p.rank != chunk.writer) fn(p.rank, Item{c, p.local, 0, 0, ItemKind::kHash});
      }
    }
  }
}

GlobalPlan Planner::Emit() {
  const uint32_t world = layout_.world_size();
  GlobalPlan plan;
  plan.fingerprint = CombineFingerprints(layout_, rank_fingerprints_);
  plan.rank_fingerprints = rank_fingerprints_;
  plan.staged_bytes_by_rank = staged_bytes_;
  plan.bytes_written_by_rank = load_;
  for (uint64_t bytes : load_) plan.total_bytes += bytes;
  EmitTensors(&plan);

  // Group the items by rank (a counting sort), then encode each rank's assignment straight
  // into wire format (plan_wire.h): items of one chunk share its pre-encoded key and box.
  ChooseSources();
  std::vector<uint32_t> offsets(world + 1, 0);
  ForEachItem([&](uint32_t rank, const Item&) { ++offsets[rank + 1]; });
  for (uint32_t r = 0; r < world; ++r) offsets[r + 1] += offsets[r];
  std::vector<Item> items(offsets[world]);
  {
    std::vector<uint32_t> next(offsets.begin(), offsets.end() - 1);
    ForEachItem([&](uint32_t rank, const Item& item) { items[next[rank]++] = item; });
  }
  EncodeChunkBytes();
  plan.assignments.resize(world);
  const size_t threads = Threads(items.size());
  RunOnThreads(threads, [&](size_t t) {
    std::string buffer;  // reused: its capacity grows once per thread, not per rank
    for (uint32_t r = static_cast<uint32_t>(t); r < world; r += static_cast<uint32_t>(threads)) {
      buffer.clear();
      absl::Span<const Item> mine(items.data() + offsets[r], offsets[r + 1] - offsets[r]);
      const bool writes = std::any_of(mine.begin(), mine.end(),
                                      [](const Item& i) { return i.kind == ItemKind::kWrite; });
      if (writes) {
        WireWriter(&buffer).String(v1::RankAssignment::kFileFieldNumber, DataFileName(r));
      }
      // Fields in number order: writes, hashes, sends.
      for (ItemKind kind : {ItemKind::kWrite, ItemKind::kHash, ItemKind::kSend}) {
        for (const Item& item : mine) {
          if (item.kind == kind) EncodeItem(item, &buffer);
        }
      }
      plan.assignments[r] = buffer;
    }
  });
  return plan;
}

void Planner::EmitTensors(GlobalPlan* plan) const {
  plan->tensors.reserve(sorted_keys_.size());
  size_t c = 0;
  for (uint32_t k : sorted_keys_) {
    const KeyInfo& key = keys_[k];
    v1::TensorEntry& entry = plan->tensors.emplace_back();
    entry.set_key(key.name);
    entry.set_fqn(std::string(key.ref.fqn));
    entry.set_kind(key.ref.kind);
    if (!key.ref.absent) entry.set_state_key(std::string(key.ref.state_key));
    entry.set_state_absent(key.ref.absent);
    if (key.ref.kind == v1::SHARD_KIND_EXTRA) entry.set_rank(key.ref.extra_rank);
    entry.set_dtype(key.dtype);
    entry.mutable_global_shape()->Add(key.shape.begin(), key.shape.end());
    size_t end = c;
    while (end < chunks_.size() && chunks_[end].key == k) ++end;
    entry.mutable_chunks()->Reserve(static_cast<int>(end - c));
    for (; c < end; ++c) {
      const Chunk& chunk = chunks_[c];
      v1::ChunkEntry* ce = entry.add_chunks();
      *ce->mutable_box() = piece(chunk.begin).shard->box();
      ce->set_file(DataFileName(chunk.writer));
      ce->set_nbytes(chunk.nbytes);
      ce->set_writer_rank(chunk.writer);
    }
  }
}

uint64_t Planner::Int32Varint(int32_t v) { return static_cast<uint64_t>(static_cast<int64_t>(v)); }

// Each chunk's encoded WriteItem, which only its writer carries. (HashItems and
// GatherSends name their local shard and chunk: no key or box to share.)
void Planner::EncodeChunkBytes() {
  write_bytes_.reserve(chunks_.size());
  std::string box;
  for (const Chunk& chunk : chunks_) {
    const std::string& key = keys_[chunk.key].name;
    box = EncodeBox(piece(chunk.begin).shard->box());
    std::string& write = write_bytes_.emplace_back();
    WireWriter w(&write);
    w.String(v1::WriteItem::kKeyFieldNumber, key);
    w.Message(v1::WriteItem::kBoxFieldNumber, box);
    w.Varint(v1::WriteItem::kDtypeFieldNumber, piece(chunk.begin).dtype);
    w.Varint(v1::WriteItem::kNbytesFieldNumber, chunk.nbytes);
    for (uint32_t x = chunk.sources_begin; x < chunk.sources_end; ++x) {
      const Piece& p = piece(sources_[x]);
      WireBuffer source, range;
      source.Varint(v1::ChunkSource::kRankFieldNumber, p.rank);
      source.Varint(v1::ChunkSource::kLocalShardFieldNumber, Int32Varint(p.local));
      if (chunk.gathered) {
        range.Varint(v1::FlatRange::kBeginFieldNumber, static_cast<uint64_t>(p.begin));
        range.Varint(v1::FlatRange::kEndFieldNumber, static_cast<uint64_t>(p.end));
        source.Message(v1::ChunkSource::kRangeFieldNumber, range.view());
      }
      w.Message(v1::WriteItem::kSourcesFieldNumber, source.view());
    }
  }
}

// Appends `item` to `out`, an encoded v1::RankAssignment.
void Planner::EncodeItem(const Item& item, std::string* out) const {
  if (item.kind == ItemKind::kWrite) {
    WireWriter(out).Message(v1::RankAssignment::kWritesFieldNumber, write_bytes_[item.chunk]);
    return;
  }
  const Chunk& chunk = chunks_[item.chunk];
  WireBuffer body, range;
  range.Varint(v1::FlatRange::kBeginFieldNumber, static_cast<uint64_t>(item.begin));
  range.Varint(v1::FlatRange::kEndFieldNumber, static_cast<uint64_t>(item.end));
  int field;
  if (item.kind == ItemKind::kHash) {
    field = v1::RankAssignment::kHashesFieldNumber;
    body.Varint(v1::HashItem::kLocalShardFieldNumber, Int32Varint(item.local));
    body.Varint(v1::HashItem::kWriterRankFieldNumber, item.ranged ? item.reference : chunk.writer);
    if (item.ranged) body.Message(v1::HashItem::kRangeFieldNumber, range.view());
    body.Varint(v1::HashItem::kChunkFieldNumber, item.chunk);
  } else {
    field = v1::RankAssignment::kSendsFieldNumber;
    body.Varint(v1::GatherSend::kLocalShardFieldNumber, Int32Varint(item.local));
    body.Message(v1::GatherSend::kRangeFieldNumber, range.view());
    body.Varint(v1::GatherSend::kLeaderRankFieldNumber, chunk.writer);
  }
  WireWriter(out).Message(field, body.view());
}

}  // namespace plan_internal

std::string EncodePlanRecord(const GlobalPlan& plan) {
  size_t size = 64 + 11 * plan.bytes_written_by_rank.size();
  for (const std::string& a : plan.assignments) size += a.size() + 6;
  std::string out;
  out.reserve(size);
  WireWriter w(&out);
  if (plan.fingerprint != 0) {  // fixed64
    WireBuffer tag;
    tag.RawVarint((uint64_t{v1::PlanRecord::kFingerprintFieldNumber} << 3) | 1);
    out.append(tag.view().data(), tag.size());
    for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(plan.fingerprint >> (8 * i)));
  }
  for (const std::string& a : plan.assignments) {
    w.Message(v1::PlanRecord::kAssignmentsFieldNumber, a);  // repeated bytes: empty ones too
  }
  std::string tensor;
  for (const v1::TensorEntry& t : plan.tensors) {
    tensor.clear();
    t.AppendToString(&tensor);
    w.Message(v1::PlanRecord::kTensorsFieldNumber, tensor);
  }
  auto packed_varints = [&](int field, const std::vector<uint64_t>& values) {
    if (values.empty()) return;
    std::string packed;
    for (uint64_t b : values) {
      WireBuffer v;
      v.RawVarint(b);
      packed.append(v.view().data(), v.size());
    }
    w.Message(field, packed);
  };
  packed_varints(v1::PlanRecord::kBytesWrittenByRankFieldNumber, plan.bytes_written_by_rank);
  w.Varint(v1::PlanRecord::kTotalBytesFieldNumber, plan.total_bytes);
  if (!plan.rank_fingerprints.empty()) {  // packed fixed64
    std::string packed;
    packed.reserve(8 * plan.rank_fingerprints.size());
    for (uint64_t fp : plan.rank_fingerprints) {
      for (int i = 0; i < 8; ++i) packed.push_back(static_cast<char>(fp >> (8 * i)));
    }
    w.Message(v1::PlanRecord::kRankFingerprintsFieldNumber, packed);
  }
  packed_varints(v1::PlanRecord::kStagedBytesByRankFieldNumber, plan.staged_bytes_by_rank);
  w.Varint(v1::PlanRecord::kAssignmentFormatFieldNumber, kAssignmentFormat);
  return out;
}

}  // namespace tessera
