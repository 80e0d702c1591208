#include "server/relay.h"

#include <algorithm>
#include <utility>

#include "absl/strings/string_view.h"
#include "common/relayable.h"

namespace tessera {

bool Relayable(const Outgoing& command) {
  return command.pin_plan == nullptr && RelayableCommand(command.command) &&
         command.command.relay_to().empty();
}

size_t FoldRelays(std::vector<Outgoing>& commands, absl::Span<const RelayPeer> peers) {
  // (node, command bytes but seq) -> index of the group's relay in `commands`.
  absl::flat_hash_map<std::pair<absl::string_view, std::string>, size_t> relays;
  std::vector<bool> folded(commands.size(), false);
  size_t folded_count = 0;
  for (size_t i = 0; i < commands.size(); ++i) {
    Outgoing& o = commands[i];
    if (o.rank >= peers.size() || !peers[o.rank].relays || !Relayable(o)) continue;
    const RelayPeer& peer = peers[o.rank];
    // Every command has a seq of its own (commands emitted are counted): equal but for it.
    // Its bytes without it, taken in place rather than from a copy of the command.
    const uint64_t seq = o.command.seq();
    o.command.clear_seq();
    std::string unsequenced = o.command.SerializeAsString();
    o.command.set_seq(seq);
    auto [group, first] =
        relays.try_emplace({absl::string_view(peer.node_id), std::move(unsequenced)}, i);
    if (first) continue;
    v1::Command& relay = commands[group->second].command;
    if (static_cast<size_t>(relay.relay_to_size()) >= kMaxRelayTargets) {
      group->second = i;  // this one relays the next of the node
      continue;
    }
    v1::RelayTarget* target = relay.add_relay_to();
    target->set_rank(o.rank);
    target->set_incarnation(peer.incarnation);
    target->set_peer_address(peer.peer_address);
    target->set_seq(o.command.seq());
    folded[i] = true;
    ++folded_count;
  }
  if (folded_count == 0) return 0;
  size_t kept = 0;
  for (size_t i = 0; i < commands.size(); ++i) {
    if (folded[i]) continue;
    if (kept != i) commands[kept] = std::move(commands[i]);
    ++kept;
  }
  commands.resize(kept);
  return folded_count;
}

size_t RelayFanOut(const AgentRegistry& registry, const std::string& job_id, size_t relay_from,
                   std::vector<Outgoing>& commands) {
  if (relay_from == 0 || commands.size() < relay_from ||
      std::none_of(commands.begin(), commands.end(), Relayable)) {
    return 0;
  }
  uint32_t world = 0;
  for (const Outgoing& o : commands) world = std::max(world, o.rank + 1);
  return FoldRelays(commands, registry.RelayPeers(job_id, world));
}

void RelayedCommands::Record(const std::vector<Outgoing>& commands) {
  relays_.clear();
  for (const Outgoing& o : commands) {
    if (!o.command.relay_to().empty()) relays_[o.rank] = o.command;
  }
}

v1::Command RelayedCommands::Replay(uint32_t rank, v1::Command current) const {
  auto it = relays_.find(rank);
  if (it != relays_.end() && it->second.session_id() == current.session_id() &&
      it->second.seq() == current.seq()) {
    *current.mutable_relay_to() = it->second.relay_to();
  }
  return current;
}

}  // namespace tessera
