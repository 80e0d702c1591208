// Effects: what one step of the session core asks its shell to do, as plain data.
//
// The core (job_core.h, session_machine.h) never persists, sends or touches a file itself. A
// step returns Effects, and the shell — the coordinator's SessionManager, or the deterministic
// simulation — carries them out in this order (STYLE.md 9, 16):
//   1. `batch`: one synced write to the state store. If it fails, nothing else happens: the
//      caller is answered Unavailable and the job is reloaded from the store (the one recovery
//      path, job_core.h), which tells every agent to re-send what the store did not keep.
//   2. `commands` to agents, `reply` to the caller (Outcome), `plan` / `commit` work,
//      `retention` and `remove_dirs`, in any order: each is idempotent and none is needed
//      for the durability of 1.
#ifndef TESSERA_SERVER_SESSION_EFFECTS_H_
#define TESSERA_SERVER_SESSION_EFFECTS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/layout.h"
#include "server/plan/planner.h"
#include "server/session/options.h"
#include "server/store/state_store.h"
#include "tessera/v1/coordinator.pb.h"
#include "tessera/v1/manifest.pb.h"

namespace tessera {

// A command for one rank of the job. A PIN's assignment is `pin_plan->assignments[rank]`,
// still encoded (CommandSink::SendPin): a million-piece plan is never parsed back into
// messages to be sent.
struct Outgoing {
  uint32_t rank = 0;
  v1::Command command;
  std::shared_ptr<const GlobalPlan> pin_plan;
};

// Validate the global plan of a session whose local plans all arrived (plan_work.h
// DecidePlan), off the job's lock; feed the verdict back with JobCore::PlanDecided.
struct PlanWork {
  std::string job_id;
  std::string session_id;
  uint64_t attempt = 0;  // PlanDecided ignores the verdict of another attempt
  MeshLayout layout;
  std::vector<uint64_t> fingerprints;  // FingerprintLocalPlan of every rank's, in rank order
  // The local plans whose shards were sent, in rank order (a rank that submitted only its
  // fingerprint has none here). Only needed if the job's cached plan does not match.
  std::vector<LocalPlan> plans;
};

struct PlanVerdict {
  // The validated (or cached) plan, or why it was refused: a planner error, or
  // ADMISSION_DENIED. Unset (OK, null) when `missing` is not empty.
  absl::StatusOr<std::shared_ptr<const GlobalPlan>> plan;
  bool cached = false;
  // No cached plan matches and these ranks sent only fingerprints: the plan cannot be built
  // until they send their shards (SEND_PLAN). `plans` gives back the work's local plans.
  std::vector<uint32_t> missing;
  std::vector<LocalPlan> plans;
};

// One attempt at a commit the coordinator does itself (it has the storage mounted): ResolveCommit
// (format/commit.h), fed back with JobCore::CommitResolved.
struct CommitAttempt {
  std::string job_id;
  std::string session_id;
  std::shared_ptr<const v1::Manifest> manifest;
  std::string tmp_dir;
  std::string final_dir;
  bool roll_back_unless_committed = false;
};

// ApplyRetention (format/commit.h) after a commit by the coordinator.
struct RetentionWork {
  std::string job_dir;
  std::vector<int64_t> retire_steps;
  int64_t committed_step = 0;
};

struct Effects {
  StoreBatch batch;
  // The session state `batch` records, if the step was a transition (for fault injection: the
  // coordinator's --crash_in_state fires once it is durable). UNSPECIFIED otherwise.
  v1::SessionState persisted_state = v1::SESSION_STATE_UNSPECIFIED;
  std::vector<Outgoing> commands;
  std::optional<PlanWork> plan;
  std::optional<CommitAttempt> commit;
  std::optional<RetentionWork> retention;
  std::vector<std::string> remove_dirs;  // temporary directories of aborted sessions
  // A memory-only session committed (its id), or a job with one was recovered: before its
  // COMMITTED commands go out, the shell notes that no agent has kept it yet
  // (AgentRegistry::NoteMemoryCommit). Empty: none.
  std::string memory_committed;
  SessionStats stats;                    // increments
  bool changed = false;                  // something a status watcher would see

  // Appends `other`'s effects to these (a step that leads to another, e.g. a report that
  // completes a phase). At most one of each work item can be pending.
  void Append(Effects other);
};

// An event's effects and the answer to give whoever caused it (an RPC), once they are done.
template <typename T>
struct Outcome {
  Effects effects;
  absl::StatusOr<T> reply;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_SESSION_EFFECTS_H_
