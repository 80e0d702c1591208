// tessera-coordinator: the central service of a Tessera deployment. Flags are defined here
// only (STYLE.md 11). SIGTERM or SIGINT shuts it down cleanly: in-flight RPCs get a grace
// period, the state store is closed, and the process exits 0. A restart on the same --db_path
// resumes unfinished sessions (SessionManager::Recover).
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "storage/process_storage.h"
#include "storage/storage.h"
#include "common/clock.h"
#include "common/ids.h"
#include "common/log.h"
#include "common/program.h"
#include "common/signals.h"
#include "common/tls.h"
#include "grpcpp/grpcpp.h"
#include "server/admin_service.h"
#include "server/agent_registry.h"
#include "server/death_watch.h"
#include "server/command_streams.h"
#include "server/coordinator_service.h"
#include "server/metrics.h"
#include "server/peer_id_broker.h"
#include "server/session/commit_driver.h"
#include "server/session/schema.h"
#include "server/session_manager.h"
#include "server/store/rocksdb_state_store.h"

ABSL_FLAG(bool, memory_buddies, true,
          "memory tier: pair every agent with a buddy on another node (a ring over nodes) "
          "that holds a copy of its last committed checkpoint in memory");
ABSL_FLAG(std::string, listen, "127.0.0.1:7070",
          "host:port the Coordinator and Admin gRPC services listen on; port 0 picks a free "
          "port (logged)");
ABSL_FLAG(std::string, db_path, "", "RocksDB directory for the coordinator's state; required");
ABSL_FLAG(std::string, storage_root, "",
          "checkpoint root: checkpoints go to <root>/<job>/step-N; required");
ABSL_FLAG(bool, coordinator_commits, true,
          "the coordinator can write under --storage_root and commits checkpoints itself; "
          "false: a committer agent does it");
ABSL_FLAG(int32_t, lease_ms, 10000,
          "an agent whose last heartbeat is older than this is lost (AGENT_LOST)");
ABSL_FLAG(int32_t, heartbeat_interval_ms, 2000, "how often agents are told to heartbeat");
ABSL_FLAG(int32_t, planning_timeout_s, 120, "deadline for every rank's plan to arrive");
ABSL_FLAG(int32_t, pinning_timeout_s, 120, "deadline for agents to pin staging");
ABSL_FLAG(int32_t, copying_timeout_s, 600, "deadline for trainers to copy into staging");
ABSL_FLAG(int32_t, persisting_timeout_s, 1800, "deadline for gather + writes");
ABSL_FLAG(int32_t, committing_timeout_s, 120, "deadline for the commit");
ABSL_FLAG(int32_t, max_concurrent_writers, 64, "most agents writing at once to the storage");
ABSL_FLAG(int32_t, hand_out_threads, 0,
          "threads that write a command to every rank of a large job (512 ranks or more) to "
          "their streams; 0: one per core, at most 8");
ABSL_FLAG(int32_t, relay_from, static_cast<int32_t>(tessera::SessionOptions().relay_from),
          "a cached save's PIN to this many ranks or more is written once per node, to one "
          "agent that passes it on to the node's others (agents that say they relay); 0: "
          "never");
ABSL_FLAG(bool, copy_when_pinned, true,
          "let each trainer copy into staging as soon as its own agent pinned it (false: once "
          "every rank pinned, after one more round trip: a COPY command)");
ABSL_FLAG(bool, write_when_staged, false,
          "let the agent of a rank that exchanges no DP slices write as soon as its trainer's "
          "copy is staged, within --max_concurrent_writers (false: once every rank staged and "
          "gathered, after two more round trips: GATHER and PERSIST commands)");
ABSL_FLAG(int32_t, keep_last, 0,
          "committed checkpoints kept per job; older ones are deleted after each commit "
          "(0 keeps all)");
ABSL_FLAG(std::string, admin_token, "",
          "if set, Admin calls must send 'authorization: Bearer <token>' (default from "
          "$TESSERA_ADMIN_TOKEN)");
