#include "server/session/status_view.h"

#include "absl/strings/match.h"

namespace tessera {

std::string StateName(v1::SessionState state) {
  std::string name = v1::SessionState_Name(state);
  constexpr absl::string_view kPrefix = "SESSION_STATE_";
  return absl::StartsWith(name, kPrefix) ? name.substr(kPrefix.size()) : name;
}

v1::SessionStatus StatusFromRecord(const v1::SessionRecord& record) {
  v1::SessionStatus status;
  status.set_session_id(record.session_id());
  status.set_job_id(record.job_id());
  status.set_step(record.step());
  status.set_state(record.state());
  *status.mutable_error() = record.error();
  status.set_started_unix_ms(record.started_unix_ms());
  *status.mutable_phases() = record.phases();
  status.set_bytes_total(record.bytes_total());
  status.set_chunks_total(record.chunks_total());
  status.set_plan_cached(record.plan_cached());
  status.set_memory_only(record.memory_only());
  status.set_writes_began_unix_ms(record.writes_began_unix_ms());
  if (record.state() == v1::SESSION_STATE_COMMITTED) {
    status.set_checkpoint_dir(record.checkpoint_dir());
  }
  return status;
}

}  // namespace tessera
