// CommandSink: where the coordinator's commands to agents go. The gRPC Commands stream
// implements it (server/command_streams.h); tests record.
#ifndef TESSERA_SERVER_COMMAND_SINK_H_
#define TESSERA_SERVER_COMMAND_SINK_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "tessera/v1/coordinator.pb.h"

namespace tessera {

// Send must not block on the network, and must not call back into the SessionManager.
// Thread-safety: implementations are called from several threads at once.
class CommandSink {
 public:
  virtual ~CommandSink() = default;
  virtual void Send(const std::string& job_id, uint32_t rank, const v1::Command& command) = 0;
  // Sends `command`, a PIN whose pin().assignment() is left empty, with `assignment` (an
  // encoded v1::RankAssignment, the plan's bytes) as its assignment. This default parses the
  // assignment into a copy of the command and calls Send; a sink that serializes anyway can
  // append the bytes instead (CommandStreams), so that a million-piece plan is never parsed
  // back into messages to be sent.
  virtual void SendPin(const std::string& job_id, uint32_t rank, const v1::Command& command,
                       absl::string_view assignment);
};

}  // namespace tessera

#endif  // TESSERA_SERVER_COMMAND_SINK_H_
