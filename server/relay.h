// Relayed PINs: a command that is the same for several agents of one node goes to one of them,
// which passes it on (DESIGN.md "Relayed PINs").
//
// A cached save's PIN carries no assignment: it is the same message for every rank but its
// seq. At thousands of ranks writing it to every agent's stream is most of a cached save's
// time (hand_out.h), so the coordinator writes it once per node instead: to the node's first
// rank in the fan-out (the relay), with Command.relay_to naming the node's other ranks, which
// the relay's agent reaches at their Peer ports (peer.proto CommandRelay). Ranks the relay
// cannot reach it reports (Coordinator.RelayFailed) and the coordinator sends them their
// current command itself. A relay whose stream reconnects is replayed its command with the
// relay_to it was written with (RelayedCommands), so it passes it on again.
//
// Pure: no I/O, no locks. The shells (SessionManager, and the tests' SyncSessions) ask
// AgentRegistry::RelayPeers for the agents, fold a fan-out before handing it out (hand_out.h)
// and keep what they folded for replays.
#ifndef TESSERA_SERVER_RELAY_H_
#define TESSERA_SERVER_RELAY_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"
#include "server/agent_registry.h"
#include "server/session/effects.h"

namespace tessera {

// A relay passes a command on to at most this many agents; more of one node (a node id that
// many hosts share by mistake, e.g. one container hostname) make several relays.
inline constexpr size_t kMaxRelayTargets = 64;

// Whether `command` may be relayed: common/relayable.h RelayableCommand, with no assignment
// still to be attached (pin_plan) and not relayed already.
bool Relayable(const Outgoing& command);

// Folds the relayable commands of `commands` by node: those to ranks whose peers[rank] relays,
// grouped by node_id and by the command's bytes but for its seq, go to the group's first rank
// in `commands` alone, whose command gets relay_to naming the others (rank, incarnation,
// peer_address, seq) in the order they came, at most kMaxRelayTargets (the next one starts a
// new group); the others are removed. Groups of one, commands that are not relayable and
// ranks that do not relay (or are not in `peers`) are left as they are, and the remaining
// commands keep their order. Returns how many commands were folded away.
size_t FoldRelays(std::vector<Outgoing>& commands, absl::Span<const RelayPeer> peers);

// What both shells do with a fan-out before handing it out: if there are at least
// `relay_from` commands (SessionOptions.relay_from; 0: never) and one is relayable,
// FoldRelays them over `registry`'s RelayPeers of `job_id`. Returns how many were folded away.
size_t RelayFanOut(const AgentRegistry& registry, const std::string& job_id, size_t relay_from,
                   std::vector<Outgoing>& commands);

// The relays' commands of a job's last folded fan-out, for replay: a relay whose command
// stream reconnects is sent its current command (JobCore::CurrentCommand, which is its own
// PIN as emitted), and that command must name its targets again, or their PINs are lost with
// the stream that broke. Not thread-safe: the shell guards it with the job's lock.
class RelayedCommands {
 public:
  // Keeps the relays' commands among `commands` (those with relay_to), replacing what was
  // kept. The shells call it for a fan-out RelayFanOut folded something of; the others'
  // commands are no relay's, and what was kept stays until the next fold (Replay matches
  // session and seq, so what is kept never names targets for another command).
  void Record(const std::vector<Outgoing>& commands);

  // `current` with the relay_to it was written with, if `rank` relayed it (the same session
  // and seq); else `current` as it is.
  v1::Command Replay(uint32_t rank, v1::Command current) const;

 private:
  absl::flat_hash_map<uint32_t, v1::Command> relays_;  // by relay rank
};

}  // namespace tessera

#endif  // TESSERA_SERVER_RELAY_H_
