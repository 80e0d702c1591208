// AdminCommands: the online commands of the `tessera` CLI — jobs, agents, status, watch,
// checkpoints, abort — as calls on the coordinator's Admin service
// (proto/tessera/v1/admin.proto).
//
// The stub and the output streams are injected, so tests run the commands against a fake
// Admin service in-process and read what they print; the binary passes a stub on a real
// channel and std::cout / std::cerr. Human tables go to `out` by default; with
// AdminOptions::json every command prints one JSON document (the response proto in proto3
// JSON) instead — except watch, which prints one JSON document per update, one per line
// (JSON Lines). Errors go to `err` as one sentence a person can act on (DescribeRpcError).
//
// Each command returns the process exit code (client/cli/exit_codes.h): kExitOk; kExitFailed
// when a watched save aborted; kExitError when the call failed.
//
// Lifecycle: construct per invocation. Thread-safety: not thread-safe (one command at a time).
#ifndef TESSERA_CLIENT_CLI_ADMIN_COMMANDS_H_
#define TESSERA_CLIENT_CLI_ADMIN_COMMANDS_H_

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>

#include "grpcpp/client_context.h"
#include "grpcpp/support/status.h"
#include "tessera/v1/admin.grpc.pb.h"

namespace tessera {
namespace cli {

struct AdminOptions {
  // host:port of the coordinator, only for messages (the stub is already connected).
  // Default: empty.
  std::string coordinator;
  // Admin token sent as "authorization: Bearer <token>"; empty sends none. Default: empty.
  std::string token;
  // Deadline of each unary call; watch has none (it lasts as long as the save). Default: 10 s.
  int64_t timeout_ms = 10000;
  // Print JSON instead of tables. Default: false.
  bool json = false;
  // stdout is a terminal: watch redraws its display in place (ANSI cursor movement) instead
  // of printing one line per update. Default: false.
  bool tty = false;
};

// One sentence for a failed Admin call: UNAVAILABLE -> "cannot reach the coordinator at
// HOST:PORT (is tessera-coordinator running? set --coordinator or TESSERA_COORDINATOR)";
// UNAUTHENTICATED -> what to do with --token / TESSERA_ADMIN_TOKEN; DEADLINE_EXCEEDED -> the
// timeout and --timeout_ms; NOT_FOUND / FAILED_PRECONDITION / INVALID_ARGUMENT -> the
// coordinator's message; anything else -> "CODE: message".
std::string DescribeRpcError(const grpc::Status& status, const AdminOptions& options);

class AdminCommands {
 public:
  // `stub` must not be null; `out` and `err` must outlive the object.
  AdminCommands(std::shared_ptr<v1::Admin::StubInterface> stub, AdminOptions options,
                std::ostream& out, std::ostream& err);

  // Lists jobs: id, layout, world size, agents alive, latest committed step, session, state.
  // Returns kExitOk, or kExitError if the call fails.
  int Jobs();

  // Lists a job's agents: rank, coords, node, peer address, liveness, last heartbeat, pinned
  // bytes, GPU, incarnation. Returns kExitOk, or kExitError if the call fails (NOT_FOUND for
  // an unknown job).
  int Agents(const std::string& job);

  // Status of the job's current (else latest) session, or of `session_id` if not empty
  // (client/cli/session_view.h PrintSessionStatus). Returns kExitOk whatever the session's
  // state, or kExitError if the call fails.
  int Status(const std::string& job, const std::string& session_id);

  // Follows the session until it ends: a redrawn per-phase display on a terminal, one line
  // per update otherwise. Returns kExitOk when it COMMITTED; kExitFailed when it ABORTED
  // (the reason is printed); kExitError if the call fails or the stream ends first.
  int Watch(const std::string& job, const std::string& session_id);

  // Lists the job's committed checkpoints, newest first. Returns kExitOk, or kExitError if
  // the call fails.
  int Checkpoints(const std::string& job);

  // Aborts the job's in-flight session with `reason` and prints the resulting status.
  // Returns kExitOk, or kExitError if the call fails (NOT_FOUND if no session,
  // FAILED_PRECONDITION if it already ended).
  int Abort(const std::string& job, const std::string& reason);

 private:
  // The IN MEMORY cell of `tessera agents`.
  static std::string InMemory(const v1::AgentInfo& agent);
  // A context carrying the token and, if `deadline`, the unary deadline.
  std::unique_ptr<grpc::ClientContext> NewContext(bool deadline) const;
  int Fail(const grpc::Status& status);
  // Prints `message` as JSON; returns kExitOk or kExitError if printing fails.
  int PrintJson(const google::protobuf::Message& message, bool pretty);

  const std::shared_ptr<v1::Admin::StubInterface> stub_;
  const AdminOptions options_;
  std::ostream& out_;
  std::ostream& err_;
};

}  // namespace cli
}  // namespace tessera

#endif  // TESSERA_CLIENT_CLI_ADMIN_COMMANDS_H_
