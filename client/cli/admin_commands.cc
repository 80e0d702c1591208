#include "client/cli/admin_commands.h"

#include <algorithm>
#include <chrono>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "client/cli/exit_codes.h"
#include "client/cli/format_util.h"
#include "client/cli/json_writer.h"
#include "client/cli/session_view.h"
#include "client/cli/table.h"
#include "common/layout.h"
#include "grpcpp/support/sync_stream.h"

namespace tessera {
namespace cli {
namespace {

// "UNAVAILABLE" for grpc::StatusCode::UNAVAILABLE.
std::string CodeName(grpc::StatusCode code) {
  static constexpr const char* kNames[] = {"OK",
                                           "CANCELLED",
                                           "UNKNOWN",
                                           "INVALID_ARGUMENT",
                                           "DEADLINE_EXCEEDED",
                                           "NOT_FOUND",
                                           "ALREADY_EXISTS",
                                           "PERMISSION_DENIED",
                                           "RESOURCE_EXHAUSTED",
                                           "FAILED_PRECONDITION",
                                           "ABORTED",
                                           "OUT_OF_RANGE",
                                           "UNIMPLEMENTED",
                                           "INTERNAL",
                                           "UNAVAILABLE",
                                           "DATA_LOSS",
                                           "UNAUTHENTICATED"};
  const int i = static_cast<int>(code);
  if (i >= 0 && i < static_cast<int>(sizeof(kNames) / sizeof(kNames[0]))) return kNames[i];
  return absl::StrCat("code ", i);
}

// The gRPC status' message, or its code name when the server sent none.
std::string RpcMessage(const grpc::Status& status) {
  return status.error_message().empty() ? CodeName(status.error_code()) : status.error_message();
}

}  // namespace

std::string DescribeRpcError(const grpc::Status& status, const AdminOptions& options) {
  switch (status.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
      return absl::StrCat("cannot reach the coordinator at ", options.coordinator,
                          " (is tessera-coordinator running? set --coordinator or "
                          "TESSERA_COORDINATOR): ",
                          RpcMessage(status));
    case grpc::StatusCode::UNAUTHENTICATED:
      if (options.token.empty()) {
        return absl::StrCat("the coordinator at ", options.coordinator,
                            " requires an admin token: pass --token or set "
                            "TESSERA_ADMIN_TOKEN (",
                            RpcMessage(status), ")");
      }
      return absl::StrCat("the coordinator at ", options.coordinator,
                          " rejected the admin token: check --token or TESSERA_ADMIN_TOKEN (",
                          RpcMessage(status), ")");
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return absl::StrCat("the coordinator at ", options.coordinator, " did not answer within ",
                          options.timeout_ms, " ms (raise --timeout_ms if it is busy)");
    case grpc::StatusCode::NOT_FOUND:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::INVALID_ARGUMENT:
      return RpcMessage(status);
    default:
      return absl::StrCat("the coordinator at ", options.coordinator,
                          " failed the call: ", CodeName(status.error_code()), ": ",
                          RpcMessage(status));
  }
}

AdminCommands::AdminCommands(std::shared_ptr<v1::Admin::StubInterface> stub, AdminOptions options,
                             std::ostream& out, std::ostream& err)
    : stub_(std::move(stub)), options_(std::move(options)), out_(out), err_(err) {}

std::unique_ptr<grpc::ClientContext> AdminCommands::NewContext(bool deadline) const {
  auto context = std::make_unique<grpc::ClientContext>();
  if (!options_.token.empty()) {
    context->AddMetadata("authorization", absl::StrCat("Bearer ", options_.token));
  }
  if (deadline) {
    context->set_deadline(std::chrono::system_clock::now() +
                          std::chrono::milliseconds(options_.timeout_ms));
  }
  return context;
}

int AdminCommands::Fail(const grpc::Status& status) {
  err_ << "error: " << DescribeRpcError(status, options_) << '\n';
  return kExitError;
}

int AdminCommands::PrintJson(const google::protobuf::Message& message, bool pretty) {
  absl::StatusOr<std::string> json = ProtoToJson(message, pretty);
  if (!json.ok()) {
    err_ << "error: " << json.status().message() << '\n';
    return kExitError;
  }
  out_ << *json << '\n';
  return kExitOk;
}

int AdminCommands::Jobs() {
  auto context = NewContext(/*deadline=*/true);
  v1::ListJobsResponse response;
  grpc::Status status = stub_->ListJobs(context.get(), v1::ListJobsRequest(), &response);
  if (!status.ok()) return Fail(status);
  if (options_.json) return PrintJson(response, /*pretty=*/true);
  if (response.jobs_size() == 0) {
    out_ << "no jobs\n";
    return kExitOk;
  }
  Table table({"JOB", "LAYOUT", "WORLD", "ALIVE", "LATEST STEP", "SESSION", "STATE"});
  for (size_t c : {2, 3, 4}) table.AlignRight(c);
  for (const v1::JobInfo& job : response.jobs()) {
    table.AddRow({job.job_id(), job.layout().dims_size() > 0 ? LayoutSpec(job.layout()) : "-",
                  absl::StrCat(job.world_size()), absl::StrCat(job.agents_alive()),
                  job.latest_committed_step() < 0 ? "-" : absl::StrCat(job.latest_committed_step()),
                  job.current_session_id().empty() ? "-" : job.current_session_id(),
                  job.current_session_id().empty() ? "-" : StateName(job.current_state())});
  }
  table.Print(out_);
  return kExitOk;
}

int AdminCommands::Agents(const std::string& job) {
  auto context = NewContext(/*deadline=*/true);
  v1::ListAgentsRequest request;
  request.set_job_id(job);
  v1::ListAgentsResponse response;
  grpc::Status status = stub_->ListAgents(context.get(), request, &response);
  if (!status.ok()) return Fail(status);
  if (options_.json) return PrintJson(response, /*pretty=*/true);
  if (response.agents_size() == 0) {
    out_ << "no agents registered for job " << job << '\n';
    return kExitOk;
  }
  std::vector<const v1::AgentInfo*> agents;
  for (const v1::AgentInfo& a : response.agents()) agents.push_back(&a);
  std::sort(agents.begin(), agents.end(),
            [](const auto* a, const auto* b) { return a->coord().rank() < b->coord().rank(); });
  Table table({"RANK", "COORDS", "NODE", "PEER", "ALIVE", "HEARTBEAT", "PINNED", "IN MEMORY",
               "GPU", "INCARNATION"});
  for (size_t c : {0, 5, 6}) table.AlignRight(c);
  int alive = 0;
  for (const v1::AgentInfo* a : agents) {
    alive += a->alive();
    table.AddRow({absl::StrCat(a->coord().rank()), a->coords(), a->node_id(), a->peer_address(),
                  a->alive() ? "yes" : "NO",
                  absl::StrCat(HumanDuration(absl::Milliseconds(a->ms_since_heartbeat())), " ago"),
                  FormatBytes(a->pinned_bytes()),
                  InMemory(*a),
                  a->has_gpu() ? "yes" : "no",
                  absl::StrFormat("%016x", a->incarnation())});
  }
  table.Print(out_);
  out_ << alive << " of " << agents.size() << " agents alive\n";
  return kExitOk;
}

// What an agent holds in memory: "step 300 (512.0 MiB)", then ", buddy of 1 (512.0 MiB)"
// per copy it holds for another rank; "-" if nothing.
std::string AdminCommands::InMemory(const v1::AgentInfo& agent) {
  std::vector<std::string> parts;
  if (agent.has_resident()) {
    parts.push_back(absl::StrCat("step ", agent.resident().step(), " (",
                                 FormatBytes(agent.resident().nbytes()), ")"));
  }
  for (const v1::MemoryCopy& c : agent.buddy_copies()) {
    parts.push_back(absl::StrCat("buddy of ", c.writer_rank(), " (", FormatBytes(c.nbytes()), ")"));
  }
  return parts.empty() ? "-" : absl::StrJoin(parts, ", ");
}

int AdminCommands::Status(const std::string& job, const std::string& session_id) {
  auto context = NewContext(/*deadline=*/true);
  v1::GetSessionRequest request;
  request.set_job_id(job);
  request.set_session_id(session_id);
  v1::SessionStatus response;
  grpc::Status status = stub_->GetSession(context.get(), request, &response);
  if (!status.ok()) return Fail(status);
  if (options_.json) return PrintJson(response, /*pretty=*/true);
  PrintSessionStatus(response, out_);
  return kExitOk;
}

int AdminCommands::Watch(const std::string& job, const std::string& session_id) {
  // No deadline: a save may take as long as it takes; the user interrupts with Ctrl-C.
  auto context = NewContext(/*deadline=*/false);
  v1::GetSessionRequest request;
  request.set_job_id(job);
  request.set_session_id(session_id);
  std::unique_ptr<grpc::ClientReaderInterface<v1::SessionStatus>> reader =
      stub_->WatchSession(context.get(), request);
  v1::SessionStatus update;
  v1::SessionStatus last;
  bool got_any = false;
  int frame_lines = 0;
  while (reader->Read(&update)) {
    got_any = true;
    last = update;
    if (options_.json) {
      if (PrintJson(update, /*pretty=*/false) != kExitOk) return kExitError;
    } else if (options_.tty) {
      std::string frame = WatchFrame(update);
      // Move back over the previous frame and clear to the end of the screen.
      if (frame_lines > 0) out_ << "\x1b[" << frame_lines << "A\x1b[J";
      out_ << frame;
      frame_lines = static_cast<int>(std::count(frame.begin(), frame.end(), '\n'));
    } else {
      out_ << WatchLine(update) << '\n';
    }
    out_.flush();
    if (IsTerminal(update.state())) break;
  }
  const bool ended = got_any && IsTerminal(last.state());
  // The session ended: stop the stream rather than wait for the server to close it.
  if (ended) context->TryCancel();
  grpc::Status status = reader->Finish();
  if (!ended) {
    if (!status.ok()) return Fail(status);
    err_ << "error: the coordinator closed the watch before the session ended"
         << (got_any ? absl::StrCat(" (last state ", StateName(last.state()), ")") : "") << '\n';
    return kExitError;
  }
  if (last.state() == v1::SESSION_STATE_COMMITTED) return kExitOk;
  if (!options_.json) {
    out_ << "save of step " << last.step() << " aborted: ";
    PrintErrorDetail(last.error(), out_);
  }
  return kExitFailed;
}

int AdminCommands::Checkpoints(const std::string& job) {
  auto context = NewContext(/*deadline=*/true);
  v1::ListCheckpointsRequest request;
  request.set_job_id(job);
  v1::ListCheckpointsResponse response;
  grpc::Status status = stub_->ListCheckpoints(context.get(), request, &response);
  if (!status.ok()) return Fail(status);
  if (options_.json) return PrintJson(response, /*pretty=*/true);
  if (response.checkpoints_size() == 0) {
    out_ << "no committed checkpoints for job " << job << '\n';
    return kExitOk;
  }
  Table table({"STEP", "STATUS", "COMMITTED", "SIZE", "TENSORS", "CHUNKS", "SESSION", "DIR"});
  for (size_t c : {0, 3, 4, 5}) table.AlignRight(c);
  // Newest first: the first disk checkpoint listed is the latest (a memory-only commit never is).
  bool latest_seen = false;
  std::vector<std::string> notes;  // printed after the table
  for (const v1::CheckpointInfo& c : response.checkpoints()) {
    std::string status = "disk";
    if (c.memory_only()) {
      status = "memory-only";
      if (!c.files_not_in_memory().empty()) {
        status = "memory-only, LOST";
        notes.push_back(absl::StrCat("step ", c.step(), ": no live agent holds ",
                                     absl::StrJoin(c.files_not_in_memory(), ", "),
                                     " in memory; it can no longer be loaded"));
      } else if (c.memory_copies_unknown()) {
        status = "memory-only, copies unknown";
        notes.push_back(absl::StrCat("step ", c.step(),
                                     ": not every live agent has stated its memory copies "
                                     "yet (the coordinator started, or an agent registered "
                                     "again, less than a lease ago; or an agent has not "
                                     "handled its commit yet); list again in a few seconds"));
      }
    } else if (!latest_seen) {
      status = "disk, latest";
      latest_seen = true;
    }
    table.AddRow({absl::StrCat(c.step()), status, FormatUnixMs(c.committed_unix_ms()),
                  FormatBytes(c.bytes()), absl::StrCat(c.tensors()), absl::StrCat(c.chunks()),
                  c.session_id(), c.memory_only() ? "-" : c.dir()});
  }
  table.Print(out_);
  for (const std::string& line : notes) out_ << line << '\n';
  return kExitOk;
}

int AdminCommands::Abort(const std::string& job, const std::string& reason) {
  auto context = NewContext(/*deadline=*/true);
  v1::AbortSessionRequest request;
  request.set_job_id(job);
  request.set_reason(reason);
  v1::SessionStatus response;
  grpc::Status status = stub_->AbortSession(context.get(), request, &response);
  if (!status.ok()) return Fail(status);
  if (options_.json) return PrintJson(response, /*pretty=*/true);
  out_ << "aborted session " << response.session_id() << " of job " << response.job_id()
       << " (step " << response.step() << "), now " << StateName(response.state()) << '\n';
  if (response.has_error()) PrintErrorDetail(response.error(), out_, "  ");
  return kExitOk;
}

}  // namespace cli
}  // namespace tessera
