// Planning a session, off the job's lock: the job's cached plan if the local plans are
// unchanged, else the planner (server/plan/planner.h); then host-RAM admission. The shell runs it
// for a PlanWork (effects.h) and feeds the verdict to JobCore::PlanDecided.
//
// Thread-safety: free functions. DecidePlan reads the registry and the plan cache, both
// thread-safe; the work item is its own.
#ifndef TESSERA_SERVER_SESSION_PLAN_WORK_H_
#define TESSERA_SERVER_SESSION_PLAN_WORK_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "server/agent_registry.h"
#include "server/plan/plan_cache.h"
#include "server/plan/planner.h"
#include "server/session/effects.h"

namespace tessera {

// Host-RAM admission: the staging every rank of a node pins (its shards,
// plan.staged_bytes_by_rank, plus the chunks it gathers and writes as a DP leader) must fit
// the node's budget. `nodes[rank]` says where each rank stages (AgentRegistry::NodeBudgets).
// Errors: ResourceExhausted + ADMISSION_DENIED naming the node, its need and its budget.
absl::Status CheckAdmission(const GlobalPlan& plan, const std::vector<NodeBudget>& nodes);

// Runs `work`: the cached plan of the job if its fingerprint matches; else, if some rank sent
// only its fingerprint, the verdict names the missing ranks and gives the plans back; else
// BuildGlobalPlan (a validated plan is cached). Then CheckAdmission with the registry's
// nodes. Gives work.plans back in the verdict when ranks are missing; otherwise leaves them in
// `work` for the caller to free where it does not delay the save (a million shard messages
// take a fifth of a second to free: the shell frees them on a pool thread). Errors (in the
// verdict): the planner's InvalidArgument details; ADMISSION_DENIED.
PlanVerdict DecidePlan(PlanWork& work, PlanCache& cache, const AgentRegistry& registry,
                       const PlannerOptions& options);

}  // namespace tessera

#endif  // TESSERA_SERVER_SESSION_PLAN_WORK_H_
