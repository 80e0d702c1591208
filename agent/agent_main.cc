// tessera-agent: runs beside one trainer rank. Flags are defined here only (STYLE.md 11).
// SIGTERM or SIGINT stops it cleanly (exit 0); if a newer agent process of the same rank
// registers, this one exits 3.
//
// Wiring: Lifeline (register + heartbeat) → CommandStream (coordinator commands) →
// SaveExecutor (staging, peer exchange, writes) ← TrainerService (unix socket, the trainer);
// Loader serves loads; GrpcPeerTransport serves and sends DP slices. Commands the coordinator
// relays through this node's agents: CommandRelayer passes them on, CommandRelayService (on
// the Peer port) takes them for the SaveExecutor.
#include <signal.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "agent/buddy_replicator.h"
#include "agent/backoff.h"
#include "agent/buddy_store.h"
#include "agent/command_relay.h"
#include "agent/command_stream.h"
#include "agent/coordinator_client.h"
#include "agent/lifeline.h"
#include "agent/loader.h"
#include "agent/memory_budgets.h"
#include "agent/memory_bulk.h"
#include "agent/memory_tier.h"
#include "agent/peer/grpc_peer_transport.h"
#include "agent/peer/peer_address_book.h"
#include "agent/peer_memory.h"
#include "agent/shm_huge_pages.h"
#include "agent/save/save_executor.h"
#include "agent/staging_pool.h"
#include "agent/trainer_service.h"
#include "common/clock.h"
#include "common/ids.h"
#include "common/layout.h"
#include "common/log.h"
#include "common/program.h"
#include "common/signals.h"
#include "common/strand.h"
#include "common/tls.h"
#include "grpcpp/grpcpp.h"
#include "shm/cuda_host.h"
#include "shm/ownership.h"
#include "storage/process_storage.h"
#include "storage/storage.h"

ABSL_FLAG(std::string, coordinator, "127.0.0.1:7070", "host:port of tessera-coordinator");
ABSL_FLAG(std::string, job, "", "job id (1..128 of [A-Za-z0-9._-]); required");
ABSL_FLAG(int32_t, rank, -1, "this trainer rank (0 .. world size - 1); required");
ABSL_FLAG(std::string, layout, "",
          "the job's device mesh, outermost dim first, e.g. pp=2,tp=2,dp=2; required");
ABSL_FLAG(std::string, socket, "",
          "unix socket the trainer connects to (default: /tmp/tessera/<job>/agent-<rank>.sock)");
ABSL_FLAG(std::string, peer_listen, "0.0.0.0:0",
          "host:port for DP-gather transfers from other agents (port 0: a free one)");
ABSL_FLAG(std::string, peer_host, "",
          "host name or address other agents use to reach this one (default: the host of "
          "--peer_listen if it names one address, else the hostname)");
ABSL_FLAG(std::string, memory_bulk_listen, "",
          "memory tier: host:port where other agents read this agent's memory copies over plain "
          "TCP, faster than over --peer_listen (default: the host of --peer_listen, a free port; "
          "'off': read over --peer_listen only)");
ABSL_FLAG(std::string, node_id, "",
          "identity of this host; ranks on one node share its RAM budget (default: hostname)");
ABSL_FLAG(int64_t, host_ram_budget_mb, 0,
          "MiB of host RAM this node's agents may pin for staging, all together (0: none "
          "declared)");
ABSL_FLAG(int32_t, agents_per_node, 0,
          "agents on this host, which share its memory (0: LOCAL_WORLD_SIZE, else "
          "SLURM_NTASKS_PER_NODE, else 1); divides the default budgets below");
ABSL_FLAG(int64_t, staging_budget_mb, 0,
          "MiB this agent may map for staging (0: half of physical memory divided by "
          "--agents_per_node)");
ABSL_FLAG(bool, memory_tier, true,
          "keep the last committed checkpoint's staged bytes in memory, so a trainer restarted "
          "on this node loads it from there (verified against the manifest's checksums); "
          "bounded by --staging_budget_mb, dropped when a save needs the room");
ABSL_FLAG(int64_t, buddy_budget_mb, 0,
          "memory tier: MiB this agent may hold as other ranks' memory buddy, copies being "
          "received and replaced included (0: half of --staging_budget_mb)");
