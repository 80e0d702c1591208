// What the session core is configured with, and the counters it reports for metrics.
#ifndef TESSERA_SERVER_SESSION_OPTIONS_H_
#define TESSERA_SERVER_SESSION_OPTIONS_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/time/time.h"
#include "server/plan/planner.h"

namespace tessera {

struct SessionOptions {
  // Directory under which each job's checkpoints live (<root>/<job>/step-N). Required.
  std::string storage_root;
  // True if the coordinator can write under storage_root itself (then it commits); false to
  // have a committer agent (one that registered storage_root_mounted) do it. Default: true.
  bool coordinator_commits = true;
  // Phase deadlines, measured from entering the phase. Past the deadline of PLANNING to
  // PERSISTING a session aborts with TIMEOUT; past COMMITTING's it is rolled back unless its
  // commit completes (never aborted by the timer alone). Defaults: 120 s, 120 s, 600 s,
  // 1800 s, 120 s.
  absl::Duration planning_timeout = absl::Seconds(120);
  absl::Duration pinning_timeout = absl::Seconds(120);
  absl::Duration copying_timeout = absl::Seconds(600);
  absl::Duration persisting_timeout = absl::Seconds(1800);
  absl::Duration committing_timeout = absl::Seconds(120);
  // PIN tells agents to let their trainers copy once their own staging is pinned
  // (PinCommand.copy_when_pinned), instead of the coordinator sending COPY once every rank
  // pinned. Default: true.
  bool copy_when_pinned = true;
  // PIN tells the agents of ranks that exchange no DP slices to hash and write as soon as
  // their trainer's copy is staged (PinCommand.write_when_staged), without waiting for GATHER
  // and PERSIST: as many writers as max_concurrent_writers admits, the first in rank order.
  // Default: false — measured on the 2-core VM, the early writers' checksums slowed the
  // other ranks' CPU copies (DESIGN.md "Save protocol", 4).
  bool write_when_staged = false;
  // A cached save's PINs to this many ranks or more are written once per node, to one agent
  // that passes them on to the node's others (server/relay.h; only among agents that
  // registered relays_commands). 0: never. Default: 512 — a relay adds a hop on the node,
  // which pays only where the coordinator's writes are the cost.
  size_t relay_from = 512;
  // Most agents writing at once to the storage target (memory-only saves write nothing and
  // are not bound). Default: 64.
  uint32_t max_concurrent_writers = 64;
  // Committed checkpoints kept per job; older ones are retired with each commit. 0 keeps all.
  // Default: 0.
  int keep_last = 0;
  // Delay before the coordinator retries a commit whose outcome was unresolved (an I/O
  // error), doubling up to commit_retry_max. Defaults: 500 ms, 30 s.
  absl::Duration commit_retry_initial = absl::Milliseconds(500);
  absl::Duration commit_retry_max = absl::Seconds(30);
  PlannerOptions planner;
};

// Counters since the coordinator started, for metrics (server/metrics.h). The core reports
// increments in each step's Effects; the manager adds them up.
struct SessionStats {
  uint64_t commits = 0;
  uint64_t bytes_committed = 0;
  std::map<std::string, uint64_t> aborts_by_reason;  // "AGENT_LOST" -> count
  struct Timing {
    uint64_t count = 0;
    double seconds = 0;
  };
  std::map<std::string, Timing> phase_seconds;  // "PERSISTING" -> completed phases
  Timing trainer_stall;                         // one sample per rank per save
  uint64_t sessions_in_flight = 0;              // filled by the manager, not added up

  // Adds `other`'s counters (not sessions_in_flight) to these.
  void Add(const SessionStats& other);
};

}  // namespace tessera

#endif  // TESSERA_SERVER_SESSION_OPTIONS_H_
