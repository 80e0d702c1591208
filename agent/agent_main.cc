// tessera-agent: runs beside one trainer rank. Flags are defined here only (STYLE.md 11).
// SIGTERM or SIGINT stops it cleanly (exit 0); if a newer agent process of the same rank
// registers, this one exits 3.
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "agent/coordinator_client.h"
#include "agent/lifeline.h"
#include "common/ids.h"
#include "common/layout.h"
#include "common/log.h"
#include "common/program.h"
#include "common/signals.h"
#include "grpcpp/grpcpp.h"

ABSL_FLAG(std::string, coordinator, "127.0.0.1:7070", "host:port of tessera-coordinator");
ABSL_FLAG(std::string, job, "", "job id (1..128 of [A-Za-z0-9._-]); required");
ABSL_FLAG(int32_t, rank, -1, "this trainer rank (0 .. world size - 1); required");
ABSL_FLAG(std::string, layout, "",
          "the job's device mesh, outermost dim first, e.g. pp=2,tp=2,dp=2; required");
ABSL_FLAG(std::string, node_id, "",
          "identity of this host; ranks on one node share its RAM budget (default: hostname)");
ABSL_FLAG(int64_t, host_ram_budget_mb, 0,
          "MiB of host RAM this node's agents may pin for staging (0: no limit declared)");

namespace {

std::string Hostname() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

int Fail(const std::string& message) {
  std::fprintf(stderr, "tessera-agent: %s\n", message.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  tessera::InitProgram(
      "stages, writes and verifies one trainer rank's checkpoint shards.\n\n"
      "Usage: tessera-agent --coordinator=HOST:PORT --job=ID --rank=R --layout=pp=2,tp=2,dp=2",
      argc, argv);
  tessera::BlockTerminationSignals();

  const std::string job = absl::GetFlag(FLAGS_job);
  const int32_t rank = absl::GetFlag(FLAGS_rank);
  if (!tessera::IsValidJobId(job)) return Fail("--job is missing or invalid");
  absl::StatusOr<tessera::v1::Layout> layout =
      tessera::ParseLayoutSpec(absl::GetFlag(FLAGS_layout));
  if (!layout.ok()) return Fail(absl::StrCat("--layout: ", layout.status().message()));
  absl::StatusOr<tessera::MeshLayout> mesh = tessera::MeshLayout::FromProto(*layout);
  if (rank < 0 || static_cast<uint32_t>(rank) >= mesh->world_size()) {
    return Fail(absl::StrCat("--rank must be in [0, ", mesh->world_size(), ")"));
  }
  tessera::InitLog(absl::StrCat("agent[", rank, "]"));

  tessera::v1::RegisterAgentRequest registration;
  registration.set_job_id(job);
  registration.mutable_coord()->set_rank(static_cast<uint32_t>(rank));
  for (uint32_t c : mesh->Coords(rank)) registration.mutable_coord()->add_index(c);
  *registration.mutable_layout() = *layout;
  registration.set_incarnation(tessera::NewIncarnation());
  const std::string node = absl::GetFlag(FLAGS_node_id);
  registration.set_node_id(node.empty() ? Hostname() : node);
  registration.set_node_host_ram_budget(
      static_cast<uint64_t>(absl::GetFlag(FLAGS_host_ram_budget_mb)) << 20);

  tessera::GrpcCoordinatorClient client(grpc::CreateChannel(
      absl::GetFlag(FLAGS_coordinator), grpc::InsecureChannelCredentials()));
  tessera::Lifeline lifeline(&client, registration);
  tessera::LogInfo("starting for job ", job, " at ", mesh->CoordString(rank), ", coordinator ",
                   absl::GetFlag(FLAGS_coordinator));
  lifeline.Start();

  // The main thread waits for a termination signal; a dedicated thread watches for the
  // lifeline being superseded so that case also ends the process.
  std::thread watcher([&lifeline] {
    if (lifeline.WaitTerminal(absl::InfiniteDuration()) ==
        tessera::Lifeline::State::kSuperseded) {
      tessera::LogError("exiting: superseded");
      std::_Exit(3);
    }
  });
  int signal_number = tessera::WaitForTerminationSignal();
  tessera::LogInfo("received signal ", signal_number, "; stopping after ",
                   lifeline.heartbeats_ok(), " heartbeats");
  lifeline.Stop();
  watcher.join();
  tessera::LogInfo("stopped");
  return 0;
}
