#include "server/plan/planner.h"

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/box.h"
#include "common/dtype.h"
#include "common/status.h"
#include "common/tensor_key.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/plan/fingerprint.h"
#include "server/plan/plan_wire.h"
#include "tessera/v1/coordinator_state.pb.h"

namespace tessera {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::SizeIs;

// ---------------------------------------------------------------------------------------------
// Helpers that keep the tests short.

MeshLayout Mesh(std::vector<std::pair<std::string, uint32_t>> dims) {
  v1::Layout proto;
  for (const auto& [name, degree] : dims) {
    v1::MeshDim* dim = proto.add_dims();
    dim->set_name(name);
    dim->set_degree(degree);
  }
  absl::StatusOr<MeshLayout> layout = MeshLayout::FromProto(proto);
  EXPECT_TRUE(layout.ok()) << layout.status();
  return *layout;
}

uint32_t RankOf(const MeshLayout& layout, std::vector<uint32_t> coords) {
  absl::StatusOr<uint32_t> rank = layout.Rank(coords);
  EXPECT_TRUE(rank.ok()) << rank.status();
  return *rank;
}

int64_t Elements(const std::vector<int64_t>& lengths) {
  int64_t n = 1;
  for (int64_t l : lengths) n *= l;
  return n;
}

// A parameter piece: `box` of a tensor of `shape`, F32 unless told, nbytes filled in.
v1::ShardDesc Param(const std::string& fqn, std::vector<int64_t> shape,
                    std::vector<int64_t> offsets, std::vector<int64_t> lengths,
                    std::vector<std::string> replicated_over = {},
                    v1::DType dtype = v1::DTYPE_F32) {
  v1::ShardDesc s;
  s.set_fqn(fqn);
  s.set_kind(v1::SHARD_KIND_PARAM);
  s.set_dtype(dtype);
  s.mutable_global_shape()->Add(shape.begin(), shape.end());
  s.mutable_box()->mutable_offsets()->Add(offsets.begin(), offsets.end());
  s.mutable_box()->mutable_lengths()->Add(lengths.begin(), lengths.end());
  for (std::string& dim : replicated_over) s.add_replicated_over(std::move(dim));
  s.set_nbytes(Elements(lengths) * DTypeSize(dtype));
  return s;
}

// The whole tensor.
v1::ShardDesc Whole(const std::string& fqn, std::vector<int64_t> shape,
                    std::vector<std::string> replicated_over = {},
                    v1::DType dtype = v1::DTYPE_F32) {
  std::vector<int64_t> zeros(shape.size(), 0);
  return Param(fqn, shape, zeros, shape, std::move(replicated_over), dtype);
}

// Optimizer state `key` of `fqn`: flat range [begin, end) of the whole tensor.
v1::ShardDesc OptSlice(const std::string& fqn, const std::string& key, std::vector<int64_t> shape,
                       int64_t begin, int64_t end, std::vector<std::string> replicated_over = {}) {
  v1::ShardDesc s = Whole(fqn, shape, std::move(replicated_over));
  s.set_kind(v1::SHARD_KIND_OPTIMIZER);
  s.set_state_key(key);
  s.mutable_flat_range()->set_begin(begin);
  s.mutable_flat_range()->set_end(end);
  s.set_nbytes((end - begin) * 4);
  return s;
}

// Optimizer state `key` of a whole-box piece.
v1::ShardDesc OptBox(const std::string& fqn, const std::string& key, std::vector<int64_t> shape,
                     std::vector<int64_t> offsets, std::vector<int64_t> lengths,
                     std::vector<std::string> replicated_over = {}) {
  v1::ShardDesc s = Param(fqn, shape, offsets, lengths, std::move(replicated_over));
  s.set_kind(v1::SHARD_KIND_OPTIMIZER);
  s.set_state_key(key);
  return s;
}

// "This rank has no optimizer state for `fqn` yet."
v1::ShardDesc Absent(const std::string& fqn, std::vector<int64_t> shape) {
  v1::ShardDesc s = Whole(fqn, shape);
  s.set_kind(v1::SHARD_KIND_OPTIMIZER);
  s.set_state_absent(true);
  s.set_nbytes(0);
  return s;
}

v1::ShardDesc Extra(const std::string& fqn, int64_t bytes) {
  v1::ShardDesc s = Whole(fqn, {bytes}, {}, v1::DTYPE_U8);
  s.set_kind(v1::SHARD_KIND_EXTRA);
  return s;
}

std::vector<LocalPlan> EmptyPlans(const MeshLayout& layout) {
  std::vector<LocalPlan> plans(layout.world_size());
  for (uint32_t r = 0; r < plans.size(); ++r) plans[r].rank = r;
  return plans;
}

// Builds the plan; the test fails (and gets an empty plan) if it is rejected.
GlobalPlan MustPlan(const MeshLayout& layout, const std::vector<LocalPlan>& plans) {
  absl::StatusOr<GlobalPlan> plan = BuildGlobalPlan(layout, plans);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return plan.ok() ? *std::move(plan) : GlobalPlan{};
}

// The error detail of a rejected plan; the test fails unless it carries `code`.
v1::ErrorDetail MustFail(const MeshLayout& layout, const std::vector<LocalPlan>& plans,
                         v1::ErrorCode code, const PlannerOptions& options = {}) {
  absl::StatusOr<GlobalPlan> plan = BuildGlobalPlan(layout, plans, options);
  EXPECT_FALSE(plan.ok()) << "expected " << ErrorCodeName(code);
  if (plan.ok()) return {};
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  std::optional<v1::ErrorDetail> detail = GetErrorDetail(plan.status());
  EXPECT_TRUE(detail.has_value()) << plan.status();
  if (!detail.has_value()) return {};
  EXPECT_EQ(detail->code(), code) << plan.status();
  EXPECT_FALSE(detail->message().empty());
  return *detail;
}

std::vector<std::string> Coords(const v1::ErrorDetail& detail) {
  std::vector<std::string> coords;
  for (const v1::RankRef& r : detail.ranks()) coords.push_back(r.coords());
  return coords;
}

std::vector<uint32_t> Ranks(const v1::ErrorDetail& detail) {
  std::vector<uint32_t> ranks;
  for (const v1::RankRef& r : detail.ranks()) ranks.push_back(r.rank());
  return ranks;
}

const v1::TensorEntry* FindTensor(const GlobalPlan& plan, const std::string& key) {
  for (const v1::TensorEntry& t : plan.tensors) {
    if (t.key() == key) return &t;
  }
  return nullptr;
}

std::vector<std::string> TensorKeys(const GlobalPlan& plan) {
  std::vector<std::string> keys;
  for (const v1::TensorEntry& t : plan.tensors) keys.push_back(t.key());
  return keys;
}

// Every rank's assignment, parsed.
std::vector<v1::RankAssignment> Assignments(const GlobalPlan& plan) {
  std::vector<v1::RankAssignment> out;
  for (uint32_t r = 0; r < plan.assignments.size(); ++r) {
    absl::StatusOr<v1::RankAssignment> a = plan.Assignment(r);
    EXPECT_TRUE(a.ok()) << a.status();
    out.push_back(a.ok() ? *std::move(a) : v1::RankAssignment());
  }
  return out;
}

size_t CountWrites(const GlobalPlan& plan) {
  size_t n = 0;
  for (const v1::RankAssignment& a : Assignments(plan)) n += a.writes_size();
  return n;
}

Box B(std::vector<int64_t> offsets, std::vector<int64_t> lengths) {
  return Box{std::move(offsets), std::move(lengths)};
}

// Checks what every valid plan must satisfy, against the local plans it came from: each
// chunk written once by a claimant, sources tiling it, every other holder hashing or sending,
// every element of every tensor in exactly one chunk, and the byte totals.
void ExpectConsistent(const MeshLayout& layout, const std::vector<LocalPlan>& plans,
                      const GlobalPlan& plan) {
  std::map<uint32_t, const LocalPlan*> by_rank;
  for (const LocalPlan& p : plans) by_rank[p.rank] = &p;
  ASSERT_EQ(plan.assignments.size(), layout.world_size());
  const std::vector<v1::RankAssignment> assignments = Assignments(plan);
  ASSERT_EQ(plan.bytes_written_by_rank.size(), layout.world_size());

  // plan.peers: the ranks each rank exchanges DP slices with, as its parsed assignment says.
  ASSERT_EQ(plan.peers.size(), layout.world_size());
  for (uint32_t r = 0; r < layout.world_size(); ++r) {
    std::set<uint32_t> peers;
    for (const v1::GatherSend& g : assignments[r].sends()) peers.insert(g.leader_rank());
    for (const v1::WriteItem& w : assignments[r].writes()) {
      for (const v1::ChunkSource& s : w.sources()) peers.insert(s.rank());
    }
    peers.erase(r);
    EXPECT_EQ(plan.peers[r], std::vector<uint32_t>(peers.begin(), peers.end())) << "rank " << r;
  }
  // The plan's record encodes as the message would.
  v1::PlanRecord record;
  record.set_fingerprint(plan.fingerprint);
  for (const std::string& a : plan.assignments) record.add_assignments(a);
  for (const v1::TensorEntry& t : plan.tensors) *record.add_tensors() = t;
  for (uint64_t b : plan.bytes_written_by_rank) record.add_bytes_written_by_rank(b);
  record.set_total_bytes(plan.total_bytes);
  for (uint64_t fp : plan.rank_fingerprints) record.add_rank_fingerprints(fp);
  for (uint64_t b : plan.staged_bytes_by_rank) record.add_staged_bytes_by_rank(b);
  record.set_assignment_format(kAssignmentFormat);
  EXPECT_EQ(EncodePlanRecord(plan), record.SerializeAsString());
  // Each rank's fingerprint and staged bytes are its local plan's.
  ASSERT_EQ(plan.rank_fingerprints.size(), layout.world_size());
  ASSERT_EQ(plan.staged_bytes_by_rank.size(), layout.world_size());
  for (const LocalPlan& local : plans) {
    EXPECT_EQ(plan.rank_fingerprints[local.rank], FingerprintLocalPlan(local));
    uint64_t staged = 0;
    for (const v1::ShardDesc& s : local.shards) staged += s.nbytes();
    EXPECT_EQ(plan.staged_bytes_by_rank[local.rank], staged) << "rank " << local.rank;
  }

  // Every element of every tensor lies in exactly one chunk.
  uint64_t chunk_bytes = 0;
  std::map<std::tuple<std::string, std::vector<int64_t>>, const v1::ChunkEntry*> chunks;
  // Index = a chunk's index in the plan (HashItem.chunk): its tensor key and entry.
  std::vector<std::pair<std::string, const v1::ChunkEntry*>> chunk_order;
  for (size_t t = 0; t < plan.tensors.size(); ++t) {
    const v1::TensorEntry& tensor = plan.tensors[t];
    if (t > 0) {
      ASSERT_LT(plan.tensors[t - 1].key(), tensor.key());
    }
    std::vector<int64_t> shape(tensor.global_shape().begin(), tensor.global_shape().end());
    const int64_t volume = Elements(shape);
    std::vector<int> counts(volume, 0);
    for (const v1::ChunkEntry& c : tensor.chunks()) {
      Box box = BoxFromProto(c.box());
      ASSERT_TRUE(ValidateBoxInShape(box, shape).ok());
      ASSERT_EQ(c.nbytes(), Elements(box.lengths) * DTypeSize(tensor.dtype()));
      ASSERT_EQ(c.file(), DataFileName(c.writer_rank()));
      chunk_bytes += c.nbytes();
      chunks[{tensor.key(), box.offsets}] = &c;
      chunk_order.emplace_back(tensor.key(), &c);
      absl::StatusOr<std::vector<ElementRun>> runs = RowMajorRuns(FullBox(shape), box);
      ASSERT_TRUE(runs.ok());
      for (const ElementRun& run : *runs) {
        for (int64_t e = run.start; e < run.start + run.count; ++e) ++counts[e];
      }
    }
    if (tensor.kind() != v1::SHARD_KIND_EXTRA && !tensor.state_absent()) {
      for (int64_t e = 0; e < volume; ++e)
        ASSERT_EQ(counts[e], 1) << tensor.key() << " element " << e;
    }
  }
  ASSERT_EQ(plan.total_bytes, chunk_bytes);

  // Every write matches a chunk; its sources tile it; the pieces it reads are the right ones.
  std::set<std::pair<uint32_t, int32_t>> used;  // (rank, local shard) that write, hash or send
  uint64_t total = 0;
  size_t writes = 0;
  for (uint32_t r = 0; r < layout.world_size(); ++r) {
    const v1::RankAssignment& a = assignments[r];
    uint64_t written = 0;
    EXPECT_EQ(a.file(), a.writes_size() > 0 ? DataFileName(r) : "");
    for (const v1::WriteItem& w : a.writes()) {
      ++writes;
      written += w.nbytes();
      Box box = BoxFromProto(w.box());
      auto it = chunks.find({w.key(), box.offsets});
      ASSERT_NE(it, chunks.end()) << w.key();
      EXPECT_EQ(it->second->writer_rank(), r);
      EXPECT_EQ(it->second->nbytes(), w.nbytes());
      const int64_t volume = Elements(box.lengths);
      int64_t next = 0;
      for (const v1::ChunkSource& src : w.sources()) {
        const v1::ShardDesc& s = by_rank.at(src.rank())->shards.at(src.local_shard());
        EXPECT_EQ(TensorKeyOf(s, src.rank()), w.key());
        EXPECT_EQ(BoxFromProto(s.box()), box);
        used.insert({src.rank(), src.local_shard()});
        if (!src.has_range()) {
          EXPECT_EQ(src.rank(), r);
          EXPECT_EQ(w.sources_size(), 1);
          next = volume;
          continue;
        }
        EXPECT_EQ(src.range().begin(), next);
        EXPECT_EQ(s.flat_range().begin(), src.range().begin());
        EXPECT_EQ(s.flat_range().end(), src.range().end());
        next = src.range().end();
        if (src.rank() != r) {
          // The sender has the matching GatherSend.
          bool found = false;
          for (const v1::GatherSend& g : assignments[src.rank()].sends()) {
            // (The slice's key and box are its local shard's, checked above.)
            found |= g.local_shard() == src.local_shard() && g.leader_rank() == r &&
                     g.range().begin() == src.range().begin() &&
                     g.range().end() == src.range().end();
          }
          EXPECT_TRUE(found) << "no GatherSend for a source of " << w.key();
        }
      }
      EXPECT_EQ(next, volume) << w.key();
    }
    for (const v1::HashItem& h : a.hashes()) {
      // The item names its local shard and its chunk by index in the manifest skeleton.
      const v1::ShardDesc& s = by_rank.at(r)->shards.at(h.local_shard());
      ASSERT_LT(h.chunk(), chunk_order.size()) << "rank " << r;
      EXPECT_EQ(TensorKeyOf(s, r), chunk_order[h.chunk()].first);
      EXPECT_EQ(BoxFromProto(s.box()), BoxFromProto(chunk_order[h.chunk()].second->box()));
      auto it = chunks.find({TensorKeyOf(s, r), BoxFromProto(s.box()).offsets});
      ASSERT_NE(it, chunks.end());
      EXPECT_EQ(it->second, chunk_order[h.chunk()].second);
      if (h.has_range()) {
        // A replicated flat-range slice: every holder hashes it (the gathered one too), and
        // the reference is the rank whose slice is gathered.
        EXPECT_EQ(s.flat_range().begin(), h.range().begin());
        EXPECT_EQ(s.flat_range().end(), h.range().end());
        used.insert({r, h.local_shard()});
        continue;
      }
      EXPECT_EQ(it->second->writer_rank(), h.writer_rank());
      EXPECT_NE(h.writer_rank(), r);
      EXPECT_TRUE(used.insert({r, h.local_shard()}).second);
    }
    for (const v1::GatherSend& g : a.sends()) {
      EXPECT_NE(g.leader_rank(), r);
      used.insert({r, g.local_shard()});
    }
    EXPECT_EQ(plan.bytes_written_by_rank[r], written);
    // The planner encodes assignments itself; the bytes are protobuf's canonical encoding.
    EXPECT_EQ(a.SerializeAsString(), plan.assignments[r]) << "rank " << r;
    total += written;
  }
  EXPECT_EQ(total, plan.total_bytes);
  size_t chunk_count = 0;
  for (const v1::TensorEntry& t : plan.tensors) chunk_count += t.chunks_size();
  EXPECT_EQ(writes, chunk_count);

  // Every piece with bytes is written, hashed or sent — except a replica of a flat range
  // another replica already sends (HashItem has no flat range; see planner.h).
  for (const LocalPlan& p : plans) {
    for (size_t i = 0; i < p.shards.size(); ++i) {
      const v1::ShardDesc& s = p.shards[i];
      if (s.nbytes() == 0 || s.has_flat_range()) continue;
      EXPECT_TRUE(used.count({p.rank, static_cast<int32_t>(i)}))
          << "rank " << p.rank << " shard " << i << " (" << s.fqn() << ") is unused";
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The seed reports.

// torchtitan PP=2: stage 1 names its layers layers.0.* like stage 0. Before Tessera the second
// stage's tensors were taken for replicas and half the layers were never written.
TEST(Planner, Plan_PpStagesReuseLayerNames_DuplicateFqn) {
  MeshLayout layout = Mesh({{"pp", 2}, {"dp", 2}});
  std::vector<LocalPlan> plans = EmptyPlans(layout);
  for (uint32_t r = 0; r < 4; ++r) {
    for (int layer = 0; layer < 2; ++layer) {  // both stages: layers.0, layers.1
      plans[r].shards.push_back(
          Whole(absl::StrCat("layers.", layer, ".attention.wq.weight"), {16, 16}, {"dp"}));
    }
  }
  v1::ErrorDetail detail = MustFail(layout, plans, v1::ERROR_CODE_DUPLICATE_FQN);
  EXPECT_THAT(detail.fqns(), ElementsAre("layers.0.attention.wq.weight"));
  EXPECT_THAT(Coords(detail), ElementsAre("pp=0,dp=0", "pp=1,dp=0"));
  EXPECT_THAT(Ranks(detail), ElementsAre(0, 2));
  EXPECT_THAT(detail.message(), ::testing::HasSubstr("differ in pp"));
}

TEST(Planner, Plan_PpStagesUniqueNames_AllLayersSaved) {
  MeshLayout layout = Mesh({{"pp", 2}, {"dp", 2}});
  std::vector<LocalPlan> plans = EmptyPlans(layout);
  for (uint32_t r = 0; r < 4; ++r) {
    const int stage = layout.Coords(r)[0];
    for (int layer = 2 * stage; layer < 2 * stage + 2; ++layer) {
      plans[r].shards.push_back(Whole(absl::StrCat("layers.", layer, ".w"), {16, 16}, {"dp"}));
    }
  }
  GlobalPlan plan = MustPlan(layout, plans);
  const std::vector<v1::RankAssignment> assignments = Assignments(plan);
  ExpectConsistent(layout, plans, plan);
  EXPECT_THAT(TensorKeys(plan),
              ElementsAre("layers.0.w", "layers.1.w", "layers.2.w", "layers.3.w"));
  EXPECT_EQ(plan.total_bytes, 4u * 16 * 16 * 4);
  EXPECT_EQ(CountWrites(plan), 4u);
  // Each layer is written by one of its stage's two DP ranks; the other hashes it, and the
  // balancing gives every rank one layer.
  for (uint32_t r = 0; r < 4; ++r) {
    EXPECT_EQ(assignments[r].writes_size(), 1) << r;
    EXPECT_EQ(assignments[r].hashes_size(), 1) << r;
    EXPECT_EQ(plan.bytes_written_by_rank[r], 16u * 16 * 4);
  }
}

TEST(Planner, Plan_TpReplicatedNorm_Accepted) {
  MeshLayout layout = Mesh({{"tp", 2}, {"dp", 2}});
  std::vector<LocalPlan> plans = EmptyPlans(layout);
  for (uint32_t r = 0; r < 4; ++r) {
    const int64_t tp = layout.Coords(r)[0];
    plans[r].shards.push_back(Whole("norm.weight", {64}, {"dp", "tp"}));
    plans[r].shards.push_back(Param("wq.weight", {64, 64}, {32 * tp, 0}, {32, 64}, {"dp"}));
  }
  GlobalPlan plan = MustPlan(layout, plans);
  const std::vector<v1::RankAssignment> assignments = Assignments(plan);
  ExpectConsistent(layout, plans, plan);
  const v1::TensorEntry* norm = FindTensor(plan, "norm.weight");
  ASSERT_NE(norm, nullptr);
  EXPECT_THAT(norm->chunks(), SizeIs(1));
  EXPECT_THAT(FindTensor(plan, "wq.weight")->chunks(), SizeIs(2));
  size_t norm_hashes = 0;
  for (uint32_t r = 0; r < 4; ++r) {
    for (const v1::HashItem& h : assignments[r].hashes()) {
      norm_hashes += plans[r].shards.at(h.local_shard()).fqn() == "norm.weight";
    }
  }
  EXPECT_EQ(norm_hashes, 3u);
}

TEST(Planner, Plan_TpReplicatedNormDeclaredOnlyOverDp_DuplicateFqn) {
  MeshLayout layout = Mesh({{"tp", 2}, {"dp", 2}});
  std::vector<LocalPlan> plans = EmptyPlans(layout);
  for (uint32_t r = 0; r < 4; ++r) plans[r].shards.push_back(Whole("norm.weight", {64}, {"dp"}));
  v1::ErrorDetail detail = MustFail(layout, plans, v1::ERROR_CODE_DUPLICATE_FQN);
  EXPECT_THAT(Coords(detail), ElementsAre("tp=0,dp=0", "tp=1,dp=0"));
}

// A tied embedding shared by the first and last of four stages: the claimants are a subset
// of the {dp, pp} replica group, which is allowed.
TEST(Planner, Plan_TiedEmbeddingReplicatedOverPp_Accepted) {
  MeshLayout layout = Mesh({{"pp", 4}, {"dp", 2}});
  std::vector<LocalPlan> plans = EmptyPlans(layout);
  for (uint32_t r = 0; r < layout.world_size(); ++r) {
    const uint32_t stage = layout.Coords(r)[0];
    if (stage == 0 || stage == 3) {
      plans[r].shards.push_back(Whole("tok_embeddings.weight", {100, 8}, {"dp", "pp"}));
    }
    plans[r].shards.push_back(Whole(absl::StrCat("layers.", stage, ".w"), {8, 8}, {"dp"}));
  }
  GlobalPlan plan = MustPlan(layout, plans);
  ExpectConsistent(layout, plans, plan);
  const v1::TensorEntry* emb = FindTensor(plan, "tok_embeddings.weight");
  ASSERT_NE(emb, nullptr);
  ASSERT_THAT(emb->chunks(), SizeIs(1));
  const uint32_t writer = emb->chunks(0).writer_rank();
  EXPECT_TRUE(layout.Coords(writer)[0] == 0 || layout.Coords(writer)[0] == 3);

  // Declared {dp} only, the last stage's copy is a duplicate of the first's.
  for (LocalPlan& p : plans) {
    for (v1::ShardDesc& s : p.shards) {
      if (s.fqn() == "tok_embeddings.weight") s.mutable_replicated_over()->RemoveLast();
    }
  }
  v1::ErrorDetail detail = MustFail(layout, plans, v1::ERROR_CODE_DUPLICATE_FQN);
  EXPECT_THAT(Coords(detail), ElementsAre("pp=0,dp=0", "pp=3,dp=0"));
}

// Megatron's distributed optimizer: each of 4 DP ranks holds a flat quarter of every state.
// The leader gathers the quarters and writes the box once; nobody else writes it.
TEST(Planner, Plan_DistributedOptimizerSlices_GatheredToLeader) {
  MeshLayout layout = Mesh({{"dp", 4}});
  std::vector<LocalPlan> plans = EmptyPlans(layout);
  for (uint32_t r = 0; r < 4; ++r) {
    plans[r].shards.push_back(Whole("w", {8, 4}, {"dp"}));
    plans[r].shards.push_back(OptSlice("w", "exp_avg", {8, 4}, 8 * r, 8 * r + 8));
  }
  GlobalPlan plan = MustPlan(layout, plans);
  const std::vector<v1::RankAssignment> assignments = Assignments(plan);
  ExpectConsistent(layout, plans, plan);
  const v1::TensorEntry* state = FindTensor(plan, "w#exp_avg");
  ASSERT_NE(state, nullptr);
  EXPECT_EQ(state->state_key(), "exp_avg");
  EXPECT_EQ(state->kind(), v1::SHARD_KIND_OPTIMIZER);
  ASSERT_THAT(state->chunks(), SizeIs(1));
  EXPECT_EQ(BoxFromProto(state->chunks(0).box()), B({0, 0}, {8, 4}));
  const uint32_t leader = state->chunks(0).writer_rank();
  // Balancing: the parameter (same size) went to another rank.
  EXPECT_NE(FindTensor(plan, "w")->chunks(0).writer_rank(), leader);

  const v1::WriteItem* gathered = nullptr;
  for (const v1::WriteItem& w : assignments[leader].writes()) {
    if (w.key() == "w#exp_avg") gathered = &w;
  }
  ASSERT_NE(gathered, nullptr);
  ASSERT_THAT(gathered->sources(), SizeIs(4));
  for (uint32_t r = 0; r < 4; ++r) {
    EXPECT_EQ(gathered->sources(r).rank(), r);
    EXPECT_EQ(gathered->sources(r).local_shard(), 1);
    EXPECT_EQ(gathered->sources(r).range().begin(), 8 * r);
    EXPECT_EQ(gathered->sources(r).range().end(), 8 * r + 8);
  }
  int sends = 0;
  for (uint32_t r = 0; r < 4; ++r) {
    for (const v1::GatherSend& g : assignments[r].sends()) {
      ++sends;
      EXPECT_NE(r, leader);
      EXPECT_EQ(g.leader_rank(), leader);
      EXPECT_EQ(g.local_shard(), 1);  // w#exp_avg: the slice's key is its local shard's
      EXPECT_EQ(plans[r].shards[1].state_key(), "exp_avg");
      EXPECT_EQ(g.range().begin(), 8 * r);
    }
  }
  EXPECT_EQ(sends, 3);
  // The leader exchanges slices with every other rank; each of them with the leader only.
  for (uint32_t r = 0; r < 4; ++r) {
    if (r == leader) {
      std::vector<uint32_t> others;
      for (uint32_t o = 0; o < 4; ++o) {
        if (o != leader) others.push_back(o);
      }
      EXPECT_EQ(plan.peers[r], others);
    } else {
      EXPECT_THAT(plan.peers[r], ElementsAre(leader)) << "rank " << r;
    }
  }
}

TEST(PlanWire, AssignmentPeers_SendsAndSources_SortedWithoutSelf) {
  v1::RankAssignment a;
  v1::WriteItem* w = a.add_writes();
  w->set_key("k");
  w->add_sources()->set_rank(2);   // self
  w->add_sources();                // rank 0: a field proto3 leaves out
  w->add_sources()->set_rank(7);
  a.add_sends()->set_leader_rank(5);
  a.add_sends()->set_leader_rank(7);
  a.add_hashes()->set_writer_rank(9);  // hashing needs no peer
  absl::StatusOr<std::vector<uint32_t>> peers = AssignmentPeers(a.SerializeAsString(), 2);
  ASSERT_TRUE(peers.ok()) << peers.status();
  EXPECT_THAT(*peers, ElementsAre(0, 5, 7));

  EXPECT_THAT(*AssignmentPeers("", 0), IsEmpty());
  const std::string bytes = a.SerializeAsString();
  EXPECT_EQ(AssignmentPeers(bytes.substr(0, bytes.size() - 1), 2).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(AssignmentPeers("\x22\x05\x28", 2).status().code(), absl::StatusCode::kDataLoss);

  GlobalPlan plan;
  plan.assignments = {bytes, "\xff"};
  EXPECT_EQ(FillDerived(&plan).code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(plan.peers, IsEmpty());
  plan.assignments.pop_back();
  ASSERT_TRUE(FillDerived(&plan).ok());
  EXPECT_THAT(plan.peers, ElementsAre(ElementsAre(2, 5, 7)));  // as rank 0: 0 is self
}

// Megatron's "KeyError: 'exp_avg'": one DP rank has no optimizer state yet.
TEST(Planner, Plan_OptimizerStateAbsentOnOneRank_Mismatch) {
  MeshLayout layout = Mesh({{"dp", 2}});
  std::vector<LocalPlan> plans = EmptyPlans(layout);
  plans[0].shards = {OptSlice("w", "exp_avg", {4}, 0, 2), OptSlice("w", "exp_avg_sq", {4}, 0, 2)};
  plans[1].shards = {Absent("w", {4})};
  v1::ErrorDetail detail = MustFail(layout, plans, v1::ERROR_CODE_OPTIMIZER_STATE_MISMATCH);
  EXPECT_THAT(detail.fqns(), ElementsAre("w"));
  EXPECT_THAT(Coords(detail), ElementsAre("dp=0", "dp=1"));
  EXPECT_EQ(detail.state_key(), "exp_avg");
  EXPECT_THAT(detail.message(), ::testing::HasSubstr("no state (absent)"));
}

TEST(Planner, Plan_OptimizerStateKeysDiffer_Mismatch) {
  MeshLayout layout = Mesh({{"dp", 2}});
  std::vector<LocalPlan> plans = EmptyPlans(layout);
  plans[0].shards = {OptSlice("w", "exp_avg", {4}, 0, 2), OptSlice("w", "exp_avg_sq", {4}, 0, 2)};
  plans[1].shards = {OptSlice("w", "exp_avg", {4}, 2, 4)};
  v1::ErrorDetail detail = MustFail(layout, plans, v1::ERROR_CODE_OPTIMIZER_STATE_MISMATCH);
  EXPECT_EQ(detail.state_key(), "exp_avg_sq");
  EXPECT_THAT(Ranks(detail), ElementsAre(0, 1));
}

TEST(Planner, Plan_OptimizerStateAbsentAndPresentOnOneRank_Mismatch) {
  MeshLayout layout = Mesh({{"dp", 1}});
  std::vector<LocalPlan> plans = EmptyPlans(layout);
  plans[0].shards = {Absent("w", {4}), OptSlice("w", "exp_avg", {4}, 0, 4)};
  v1::ErrorDetail detail = MustFail(layout, plans, v1::ERROR_CODE_OPTIMIZER_STATE_MISMATCH);
  EXPECT_EQ(detail.state_key(), "exp_avg");
}

TEST(Planner, Plan_OptimizerStateAbsentEverywhere_Accepted) {
  MeshLayout layout = Mesh({{"dp", 2}});
  std::vector<LocalPlan> plans = EmptyPlans(layout);
  for (LocalPlan& p : plans) p.shards = {Whole("w", {4}, {"dp"}), Absent("w", {4})};
  GlobalPlan plan = MustPlan(layout, plans);
  ExpectConsistent(layout, plans, plan);
  EXPECT_THAT(TensorKeys(plan), ElementsAre("w", "w#"));
  const v1::TensorEntry* state = FindTensor(plan, "w#");
  EXPECT_TRUE(state->state_absent());
  EXPECT_EQ(state->kind(), v1::SHARD_KIND_OPTIMIZER);
  EXPECT_EQ(state->fqn(), "w");
  EXPECT_THAT(state->chunks(), IsEmpty());
  EXPECT_EQ(CountWrites(plan), 1u);
  EXPECT_EQ(plan.total_bytes, 16u);
}

// FSDP2 shards dim 0 with torch.chunk: 7 rows on 3 ranks are 3, 3, 1; 5 rows on 8 ranks leave
// ranks 5..7 with empty shards.
TEST(Planner, Plan_Fsdp2UnevenAndEmptyShards_Accepted) {
  const std::vector<std::pair<uint32_t, int64_t>> cases = {{3, 7}, {8, 5}};
  for (const auto& [ranks, rows] : cases) {
    SCOPED_TRACE(absl::StrCat(ranks, " ranks, ", rows, " rows"));
    MeshLayout layout = Mesh({{"dp_shard", ranks}});
    std::vector<LocalPlan> plans = EmptyPlans(layout);
    const int64_t per = (rows + ranks - 1) / ranks;
    for (uint32_t r = 0; r < ranks; ++r) {
      const int64_t begin = std::min<int64_t>(rows, r * per);
      const int64_t end = std::min<int64_t>(rows, begin + per);
      plans[r].shards.push_back(Param("w", {rows, 3}, {begin, 0}, {end - begin, 3}));
      plans[r].shards.push_back(OptBox("w", "exp_avg", {rows, 3}, {begin, 0}, {end - begin, 3}));
    }
    GlobalPlan plan = MustPlan(layout, plans);
    const std::vector<v1::RankAssignment> assignments = Assignments(plan);
    ExpectConsistent(layout, plans, plan);
    const size_t nonempty = (rows + per - 1) / per;
    EXPECT_THAT(FindTensor(plan, "w")->chunks(), SizeIs(nonempty));
    EXPECT_THAT(FindTensor(plan, "w#exp_avg")->chunks(), SizeIs(nonempty));
    for (uint32_t r = 0; r < ranks; ++r) {
      // Each rank writes its own rows; an empty shard produces nothing at all.
      EXPECT_EQ(assignments[r].writes_size(), r < nonempty ? 2 : 0);
      EXPECT_THAT(assignments[r].hashes(), IsEmpty());
      EXPECT_EQ(assignments[r].file().empty(), r >= nonempty);
    }
  }
}

// 2-D: FSDP over dim 0 and TP over dim 1 of every weight.
TEST(Planner, Plan_FsdpTimesTp2d_Accepted) {
  MeshLayout layout = Mesh({{"dp_shard", 2}, {"tp", 4}});
  std::vector<LocalPlan> plans = EmptyPlans(layout);
  for (uint32_t r = 0; r < layout.world_size(); ++r) {
    const int64_t dp = layout.Coords(r)[0], tp = layout.Coords(r)[1];
    plans[r].shards.push_back(Param("w1", {10, 16}, {5 * dp, 4 * tp}, {5, 4}));
    plans[r].shards.push_back(Param("w2", {16, 10}, {4 * tp, 5 * dp}, {4, 5}));
    plans[r].shards.push_back(Param("norm", {16}, {8 * dp}, {8}, {"tp"}));
  }
  GlobalPlan plan = MustPlan(layout, plans);
  ExpectConsistent(layout, plans, plan);
  EXPECT_THAT(FindTensor(plan, "w1")->chunks(), SizeIs(8));
  EXPECT_THAT(FindTensor(plan, "w2")->chunks(), SizeIs(8));
  EXPECT_THAT(FindTensor(plan, "norm")->chunks(), SizeIs(2));
}

// HSDP: sharded over dp_shard, replicated over dp_replicate.
TEST(Planner, Plan_HsdpReplicateTimesShard_Accepted) {
  MeshLayout layout = Mesh({{"dp_replicate", 2}, {"dp_shard", 2}});
  std::vector<LocalPlan> plans = EmptyPlans(layout);
  for (uint32_t r = 0; r < 4; ++r) {
    const int64_t shard = layout.Coords(r)[1];
    plans[r].shards.push_back(Param("w", {8, 2}, {4 * shard, 0}, {4, 2}, {"dp_replicate"}));
    plans[r].shards.push_back(Param("v", {8, 2}, {4 * shard, 0}, {4, 2}, {"dp_replicate"}));
  }
  GlobalPlan plan = MustPlan(layout, plans);
  const std::vector<v1::RankAssignment> assignments = Assignments(plan);
  ExpectConsistent(layout, plans, plan);
  EXPECT_THAT(FindTensor(plan, "w")->chunks(), SizeIs(2));
  for (uint32_t r = 0; r < 4; ++r) {
    EXPECT_EQ(plan.bytes_written_by_rank[r], 32u) << r;  // one of the four chunks each
    EXPECT_EQ(assignments[r].hashes_size(), 1) << r;
  }
  // Without dp_replicate in replicated_over, the two copies of a shard are duplicates.
  for (LocalPlan& p : plans) p.shards[0].clear_replicated_over();
  v1::ErrorDetail detail = MustFail(layout, plans, v1::ERROR_CODE_DUPLICATE_FQN);
  EXPECT_THAT(Coords(detail),
              ElementsAre("dp_replicate=0,dp_shard=0", "dp_replicate=1,dp_shard=0"));
}

// Partial distributed optimizer: slices sharded over dp_shard, replicated over dp_replicate.
// Ranks 0 and 1 are busy writing their extras, so the leader is rank 2 (dp_replicate=1,
// dp_shard=0): it reads the first half from its own copy, not rank 0's, and only one of the
// second half's replicas sends it.
TEST(Planner, Plan_ReplicatedOptimizerSlices_OneSourcePerRange) {
  MeshLayout layout = Mesh({{"dp_replicate", 2}, {"dp_shard", 2}});
  std::vector<LocalPlan> plans = EmptyPlans(layout);
  for (uint32_t r = 0; r < 4; ++r) {
    const int64_t shard = layout.Coords(r)[1];
    plans[r].shards.push_back(
        OptSlice("w", "exp_avg", {4, 4}, 8 * shard, 8 * shard + 8, {"dp_replicate"}));
    if (r < 2) plans[r].shards.push_back(Extra("rng", 1000));
  }
  GlobalPlan plan = MustPlan(layout, plans);
  const std::vector<v1::RankAssignment> assignments = Assignments(plan);
  ExpectConsistent(layout, plans, plan);
  const v1::TensorEntry* state = FindTensor(plan, "w#exp_avg");
  ASSERT_THAT(state->chunks(), SizeIs(1));
  ASSERT_EQ(state->chunks(0).writer_rank(), 2u);
  const v1::WriteItem& write = assignments[2].writes(0);
  ASSERT_THAT(write.sources(), SizeIs(2));
  EXPECT_EQ(write.sources(0).rank(), 2u);
  EXPECT_EQ(write.sources(1).rank(), 1u);
  int sends = 0;
  for (const v1::RankAssignment& a : assignments) sends += a.sends_size();
  EXPECT_EQ(sends, 1);
  EXPECT_EQ(assignments[1].sends_size(), 1);
}

// ---------------------------------------------------------------------------------------------
// Overlaps, gaps, mismatches.

TEST(Planner, Plan_PartiallyOverlappingBoxes_Rejected) {
  MeshLayout layout = Mesh({{"tp", 2}});
  std::vector<LocalPlan> plans = EmptyPlans(layout);
  plans[0].shards = {Param("w", {10, 3}, {0, 0}, {6, 3})};
  plans[1].shards = {Param("w", {10, 3}, {4, 0}, {6, 3})};
  v1::ErrorDetail detail = MustFail(layout, plans, v1::ERROR_CODE_OVERLAPPING_SHARDS);
  EXPECT_THAT(detail.fqns(), ElementsAre("w"));
  EXPECT_THAT(Coords(detail), ElementsAre("tp=0", "tp=1"));
  EXPECT_THAT(detail.message(), ::testing::HasSubstr("[4:10, 0:3]"));
}

TEST(Planner, Plan_BoxInsideAnother_Rejected) {
  MeshLayout layout = Mesh({{"tp", 2}});
  std::vector<LocalPlan> plans = EmptyPlans(layout);
  plans[0].shards = {Whole("w", {10})};
  plans[1].shards = {Param("w", {10}, {2}, {3})};
  MustFail(layout, plans, v1::ERROR_CODE_OVERLAPPING_SHARDS);
}

TEST(Planner, Plan_OverlappingFlatRanges_Rejected) {
  MeshLayout layout = Mesh({{"dp", 2}});
  std::vector<LocalPlan> plans = EmptyPlans(layout);
  plans[0].shards = {OptSlice("w", "m", {10}, 0, 6)};
  plans[1].shards = {OptSlice("w", "m", {10}, 5, 10)};
  v1::ErrorDetail detail = MustFail(layout, plans, v1::ERROR_CODE_OVERLAPPING_SHARDS);
  EXPECT_EQ(detail.state_key(), "m");
  EXPECT_THAT(Ranks(detail), ElementsAre(0, 1));
}

TEST(Planner, Plan_WholeBoxAndFlatRangeOfIt_Rejected) {
  MeshLayout layout = Mesh({{"dp", 2}});
  std::vector<LocalPlan> plans = EmptyPlans(layout);
  plans[0].shards = {OptBox("w", "m", {10}, {0}, {10})};
  plans[1].shards = {OptSlice("w", "m", {10}, 0, 10)};
  MustFail(layout, plans, v1::ERROR_CODE_OVERLAPPING_SHARDS);
}

TEST(Planner, Plan_MissingColumns_IncompleteCoverageNamesRegion) {
  MeshLayout layout = Mesh({{"tp", 3}});
  std::vector<LocalPlan> plans = EmptyPlans(layout);
  plans[0].shards = {Param("w", {4, 6}, {0, 0}, {4, 2})};
  plans[1].shards = {Param("w", {4, 6}, {0, 4}, {4, 2})};
  plans[2].shards = {Param("w", {4, 6}, {0, 2}, {4, 0})};  // an empty shard: legal, covers nothing
  v1::ErrorDetail detail = MustFail(layout, plans, v1::ERROR_CODE_INCOMPLETE_COVERAGE);
  EXPECT_THAT(detail.fqns(), ElementsAre("w"));
  EXPECT_EQ(BoxFromProto(detail.region()), B({0, 2}, {4, 2}));
  EXPECT_THAT(detail.message(), ::testing::HasSubstr("[0:4, 2:4]"));
}

TEST(Planner, Plan_FlatRangeGap_IncompleteCoverage) {
  MeshLayout layout = Mesh({{"dp", 3}});
  std::vector<LocalPlan> plans = EmptyPlans(layout);
  plans[0].shards = {OptSlice("w", "m", {3, 4}, 0, 4)};
  plans[1].shards = {OptSlice("w", "m", {3, 4}, 8, 12)};
  plans[2].shards = {OptSlice("w", "m", {3, 4}, 4, 4)};  // empty slice
  v1::ErrorDetail detail = MustFail(layout, plans, v1::ERROR_CODE_INCOMPLETE_COVERAGE);
  EXPECT_EQ(BoxFromProto(detail.region()), B({0, 0}, {3, 4}));
  EXPECT_THAT(detail.message(), ::testing::HasSubstr("[4, 8)"));
  // The tail of the box missing.
  plans[1].shards = {OptSlice("w", "m", {3, 4}, 4, 8)};
  detail = MustFail(layout, plans, v1::ERROR_CODE_INCOMPLETE_COVERAGE);
  EXPECT_THAT(detail.message(), ::testing::HasSubstr("[8, 12)"));
}

TEST(Planner, Plan_ShapeOrDtypeMismatch_Rejected) {
  MeshLayout layout = Mesh({{"dp", 2}});
  std::vector<LocalPlan> plans = EmptyPlans(layout);
  plans[0].shards = {Whole("w", {4, 4}, {"dp"})};
  plans[1].shards = {Whole("w", {4, 5}, {"dp"})};
  v1::ErrorDetail detail = MustFail(layout, plans, v1::ERROR_CODE_SHAPE_MISMATCH);
  EXPECT_THAT(detail.fqns(), ElementsAre("w"));
  EXPECT_THAT(Coords(detail), ElementsAre("dp=0", "dp=1"));
  EXPECT_THAT(detail.message(), ::testing::HasSubstr("F32[4, 5]"));

  plans[1].shards = {Whole("w", {4, 4}, {"dp"}, v1::DTYPE_BF16)};
  detail = MustFail(layout, plans, v1::ERROR_CODE_SHAPE_MISMATCH);
  EXPECT_THAT(detail.message(), ::testing::HasSubstr("BF16[4, 4]"));
}

TEST(Planner, Plan_ReplicasDisagreeOnReplicatedOver_ReplicationMismatch) {
  MeshLayout layout = Mesh({{"tp", 2}, {"dp", 2}});
  std::vector<LocalPlan> plans = EmptyPlans(layout);
  for (uint32_t r = 0; r < 4; ++r) plans[r].shards = {Whole("norm", {8}, {"dp", "tp"})};
  plans[3].shards = {Whole("norm", {8}, {"dp"})};
  v1::ErrorDetail detail = MustFail(layout, plans, v1::ERROR_CODE_REPLICATION_MISMATCH);
  EXPECT_THAT(Ranks(detail), ElementsAre(0, 3));
  EXPECT_THAT(detail.message(), ::testing::HasSubstr("{tp, dp}"));
}

// ---------------------------------------------------------------------------------------------
// Malformed shards, layout and limits.

TEST(Planner, Plan_MalformedShards_Rejected) {
  struct Case {
    std::string name;
    std::function<void(v1::ShardDesc*)> mutate;
  };
  const std::vector<Case> cases = {
      {"empty fqn", [](v1::ShardDesc* s) { s->set_fqn(""); }},
      {"fqn with #", [](v1::ShardDesc* s) { s->set_fqn("a#b"); }},
      {"fqn with @", [](v1::ShardDesc* s) { s->set_fqn("a@b"); }},
      {"fqn with control char", [](v1::ShardDesc* s) { s->set_fqn("a\nb"); }},
      {"fqn not UTF-8", [](v1::ShardDesc* s) { s->set_fqn("a\xff"); }},
      {"fqn too long", [](v1::ShardDesc* s) { s->set_fqn(std::string(kMaxFqnBytes + 1, 'a')); }},
      {"kind unspecified", [](v1::ShardDesc* s) { s->set_kind(v1::SHARD_KIND_UNSPECIFIED); }},
      {"kind unknown", [](v1::ShardDesc* s) { s->set_kind(static_cast<v1::ShardKind>(42)); }},
      {"dtype unspecified", [](v1::ShardDesc* s) { s->set_dtype(v1::DTYPE_UNSPECIFIED); }},
      {"dtype unknown", [](v1::ShardDesc* s) { s->set_dtype(static_cast<v1::DType>(99)); }},
      {"box rank",
       [](v1::ShardDesc* s) {
         s->mutable_box()->add_offsets(0);
         s->mutable_box()->add_lengths(1);
       }},
      {"offsets vs lengths", [](v1::ShardDesc* s) { s->mutable_box()->add_offsets(0); }},
      {"65 axes", [](v1::ShardDesc* s) { *s = Whole("w", std::vector<int64_t>(65, 1)); }},
      {"box outside", [](v1::ShardDesc* s) { s->mutable_box()->set_offsets(0, 1); }},
      {"negative offset", [](v1::ShardDesc* s) { s->mutable_box()->set_offsets(0, -1); }},
      {"negative length", [](v1::ShardDesc* s) { s->mutable_box()->set_lengths(0, -1); }},
      {"negative dim", [](v1::ShardDesc* s) { s->set_global_shape(0, -4); }},
      {"shape overflow",
       [](v1::ShardDesc* s) {
         s->set_global_shape(0, int64_t{1} << 62);
         s->set_global_shape(1, 8);
       }},
      {"flat range beyond box",
       [](v1::ShardDesc* s) {
         s->mutable_flat_range()->set_end(33);
         s->set_nbytes(33 * 4);
       }},
      {"flat range reversed",
       [](v1::ShardDesc* s) {
         s->mutable_flat_range()->set_begin(5);
         s->mutable_flat_range()->set_end(4);
       }},
      {"flat range negative",
       [](v1::ShardDesc* s) {
         s->mutable_flat_range()->set_begin(-1);
         s->mutable_flat_range()->set_end(0);
       }},
      {"nbytes", [](v1::ShardDesc* s) { s->set_nbytes(s->nbytes() + 1); }},
      {"unknown replicated dim", [](v1::ShardDesc* s) { s->add_replicated_over("pp"); }},
      {"state_key on param", [](v1::ShardDesc* s) { s->set_state_key("exp_avg"); }},
      {"state_absent on param",
       [](v1::ShardDesc* s) {
         s->set_state_absent(true);
         s->set_nbytes(0);
       }},
      {"optimizer without key", [](v1::ShardDesc* s) { s->set_kind(v1::SHARD_KIND_OPTIMIZER); }},
      {"optimizer bad key",
       [](v1::ShardDesc* s) {
         s->set_kind(v1::SHARD_KIND_OPTIMIZER);
         s->set_state_key("a#b");
       }},
      {"absent with key",
       [](v1::ShardDesc* s) {
         s->set_kind(v1::SHARD_KIND_OPTIMIZER);
         s->set_state_key("m");
         s->set_state_absent(true);
         s->set_nbytes(0);
       }},
      {"absent with bytes",
       [](v1::ShardDesc* s) {
         s->set_kind(v1::SHARD_KIND_OPTIMIZER);
         s->set_state_absent(true);
       }},
      {"extra not U8",
       [](v1::ShardDesc* s) {
         *s = Extra("rng", 8);
         s->set_dtype(v1::DTYPE_I8);
       }},
      {"extra 2-d",
       [](v1::ShardDesc* s) {
         *s = Whole("rng", {2, 4}, {}, v1::DTYPE_U8);
         s->set_kind(v1::SHARD_KIND_EXTRA);
       }},
      {"extra partial",
       [](v1::ShardDesc* s) {
         *s = Extra("rng", 8);
         s->mutable_box()->set_lengths(0, 4);
         s->set_nbytes(4);
       }},
      {"extra flat range",
       [](v1::ShardDesc* s) {
         *s = Extra("rng", 8);
         s->mutable_flat_range()->set_end(8);
       }},
  };
  MeshLayout layout = Mesh({{"dp", 2}});
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::vector<LocalPlan> plans = EmptyPlans(layout);
    for (LocalPlan& p : plans)
      p.shards = {Whole("ok", {2}, {"dp"}), OptSlice("w", "m", {4, 8}, 0, 32)};
    plans[1].shards[1] = Whole("w", {4, 8}, {"dp"});
    plans[1].shards[1].mutable_flat_range()->set_begin(0);  // a flat range for the flat-range cases
    plans[1].shards[1].mutable_flat_range()->set_end(32);
    if (c.name.find("flat") == std::string::npos) plans[1].shards[1].clear_flat_range();
    c.mutate(&plans[1].shards[1]);
    v1::ErrorDetail detail = MustFail(layout, plans, v1::ERROR_CODE_MALFORMED_SHARD);
    EXPECT_THAT(Coords(detail), ElementsAre("dp=1"));
    EXPECT_THAT(detail.message(), ::testing::HasSubstr("Shard 1 "));
    EXPECT_TRUE(detail.SerializeAsString().size() > 0);
  }
}

// A plan of 65,536 shards or more is validated, fingerprinted and encoded on several threads
// (one per core): the plan is the one the rules give, and of two malformed shards the error
// names the lower rank's, as one thread finds it first. Ranks 7 and 40 fall to different
// threads on any machine with 2 to 8 cores that run the pass.
TEST(Planner, Plan_LargePlanOnSeveralThreads_SamePlanAndFirstErrorByRank) {
  MeshLayout layout = Mesh({{"dp", 64}});
  std::vector<LocalPlan> plans = EmptyPlans(layout);
  for (uint32_t r = 0; r < 64; ++r) {
    plans[r].shards.push_back(Whole("shared", {8}, {"dp"}));  // a replica on every rank
    for (int i = 0; i < 1100; ++i) {
      plans[r].shards.push_back(Whole(absl::StrCat("r", r, ".p", i), {4}));
    }
  }
  GlobalPlan plan = MustPlan(layout, plans);
  ExpectConsistent(layout, plans, plan);
  EXPECT_EQ(plan.fingerprint, FingerprintPlans(layout, plans));

  plans[40].shards[5].set_dtype(static_cast<v1::DType>(999));
  plans[7].shards[900].set_dtype(static_cast<v1::DType>(999));
  v1::ErrorDetail detail = MustFail(layout, plans, v1::ERROR_CODE_MALFORMED_SHARD);
  EXPECT_THAT(Coords(detail), ElementsAre("dp=7"));
  EXPECT_THAT(detail.message(), ::testing::HasSubstr("Shard 900 "));
}

// A plan of 70,000 shards over dp=64 (the threaded passes run from 65,536): every rank holds a
// replica of "shared" and 1,100 tensors of its own; ranks 40-63 hold "late" (a key first met
// far into the ranks) and DP slices of "w"'s optimizer state.
std::vector<LocalPlan> LargePlans(const MeshLayout& layout) {
  std::vector<LocalPlan> plans = EmptyPlans(layout);
  for (uint32_t r = 0; r < 64; ++r) {
    plans[r].shards.push_back(Whole("shared", {8}, {"dp"}));
    for (int i = 0; i < 1100; ++i) {
      plans[r].shards.push_back(Whole(absl::StrCat("r", r, ".p", i), {4}));
    }
    plans[r].shards.push_back(OptSlice("w", "exp_avg", {64, 2}, 2 * r, 2 * r + 2));
    if (r >= 40) plans[r].shards.push_back(Whole("late", {3, 5}, {"dp"}, v1::DTYPE_BF16));
  }
  return plans;
}

// BuildGlobalPlan with PlannerOptions.threads = `threads`: the plan's serialized parts, or
// the error's ErrorDetail, as one string.
std::string PlanOrError(const MeshLayout& layout, const std::vector<LocalPlan>& plans,
                        size_t threads) {
  PlannerOptions options;
  options.threads = threads;
  absl::StatusOr<GlobalPlan> plan = BuildGlobalPlan(layout, plans, options);
  if (!plan.ok()) {
    std::optional<v1::ErrorDetail> detail = GetErrorDetail(plan.status());
    return absl::StrCat("error ", plan.status().ToString(), " ",
                        detail.has_value() ? detail->SerializeAsString() : "");
  }
  std::string out = absl::StrCat("plan ", plan->fingerprint, " ", plan->total_bytes);
  for (const std::string& a : plan->assignments) absl::StrAppend(&out, "|", a);
  for (const v1::TensorEntry& t : plan->tensors) absl::StrAppend(&out, "|", t.SerializeAsString());
  for (size_t r = 0; r < plan->assignments.size(); ++r) {
    absl::StrAppend(&out, "|", plan->bytes_written_by_rank[r], ",", plan->rank_fingerprints[r],
                    ",", plan->staged_bytes_by_rank[r], ",", absl::StrJoin(plan->peers[r], ","));
  }
  return out;
}

// The passes split ranks (validation, grouping by key) and keys (rules 4 and 5) into runs,
// one per thread: the plan, and of several errors the one returned, are the same on 1, 2, 3
// and 8 threads.
TEST(Planner, Plan_LargePlan_SamePlanAndErrorOnAnyThreadCount) {
  MeshLayout layout = Mesh({{"dp", 64}});
  struct Case {
    std::string name;
    std::function<void(std::vector<LocalPlan>*)> mutate;
    v1::ErrorCode expect;  // ERROR_CODE_UNSPECIFIED for a valid plan
  };
  const std::vector<Case> cases = {
      {"valid", [](std::vector<LocalPlan>*) {}, v1::ERROR_CODE_UNSPECIFIED},
      {"malformed on ranks 7 and 40",
       [](std::vector<LocalPlan>* p) {
         (*p)[40].shards[5].set_dtype(static_cast<v1::DType>(999));
         (*p)[7].shards[900].set_dtype(static_cast<v1::DType>(999));
       },
       v1::ERROR_CODE_MALFORMED_SHARD},
      {"a later rank's claim of \"late\" differs from rank 40's",
       [](std::vector<LocalPlan>* p) { (*p)[63].shards.back().set_dtype(v1::DTYPE_F16); },
       v1::ERROR_CODE_SHAPE_MISMATCH},
      {"coverage: \"a.gap\" on the last ranks, \"z.overlap\" on the first",
       [](std::vector<LocalPlan>* p) {
         (*p)[62].shards.push_back(Param("a.gap", {4, 4}, {0, 0}, {2, 4}));
         (*p)[0].shards.push_back(Whole("z.overlap", {4}));
         (*p)[1].shards.push_back(Param("z.overlap", {4}, {2}, {2}));
       },
       v1::ERROR_CODE_INCOMPLETE_COVERAGE},
      {"a slice of \"w\" missing on rank 50",
       [](std::vector<LocalPlan>* p) {
         std::vector<v1::ShardDesc>& shards = (*p)[50].shards;
         shards.erase(shards.end() - 2);
       },
       v1::ERROR_CODE_INCOMPLETE_COVERAGE},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::vector<LocalPlan> plans = LargePlans(layout);
    c.mutate(&plans);
    const std::string one = PlanOrError(layout, plans, 1);
    if (c.expect == v1::ERROR_CODE_UNSPECIFIED) {
      ASSERT_EQ(one.rfind("plan ", 0), 0u) << one.substr(0, 300);
      ExpectConsistent(layout, plans, MustPlan(layout, plans));
    } else {
      ASSERT_EQ(one.rfind("error ", 0), 0u);
      MustFail(layout, plans, c.expect);
    }
    for (size_t threads : {2, 3, 8}) {
      SCOPED_TRACE(absl::StrCat(threads, " threads"));
      EXPECT_TRUE(PlanOrError(layout, plans, threads) == one);
    }
  }
  // Which error: rank 7's shard, rank 40's "late" against rank 63's, "a.gap" (first by name).
  std::vector<LocalPlan> plans = LargePlans(layout);
  plans[40].shards[5].set_dtype(static_cast<v1::DType>(999));
  plans[7].shards[900].set_dtype(static_cast<v1::DType>(999));
  PlannerOptions eight;
  eight.threads = 8;
  EXPECT_THAT(Ranks(MustFail(layout, plans, v1::ERROR_CODE_MALFORMED_SHARD, eight)),
              ElementsAre(7));
  plans = LargePlans(layout);
  plans[63].shards.back().set_dtype(v1::DTYPE_F16);
  EXPECT_THAT(Ranks(MustFail(layout, plans, v1::ERROR_CODE_SHAPE_MISMATCH, eight)),
              ElementsAre(40, 63));
  plans = LargePlans(layout);
  plans[62].shards.push_back(Param("a.gap", {4, 4}, {0, 0}, {2, 4}));
  plans[0].shards.push_back(Whole("z.overlap", {4}));
  plans[1].shards.push_back(Param("z.overlap", {4}, {2}, {2}));
  EXPECT_THAT(MustFail(layout, plans, v1::ERROR_CODE_INCOMPLETE_COVERAGE, eight).fqns(),
              ElementsAre("a.gap"));
}

TEST(Planner, Plan_SamePieceTwiceOnOneRank_Malformed) {
  MeshLayout layout = Mesh({{"dp", 2}});
  std::vector<LocalPlan> plans = EmptyPlans(layout);
  for (LocalPlan& p : plans) p.shards = {Whole("w", {4}, {"dp"})};
  plans[1].shards.push_back(Whole("w", {4}, {"dp"}));
  v1::ErrorDetail detail = MustFail(layout, plans, v1::ERROR_CODE_MALFORMED_SHARD);
  EXPECT_THAT(Coords(detail), ElementsAre("dp=1"));
  EXPECT_THAT(detail.message(), ::testing::HasSubstr("twice"));

  plans[1].shards = {Extra("rng", 4), Extra("rng", 4)};
  plans[0].shards.clear();
  plans[1].shards.push_back(Whole("w", {4}));
  detail = MustFail(layout, plans, v1::ERROR_CODE_MALFORMED_SHARD);
  EXPECT_THAT(detail.message(), ::testing::HasSubstr("twice"));
}

TEST(Planner, Plan_TensorKeyCollision_Malformed) {
  MeshLayout layout = Mesh({{"dp", 4}});
  std::vector<LocalPlan> plans = EmptyPlans(layout);
  plans[3].shards = {Extra("x", 4), Whole("x", {4}), OptBox("x", "rank3", {4}, {0}, {4})};
  v1::ErrorDetail detail = MustFail(layout, plans, v1::ERROR_CODE_MALFORMED_SHARD);
  EXPECT_THAT(detail.message(), ::testing::HasSubstr("x#rank3"));
}

TEST(Planner, Plan_PlansThatDoNotMatchTheMesh_LayoutMismatch) {
  MeshLayout layout = Mesh({{"pp", 2}, {"dp", 2}});
  std::vector<LocalPlan> plans = EmptyPlans(layout);
  plans.pop_back();
  v1::ErrorDetail detail = MustFail(layout, plans, v1::ERROR_CODE_LAYOUT_MISMATCH);
  EXPECT_THAT(Coords(detail), ElementsAre("pp=1,dp=1"));

  plans = EmptyPlans(layout);
  plans[2].rank = 1;
  detail = MustFail(layout, plans, v1::ERROR_CODE_LAYOUT_MISMATCH);
  EXPECT_THAT(Ranks(detail), ElementsAre(1));

  plans = EmptyPlans(layout);
  plans[3].rank = 4;
  detail = MustFail(layout, plans, v1::ERROR_CODE_LAYOUT_MISMATCH);
  EXPECT_THAT(Ranks(detail), ElementsAre(4));
}

TEST(Planner, Plan_OverTheLimits_PlanTooLarge) {
  MeshLayout layout = Mesh({{"dp", 2}});
  std::vector<LocalPlan> plans = EmptyPlans(layout);
  for (LocalPlan& p : plans) {
    for (int i = 0; i < 3; ++i) p.shards.push_back(Whole(absl::StrCat("w", i), {2}, {"dp"}));
  }
  PlannerOptions options;
  options.max_shards_per_rank = 2;
  v1::ErrorDetail detail = MustFail(layout, plans, v1::ERROR_CODE_PLAN_TOO_LARGE, options);
  EXPECT_THAT(Ranks(detail), ElementsAre(0));
  options.max_shards_per_rank = 3;
  options.max_total_shards = 5;
  MustFail(layout, plans, v1::ERROR_CODE_PLAN_TOO_LARGE, options);
  options.max_total_shards = 6;
  EXPECT_TRUE(BuildGlobalPlan(layout, plans, options).ok());
}

// ---------------------------------------------------------------------------------------------
// Odd shapes, extras, output order.

TEST(Planner, Plan_ScalarsEmptyTensorsAndExtras_Accepted) {
  MeshLayout layout = Mesh({{"dp", 2}});
  std::vector<LocalPlan> plans = EmptyPlans(layout);
  for (uint32_t r = 0; r < 2; ++r) {
    plans[r].shards = {Whole("step", {}, {"dp"}, v1::DTYPE_I64), Whole("empty", {0, 4}, {"dp"}),
                       Extra("rng", 16 + r), Extra("loader", 0)};
  }
  GlobalPlan plan = MustPlan(layout, plans);
  ExpectConsistent(layout, plans, plan);
  EXPECT_THAT(TensorKeys(plan), ElementsAre("empty", "loader#rank0", "loader#rank1", "rng#rank0",
                                            "rng#rank1", "step"));
  const v1::TensorEntry* step = FindTensor(plan, "step");
  ASSERT_THAT(step->chunks(), SizeIs(1));
  EXPECT_EQ(step->chunks(0).box().offsets_size(), 0);
  EXPECT_EQ(step->chunks(0).nbytes(), 8u);
  EXPECT_THAT(FindTensor(plan, "empty")->chunks(), IsEmpty());
  EXPECT_THAT(FindTensor(plan, "loader#rank1")->chunks(), IsEmpty());
  const v1::TensorEntry* rng1 = FindTensor(plan, "rng#rank1");
  EXPECT_EQ(rng1->rank(), 1u);
  EXPECT_EQ(rng1->kind(), v1::SHARD_KIND_EXTRA);
  ASSERT_THAT(rng1->chunks(), SizeIs(1));
  EXPECT_EQ(rng1->chunks(0).writer_rank(), 1u);
  EXPECT_EQ(rng1->chunks(0).nbytes(), 17u);
  EXPECT_EQ(plan.total_bytes, 8u + 16 + 17);
}

TEST(Planner, Plan_ScalarClaimedByTwoStages_DuplicateFqn) {
  MeshLayout layout = Mesh({{"pp", 2}});
  std::vector<LocalPlan> plans = EmptyPlans(layout);
  for (LocalPlan& p : plans) p.shards = {Whole("step", {}, {}, v1::DTYPE_I64)};
  MustFail(layout, plans, v1::ERROR_CODE_DUPLICATE_FQN);
}

TEST(Planner, Plan_ChunksSortedByBox_WithinEachTensor) {
  MeshLayout layout = Mesh({{"tp", 4}});
  std::vector<LocalPlan> plans = EmptyPlans(layout);
  for (uint32_t r = 0; r < 4; ++r) plans[r].shards = {Param("w", {8}, {2 * (3 - r)}, {2})};
  GlobalPlan plan = MustPlan(layout, plans);
  const v1::TensorEntry* w = FindTensor(plan, "w");
  ASSERT_THAT(w->chunks(), SizeIs(4));
  for (int c = 0; c < 4; ++c) {
    EXPECT_EQ(w->chunks(c).box().offsets(0), 2 * c);
    EXPECT_EQ(w->chunks(c).writer_rank(), 3u - c);
  }
}

// ---------------------------------------------------------------------------------------------
// Writer balancing.

TEST(Planner, Plan_ReplicatedChunks_WritersBalanced) {
  MeshLayout layout = Mesh({{"dp", 8}});
  std::vector<LocalPlan> plans = EmptyPlans(layout);
  std::mt19937 rng(7);
  int64_t largest = 0, total = 0;
  for (int t = 0; t < 200; ++t) {
    const int64_t rows = 1 + rng() % 300;
    largest = std::max(largest, rows * 16 * 4);
    total += rows * 16 * 4;
    for (LocalPlan& p : plans) p.shards.push_back(Whole(absl::StrCat("t", t), {rows, 16}, {"dp"}));
  }
  GlobalPlan plan = MustPlan(layout, plans);
  ExpectConsistent(layout, plans, plan);
  const auto [lo, hi] =
      std::minmax_element(plan.bytes_written_by_rank.begin(), plan.bytes_written_by_rank.end());
  // Greedy largest-first onto the least loaded: the spread is at most one chunk.
  EXPECT_LE(*hi - *lo, static_cast<uint64_t>(largest));
  EXPECT_LE(*hi, static_cast<uint64_t>(total / 8 + largest));
  EXPECT_GT(*lo, 0u);
}

TEST(Planner, Plan_ForcedWritersCountedFirst_FlexibleChunksGoElsewhere) {
  MeshLayout layout = Mesh({{"dp", 2}});
  std::vector<LocalPlan> plans = EmptyPlans(layout);
  plans[0].shards = {Extra("big", 1000), Whole("a", {100}, {"dp"}), Whole("b", {100}, {"dp"})};
  plans[1].shards = {Whole("a", {100}, {"dp"}), Whole("b", {100}, {"dp"})};
  GlobalPlan plan = MustPlan(layout, plans);
  EXPECT_EQ(plan.bytes_written_by_rank[0], 1000u);
  EXPECT_EQ(plan.bytes_written_by_rank[1], 800u);
}

// ---------------------------------------------------------------------------------------------
// Fingerprint.

std::vector<LocalPlan> SamplePlans(const MeshLayout& layout) {
  std::vector<LocalPlan> plans = EmptyPlans(layout);
  for (uint32_t r = 0; r < layout.world_size(); ++r) {
    plans[r].shards = {Whole("w", {4, 4}, {"dp"}), OptSlice("w", "m", {4, 4}, 4 * r, 4 * r + 4),
                       Extra("rng", 8)};
  }
  return plans;
}

// The chunk index of a built plan: every chunk, numbered in plan order (what HashItem.chunk
// and ChunkLedger count by); a plan restored from its record gets the same one.
TEST(Planner, ChunkIndex_EveryChunkInPlanOrder_SameAfterFillDerived) {
  MeshLayout layout = Mesh({{"dp", 4}});
  GlobalPlan plan = MustPlan(layout, SamplePlans(layout));
  uint32_t next = 0;
  for (const v1::TensorEntry& t : plan.tensors) {
    for (const v1::ChunkEntry& c : t.chunks()) {
      auto it = plan.chunk_index.find(ChunkId(t.key(), c.box()));
      ASSERT_NE(it, plan.chunk_index.end()) << t.key();
      EXPECT_EQ(it->second, next++) << t.key();
    }
  }
  EXPECT_EQ(plan.chunk_index.size(), next);
  EXPECT_EQ(next, 6u);  // w, m (its slices gathered into one chunk), rng of ranks 0..3

  GlobalPlan restored;
  restored.assignments = plan.assignments;
  restored.tensors = plan.tensors;
  ASSERT_TRUE(FillDerived(&restored).ok());
  EXPECT_EQ(restored.chunk_index, plan.chunk_index);
  EXPECT_EQ(restored.peers, plan.peers);
}

TEST(Planner, ChunkIndex_ChunkListedTwice_DataLossAndNothingFilled) {
  MeshLayout layout = Mesh({{"dp", 4}});
  GlobalPlan plan = MustPlan(layout, SamplePlans(layout));
  plan.chunk_index.clear();
  plan.peers.clear();
  plan.tensors.push_back(plan.tensors[0]);  // a record that lists a tensor twice
  const absl::Status status = FillDerived(&plan);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(status.message()), ::testing::HasSubstr("twice"));
  EXPECT_THAT(plan.chunk_index, IsEmpty());
  EXPECT_THAT(plan.peers, IsEmpty());
}

TEST(Planner, Fingerprint_SameInput_Stable) {
  MeshLayout layout = Mesh({{"dp", 4}});
  std::vector<LocalPlan> plans = SamplePlans(layout);
  const uint64_t fp = FingerprintPlans(layout, plans);
  EXPECT_EQ(FingerprintPlans(layout, SamplePlans(layout)), fp);
  std::reverse(plans.begin(), plans.end());  // plan order does not matter, ranks do
  EXPECT_EQ(FingerprintPlans(layout, plans), fp);
  GlobalPlan plan = MustPlan(layout, plans);
  EXPECT_EQ(plan.fingerprint, fp);
}

TEST(Planner, Fingerprint_AnyChange_Differs) {
  MeshLayout layout = Mesh({{"dp", 4}});
  const uint64_t fp = FingerprintPlans(layout, SamplePlans(layout));
  std::vector<std::function<void(std::vector<LocalPlan>*)>> changes = {
      [](auto* p) { std::swap((*p)[1].shards[0], (*p)[1].shards[1]); },
      [](auto* p) { (*p)[2].shards[0].mutable_box()->set_offsets(0, 1); },
      [](auto* p) { (*p)[2].shards[0].mutable_box()->set_lengths(1, 3); },
      [](auto* p) { (*p)[0].shards[0].set_fqn("v"); },
      [](auto* p) { (*p)[0].shards[0].add_replicated_over("tp"); },
      [](auto* p) { (*p)[0].shards[0].clear_replicated_over(); },
      [](auto* p) { (*p)[3].shards[1].mutable_flat_range()->set_end(15); },
      [](auto* p) { (*p)[3].shards[1].clear_flat_range(); },
      [](auto* p) { (*p)[3].shards[1].set_state_key("v"); },
      [](auto* p) { (*p)[3].shards[1].set_state_absent(true); },
      [](auto* p) { (*p)[3].shards[2].set_nbytes(9); },
      [](auto* p) { (*p)[3].shards[2].set_dtype(v1::DTYPE_I8); },
      [](auto* p) { (*p)[3].shards[2].set_kind(v1::SHARD_KIND_PARAM); },
      [](auto* p) { (*p)[3].shards[0].add_global_shape(1); },
      [](auto* p) { (*p)[3].shards.pop_back(); },
      [](auto* p) { (*p)[0].rank = 7; },
  };
  std::set<uint64_t> seen = {fp};
  for (size_t i = 0; i < changes.size(); ++i) {
    std::vector<LocalPlan> plans = SamplePlans(layout);
    changes[i](&plans);
    EXPECT_TRUE(seen.insert(FingerprintPlans(layout, plans)).second) << "change " << i;
  }
  EXPECT_NE(FingerprintPlans(Mesh({{"dp", 4}, {"tp", 1}}), SamplePlans(layout)), fp);
  EXPECT_NE(FingerprintPlans(Mesh({{"fsdp", 4}}), SamplePlans(layout)), fp);
}

TEST(Planner, Fingerprint_CombinedFromPerRankFingerprints_Equal) {
  MeshLayout layout = Mesh({{"dp", 4}});
  std::vector<LocalPlan> plans = SamplePlans(layout);
  std::vector<uint64_t> per_rank;
  for (const LocalPlan& p : plans) per_rank.push_back(FingerprintLocalPlan(p));
  EXPECT_EQ(CombineFingerprints(layout, per_rank), FingerprintPlans(layout, plans));
  std::swap(per_rank[0], per_rank[1]);
  EXPECT_NE(CombineFingerprints(layout, per_rank), FingerprintPlans(layout, plans));

  // Large enough for the multi-threaded path: the same answer.
  MeshLayout big = Mesh({{"dp", 5}});
  std::vector<LocalPlan> many = EmptyPlans(big);
  for (LocalPlan& p : many) {
    for (int i = 0; i < 14000; ++i) p.shards.push_back(Whole(absl::StrCat("w", i), {2}, {"dp"}));
  }
  per_rank.clear();
  for (const LocalPlan& p : many) per_rank.push_back(FingerprintLocalPlan(p));
  const uint64_t fp = FingerprintPlans(big, many);
  EXPECT_EQ(fp, CombineFingerprints(big, per_rank));
  many[3].shards[777].mutable_box()->set_lengths(0, 1);
  EXPECT_NE(FingerprintPlans(big, many), fp);
}

// ---------------------------------------------------------------------------------------------
// Property test: random meshes and random valid tilings, then one perturbation each.

// `n` split into `parts` consecutive (offset, length) pieces, some possibly empty.
std::vector<std::pair<int64_t, int64_t>> RandomSplit(int64_t n, uint32_t parts, std::mt19937& rng) {
  std::vector<int64_t> cuts = {0, n};
  for (uint32_t i = 1; i < parts; ++i) cuts.push_back(n == 0 ? 0 : rng() % (n + 1));
  std::sort(cuts.begin(), cuts.end());
  std::vector<std::pair<int64_t, int64_t>> out;
  for (uint32_t i = 0; i < parts; ++i) out.emplace_back(cuts[i], cuts[i + 1] - cuts[i]);
  return out;
}

struct RandomJob {
  MeshLayout layout;
  std::vector<LocalPlan> plans;
};

// Mesh pp x dp_replicate x dp_shard x tp. Each tensor lives on one stage (or, tied, on some
// stages with pp in replicated_over); TP splits one axis or replicates; DP replicates over
// dp_replicate and splits (FSDP boxes or distributed-optimizer flat ranges) or replicates over
// dp_shard.
RandomJob MakeRandomJob(std::mt19937& rng) {
  const uint32_t pp = 1 + rng() % 3, rep = 1 + rng() % 2, shard = 1 + rng() % 3, tp = 1 + rng() % 3;
  RandomJob job{Mesh({{"pp", pp}, {"dp_replicate", rep}, {"dp_shard", shard}, {"tp", tp}}), {}};
  job.plans = EmptyPlans(job.layout);
  const int tensors = 1 + rng() % 6;
  for (int t = 0; t < tensors; ++t) {
    const std::string fqn = absl::StrCat("t", t);
    const size_t rank = rng() % 4;
    std::vector<int64_t> shape(rank);
    for (int64_t& d : shape) d = rng() % 10 == 0 ? 0 : 1 + rng() % 7;
    const bool optimizer = rng() % 3 == 0;
    std::vector<uint32_t> stages = {static_cast<uint32_t>(rng() % pp)};
    std::vector<std::string> repl = {"dp_replicate"};
    if (pp > 1 && rng() % 5 == 0) {  // tied across stages
      stages = {0, pp - 1};
      repl.push_back("pp");
    }
    const bool tp_split = rank > 0 && rng() % 2 == 0;
    const size_t tp_axis = rank > 0 ? rng() % rank : 0;
    if (!tp_split) repl.push_back("tp");
    const int dp_mode = rng() % 3;  // 0 replicate, 1 FSDP boxes, 2 flat ranges
    const bool dp_boxes = dp_mode == 1 && rank > 0;
    const bool dp_flat = dp_mode == 2;
    if (!dp_boxes && !dp_flat) repl.push_back("dp_shard");
    const size_t dp_axis = rank > 0 ? rng() % rank : 0;

    Box full = FullBox(shape);
    std::vector<std::pair<int64_t, int64_t>> tp_parts =
        tp_split ? RandomSplit(shape[tp_axis], tp, rng)
                 : std::vector<std::pair<int64_t, int64_t>>();
    std::vector<std::vector<std::pair<int64_t, int64_t>>> dp_parts(tp);
    for (uint32_t t_i = 0; t_i < tp; ++t_i) {
      if (!tp_split && t_i > 0) {  // TP replicas split alike
        dp_parts[t_i] = dp_parts[0];
        continue;
      }
      Box tbox = full;
      if (tp_split)
        tbox.offsets[tp_axis] = tp_parts[t_i].first, tbox.lengths[tp_axis] = tp_parts[t_i].second;
      if (dp_boxes) dp_parts[t_i] = RandomSplit(tbox.lengths[dp_axis], shard, rng);
      if (dp_flat) dp_parts[t_i] = RandomSplit(Elements(tbox.lengths), shard, rng);
    }
    for (uint32_t stage : stages) {
      for (uint32_t r_i = 0; r_i < rep; ++r_i) {
        for (uint32_t s_i = 0; s_i < shard; ++s_i) {
          for (uint32_t t_i = 0; t_i < tp; ++t_i) {
            Box box = full;
            if (tp_split)
              box.offsets[tp_axis] = tp_parts[t_i].first,
              box.lengths[tp_axis] = tp_parts[t_i].second;
            if (dp_boxes) {
              box.offsets[dp_axis] += dp_parts[t_i][s_i].first;
              box.lengths[dp_axis] = dp_parts[t_i][s_i].second;
            }
            v1::ShardDesc s = Param(fqn, shape, box.offsets, box.lengths, repl);
            if (optimizer) {
              s.set_kind(v1::SHARD_KIND_OPTIMIZER);
              s.set_state_key("exp_avg");
            }
            if (dp_flat) {
              s.mutable_flat_range()->set_begin(dp_parts[t_i][s_i].first);
              s.mutable_flat_range()->set_end(dp_parts[t_i][s_i].first + dp_parts[t_i][s_i].second);
              s.set_nbytes(dp_parts[t_i][s_i].second * 4);
            }
            job.plans[RankOf(job.layout, {stage, r_i, s_i, t_i})].shards.push_back(s);
          }
        }
      }
    }
  }
  for (LocalPlan& p : job.plans) {  // submission order is arbitrary
    std::shuffle(p.shards.begin(), p.shards.end(), rng);
    if (rng() % 4 == 0) p.shards.push_back(Extra("rng", rng() % 16));
  }
  return job;
}

struct PieceRef {
  uint32_t plan;
  size_t shard;
};

// Non-empty pieces no other rank holds identically.
std::vector<PieceRef> SolePieces(const RandomJob& job) {
  std::map<std::string, int> count;
  auto id = [](const v1::ShardDesc& s) {
    return absl::StrCat(s.fqn(), "|", s.kind(), "|", s.box().ShortDebugString(), "|",
                        s.flat_range().ShortDebugString(), "|", s.has_flat_range());
  };
  for (const LocalPlan& p : job.plans) {
    for (const v1::ShardDesc& s : p.shards) ++count[id(s)];
  }
  std::vector<PieceRef> out;
  for (uint32_t i = 0; i < job.plans.size(); ++i) {
    for (size_t j = 0; j < job.plans[i].shards.size(); ++j) {
      const v1::ShardDesc& s = job.plans[i].shards[j];
      if (s.nbytes() > 0 && s.kind() != v1::SHARD_KIND_EXTRA && count[id(s)] == 1)
        out.push_back({i, j});
    }
  }
  return out;
}

TEST(Planner, Plan_RandomValidLayouts_AcceptedAndEachByteWrittenOnce) {
  std::mt19937 rng(12345);
  std::map<v1::ErrorCode, int> perturbed;
  for (int iter = 0; iter < 300; ++iter) {
    SCOPED_TRACE(absl::StrCat("iteration ", iter));
    RandomJob job = MakeRandomJob(rng);
    absl::StatusOr<GlobalPlan> plan = BuildGlobalPlan(job.layout, job.plans);
    ASSERT_TRUE(plan.ok()) << plan.status();
    ExpectConsistent(job.layout, job.plans, *plan);
    if (HasFailure()) return;

    // 1. Drop a piece nobody else holds: a hole.
    std::vector<PieceRef> sole = SolePieces(job);
    const PieceRef victim = sole.empty() ? PieceRef{0, 0} : sole[rng() % sole.size()];
    int others = 0;  // pieces of the victim's tensor elsewhere: keep the tensor known
    for (const LocalPlan& p : job.plans) {
      for (const v1::ShardDesc& o : p.shards) {
        others += !sole.empty() && o.fqn() == job.plans[victim.plan].shards[victim.shard].fqn() &&
                  o.kind() == job.plans[victim.plan].shards[victim.shard].kind();
      }
    }
    if (others >= 2) {
      RandomJob bad = job;
      bad.plans[victim.plan].shards.erase(bad.plans[victim.plan].shards.begin() + victim.shard);
      MustFail(bad.layout, bad.plans, v1::ERROR_CODE_INCOMPLETE_COVERAGE);
      ++perturbed[v1::ERROR_CODE_INCOMPLETE_COVERAGE];
    }
    // 2. Grow a whole-box piece by one element along an axis: it overlaps a neighbour.
    for (const PieceRef& ref : sole) {
      const v1::ShardDesc& s = job.plans[ref.plan].shards[ref.shard];
      if (s.has_flat_range()) continue;
      int axis = -1;
      for (int d = 0; d < s.global_shape_size(); ++d) {
        if (s.box().lengths(d) < s.global_shape(d)) axis = d;
      }
      if (axis < 0) continue;
      RandomJob bad = job;
      v1::ShardDesc& g = bad.plans[ref.plan].shards[ref.shard];
      if (g.box().offsets(axis) + g.box().lengths(axis) == g.global_shape(axis)) {
        g.mutable_box()->set_offsets(axis, g.box().offsets(axis) - 1);
      }
      g.mutable_box()->set_lengths(axis, g.box().lengths(axis) + 1);
      g.set_nbytes(Elements({g.box().lengths().begin(), g.box().lengths().end()}) * 4);
      MustFail(bad.layout, bad.plans, v1::ERROR_CODE_OVERLAPPING_SHARDS);
      ++perturbed[v1::ERROR_CODE_OVERLAPPING_SHARDS];
      break;
    }
    // 3. The torchtitan bug: a piece also claimed, under the same name, by another stage.
    const uint32_t pp = job.layout.degree(0);
    for (const PieceRef& ref : sole) {
      const v1::ShardDesc& s = job.plans[ref.plan].shards[ref.shard];
      if (pp < 2 || std::count(s.replicated_over().begin(), s.replicated_over().end(), "pp"))
        continue;
      RandomJob bad = job;
      std::vector<uint32_t> coords = job.layout.Coords(job.plans[ref.plan].rank);
      coords[0] = (coords[0] + 1) % pp;
      bad.plans[RankOf(job.layout, coords)].shards.push_back(s);
      MustFail(bad.layout, bad.plans, v1::ERROR_CODE_DUPLICATE_FQN);
      ++perturbed[v1::ERROR_CODE_DUPLICATE_FQN];
      break;
    }
    // 4. One claim of a shared tensor with another dtype of the same size.
    for (uint32_t i = 0; i < job.plans.size(); ++i) {
      bool done = false;
      for (size_t j = 0; j < job.plans[i].shards.size() && !done; ++j) {
        const v1::ShardDesc& s = job.plans[i].shards[j];
        if (s.kind() == v1::SHARD_KIND_EXTRA) continue;
        int claims = 0;
        for (const LocalPlan& p : job.plans) {
          for (const v1::ShardDesc& o : p.shards)
            claims += o.fqn() == s.fqn() && o.kind() == s.kind();
        }
        if (claims < 2) continue;
        RandomJob bad = job;
        bad.plans[i].shards[j].set_dtype(v1::DTYPE_I32);
        MustFail(bad.layout, bad.plans, v1::ERROR_CODE_SHAPE_MISMATCH);
        ++perturbed[v1::ERROR_CODE_SHAPE_MISMATCH];
        done = true;
      }
      if (done) break;
    }
    // 5. One rank's optimizer state declared absent while others have it.
    for (uint32_t i = 0; i < job.plans.size(); ++i) {
      bool done = false;
      for (size_t j = 0; j < job.plans[i].shards.size() && !done; ++j) {
        const v1::ShardDesc& s = job.plans[i].shards[j];
        if (s.kind() != v1::SHARD_KIND_OPTIMIZER) continue;
        std::set<uint32_t> ranks;
        for (const LocalPlan& p : job.plans) {
          for (const v1::ShardDesc& o : p.shards) {
            if (o.fqn() == s.fqn() && o.kind() == s.kind()) ranks.insert(p.rank);
          }
        }
        if (ranks.size() < 2) continue;
        RandomJob bad = job;
        for (v1::ShardDesc& o : bad.plans[i].shards) {
          if (o.fqn() != s.fqn()) continue;
          o.clear_state_key();
          o.set_state_absent(true);
          o.set_nbytes(0);
        }
        MustFail(bad.layout, bad.plans, v1::ERROR_CODE_OPTIMIZER_STATE_MISMATCH);
        ++perturbed[v1::ERROR_CODE_OPTIMIZER_STATE_MISMATCH];
        done = true;
      }
      if (done) break;
    }
    if (HasFailure()) return;
  }
  // Every perturbation was exercised many times.
  for (v1::ErrorCode code : {v1::ERROR_CODE_INCOMPLETE_COVERAGE, v1::ERROR_CODE_OVERLAPPING_SHARDS,
                             v1::ERROR_CODE_DUPLICATE_FQN, v1::ERROR_CODE_SHAPE_MISMATCH,
                             v1::ERROR_CODE_OPTIMIZER_STATE_MISMATCH}) {
    EXPECT_GE(perturbed[code], 20) << ErrorCodeName(code);
  }
}

// Bug 6 of issue 11: the planner summed chunk bytes without overflow checks, so a plan whose
// total exceeds 2^64 bytes was accepted with a wrapped total that the manifest validator then
// refused. Eight 2^61-byte tensors total 2^64 bytes.
TEST(Planner, Regression_TotalBytesOverflow_PlanTooLarge) {
  MeshLayout layout = Mesh({{"dp", 1}});
  std::vector<LocalPlan> plans = EmptyPlans(layout);
  for (int i = 0; i < 8; ++i) {
    plans[0].shards.push_back(Whole(absl::StrCat("huge.", i), {int64_t{1} << 59}));
  }
  v1::ErrorDetail detail = MustFail(layout, plans, v1::ERROR_CODE_PLAN_TOO_LARGE);
  EXPECT_THAT(detail.message(), ::testing::HasSubstr("bytes"));
}

}  // namespace
}  // namespace tessera
