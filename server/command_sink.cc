#include "server/command_sink.h"

#include "common/log.h"

namespace tessera {

void CommandSink::SendPin(const std::string& job_id, uint32_t rank, const v1::Command& command,
                          absl::string_view assignment) {
  v1::Command c = command;
  if (!c.mutable_pin()->mutable_assignment()->ParseFromArray(
          assignment.data(), static_cast<int>(assignment.size()))) {
    LogError("the PIN assignment of rank ", rank, " of job ", job_id, " does not parse");
  }
  Send(job_id, rank, c);
}

}  // namespace tessera