ABSL_FLAG(int32_t, writes_in_flight, 1,
          "data-file writes of 8 MiB issued at once when persisting (1: one after another, the "
          "fastest on a virtio disk; NVMe and parallel file systems may want more: measure "
          "with //format:shard_writer_benchmark)");
ABSL_FLAG(std::string, storage_root, "",
          "the storage root this agent reads and writes under; if set, a coordinator that "
          "names another is refused (common/ids.h CheckStorageRoot), and the agent saves and "
          "loads nothing. Empty: the coordinator's is taken as given");
ABSL_FLAG(bool, storage_root_mounted, true,
          "this host can write the coordinator's storage root (needed to persist shards)");
ABSL_FLAG(std::string, crash_on, "",
          "fault injection for tests: SIGKILL this agent as this step of a save starts (pin: "
          "its staging; copy: its slots go to the trainer; gather; persist: its write; "
          "commit; keep: a committed save is about to be kept in the memory tier)");
ABSL_FLAG(std::string, freeze_on, "",
          "fault injection for tests: SIGSTOP this agent (the whole process freezes until "
          "SIGCONT), once, at the points of --crash_on");
ABSL_FLAG(std::string, s3_credentials_file, "",
          "for an s3:// storage root: an AWS-style credentials file (profile $AWS_PROFILE or "
          "default); empty: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, then ~/.aws/credentials. "
          "The store is named by AWS_ENDPOINT_URL and AWS_REGION (docs/OPERATIONS.md)");
// The defaults are S3StorageOptions' (storage/s3/s3_storage.h), chosen by tests/bench/run.sh
// --only=s3; the flags let the benchmark measure others.
ABSL_FLAG(int32_t, s3_part_size_mb,
          static_cast<int32_t>(tessera::S3StorageOptions().part_size >> 20),
          "for an s3:// storage root: MiB per part of a data file's multipart upload (at least 5)");
ABSL_FLAG(int32_t, s3_parts_in_flight, tessera::S3StorageOptions().parts_in_flight,
          "for an s3:// storage root: parts of one data file uploaded at once");
ABSL_FLAG(int32_t, s3_read_piece_mb,
          static_cast<int32_t>(tessera::S3StorageOptions().read_piece >> 20),
          "for an s3:// storage root: MiB per ranged GET of a read");
ABSL_FLAG(int32_t, s3_reads_in_flight, tessera::S3StorageOptions().reads_in_flight,
          "for an s3:// storage root: ranged GETs of one read fetched at once");
ABSL_FLAG(std::string, inject_storage_fault, "",
          "fault injection for tests only: make this agent's storage fail. ';'-separated: "
          "ERR:after_bytes=N (writes fail once N bytes were written, as a full disk does), "
          "ERR:write=N (the N-th write fails), ERR:sync, ERR:syncdir, ERR:rename, "
          "ERR:syncdir_after_dir_rename=N (the N directory fsyncs after the first directory "
          "rename fail), readonly (every mutation fails with EROFS), crash_after_dir_rename "
          "(SIGKILL right after the first directory rename), hold_writes=PATH (writes wait "
          "until PATH exists); ERR is enospc, eio, edquot, erofs or eacces. Counts start when "
          "the agent starts and cover every save (storage/fault_injecting_storage.h)");
ABSL_FLAG(std::string, tls_ca, "", "PEM CA to verify the coordinator (enables TLS)");
ABSL_FLAG(std::string, tls_cert, "", "PEM client certificate for mutual TLS");
ABSL_FLAG(std::string, tls_key, "", "PEM key of --tls_cert");

namespace {

std::string Hostname() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

// A buddy send of a memory copy: over the bulk port it ends once no byte moved for this long,
// whatever its size; over gRPC (no bulk port) it bounds the whole transfer. Reads of a copy
// use the readers' limit (common/bulk_wire.h kMemoryCopyReadStall) the same way.
constexpr absl::Duration kMemoryCopySendStall = absl::Minutes(2);
// How long a save waits for a buddy send of an older step to let its staging region go
// (BuddyReplicator::GiveWay): it stops within one 1 MiB chunk or 5 ms unless the buddy stopped
// reading; measured 15-85 ms on the 2-core VM with four agents busy.
constexpr absl::Duration kGiveWayWait = absl::Milliseconds(500);
// How long a relay keeps telling the coordinator which ranks it could not pass a command on
// to (Coordinator.RelayFailed), with backoff, before it gives up (logged).
constexpr absl::Duration kRelayReportRetryFor = absl::Seconds(30);

// --crash_on / --freeze_on: a named step of a save (pin, copy, gather, persist, commit, keep:
// SaveExecutorOptions::at_fault_point) kills or stops this process as it starts (the freeze
// once). Safe from any thread.
class FaultPoints {
 public:
  FaultPoints(std::string crash_on, std::string freeze_on)
      : crash_on_(std::move(crash_on)), freeze_on_(std::move(freeze_on)) {}

