#include "server/session/plan_work.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/plan_fingerprint.h"
#include "common/status.h"

namespace tessera {

absl::Status CheckAdmission(const GlobalPlan& plan, const std::vector<NodeBudget>& nodes) {
  struct Need {
    uint64_t bytes = 0;
    uint64_t budget = 0;
  };
  absl::flat_hash_map<std::string, Need> by_node;
  std::vector<std::string> order;  // first appearance, so the error is deterministic
  const std::vector<uint64_t>& staged_bytes = plan.staged_bytes_by_rank;
  for (uint32_t r = 0; r < nodes.size() && r < staged_bytes.size(); ++r) {
    if (r >= plan.bytes_written_by_rank.size()) break;
    auto [it, inserted] = by_node.try_emplace(nodes[r].node_id);
    if (inserted) order.push_back(nodes[r].node_id);
    it->second.bytes += staged_bytes[r] + plan.bytes_written_by_rank[r];
    it->second.budget = std::max(it->second.budget, nodes[r].budget);
  }
  for (const std::string& node : order) {
    const Need& need = by_node[node];
    if (need.budget != 0 && need.bytes > need.budget) {
      return MakeError(absl::StatusCode::kResourceExhausted, v1::ERROR_CODE_ADMISSION_DENIED,
                       absl::StrCat("node ", node, " would pin ", need.bytes,
                                    " bytes of staging for this save; its budget is ",
                                    need.budget, " bytes"));
    }
  }
  return absl::OkStatus();
}

PlanVerdict DecidePlan(PlanWork& work, PlanCache& cache, const AgentRegistry& registry,
                       const PlannerOptions& options) {
  PlanVerdict verdict;
  const uint64_t fingerprint = CombineFingerprints(work.layout, work.fingerprints);
  std::shared_ptr<const GlobalPlan> plan = cache.Lookup(work.job_id, fingerprint);
  verdict.cached = plan != nullptr;
  if (plan == nullptr && work.plans.size() < work.fingerprints.size()) {
    std::vector<bool> sent(work.fingerprints.size(), false);
    for (const LocalPlan& p : work.plans) {
      if (p.rank < sent.size()) sent[p.rank] = true;
    }
    for (uint32_t r = 0; r < sent.size(); ++r) {
      if (!sent[r]) verdict.missing.push_back(r);
    }
    verdict.plans = std::move(work.plans);
    verdict.plan = std::shared_ptr<const GlobalPlan>();
    return verdict;
  }
  if (plan == nullptr) {
    const absl::Time start = absl::Now();
    size_t pieces = 0;
    for (const LocalPlan& p : work.plans) pieces += p.shards.size();
    absl::StatusOr<GlobalPlan> built = BuildGlobalPlan(work.layout, work.plans, options);
    LogInfo("plan of job ", work.job_id, " built in ",
            absl::FormatDuration(absl::Now() - start), " (", pieces, " pieces from ",
            work.plans.size(), " ranks)", built.ok() ? "" : ": rejected");
    if (!built.ok()) {
      verdict.plan = built.status();
      return verdict;
    }
    plan = std::make_shared<const GlobalPlan>(*std::move(built));
    cache.Insert(work.job_id, plan);
  }
  const std::vector<NodeBudget> nodes = registry.NodeBudgets(work.job_id,
                                                             work.layout.world_size());
  if (absl::Status admitted = CheckAdmission(*plan, nodes); !admitted.ok()) {
    verdict.plan = admitted;
    return verdict;
  }
  verdict.plan = std::move(plan);
  return verdict;
}

}  // namespace tessera
