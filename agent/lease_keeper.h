// LeaseKeeper: an agent's view of its own lease, as a pure value — the one rule for when
// work begun under a lease may still write, shared by the agent's Lifeline and the
// simulation's agents (tests/sim).
//
// The coordinator is the judge of leases (server/agent_registry.h): it counts only time it was
// running to hear heartbeats, so a pause of the coordinator longer than the lease gives nobody
// up. The agent cannot know whether the coordinator gave it up, only the coordinator can say
// (RegisterAgentResponse / HeartbeatResponse .lease_kept). So:
//   - the lease is *current* while the agent is registered and its last renewal (registration
//     or heartbeat answered OK, timed from when it was sent) is within the lease by the
//     agent's own clock — if not, the agent cannot tell whether it still holds it, and
//     nothing may be written under it until the coordinator answers again;
//   - the *generation* moves on when a renewal's answer says the lease was not kept: the
//     coordinator judged this agent lost in between, and aborted whatever it was part of.
//     It moves on too when the lease lapsed by the agent's own clock while it was registered
//     (it was frozen or starved, or its renewal hung: it did not renew in time although it
//     could try) and the renewal comes from another coordinator process: a restarted
//     coordinator knows nothing of what the one before it judged, so its "kept" covers
//     nothing before it started. A lease that ran out while the agent kept trying to reach a
//     coordinator that was down moves nothing: that coordinator could not judge anyone. Work
//     begun under one generation must not write under another.
//
//              Renewed(kept)                       Renewed(!kept): generation + 1
//   unregistered ────────────► registered ◄─────────────────────────────────────┐
//        ▲                        │  │                                          │
//        └──── Unregistered ──────┘  └── own clock: no renewal within the lease ─┘
//              (a heartbeat failed)      (Lapsed: register again and be told)
//
// Thread-safety: none (a value; the Lifeline guards it with its mutex).
#ifndef TESSERA_AGENT_LEASE_KEEPER_H_
#define TESSERA_AGENT_LEASE_KEEPER_H_

#include <cstdint>
#include <optional>

#include "absl/time/time.h"

namespace tessera {

class LeaseKeeper {
 public:
  // A registration or heartbeat sent at `sent` (the agent's monotonic time) was answered OK by
  // the coordinator process `coordinator` (its coordinator_incarnation), granting `lease`;
  // `kept`: the answer's lease_kept. The first renewal ever does not move the generation
  // whatever it says: nothing was begun before it.
  void Renewed(absl::Time sent, absl::Duration lease, bool kept, uint64_t coordinator);

  // Not registered any more at `now` (a heartbeat was refused or failed, or Lapsed): no lease
  // is current until the next renewal. Notes whether the lease had lapsed by then.
  void Unregistered(absl::Time now) {
    lapsed_ = lapsed_ || Lapsed(now);
    registered_ = false;
  }

  // The generation if the lease is current at `now`, else nullopt.
  std::optional<uint64_t> Generation(absl::Time now) const;

  // Registered, but not renewed within the lease by the agent's own clock at `now` (the
  // process was frozen, or starved, or cut off): it must register again, and the answer says
  // whether the coordinator kept the lease meanwhile.
  bool Lapsed(absl::Time now) const { return registered_ && now - renewed_ > lease_; }

  // How long since the last renewal, at `now`.
  absl::Duration SinceRenewal(absl::Time now) const { return now - renewed_; }
  absl::Duration lease() const { return lease_; }
  // Times the coordinator said the lease had not been kept.
  uint64_t leases_lost() const { return generation_; }

 private:
  bool renewed_once_ = false;
  bool registered_ = false;
  bool lapsed_ = false;  // lapsed while registered, since the last renewal
  absl::Time renewed_ = absl::InfinitePast();
  absl::Duration lease_ = absl::InfiniteDuration();
  uint64_t coordinator_ = 0;  // of the last renewal
  uint64_t generation_ = 0;
};

}  // namespace tessera

#endif  // TESSERA_AGENT_LEASE_KEEPER_H_