  void At(const std::string& point) const {
    if (!crash_on_.empty() && point == crash_on_) {
      tessera::LogError("fault injection: crashing on ", point);
      raise(SIGKILL);
    }
    if (!freeze_on_.empty() && point == freeze_on_ && !frozen_.exchange(true)) {
      tessera::LogError("fault injection: freezing on ", point);
      raise(SIGSTOP);
      tessera::LogWarning("fault injection: resumed after freezing on ", point);
    }
  }

 private:
  const std::string crash_on_;
  const std::string freeze_on_;
  mutable std::atomic<bool> frozen_{false};
};

// The contents of a small file, or "" if it cannot be read. (Not storage's ReadFileToString:
// procfs and sysfs files report size 0.)
std::string WholeFile(const char* path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
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
  const auto urank = static_cast<uint32_t>(rank);
  tessera::InitLog(absl::StrCat("agent[", rank, "]"));
  const uint64_t incarnation = tessera::NewIncarnation();
  const bool gpu = tessera::GpuAvailable();

  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      tessera::MakeChannelCredentials({absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key),
                                       absl::GetFlag(FLAGS_tls_ca)});
  if (!credentials.ok()) return Fail(std::string(credentials.status().message()));
  grpc::ChannelArguments channel_args;
  channel_args.SetMaxReceiveMessageSize(256 << 20);
  channel_args.SetMaxSendMessageSize(256 << 20);
  // A restarted coordinator, or one whose link was cut, is reached again within half a second
  // of it answering (gRPC's backoff starts at 1 s and grows to 120 s): a lease counts from the
  // last heartbeat before the cut, so every second after the link returns is a second less of
  // the lease, and a save's commit reaches its trainers only once the command stream is back
  // (issue 52). Failed attempts cost a refused connection, nothing on the coordinator.
  channel_args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  channel_args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 500);
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(absl::GetFlag(FLAGS_coordinator), *credentials, channel_args);
  tessera::GrpcCoordinatorClient coordinator(channel);

  // Staging: one pool for saves, one for loads (each Acquire replaces its pool's regions).
  // Claim (job, rank) on this host first: regions of other incarnations then belong to dead
  // agents only, and a second agent for the same rank is refused instead of deleting them.
  absl::StatusOr<std::unique_ptr<tessera::StagingOwnership>> ownership =
      tessera::StagingOwnership::Acquire(job, urank);
  if (!ownership.ok()) return Fail(std::string(ownership.status().message()));
  absl::StatusOr<int> stale = tessera::StagingPool::RemoveStaleRegions(job, urank, incarnation);
  if (stale.ok() && *stale > 0) {
    tessera::LogInfo("removed ", *stale, " staging region(s) of an earlier agent");
  }
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGESIZE);
  const uint64_t physical = pages > 0 && page_size > 0
                                ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size)
                                : 0;
  absl::StatusOr<uint32_t> agents_per_node =
      tessera::AgentsPerNode(absl::GetFlag(FLAGS_agents_per_node), std::getenv("LOCAL_WORLD_SIZE"),
                             std::getenv("SLURM_NTASKS_PER_NODE"));
  if (!agents_per_node.ok()) return Fail(agents_per_node.status().ToString());
  absl::StatusOr<tessera::MemoryBudgets> budgets = tessera::ResolveMemoryBudgets(
      physical, *agents_per_node, absl::GetFlag(FLAGS_staging_budget_mb),
      absl::GetFlag(FLAGS_buddy_budget_mb));
  if (!budgets.ok()) return Fail(budgets.status().ToString());
  tessera::LogInfo("memory budgets: staging ", budgets->staging_bytes >> 20,
                   " MiB, buddy copies ", budgets->buddy_bytes >> 20, " MiB (", *agents_per_node,
                   " agent(s) on a node of ", physical >> 20, " MiB)");
  const tessera::ShmHugePages huge_pages = tessera::ShmHugePagesFrom(
      WholeFile("/proc/mounts"), WholeFile("/sys/kernel/mm/transparent_hugepage/shmem_enabled"));
  if (huge_pages.on) {
    tessera::LogInfo("staging gets huge pages: ", huge_pages.why);
  } else {
    tessera::LogInfo("staging gets no huge pages (", huge_pages.why,
                     "): a trainer faults in every 4 KiB page of a region it maps anew, e.g. to "
                     "restore from memory; mount /dev/shm with huge=within_size to avoid that "
                     "(docs/OPERATIONS.md \"Sizing\")");
  }
  tessera::StagingPoolOptions pool_options;
  pool_options.job_id = job;
  pool_options.rank = urank;
  pool_options.incarnation = incarnation;
  pool_options.budget_bytes = budgets->staging_bytes;
  pool_options.pin = gpu;
  absl::StatusOr<std::unique_ptr<tessera::StagingPool>> save_pool =
      tessera::StagingPool::Create(pool_options);
  if (!save_pool.ok()) return Fail(save_pool.status().ToString());
  absl::StatusOr<std::unique_ptr<tessera::StagingPool>> load_pool =
      tessera::StagingPool::Create(tessera::LoadPoolOptions(pool_options));
  if (!load_pool.ok()) return Fail(load_pool.status().ToString());

  tessera::ProcessStorageOptions storage_options;
  storage_options.fault_spec = absl::GetFlag(FLAGS_inject_storage_fault);
  storage_options.s3_credentials_file = absl::GetFlag(FLAGS_s3_credentials_file);
  // A size below 1 MiB becomes 0, which ProcessStorage::Open refuses (S3StorageOptions::Check).
  auto mib = [](int32_t n) { return static_cast<uint64_t>(std::max(0, n)) << 20; };
  storage_options.s3.part_size = mib(absl::GetFlag(FLAGS_s3_part_size_mb));
  storage_options.s3.parts_in_flight = absl::GetFlag(FLAGS_s3_parts_in_flight);
  storage_options.s3.read_piece = mib(absl::GetFlag(FLAGS_s3_read_piece_mb));
  storage_options.s3.reads_in_flight = absl::GetFlag(FLAGS_s3_reads_in_flight);
  absl::StatusOr<std::unique_ptr<tessera::ProcessStorage>> process_storage =
      tessera::ProcessStorage::Open(storage_options);
  if (!process_storage.ok()) return Fail(std::string(process_storage.status().message()));
  tessera::Storage& storage = (*process_storage)->storage();
  // The memory tier (DESIGN.md "Memory tier"): a committed save's staging stays resident;
  // every heartbeat states it (at once after a commit) and the copies this agent holds as
  // other ranks' buddy; the buddy the coordinator names gets a copy; loads read copies from
  // memory — this node's mapped, other nodes' over PeerMemory.
  const bool memory_on = absl::GetFlag(FLAGS_memory_tier);
  tessera::Lifeline* lifeline_for_lease = nullptr;  // set once the lifeline exists
  tessera::BuddyReplicator* replicator = nullptr;   // likewise
  tessera::MemoryTier memory_tier([&replicator] {
    if (replicator != nullptr) replicator->OnPublished();
  });
  tessera::MemoryTier* const memory = memory_on ? &memory_tier : nullptr;
  tessera::BuddyStore buddy_store(budgets->buddy_bytes);
  // The job's secret, from the registration reply: until it is set every peer is refused
  // (common/peer_auth.h).
  tessera::PeerKeyring keyring(job);
  tessera::PeerMemoryServiceOptions peer_memory_options;
  peer_memory_options.keyring = &keyring;
  tessera::PeerMemoryService peer_memory(job, &memory_tier, &buddy_store, peer_memory_options);

  // The bulk port for other agents' reads of this agent's memory copies.
  std::unique_ptr<tessera::MemoryBulkServer> memory_bulk;
  tessera::MemoryBulkServerOptions bulk_options;
  if (memory_on && absl::GetFlag(FLAGS_memory_bulk_listen) != "off") {
    absl::StatusOr<std::string> listen = tessera::MemoryBulkListenAddress(
        absl::GetFlag(FLAGS_memory_bulk_listen), absl::GetFlag(FLAGS_peer_listen));
    if (!listen.ok()) return Fail(std::string(listen.status().message()));
    bulk_options.listen_address = *listen;
    absl::StatusOr<std::unique_ptr<tessera::MemoryBulkServer>> started =
        tessera::MemoryBulkServer::Start(&keyring, &memory_tier, &buddy_store, bulk_options);
    if (!started.ok()) {
      return Fail(absl::StrCat("memory bulk port on ", *listen, ": ", started.status().message()));
    }
    memory_bulk = *std::move(started);
  }

  // Commands relayed to this agent (agent/command_relay.h), served on the Peer port whether or
  // not the memory tier is on. They go to the executor, which is created after the transport
  // that serves them (it sends over it): `relay_executor` is set once it exists, before the
  // registration without which nobody relays to this incarnation.
  std::atomic<tessera::SaveExecutor*> relay_executor{nullptr};
  tessera::CommandRelayService relay_service(
      job, urank, incarnation, [&relay_executor](const tessera::v1::Command& c) {
        tessera::SaveExecutor* executor = relay_executor.load();
        if (executor == nullptr) {
          tessera::LogError("a command relayed before this agent registered is dropped: session ",
                            c.session_id(), " seq ", c.seq());
          return;
        }
        executor->OnCommand(c);
      },
      &keyring);

  tessera::PeerAddressBook addresses;  // filled from GATHER commands
  tessera::GrpcPeerTransportOptions peer_options;
  peer_options.extra_services.push_back(&relay_service);
  if (memory_on) peer_options.extra_services.push_back(&peer_memory);
  peer_options.rank = urank;
  peer_options.keyring = &keyring;
  peer_options.listen_address = absl::GetFlag(FLAGS_peer_listen);
  peer_options.resolve_peer = [&addresses](const std::string& session, uint32_t r) {
    return addresses.Resolve(session, r);
  };
  absl::StatusOr<std::unique_ptr<tessera::GrpcPeerTransport>> peers =
      tessera::GrpcPeerTransport::Create(peer_options);
  if (!peers.ok()) return Fail(absl::StrCat("peer transport: ", peers.status().ToString()));

  // The executor asks the lifeline whether this agent's lease is still current before
  // writing; the lifeline is created below, before the executor runs any command.
  tessera::SaveExecutorOptions executor_options;
  executor_options.lease_generation = [&lifeline_for_lease]() -> std::optional<uint64_t> {
    if (lifeline_for_lease == nullptr) return std::nullopt;
    return lifeline_for_lease->LeaseGeneration();
  };
  executor_options.writer.writes_in_flight = absl::GetFlag(FLAGS_writes_in_flight);
  if (absl::Status bad = executor_options.writer.Check(); !bad.ok()) {
    return Fail(absl::StrCat("--", bad.message()));
  }
  executor_options.core.job_id = job;
  executor_options.core.rank = urank;
  executor_options.core.incarnation = incarnation;
  executor_options.core.seed = incarnation;  // backoff jitter differs between agents
  executor_options.on_peer_addresses = [&addresses](const std::string& session,
                                                    const std::map<uint32_t, std::string>& a) {
    addresses.Set(session, a);
  };
  executor_options.memory_tier = memory;
  executor_options.after_keep = [&lifeline_for_lease] {
    if (lifeline_for_lease != nullptr) lifeline_for_lease->BeatNow();
  };
  // A buddy send of an older step holds the staging set the save reuses: it gives way.
  executor_options.before_acquire = [&replicator] {
    if (replicator != nullptr) replicator->GiveWay(kGiveWayWait);
  };
  const FaultPoints faults{absl::GetFlag(FLAGS_crash_on), absl::GetFlag(FLAGS_freeze_on)};
  executor_options.at_fault_point = [&faults](const std::string& point) { faults.At(point); };
  tessera::SaveExecutor executor(&coordinator, save_pool->get(), &storage, peers->get(),
                                 executor_options);
  relay_executor.store(&executor);
  // The transport serving relayed commands outlives the executor: they stop first, on every
  // way out of main.
  absl::Cleanup stop_relayed_commands = [&relay_service] { relay_service.Stop(); };
  const std::string node = absl::GetFlag(FLAGS_node_id);
  tessera::LoaderOptions loader_options;
  loader_options.memory = memory;
  if (memory_on) loader_options.buddies = &buddy_store;
  loader_options.node_id = node.empty() ? Hostname() : node;
  loader_options.job_id = job;
  if (memory != nullptr) {
    // The caller's identity and `step`, as every memory-tier query to the coordinator names it.
    auto query = [&job, urank, incarnation](auto& request, int64_t step) {
      request.set_job_id(job);
      request.set_rank(urank);
      request.set_incarnation(incarnation);
      request.set_step(step);
    };
    loader_options.find_copies =
        [&coordinator, query](
            int64_t step, const std::string& session_id, const std::vector<std::string>& files,
            bool memory_only) -> absl::StatusOr<std::vector<tessera::v1::MemoryCopy>> {
      tessera::v1::FindMemoryCopiesRequest request;
      query(request, step);
      request.set_session_id(session_id);
      request.set_memory_only(memory_only);
      for (const std::string& file : files) request.add_files(file);
      absl::StatusOr<tessera::v1::FindMemoryCopiesResponse> found =
          coordinator.FindMemoryCopies(request);
      if (!found.ok()) return found.status();
      return std::vector<tessera::v1::MemoryCopy>(found->copies().begin(), found->copies().end());
    };
    loader_options.memory_manifest =
        [&coordinator, query](int64_t step) -> absl::StatusOr<tessera::v1::Manifest> {
      tessera::v1::GetMemoryCheckpointRequest request;
      query(request, step);
      absl::StatusOr<tessera::v1::GetMemoryCheckpointResponse> found =
          coordinator.GetMemoryCheckpoint(request);
      if (!found.ok()) return found.status();
      return std::move(*found->mutable_manifest());
    };
    loader_options.fetch_copy = [&keyring](const tessera::v1::MemoryCopy& copy, char* dest) {
      return tessera::ReadMemoryCopyFromHolder(keyring.Get(), copy, dest,
                                               tessera::kMemoryCopyReadStall);
    };
  }
  loader_options.peer_keyring = &keyring;
  tessera::Loader loader(&storage, load_pool->get(), urank, loader_options);
  std::unique_ptr<tessera::BuddyReplicator> replicator_owner;
  if (memory_on) {
    replicator_owner = std::make_unique<tessera::BuddyReplicator>(
        &memory_tier, urank,
        [&keyring, &executor](const tessera::v1::MemoryBuddy& buddy,
                          const tessera::v1::MemoryCopy& copy, const char* data,
                          const std::atomic<bool>& cancel) {
          // The copy to the buddy yields the CPU to a trainer's save copy on this agent: the
          // stall is the copy alone. Checked each 5 ms for cancellation: a save that needs
          // this copy's region waits for it to let go (BuddyReplicator::GiveWay).
          auto yield_to_saves = [&executor, &cancel] {
            while (!cancel.load() && !executor.AwaitTrainerFree(absl::Milliseconds(5))) {
            }
          };
          return tessera::SendMemoryCopyToBuddy(keyring.Get(), buddy, copy, data,
                                                kMemoryCopySendStall, &cancel, yield_to_saves);
        });
    replicator = replicator_owner.get();
  }

  tessera::v1::RegisterAgentRequest registration;
  registration.set_job_id(job);
  registration.mutable_coord()->set_rank(urank);
  for (uint32_t c : mesh->Coords(urank)) registration.mutable_coord()->add_index(c);
  *registration.mutable_layout() = *layout;
  registration.set_incarnation(incarnation);
  registration.set_node_id(loader_options.node_id);
  registration.set_node_host_ram_budget(
      static_cast<uint64_t>(absl::GetFlag(FLAGS_host_ram_budget_mb)) << 20);
  registration.set_peer_address(tessera::AdvertisedPeerAddress(absl::GetFlag(FLAGS_peer_host),
                                                               absl::GetFlag(FLAGS_peer_listen),
                                                               (*peers)->port(), Hostname()));
  if (memory_bulk != nullptr) {
    registration.set_memory_bulk_address(
        tessera::AdvertisedPeerAddress(absl::GetFlag(FLAGS_peer_host), bulk_options.listen_address,
                                       memory_bulk->port(), Hostname()));
  }
  registration.set_storage_root_mounted(absl::GetFlag(FLAGS_storage_root_mounted));
  registration.set_has_gpu(gpu);
  registration.set_memory_tier(memory_on);
  registration.set_copies_when_pinned(true);  // SaveCore follows PinCommand.copy_when_pinned
  registration.set_writes_when_staged(true);  // and PinCommand.write_when_staged (R13)
  registration.set_relays_commands(true);     // CommandRelayer + CommandRelayService

  tessera::LifelineOptions lifeline_options;
  if (memory_on) {
    lifeline_options.fill_heartbeat = [&executor, &memory_tier,
                                       &buddy_store](tessera::v1::HeartbeatRequest& request) {
      // The last commit handled first: once it is named, the tier has what it kept of it
      // (SaveExecutor::LastCommittedSession), so the coordinator never reads "none" early.
      request.set_last_committed_session(executor.LastCommittedSession());
      if (std::optional<tessera::v1::MemoryCopy> own = memory_tier.CurrentCopy()) {
        *request.mutable_resident() = *std::move(own);
      }
      for (tessera::v1::MemoryCopy& held : buddy_store.Copies()) {
        *request.add_buddy_copies() = std::move(held);
      }
    };
    lifeline_options.on_heartbeat = [&replicator](const tessera::v1::HeartbeatResponse& reply) {
      replicator->SetBuddy(reply.has_buddy() ? std::optional(reply.buddy()) : std::nullopt);
    };
  }
  lifeline_options.on_lease_changed = [&executor] { executor.LeaseMayHaveChanged(); };
  const std::string own_storage_root = absl::GetFlag(FLAGS_storage_root);
  lifeline_options.on_registered = [&](const tessera::v1::RegisterAgentResponse& response) {
    // Before anything that might make a peer call this agent (the heartbeats that follow).
    keyring.Set(response.peer_secret());
    if (absl::Status bad = tessera::CheckStorageRoot(own_storage_root, response.storage_root());
        !bad.ok()) {
      // No root: the save core refuses every path (R4) and the loader every load.
      tessera::LogError(bad.message());
      tessera::v1::RegisterAgentResponse rootless = response;
      rootless.clear_storage_root();
      loader.SetJobDir("");
      executor.OnRegistered(rootless);
      return;
    }
    loader.SetJobDir(tessera::JobDirPath(response.storage_root(), job));
    executor.OnRegistered(response);
  };
  tessera::Lifeline lifeline(&coordinator, registration, lifeline_options);
  lifeline_for_lease = &lifeline;

  // A relay's RelayFailed reports, one at a time on a thread of their own: each retries for up
  // to kRelayReportRetryFor while the coordinator is unreachable, which must not hold up the
  // next relayed command. Declared after the coordinator client they use and before the
  // relayer that posts them (so it is destroyed first; the pool then runs what it was given).
  tessera::ThreadPool relay_reports(1);
  // Passes commands with relay_to on to this node's other agents. Declared before the stream
  // that feeds it and after the coordinator client it reports to.
  tessera::CommandRelayerOptions relayer_options;
  relayer_options.channel_credentials = peer_options.channel_credentials;
  relayer_options.keyring = &keyring;
  tessera::CommandRelayer relayer(
      job, urank,
      [&relay_reports, &coordinator, &job, urank, incarnation](
          const std::string& session_id, uint64_t seq, std::vector<uint32_t> ranks) {
        tessera::v1::RelayFailedRequest request;
        request.set_job_id(job);
        request.set_rank(urank);
        request.set_incarnation(incarnation);
        request.set_session_id(session_id);
        request.set_seq(seq);
        for (uint32_t r : ranks) request.add_ranks(r);
        relay_reports.Post([&coordinator, request = std::move(request)] {
          tessera::Backoff backoff;
          const absl::Status reported = tessera::ReportRelayFailed(
              coordinator, request, absl::Now() + kRelayReportRetryFor, backoff,
              *tessera::RealClock::Get(), [](absl::Duration d) { absl::SleepFor(d); });
          if (reported.ok()) {
            tessera::LogInfo("reported ", request.ranks_size(), " rank(s) the relay of session ",
                             request.session_id(), " seq ", request.seq(),
                             " missed: the coordinator sends them the command");
          } else {
            tessera::LogWarning("could not report ", request.ranks_size(),
                                " rank(s) the relay of session ", request.session_id(), " seq ",
                                request.seq(), " missed: ", reported.ToString());
          }
        });
      },
      relayer_options);

  tessera::v1::CommandsRequest commands;
  commands.set_job_id(job);
  commands.set_rank(urank);
  commands.set_incarnation(incarnation);
  tessera::CommandStream stream(
      coordinator.stub(), &lifeline, commands,
      [&relayer, &executor](const tessera::v1::Command& c) {
        relayer.Forward(c);  // returns at once: the relay runs on the relayer's thread
        executor.OnCommand(c);
      },
      [&executor] { executor.OnStreamConnected(); });

  // The trainer's endpoint.
  std::string socket = absl::GetFlag(FLAGS_socket);
  if (socket.empty()) socket = absl::StrCat("/tmp/tessera/", job, "/agent-", rank, ".sock");
  constexpr size_t kMaxUnixPath = sizeof(sockaddr_un::sun_path) - 1;
  if (socket.size() > kMaxUnixPath) {
    return Fail(absl::StrCat("--socket path is ", socket.size(), " bytes; unix sockets allow ",
                             kMaxUnixPath, ": choose a shorter path"));
  }
  std::error_code ec;
  // A directory this agent makes for its socket is its user's alone (0700).
  const std::filesystem::path socket_dir = std::filesystem::path(socket).parent_path();
  if (!socket_dir.empty() && !std::filesystem::exists(socket_dir, ec)) {
    std::filesystem::create_directories(socket_dir, ec);
    std::filesystem::permissions(socket_dir, std::filesystem::perms::owner_all,
                                 std::filesystem::perm_options::replace, ec);
  }
  std::filesystem::remove(socket, ec);
  tessera::v1::AgentIdentity identity;
  identity.set_job_id(job);
  *identity.mutable_coord() = registration.coord();
  *identity.mutable_layout() = *layout;
  identity.set_has_gpu(gpu);
  identity.set_coordinator(absl::GetFlag(FLAGS_coordinator));
  // With the memory tier saves alternate between two sets of regions: reserve both.
  tessera::TrainerServiceOptions trainer_options;
  // UNAVAILABLE until registered, naming the coordinator's refusal if it refuses this agent
  // (another layout than the job's ...): a trainer never works with an agent the job refused.
  trainer_options.admission = [&lifeline] { return lifeline.Admission(); };
  // A client's refusal of its own tensors goes to the coordinator, which aborts the step's
  // save for every rank with it (coordinator.proto SubmitLocalPlanRequest.refusal).
  trainer_options.refuse_save = [&coordinator, &job, urank,
                                 incarnation](const tessera::v1::RefuseSaveRequest& refused) {
    tessera::v1::SubmitLocalPlanRequest request;
    request.set_job_id(job);
    request.set_rank(urank);
    request.set_incarnation(incarnation);
    request.set_step(refused.step());
    *request.mutable_refusal() = refused.error();
    tessera::LogWarning("the trainer refused its tensors for step ", refused.step(), ": ",
                        refused.error().message());
    return coordinator.SubmitLocalPlan(request).status();
  };
  tessera::TrainerService trainer(&executor, &loader, identity, save_pool->get(),
                                  memory_on ? 2 : 1, memory, std::move(trainer_options));
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + socket, grpc::InsecureServerCredentials());
  builder.SetMaxReceiveMessageSize(256 << 20);
  builder.RegisterService(&trainer);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) return Fail(absl::StrCat("cannot listen on unix:", socket));
  // Only this user may connect (connecting needs write permission on the socket): the
  // trainer's endpoint maps the job's staging, which holds its model and optimizer state.
  if (chmod(socket.c_str(), 0600) != 0) {
    return Fail(absl::StrCat("cannot make ", socket, " its user's alone (chmod 0600): ",
                             std::strerror(errno)));
  }

  tessera::LogInfo("starting for job ", job, " at ", mesh->CoordString(urank), ", coordinator ",
                   absl::GetFlag(FLAGS_coordinator), ", trainer socket ", socket, ", peers on ",
                   registration.peer_address(), gpu ? ", GPU" : ", no GPU");
  lifeline.Start();
  stream.Start();

  std::thread watcher([&lifeline] {
    if (lifeline.WaitTerminal(absl::InfiniteDuration()) == tessera::Lifeline::State::kSuperseded) {
      tessera::LogError("exiting: superseded");
      std::_Exit(3);
    }
  });
  int signal_number = tessera::WaitForTerminationSignal();
  tessera::LogInfo("received signal ", signal_number, "; stopping after ", lifeline.heartbeats_ok(),
                   " heartbeats");
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  server->Wait();
  stream.Stop();
  relay_service.Stop();
  executor.Shutdown();
  lifeline.Stop();
  watcher.join();
  std::filesystem::remove(socket, ec);
  tessera::LogInfo("stopped");
  return 0;
}
