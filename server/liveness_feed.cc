#include "server/liveness_feed.h"

#include <algorithm>
#include <optional>
#include <vector>

namespace tessera {

std::optional<Effects> LivenessFeed::Feed(AgentRegistry& registry, JobCore& core,
                                          bool judge_leases, absl::Time now) {
  uint32_t world = core.world();
  if (std::optional<MeshLayout> layout = registry.JobLayout(core.job_id())) {
    world = std::max(world, layout->world_size());
  }
  std::vector<AgentLiveness> changed =
      registry.Liveness(core.job_id(), world, &since_, judge_leases);
  if (changed.empty()) return std::nullopt;
  return core.AgentsChanged(changed, now);
}

}  // namespace tessera
