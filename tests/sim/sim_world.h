// The deterministic simulation of Tessera's save protocol (FoundationDB-style).
//
// One schedule runs one job's saves with everything real but time, the network, the disks
// and the processes:
//   - the coordinator: the real session core (server/session: JobCore, driven through
//     CarryEffects as SessionManager drives it), the real AgentRegistry and planner, over a
//     simulated state store (SimStateStore) that can refuse a write or fail after it;
//   - each agent: the real save core (agent/save/save_core.h) and the real work functions
//     (agent/save/save_work.h: staging preparation, replica hashing, the shard writer, commit
//     resolution, retention) over a simulated disk (SimStorage) shared with the coordinator,
//     and a peer transport that moves DP slices between the simulated agents' staging;
//   - trainers that save every step in lockstep and check what they are told.
// Every message (RPC requests and replies, command-stream commands) goes through a simulated
// network that drops, delays, duplicates and reorders them, and cuts an agent's link for a
// while; the coordinator crashes (at any step, also right after a write is durable and before
// its commands go out) and recovers from its store; agents die (a new incarnation starts
// without staging) and freeze past their lease; the disk fails any operation, before or after
// it takes effect. All of it from one seeded random generator, on a simulated clock: a seed
// replays exactly, event for event.
//
// After every event the invariants are checked (sim_world.cc, CheckInvariants):
//   I1 a session the store calls COMMITTED has its manifest under the step's final name; one
//      it calls ABORTED does not — never ABORTED with the directory in place;
//   I2 a commit any agent or trainer was told of stays COMMITTED in the store, across every
//      coordinator restart;
//   I3 the latest committed step (the store's, and the disk's acknowledged one) never goes
//      back;
//   I4 a committed checkpoint verifies (format/verify.h: it tiles every tensor, every chunk's
//      checksums match) and holds exactly the bytes the trainers staged;
//   I5 one writer per chunk: no data file of a session is written by two ranks;
// and at the end:
//   I6 once faults stop, everything ends within a bound of simulated time: every save's
//      session ended, every trainer call was answered, the coordinator is idle.
//   I7 30 s after that, without faults: every checkpoint the store lists is on disk, and every
//      step directory on disk is listed or pending removal (JobRecord.retention_pending).
//   I8 a refused registration of a rank a save waits for reaches every rank within
//      kRefusalBound: the last trainer of that step is answered by then (issue 52).
//   I9 a session a trainer withdrew its snapshot from (an overlapped save whose fence found
//      the state written: the staging it leaves is torn) never commits (issue 50).
// Coordinator pauses (SIGSTOP, a VM freeze: nothing reaches or leaves it, the clock runs on
// for everyone) and refused registrations are faults of their own besides.
#ifndef TESSERA_TESTS_SIM_SIM_WORLD_H_
#define TESSERA_TESTS_SIM_SIM_WORLD_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace tessera::sim {

// Schedules built to hit one bug of issue 11 (or one the simulation found) every time, with
// no random faults besides: each is a regression seed that must keep exercising its bug.
enum class Scenario {
  kRandom,
  // Bug 1: the first commit's rename happens, then every fsync of the job directory fails for
  // 25 s, past the 20 s COMMITTING deadline.
  kRenamedThenParentFsyncFails,
  // Bug 2: every agent's link is cut for 3 s (the lease is 5 s) as the first save enters
  // PERSISTING.
  kLinkBlipInPersisting,
  // Bug 4: the coordinator crashes right after the first COMMITTED is durable (before any
  // agent hears it) and restarts with its clock an hour behind.
  kClockBackAcrossRestart,
  // Bug 5: with keep_last 1, the coordinator's retention after a commit runs late, once the
  // next save has created its temp directory.
  kRetentionWhileNextSaveWrites,
  // Found by the simulation: the store applies the first COMMITTED write but reports it failed.
  kCommittedWriteFailsAfterApplying,
  // Issue 52, bug 1: the coordinator is paused (it hears nothing, the clock runs on for
  // everyone) for 2.5 leases as the first save enters PERSISTING.
  kCoordinatorPausedPastTheLease,
  // Issue 52, bug 3: as the second save starts, the last rank's agent restarts with another
  // layout than the job's and is refused; it comes back with the job's layout once every rank
  // of that save was answered. The second save aborts, with the refusal as its reason, the
  // others commit.
  kRegistrationRefused,
};

struct SimConfig {
  Scenario scenario = Scenario::kRandom;
  uint64_t seed = 1;
  // 1, 2 or 4 ranks (sim_job.h); 0 picks one from the seed.
  uint32_t world = 0;
  // Saves per schedule (steps 10, 20, ...).
  int steps = 2;
  // The coordinator commits (else a committer agent does); picked from the seed if unset.
  int coordinator_commits = -1;  // -1: from the seed, 0: agents, 1: coordinator
  // Faults happen only during the first `fault_window` of simulated time.
  absl::Duration fault_window = absl::Seconds(20);
  // After the window, everything must end within this (I6).
  absl::Duration quiet_bound = absl::Minutes(6);
  // Fault intensity: 0 none, 1 normal, 2 heavy.
  int faults = 1;
  // Keep the event trace (every event, one line each), to print when a schedule fails.
  bool trace = false;
};

struct SimResult {
  bool ok = true;
  std::string failure;              // which invariant, and how
  std::vector<std::string> trace;   // with SimConfig.trace
  uint64_t events = 0;
  int committed = 0;                // saves that committed
  int aborted = 0;                  // saves that did not
  // Plan caching (DESIGN.md): PINs delivered without their assignment, and fingerprint-only
  // submissions answered send_full_plan (a restarted coordinator knows no plan).
  int pins_without_assignment = 0;
  int full_plans_asked = 0;
  // PINs that said write_when_staged (the rank wrote once staged, unasked).
  int pins_writing_when_staged = 0;
  absl::Duration simulated;         // simulated time the schedule took
  // What the scenario set out to do, as it happened (e.g. "renamed, then the parent's fsync
  // failed"): a regression seed checks its scenario still reaches its bug.
  std::vector<std::string> markers;
  // What the job's directory holds at the end, sorted.
  std::vector<std::string> job_dir;
  // The longest time from a refused registration (or the start of the save, if later) to the
  // last answer to that save's trainers (I8); zero if none was refused.
  absl::Duration longest_refusal_answer;
};

// Runs one schedule.
SimResult RunSchedule(const SimConfig& config);

}  // namespace tessera::sim

#endif  // TESSERA_TESTS_SIM_SIM_WORLD_H_
