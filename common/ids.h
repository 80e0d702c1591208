// Identifiers and names: agent incarnations, session ids, checkpoint directory names.
//
// Thread-safety: free functions; the random source is thread-safe.
#ifndef TESSERA_COMMON_IDS_H_
#define TESSERA_COMMON_IDS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace tessera {

// A random non-zero 64-bit value, picked once per process start.
uint64_t NewIncarnation();

// "s<step>-<16 hex digits>": unique per attempt, readable in logs.
std::string NewSessionId(int64_t step);

// "step-000001000" (9 digits, zero-padded; more digits when the step needs them).
std::string StepDirName(int64_t step);

// "step-000001000.tmp-<session_id>": where a session writes before it commits.
std::string TmpDirName(int64_t step, absl::string_view session_id);

// The step of a committed directory name ("step-000001000" -> 1000); nullopt for anything
// else, including temporary directories and non-canonical spellings ("step-1000").
std::optional<int64_t> ParseStepDirName(absl::string_view name);

// True for names made by TmpDirName.
bool IsTmpDirName(absl::string_view name);

// The step and session id of a name made by TmpDirName; nullopt for any other name.
std::optional<std::pair<int64_t, std::string>> ParseTmpDirName(absl::string_view name);

// Where a job's checkpoints live, and a session's directories under it: the one rule for
// these paths, used by the coordinator that names them and by the agents that check them.
//   JobDirPath(root, job)              <root>/<job>
//   StepDirPath(root, job, step)       <root>/<job>/step-000001000
//   TmpDirPath(root, job, step, id)    <root>/<job>/step-000001000.tmp-<id>
std::string JobDirPath(absl::string_view root, absl::string_view job_id);
std::string StepDirPath(absl::string_view root, absl::string_view job_id, int64_t step);
std::string TmpDirPath(absl::string_view root, absl::string_view job_id, int64_t step,
                       absl::string_view session_id);

// The storage root a coordinator named (RegisterAgentResponse.storage_root), checked against
// the agent's own (its --storage_root): every path the coordinator sends is then checked
// against paths made from it (agent/save R4), so the root is the one thing to pin. `own`
// empty: the agent was given none and takes the coordinator's. Else `received` must be `own`,
// trailing '/' aside — a root elsewhere, a relative one or one with "." or ".." components
// ("/ckpt/../etc") is refused, not resolved.
// Errors: PermissionDenied naming both roots.
absl::Status CheckStorageRoot(absl::string_view own, absl::string_view received);

// Job ids name directories under the storage root, so they are restricted:
// 1..128 characters of [A-Za-z0-9._-], not starting with '.'.
bool IsValidJobId(absl::string_view job_id);

}  // namespace tessera

#endif  // TESSERA_COMMON_IDS_H_