ABSL_FLAG(std::string, tls_cert, "", "PEM server certificate (enables TLS)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA that client certificates must chain to (enables mutual TLS)");
ABSL_FLAG(std::string, metrics_listen, "",
          "host:port to serve Prometheus metrics on at /metrics (empty: no metrics endpoint)");
ABSL_FLAG(std::string, crash_in_state, "",
          "fault injection for tests: SIGKILL the coordinator right after it persists a "
          "session's entry into this state (PLANNING, PINNING, COPYING, PERSISTING, COMMITTING, "
          "COMMITTED)");
ABSL_FLAG(std::string, s3_credentials_file, "",
          "for an s3:// storage root: an AWS-style credentials file (profile $AWS_PROFILE or "
          "default); empty: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, then ~/.aws/credentials. "
          "The store is named by AWS_ENDPOINT_URL and AWS_REGION (docs/OPERATIONS.md)");
ABSL_FLAG(std::string, inject_storage_fault, "",
          "fault injection for tests only: make the coordinator's own storage I/O (its commits, "
          "retention and removals) fail, with the agent's flag's ';'-separated SPEC "
          "(storage/fault_injecting_storage.h), e.g. eio:syncdir_after_dir_rename=3 (the 3 "
          "directory fsyncs after the first directory rename fail) or crash_after_dir_rename "
          "(SIGKILL right after it)");
ABSL_FLAG(std::string, inject_plan_hold, "",
          "fault injection for tests only: JOB:PATH — job JOB's global plans wait to be decided "
          "(on the job's own strand) until the file PATH exists, at most 5 minutes");
ABSL_FLAG(int32_t, shutdown_grace_ms, 2000,
          "on SIGTERM, how long in-flight RPCs may take before they are cancelled");

