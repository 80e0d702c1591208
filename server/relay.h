// Relayed PINs: a command that is the same for several agents of one node goes to one of them,
// which passes it on (DESIGN.md "Relayed PINs").
//
// A cached save's PIN carries no assignment: it is the same message for every rank. At
// thousands of ranks writing it to every agent's stream is most of a cached save's time
// (hand_out.h), so the coordinator writes it once per node instead: to the node's first rank
// in the fan-out (the relay), with Command.relay_to naming the node's other ranks, which the
// relay's agent reaches over its node's loopback (peer.proto CommandRelay). Ranks the relay
// cannot reach it reports (Coordinator.RelayFailed) and the coordinator sends them their
// current command itself; a relay that is lost is an agent lost, which the session's
// deadline and lease rules already end.
//
// Pure: no I/O, no locks. The shell (SessionManager) asks AgentRegistry::RelayPeers for the
// agents and folds a fan-out before handing it out (hand_out.h).
#ifndef TESSERA_SERVER_RELAY_H_
#define TESSERA_SERVER_RELAY_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "server/agent_registry.h"
#include "server/session/effects.h"

namespace tessera {

// Whether `command` may be relayed: a PIN without an assignment (a cached plan's), which is
// the same for every rank of the session. Every other command either carries something of
// its rank (an assignment, GATHER's peers, COMMIT) or ends a session (ABORT, COMMITTED),
// which must not depend on another agent staying up.
bool Relayable(const Outgoing& command);

// Folds the relayable commands of `commands` by node: those to ranks whose peers[rank] relays,
// grouped by node_id and by the command's bytes but for its seq, go to the group's first rank
// in `commands` alone, whose command gets relay_to naming the others (rank, incarnation,
// peer_address, seq) in the order they came; the others are removed. Groups of one, commands that are not
// relayable and ranks that do not relay (or are not in `peers`) are left as they are, and
// the remaining commands keep their order. Returns how many commands were folded away.
size_t FoldRelays(std::vector<Outgoing>& commands, absl::Span<const RelayPeer> peers);

// What both shells (SessionManager, SyncSessions) do with a fan-out before handing it out: if
// there are at least `relay_from` commands (SessionOptions.relay_from; 0: never), FoldRelays
// them over `registry`'s RelayPeers of `job_id`. Returns how many were folded away.
size_t RelayFanOut(const AgentRegistry& registry, const std::string& job_id, size_t relay_from,
                   std::vector<Outgoing>& commands);

}  // namespace tessera

#endif  // TESSERA_SERVER_RELAY_H_
