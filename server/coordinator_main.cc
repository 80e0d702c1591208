// tessera-coordinator: the central service of a Tessera deployment. Flags are defined here
// only (STYLE.md 11). SIGTERM or SIGINT shuts it down cleanly: in-flight RPCs get a grace
// period, then the process exits 0.
#include <csignal>
#include <cstdio>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/ids.h"
#include "common/log.h"
#include "common/program.h"
#include "common/signals.h"
#include "grpcpp/grpcpp.h"
#include "server/agent_registry.h"
#include "server/coordinator_service.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:7070",
          "host:port the Coordinator gRPC service listens on (agents connect here)");
ABSL_FLAG(int32_t, lease_ms, 10000,
          "an agent whose last heartbeat is older than this is lost (AGENT_LOST)");
ABSL_FLAG(int32_t, heartbeat_interval_ms, 2000, "how often agents are told to heartbeat");
ABSL_FLAG(int32_t, shutdown_grace_ms, 2000,
          "on SIGTERM, how long in-flight RPCs may take before they are cancelled");

int main(int argc, char** argv) {
  tessera::InitProgram(
      "collects every rank's plan, validates the global plan and drives "
      "each checkpoint save to commit.\n\nUsage: tessera-coordinator --listen=HOST:PORT "
      "[--lease_ms=N] [--heartbeat_interval_ms=N]",
      argc, argv);
  tessera::InitLog("coordinator");
  tessera::BlockTerminationSignals();

  if (absl::GetFlag(FLAGS_lease_ms) <= 0 || absl::GetFlag(FLAGS_heartbeat_interval_ms) <= 0 ||
      absl::GetFlag(FLAGS_heartbeat_interval_ms) >= absl::GetFlag(FLAGS_lease_ms)) {
    std::fprintf(stderr,
                 "tessera-coordinator: --heartbeat_interval_ms must be positive and below "
                 "--lease_ms\n");
    return 2;
  }
  tessera::AgentRegistryOptions registry_options;
  registry_options.lease = absl::Milliseconds(absl::GetFlag(FLAGS_lease_ms));
  registry_options.heartbeat_interval =
      absl::Milliseconds(absl::GetFlag(FLAGS_heartbeat_interval_ms));
  tessera::AgentRegistry registry(tessera::RealClock::Get(), registry_options);

  tessera::CoordinatorServiceOptions service_options;
  service_options.coordinator_incarnation = tessera::NewIncarnation();
  tessera::CoordinatorService service(&registry, service_options);

  const std::string listen = absl::GetFlag(FLAGS_listen);
  int bound_port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &bound_port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || bound_port == 0) {
    std::fprintf(stderr, "tessera-coordinator: cannot listen on %s\n", listen.c_str());
    return 1;
  }
  tessera::LogInfo("listening on ", listen, " (port ", bound_port, ")");

  int signal_number = tessera::WaitForTerminationSignal();
  tessera::LogInfo("received signal ", signal_number, "; shutting down");
  server->Shutdown(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(absl::GetFlag(FLAGS_shutdown_grace_ms)));
  server->Wait();
  tessera::LogInfo("stopped");
  return 0;
}
