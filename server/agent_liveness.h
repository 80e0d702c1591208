// AgentLiveness: one rank's agent as the coordinator judges it — the registry's verdict
// (agent_registry.h), handed to a job's session core as an event (JobCore::AgentsChanged), so
// that the core never asks the registry, its lock or its clock (DESIGN.md "Liveness").
//
//                 Register ok                lease expired / found dead / registration refused
//   kAbsent ─────────────────────► kLive ─────────────────────────────────────────► kLost
//     │ (absent a lease after the     ▲                                               │
//     │  registry began serving:      └──── heartbeat, or Register ok ────────────────┘
//     │  `gone`)
//     └── registration refused ──► kLost
//
// Precedence when several hold: a live agent is live (a refused registration of a stray
// process for its rank changes nothing); otherwise the latest registration refused, then a
// process found dead, then an expired lease.
#ifndef TESSERA_SERVER_AGENT_LIVENESS_H_
#define TESSERA_SERVER_AGENT_LIVENESS_H_

#include <cstdint>
#include <string>

#include "tessera/v1/types.pb.h"

namespace tessera {

struct AgentLiveness {
  enum class State {
    kAbsent,  // no agent has registered for the rank with this coordinator process
    kLive,    // registered, and heard from within its lease (in running time)
    kLost,    // see `lost`
  };
  uint32_t rank = 0;
  State state = State::kAbsent;
  // kAbsent only: absent for longer than a lease since the registry began serving. A live
  // agent registers within one lease of a coordinator's start, so one still missing then is
  // gone (it died meanwhile, or its job resumed on another mesh); before that it may be on
  // its way.
  bool gone = false;
  // kLost only: why — code AGENT_LOST (its lease expired, or its process was found dead) or the
  // refusal's code (LAYOUT_MISMATCH for a registration refused), and a message that completes
  // "lost the agent of rank R during PHASE (...)", e.g. "no heartbeat within the lease".
  v1::ErrorDetail lost;
  // Of its registration (incarnation 0 and the rest empty if none):
  uint64_t incarnation = 0;
  std::string peer_address;
  bool storage_root_mounted = false;
  bool memory_tier = false;
  bool copies_when_pinned = false;
  bool writes_when_staged = false;

  // Whether the rank's agent cannot take part in a save: lost, or gone.
  bool unavailable() const { return state == State::kLost || (state == State::kAbsent && gone); }
};

}  // namespace tessera

#endif  // TESSERA_SERVER_AGENT_LIVENESS_H_
