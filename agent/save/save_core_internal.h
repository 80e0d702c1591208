// Internal to SaveCore (save_core.h): the small pure helpers its parts share — save_core.cc,
// submission.cc, phases.cc, commit.cc, reports.cc and ending.cc, each defining the methods of
// one concept. Nothing else includes this header (a private header of
// //agent/save:save_core); the helpers not defined here are defined in save_core.cc.
//
// Thread-safety: pure functions over values.
#ifndef TESSERA_AGENT_SAVE_SAVE_CORE_INTERNAL_H_
#define TESSERA_AGENT_SAVE_SAVE_CORE_INTERNAL_H_

#include <string>

#include "absl/status/status.h"
#include "agent/save/save_core.h"
#include "agent/save/save_effects.h"
#include "tessera/v1/coordinator.pb.h"
#include "tessera/v1/types.pb.h"

namespace tessera {
namespace save_core_internal {

using Severity = LogLine::Severity;

// The failure as reported: the cause's own ErrorDetail where it has one (a storage error's
// IO_ERROR with its path), else `code` with the cause's message.
v1::ErrorDetail DetailFor(v1::ErrorCode code, const absl::Status& cause);

// Phases before FAILED: the session is under way on this agent.
inline bool Live(SavePhase phase) { return phase < SavePhase::kFailed; }
inline bool Ended(SavePhase phase) {
  return phase == SavePhase::kCommitted || phase == SavePhase::kAborted;
}

// A report of `phase`, for AddPhaseReport to fill in.
v1::ReportPhaseRequest PhaseReport(v1::AgentPhase phase);

// R4: a session id becomes a directory name component.
absl::Status CheckSessionId(const std::string& session_id);

}  // namespace save_core_internal
}  // namespace tessera

#endif  // TESSERA_AGENT_SAVE_SAVE_CORE_INTERNAL_H_
