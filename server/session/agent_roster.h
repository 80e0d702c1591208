// AgentRoster: what a job's session core knows of its agents — one verdict per rank
// (server/agent_liveness.h), changed only by the events its shell hands it
// (JobCore::AgentsChanged, from AgentRegistry::Liveness). The core never asks the registry: no
// lock, no clock, no second "now" beside the event's (DESIGN.md "Liveness").
//
// Thread-safety: none; it belongs to its JobCore.
#ifndef TESSERA_SERVER_SESSION_AGENT_ROSTER_H_
#define TESSERA_SERVER_SESSION_AGENT_ROSTER_H_

#include <cstdint>
#include <vector>

#include "server/agent_liveness.h"

namespace tessera {

class AgentRoster {
 public:
  // Takes `verdicts` (any ranks, any order). Returns the ranks whose agent restarted: a
  // verdict names another incarnation than the one this roster knew (not 0), ascending.
  std::vector<uint32_t> Apply(const std::vector<AgentLiveness>& verdicts);

  // The verdict on `rank`; kAbsent (not gone) for a rank never heard of.
  const AgentLiveness& operator[](uint32_t rank) const;

  // Whether ranks 0 .. world - 1 all have a registration saying `field` (e.g.
  // &AgentLiveness::copies_when_pinned), live or not.
  bool EveryRegistered(uint32_t world, bool AgentLiveness::*field) const;

  // Ranks below `world` whose agent is lost (AgentLiveness::State::kLost), ascending.
  std::vector<uint32_t> Lost(uint32_t world) const;

 private:
  std::vector<AgentLiveness> ranks_;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_SESSION_AGENT_ROSTER_H_
