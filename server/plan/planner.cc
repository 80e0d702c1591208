// BuildGlobalPlan: rule 0 on the local plans as submitted, then the Planner's passes in order
// (Planner::Run); and what a GlobalPlan derives from itself: its parsed assignments, its peers
// and chunk index (FillDerived), ChunkId and DataFileName.
#include "server/plan/planner.h"

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/box.h"
#include "common/status.h"
#include "common/tensor_key.h"
#include "common/threads.h"
#include "server/plan/parallel_runs.h"
#include "server/plan/plan_wire.h"
#include "server/plan/planner_internal.h"
#include "tessera/v1/coordinator.pb.h"

namespace tessera {
namespace plan_internal {

absl::StatusOr<GlobalPlan> Planner::Run() {
  RETURN_IF_ERROR(CollectPieces());
  RETURN_IF_ERROR(NameKeys());
  RETURN_IF_ERROR(CheckShapes());
  RETURN_IF_ERROR(CheckOptimizerState());
  RETURN_IF_ERROR(BuildChunks());
  RETURN_IF_ERROR(CheckTotalBytes());
  AssignWriters();
  return Emit();
}

}  // namespace plan_internal

using plan_internal::PassThreads;
using plan_internal::PlanError;
using plan_internal::Planner;
using plan_internal::RankName;

absl::StatusOr<v1::RankAssignment> GlobalPlan::Assignment(uint32_t rank) const {
  if (rank >= assignments.size()) {
    return absl::OutOfRangeError(
        absl::StrCat("rank ", rank, " is not in a plan of ", assignments.size(), " ranks"));
  }
  v1::RankAssignment assignment;
  if (!assignment.ParseFromString(assignments[rank])) {
    return absl::DataLossError(absl::StrCat("the assignment of rank ", rank, " does not parse"));
  }
  return assignment;
}

std::string DataFileName(uint32_t rank) { return absl::StrFormat("data-%05u.safetensors", rank); }

namespace {

// plan->peers from plan->assignments.
absl::Status FillPeers(GlobalPlan* plan) {
  const uint32_t world = static_cast<uint32_t>(plan->assignments.size());
  size_t bytes = 0;
  for (const std::string& a : plan->assignments) bytes += a.size();
  // A pass over every item, like a pass over every shard: a rank's is independent.
  const size_t threads = PassThreads(bytes / 16);
  std::vector<std::vector<uint32_t>> peers(world);
  std::vector<std::optional<uint32_t>> corrupt(threads);  // the first bad rank of each thread
  RunOnThreads(threads, [&](size_t t) {
    for (uint32_t r = static_cast<uint32_t>(t); r < world; r += static_cast<uint32_t>(threads)) {
      absl::StatusOr<std::vector<uint32_t>> mine = AssignmentPeers(plan->assignments[r], r);
      if (!mine.ok()) {
        corrupt[t] = r;
        return;
      }
      peers[r] = *std::move(mine);
    }
  });
  std::optional<uint32_t> bad;
  for (const std::optional<uint32_t>& r : corrupt) {
    if (r.has_value() && (!bad.has_value() || *r < *bad)) bad = r;
  }
  if (bad.has_value()) {
    plan->peers.clear();
    return absl::DataLossError(absl::StrCat("the assignment of rank ", *bad, " does not parse"));
  }
  plan->peers = std::move(peers);
  return absl::OkStatus();
}

// plan->chunk_index from plan->tensors.
absl::Status IndexChunks(GlobalPlan* plan) {
  absl::flat_hash_map<std::string, uint32_t> index;
  size_t chunks = 0;
  for (const v1::TensorEntry& t : plan->tensors) chunks += t.chunks_size();
  index.reserve(chunks);
  uint32_t next = 0;
  for (const v1::TensorEntry& t : plan->tensors) {
    for (const v1::ChunkEntry& c : t.chunks()) {
      if (!index.emplace(ChunkId(t.key(), c.box()), next++).second) {
        return absl::DataLossError(absl::StrCat("the plan lists chunk ",
                                                ChunkName(t.key(), BoxFromProto(c.box())),
                                                " twice"));
      }
    }
  }
  plan->chunk_index = std::move(index);
  return absl::OkStatus();
}

}  // namespace

std::string ChunkId(absl::string_view key, const v1::Box& box) {
  return ChunkName(key, BoxFromProto(box)) + "|" + absl::StrJoin(box.lengths(), ",");
}

absl::Status FillDerived(GlobalPlan* plan) {
  absl::Status status = FillPeers(plan);
  if (status.ok()) status = IndexChunks(plan);
  if (!status.ok()) {
    plan->peers.clear();
    plan->chunk_index.clear();
  }
  return status;
}

absl::StatusOr<GlobalPlan> BuildGlobalPlan(const MeshLayout& layout,
                                           const std::vector<LocalPlan>& plans,
                                           const PlannerOptions& options) {
  const uint32_t world = layout.world_size();
  std::vector<const LocalPlan*> by_rank(world, nullptr);
  size_t total = 0;
  for (const LocalPlan& plan : plans) {
    if (plan.rank >= world) {
      return PlanError(layout, v1::ERROR_CODE_LAYOUT_MISMATCH)
          .Rank(plan.rank)
          .Build(absl::StrCat("A local plan comes from rank ", plan.rank, " but the mesh has ",
                              world, " ranks; every rank must run with the job's layout."));
    }
    if (by_rank[plan.rank] != nullptr) {
      return PlanError(layout, v1::ERROR_CODE_LAYOUT_MISMATCH)
          .Rank(plan.rank)
          .Build(absl::StrCat(RankName(layout, plan.rank),
                              " submitted two local plans; each rank submits exactly one."));
    }
    by_rank[plan.rank] = &plan;
    if (plan.shards.size() > options.max_shards_per_rank) {
      return PlanError(layout, v1::ERROR_CODE_PLAN_TOO_LARGE)
          .Rank(plan.rank)
          .Build(absl::StrCat(RankName(layout, plan.rank), " submitted ", plan.shards.size(),
                              " shards, over the limit of ", options.max_shards_per_rank,
                              " per rank; merge small tensors or raise the limit."));
    }
    total += plan.shards.size();
  }
  if (total > options.max_total_shards) {
    return PlanError(layout, v1::ERROR_CODE_PLAN_TOO_LARGE)
        .Build(absl::StrCat("The job's plans hold ", total, " shards, over the limit of ",
                            options.max_total_shards,
                            " per plan; merge small tensors or raise the limit."));
  }
  for (uint32_t rank = 0; rank < world; ++rank) {
    if (by_rank[rank] == nullptr) {
      return PlanError(layout, v1::ERROR_CODE_LAYOUT_MISMATCH)
          .Rank(rank)
          .Build(absl::StrCat("No local plan from ", RankName(layout, rank),
                              "; every rank of the mesh must submit one."));
    }
  }
  Planner planner(layout, std::move(by_rank), total, options.threads);
  absl::StatusOr<GlobalPlan> plan = planner.Run();
  if (plan.ok()) {
    if (absl::Status derived = FillDerived(&*plan); !derived.ok()) {
      return absl::InternalError(
          absl::StrCat("the planner produced a plan that cannot be read back: ",
                       derived.message()));
    }
  }
  return plan;
}

}  // namespace tessera
