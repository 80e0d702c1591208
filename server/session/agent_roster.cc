#include "server/session/agent_roster.h"

#include <algorithm>

namespace tessera {

std::vector<uint32_t> AgentRoster::Apply(const std::vector<AgentLiveness>& verdicts) {
  std::vector<uint32_t> restarted;
  for (const AgentLiveness& verdict : verdicts) {
    if (verdict.rank >= ranks_.size()) {
      const size_t from = ranks_.size();
      ranks_.resize(verdict.rank + 1);
      for (size_t r = from; r < ranks_.size(); ++r) ranks_[r].rank = static_cast<uint32_t>(r);
    }
    AgentLiveness& known = ranks_[verdict.rank];
    if (known.incarnation != 0 && verdict.incarnation != 0 &&
        known.incarnation != verdict.incarnation) {
      restarted.push_back(verdict.rank);
    }
    known = verdict;
  }
  std::sort(restarted.begin(), restarted.end());
  return restarted;
}

const AgentLiveness& AgentRoster::operator[](uint32_t rank) const {
  static const AgentLiveness* const kUnknown = new AgentLiveness();
  return rank < ranks_.size() ? ranks_[rank] : *kUnknown;
}

bool AgentRoster::EveryRegistered(uint32_t world, bool AgentLiveness::*field) const {
  for (uint32_t r = 0; r < world; ++r) {
    const AgentLiveness& agent = (*this)[r];
    if (agent.incarnation == 0 || !(agent.*field)) return false;
  }
  return world > 0;
}

std::vector<uint32_t> AgentRoster::Lost(uint32_t world) const {
  std::vector<uint32_t> lost;
  for (uint32_t r = 0; r < world && r < ranks_.size(); ++r) {
    if (ranks_[r].state == AgentLiveness::State::kLost) lost.push_back(r);
  }
  return lost;
}

}  // namespace tessera
