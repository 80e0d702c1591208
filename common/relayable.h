// Which coordinator commands may be relayed by one agent to the others of its node
// (DESIGN.md "Relayed PINs"). The one rule: the coordinator folds only such commands
// (server/relay.h), and an agent takes only such commands from a relay (agent/command_relay.h).
#ifndef TESSERA_COMMON_RELAYABLE_H_
#define TESSERA_COMMON_RELAYABLE_H_

#include "tessera/v1/coordinator.pb.h"

namespace tessera {

// A PIN without an assignment (a cached plan's): the same for every rank of the session but
// its seq. Every other command either carries something of its rank (an assignment, GATHER's
// peers, COMMIT) or ends a session (ABORT, COMMITTED), which must not depend on another agent
// staying up.
inline bool RelayableCommand(const v1::Command& command) {
  return command.has_pin() && command.pin().assignment_omitted();
}

}  // namespace tessera

#endif  // TESSERA_COMMON_RELAYABLE_H_