namespace {

int Fail(const std::string& message) {
  std::fprintf(stderr, "tessera-coordinator: %s\n", message.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  tessera::InitProgram(
      "collects every rank's plan, validates the global plan and drives each checkpoint save "
      "to commit.\n\nUsage: tessera-coordinator --listen=HOST:PORT --db_path=DIR "
      "--storage_root=DIR [flags]",
      argc, argv);
  tessera::InitLog("coordinator");
  tessera::BlockTerminationSignals();

  const int32_t lease_ms = absl::GetFlag(FLAGS_lease_ms);
  const int32_t heartbeat_ms = absl::GetFlag(FLAGS_heartbeat_interval_ms);
  if (lease_ms <= 0 || heartbeat_ms <= 0 || heartbeat_ms >= lease_ms) {
    return Fail("--heartbeat_interval_ms must be positive and below --lease_ms");
  }
  if (absl::GetFlag(FLAGS_db_path).empty()) return Fail("--db_path is required");
  if (absl::GetFlag(FLAGS_storage_root).empty()) return Fail("--storage_root is required");
  std::string token = absl::GetFlag(FLAGS_admin_token);
  if (token.empty() && std::getenv("TESSERA_ADMIN_TOKEN") != nullptr) {
    token = std::getenv("TESSERA_ADMIN_TOKEN");
  }

  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      tessera::MakeServerCredentials({absl::GetFlag(FLAGS_tls_cert),
                                      absl::GetFlag(FLAGS_tls_key),
                                      absl::GetFlag(FLAGS_tls_client_ca)});
  if (!credentials.ok()) return Fail(std::string(credentials.status().message()));

  tessera::RocksDbStoreOptions store_options;
  store_options.path = absl::GetFlag(FLAGS_db_path);
  absl::StatusOr<std::unique_ptr<tessera::RocksDbStateStore>> store =
      tessera::RocksDbStateStore::Open(store_options);
  if (!store.ok()) return Fail(store.status().ToString());

  const tessera::Clock* clock = tessera::RealClock::Get();
  tessera::AgentRegistryOptions registry_options;
  registry_options.lease = absl::Milliseconds(lease_ms);
  registry_options.heartbeat_interval = absl::Milliseconds(heartbeat_ms);
  tessera::AgentRegistry registry(clock, registry_options);

  tessera::ProcessStorageOptions storage_options;
  storage_options.fault_spec = absl::GetFlag(FLAGS_inject_storage_fault);
  storage_options.s3_credentials_file = absl::GetFlag(FLAGS_s3_credentials_file);
  absl::StatusOr<std::unique_ptr<tessera::ProcessStorage>> process_storage =
      tessera::ProcessStorage::Open(storage_options);
  if (!process_storage.ok()) return Fail(std::string(process_storage.status().message()));
  tessera::Storage& storage = (*process_storage)->storage();
  // A coordinator that commits must reach its root: a missing bucket or refused credentials
  // are said now, once, rather than by the first save's abort.
  if (absl::GetFlag(FLAGS_coordinator_commits)) {
    if (absl::Status reach = storage.CheckAccess(absl::GetFlag(FLAGS_storage_root));
        !reach.ok()) {
      return Fail(absl::StrCat("--storage_root=", absl::GetFlag(FLAGS_storage_root),
                               " cannot be reached: ", reach.message()));
    }
  }
  // A command stream broken from the agent's side makes the agent a suspect of the death
  // watch (made below, once the sessions it reports deaths to exist).
  std::atomic<tessera::DeathWatch*> death_watch_ptr{nullptr};
  tessera::CommandStreams::Events stream_events;
  stream_events.opened = [&death_watch_ptr](const std::string& job_id, uint32_t rank,
                                            uint64_t incarnation, uint64_t serial) {
    if (tessera::DeathWatch* watch = death_watch_ptr.load()) {
      watch->StreamOpened(job_id, rank, incarnation, serial);
    }
  };
  stream_events.broken = [&death_watch_ptr](const std::string& job_id, uint32_t rank,
                                            uint64_t incarnation, uint64_t serial) {
    if (tessera::DeathWatch* watch = death_watch_ptr.load()) {
      watch->StreamBroken(job_id, rank, incarnation, serial);
    }
  };
  tessera::CommandStreams streams(std::move(stream_events));
  tessera::SessionManagerOptions manager_options;
  tessera::SessionOptions& session_options = manager_options.session;
  session_options.storage_root = absl::GetFlag(FLAGS_storage_root);
  session_options.coordinator_commits = absl::GetFlag(FLAGS_coordinator_commits);
  session_options.planning_timeout = absl::Seconds(absl::GetFlag(FLAGS_planning_timeout_s));
  session_options.pinning_timeout = absl::Seconds(absl::GetFlag(FLAGS_pinning_timeout_s));
  session_options.copying_timeout = absl::Seconds(absl::GetFlag(FLAGS_copying_timeout_s));
  session_options.persisting_timeout = absl::Seconds(absl::GetFlag(FLAGS_persisting_timeout_s));
  session_options.committing_timeout = absl::Seconds(absl::GetFlag(FLAGS_committing_timeout_s));
  session_options.copy_when_pinned = absl::GetFlag(FLAGS_copy_when_pinned);
  session_options.write_when_staged = absl::GetFlag(FLAGS_write_when_staged);
  session_options.max_concurrent_writers =
      static_cast<uint32_t>(std::max(1, absl::GetFlag(FLAGS_max_concurrent_writers)));
  session_options.keep_last = std::max(0, absl::GetFlag(FLAGS_keep_last));
  manager_options.hand_out_threads =
      static_cast<size_t>(std::max(0, absl::GetFlag(FLAGS_hand_out_threads)));
  manager_options.session.relay_from =
      static_cast<size_t>(std::max(0, absl::GetFlag(FLAGS_relay_from)));
  if (const std::string crash = absl::GetFlag(FLAGS_crash_in_state); !crash.empty()) {
    manager_options.on_state_persisted = [crash](tessera::v1::SessionState state) {
      if (tessera::v1::SessionState_Name(state) == "SESSION_STATE_" + crash) {
        tessera::LogError("fault injection: crashing in ", crash);
        raise(SIGKILL);
      }
    };
  }
  if (const std::string hold = absl::GetFlag(FLAGS_inject_plan_hold); !hold.empty()) {
    const size_t colon = hold.find(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == hold.size()) {
      return Fail(absl::StrCat("--inject_plan_hold: expected JOB:PATH, got \"", hold, "\""));
    }
    manager_options.before_plan_decided =
        [job = hold.substr(0, colon), path = hold.substr(colon + 1)](const std::string& job_id) {
          if (job_id != job) return;
          tessera::LogWarning("fault injection: holding the plan of job ", job, " until ", path,
                              " exists");
          const absl::Time give_up = absl::Now() + absl::Minutes(5);
          while (access(path.c_str(), F_OK) != 0 && absl::Now() < give_up) {
            absl::SleepFor(absl::Milliseconds(10));
          }
          tessera::LogWarning("fault injection: the plan of job ", job, " goes on");
        };
  }
  tessera::StorageCommitEdge commit_edge(&storage, session_options.storage_root);
  tessera::SessionManager sessions(store->get(), &registry, &streams,
                                   session_options.coordinator_commits ? &commit_edge : nullptr,
                                   clock, manager_options);
  if (absl::Status recovered = sessions.Recover(); !recovered.ok()) {
    return Fail(absl::StrCat("cannot recover state from ", store_options.path, ": ",
                             recovered.ToString()));
  }

  // Finds an agent dead within moments of its process ending, not at its lease's end.
  tessera::DeathWatch death_watch(&registry, [&sessions](const std::string& job_id) {
    sessions.AgentsChanged(job_id);
  });
  death_watch_ptr.store(&death_watch);

  tessera::PeerIdBroker broker;
  tessera::CoordinatorServiceOptions service_options;
  service_options.death_watch = &death_watch;
  service_options.coordinator_incarnation = tessera::NewIncarnation();
  service_options.storage_root = session_options.storage_root;
  absl::StatusOr<std::string> peer_key = tessera::PeerKey(**store);
  if (!peer_key.ok()) return Fail(peer_key.status().ToString());
  service_options.peer_key = *std::move(peer_key);
  service_options.memory_buddies = absl::GetFlag(FLAGS_memory_buddies);
  tessera::CoordinatorService coordinator(&registry, &sessions, &streams, &broker, clock,
                                          service_options);
  tessera::AdminService admin(&registry, &sessions, token);

  std::unique_ptr<prometheus::Exposer> metrics_server;
  auto metrics = std::make_shared<tessera::CoordinatorMetrics>(&sessions, &registry);
  if (const std::string listen_metrics = absl::GetFlag(FLAGS_metrics_listen);
      !listen_metrics.empty()) {
    absl::StatusOr<std::unique_ptr<prometheus::Exposer>> served =
        tessera::ServeMetrics(listen_metrics, metrics);
    if (!served.ok()) return Fail(std::string(served.status().message()));
    metrics_server = *std::move(served);
    tessera::LogInfo("metrics on http://", listen_metrics, "/metrics");
  }

  const std::string listen = absl::GetFlag(FLAGS_listen);
  int bound_port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(listen, *credentials, &bound_port);
  builder.SetMaxReceiveMessageSize(256 << 20);  // large local plans
  builder.RegisterService(&coordinator);
  builder.RegisterService(&admin);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || bound_port == 0) return Fail(absl::StrCat("cannot listen on ", listen));
  registry.StartServing();  // agents can reach it from now: their copies arrive from now
  tessera::LogInfo("listening on ", listen, " (port ", bound_port, "); state in ",
                   store_options.path, "; checkpoints under ", session_options.storage_root,
                   token.empty() ? "" : "; admin token required");

  // Expired peer-id waits (session deadlines, leases and commits tick inside SessionManager).
  absl::Notification stop_broker;
  std::thread broker_expiry([&] {
    while (!stop_broker.WaitForNotificationWithTimeout(absl::Seconds(1))) {
      broker.Expire(clock->Now());
    }
  });

  int signal_number = tessera::WaitForTerminationSignal();
  tessera::LogInfo("received signal ", signal_number, "; shutting down");
  streams.CloseAll();
  broker.Shutdown();  // releases ExchangePeerId calls waiting for their leader
  server->Shutdown(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(absl::GetFlag(FLAGS_shutdown_grace_ms)));
  server->Wait();
  sessions.Stop();
  stop_broker.Notify();
  broker_expiry.join();
  tessera::LogInfo("stopped");
  return 0;
}
