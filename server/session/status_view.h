// The one rendering of a session for people and tools (Admin.GetSession, `tessera status`,
// WatchSession): from its stored record, to which a live session adds per-rank progress
// (SessionMachine::Status).
#ifndef TESSERA_SERVER_SESSION_STATUS_VIEW_H_
#define TESSERA_SERVER_SESSION_STATUS_VIEW_H_

#include <string>

#include "tessera/v1/admin.pb.h"
#include "tessera/v1/coordinator_state.pb.h"

namespace tessera {

// "PERSISTING" for SESSION_STATE_PERSISTING.
std::string StateName(v1::SessionState state);

// The status of a session as its record tells it: everything but per-rank progress. The
// checkpoint directory is set only once COMMITTED.
v1::SessionStatus StatusFromRecord(const v1::SessionRecord& record);

}  // namespace tessera

#endif  // TESSERA_SERVER_SESSION_STATUS_VIEW_H_
