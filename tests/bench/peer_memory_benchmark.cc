// Restoring from a buddy, without the rest of a load: a 256 MiB resident copy read over 1, 2
// and 4 connections with PeerMemory.ReadMemoryCopy (second argument 1: new connections for
// every read, as a load makes them; 0: kept) and over the bulk port (agent/memory_bulk.h, new
// connections every read), against the physical limit on the same machine in the same run —
// plain loopback TCP sockets moving the same bytes from memory into a preallocated buffer over
// as many connections (the kernel's two copies, nothing else; tests/bench/loopback_link.h).
// Server and client share this process, as two agents share a node's cores. The destination is
// faulted in once, so page faults are not measured. BM_PutMemoryCopy compares the two ways of
// replicating a copy to a buddy (gRPC against the bulk port). BM_FetchVerified is a lost node's
// trainer reading the same copy itself (client/peer_fetch.h): what has arrived (up to 1 MiB a
// time) received straight into the destination and hashed there, every 4 MiB block checked —
// held to the same sockets with the receivers hashing what arrives (BM_LoopbackTcp/n/1).
//
//   bazel run -c opt //tests/bench:peer_memory_benchmark
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "agent/buddy_store.h"
#include "agent/memory_bulk.h"
#include "agent/memory_tier.h"
#include "agent/peer_memory.h"
#include "benchmark/benchmark.h"
#include "client/peer_fetch.h"
#include "common/checksum.h"
#include "grpcpp/grpcpp.h"
#include "tests/bench/loopback_link.h"

namespace tessera {
namespace {

constexpr uint64_t kBytes = uint64_t{256} << 20;

std::shared_ptr<std::string> Payload() {
  static auto payload = std::make_shared<std::string>(kBytes, '\x5a');
  return payload;
}

// A tier holding the payload as its own copy of step 7, and that copy as a reader names it.
void PublishPayload(MemoryTier& tier) {
  std::shared_ptr<std::string> payload = Payload();
  tier.Publish(
      ResidentCheckpoint{7, "s7", "data-00000", 0, payload->size(),
                         ResidentRegion{"/bench", payload->data(), payload->size(), payload}});
}

v1::MemoryCopy PayloadCopy() {
  v1::MemoryCopy copy;
  copy.set_step(7);
  copy.set_session_id("s7");
  copy.set_file("data-00000");
  copy.set_nbytes(kBytes);
  return copy;
}

// `service` served on a free loopback port (*port).
std::unique_ptr<grpc::Server> ServeOnLoopback(PeerMemoryService* service, int* port) {
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), port);
  builder.RegisterService(service);
  return builder.BuildAndStart();
}

// Job "job" and a secret, as its agents hold it.
PeerCredential BenchCredential() {
  return PeerCredential{"job", JobPeerSecret(std::string(kPeerSecretBytes, 'b'), "job")};
}

// The agents' keyring holding BenchCredential(), which every port checks.
const PeerKeyring* BenchKeyring() {
  static PeerKeyring* keyring = [] {
    auto* k = new PeerKeyring("job");
    k->Set(BenchCredential().secret);
    return k;
  }();
  return keyring;
}

// PeerMemoryService's options with the job's keyring.
PeerMemoryServiceOptions BenchServiceOptions() {
  PeerMemoryServiceOptions options;
  options.keyring = BenchKeyring();
  return options;
}

// A bulk port on loopback for job "job" over `tier` and `store`.
absl::StatusOr<std::unique_ptr<MemoryBulkServer>> BulkOnLoopback(const MemoryTier& tier,
                                                                 BuddyStore& store) {
  MemoryBulkServerOptions options;
  options.listen_address = "127.0.0.1:0";
  return MemoryBulkServer::Start(BenchKeyring(), &tier, &store, options);
}

// The destination, faulted in once: the benchmark measures the transfer, not page faults.
char* Dest() {
  static std::string* dest = new std::string(kBytes, '\0');
  return dest->data();
}

void BM_ReadMemoryCopy(benchmark::State& state) {
  MemoryTier tier;
  BuddyStore store(0);
  PublishPayload(tier);
  PeerMemoryService service("job", &tier, &store, BenchServiceOptions());
  int port = 0;
  std::unique_ptr<grpc::Server> server = ServeOnLoopback(&service, &port);
  auto connect = [&] {
    return MemoryCopyChannels("127.0.0.1:" + std::to_string(port),
                              grpc::InsecureChannelCredentials(), static_cast<int>(state.range(0)));
  };
  std::vector<std::shared_ptr<grpc::Channel>> channels = connect();
  const v1::MemoryCopy copy = PayloadCopy();
  for (auto _ : state) {
    if (state.range(1)) channels = connect();  // cold: new connections, as a load makes
    absl::Status status =
        ReadMemoryCopy(channels, BenchCredential(), copy, Dest(), absl::Minutes(1));
    if (!status.ok()) state.SkipWithError(status.ToString().c_str());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kBytes));
  server->Shutdown();
}
BENCHMARK(BM_ReadMemoryCopy)
    ->ArgsProduct({{1, 2, 4}, {0, 1}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// The bulk port (agent/memory_bulk.h): the same read over plain TCP connections, new ones for
// every read (as a load makes them), each received straight into its part of the destination.
// The holder of the payload, serving it on a bulk port: the reader's side of each bulk read.
struct PayloadHolder {
  MemoryTier tier;
  BuddyStore store{0};
  std::unique_ptr<MemoryBulkServer> server;
  v1::MemoryCopy copy;  // the payload, as a reader names it (bulk_address set)

  // Starts the port; false (the benchmark skipped, saying why) if it cannot listen.
  bool Start(benchmark::State& state) {
    PublishPayload(tier);
    absl::StatusOr<std::unique_ptr<MemoryBulkServer>> started = BulkOnLoopback(tier, store);
    if (!started.ok()) {
      state.SkipWithError(started.status().ToString().c_str());
      return false;
    }
    server = *std::move(started);
    copy = PayloadCopy();
    copy.set_bulk_address("127.0.0.1:" + std::to_string(server->port()));
    return true;
  }
};

void BM_ReadMemoryCopyBulk(benchmark::State& state) {
  PayloadHolder holder;
  if (!holder.Start(state)) return;
  for (auto _ : state) {
    absl::Status status = ReadMemoryCopyBulk(holder.copy.bulk_address(), BenchCredential(), holder.copy, Dest(),
                                             absl::Minutes(1), static_cast<int>(state.range(0)));
    if (!status.ok()) state.SkipWithError(status.ToString().c_str());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kBytes));
}
BENCHMARK(BM_ReadMemoryCopyBulk)
    ->Arg(1)
    ->Arg(2)
    ->Arg(4)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// A lost node's trainer (client/peer_fetch.h): the same read over new connections to the bulk
// port, checked block by block as it lands, straight into the destination.
void BM_FetchVerified(benchmark::State& state) {
  PayloadHolder holder;
  if (!holder.Start(state)) return;
  std::vector<BlockCheck> blocks;
  const std::vector<uint64_t> sums = BlockChecksums(Payload()->data(), kBytes, kDefaultBlockSize);
  for (size_t b = 0; b < sums.size(); ++b) {
    const uint64_t at = b * kDefaultBlockSize;
    blocks.push_back(BlockCheck{at, std::min<uint64_t>(kDefaultBlockSize, kBytes - at), sums[b]});
  }
  const SlotCopy slot{Dest(), 0, kBytes};
  for (auto _ : state) {
    absl::StatusOr<VerifiedCopyResult> fetched =
        FetchVerified(BenchCredential(), holder.copy, {slot}, blocks, static_cast<int>(state.range(0)),
                      absl::Now() + absl::Minutes(1));
    if (!fetched.ok()) state.SkipWithError(fetched.status().ToString().c_str());
    if (fetched.ok() && !fetched->mismatched.empty()) state.SkipWithError("a block differs");
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kBytes));
}
BENCHMARK(BM_FetchVerified)->Arg(1)->Arg(2)->Arg(4)->UseRealTime()->Unit(benchmark::kMillisecond);

// Replicating to a buddy: the same 256 MiB put into a receiver's BuddyStore (a fresh buffer
// each time, as a buddy keeps each new copy), over PeerMemory.PutMemoryCopy (argument 0) and
// over the bulk port (argument 1).
void BM_PutMemoryCopy(benchmark::State& state) {
  MemoryTier tier;
  BuddyStore store(uint64_t{1} << 30);
  PeerMemoryService service("job", &tier, &store, BenchServiceOptions());
  int port = 0;
  std::unique_ptr<grpc::Server> server = ServeOnLoopback(&service, &port);
  absl::StatusOr<std::unique_ptr<MemoryBulkServer>> bulk = BulkOnLoopback(tier, store);
  if (server == nullptr || !bulk.ok()) {
    state.SkipWithError("cannot listen");
    return;
  }
  v1::MemoryBuddy buddy;
  buddy.set_peer_address("127.0.0.1:" + std::to_string(port));
  if (state.range(0) == 1) buddy.set_bulk_address("127.0.0.1:" + std::to_string((*bulk)->port()));
  v1::MemoryCopy copy = PayloadCopy();
  copy.set_writer_rank(1);
  for (auto _ : state) {
    absl::Status status = SendMemoryCopyToBuddy(BenchCredential(), buddy, copy, Payload()->data(),
                                                absl::Minutes(1), nullptr, nullptr);
    if (!status.ok()) state.SkipWithError(status.ToString().c_str());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kBytes));
  server->Shutdown();
}
BENCHMARK(BM_PutMemoryCopy)->Arg(0)->Arg(1)->UseRealTime()->Unit(benchmark::kMillisecond);

// Plain loopback TCP sockets (tests/bench/loopback_link.h, as figure 4m's baseline); second
// argument 1: each receiver also hashes what arrived, up to 1 MiB a time, right after it
// arrived — the limit of any reader that checks every byte it receives (BM_FetchVerified), on
// the same cores that make the loopback link's two copies.
void BM_LoopbackTcp(benchmark::State& state) {
  LoopbackTransfer transfer;
  transfer.streams = static_cast<int>(state.range(0));
  transfer.bytes_per_stream = kBytes / transfer.streams;
  transfer.src = Payload()->data();
  transfer.dst = Dest();
  transfer.check = state.range(1) != 0;
  for (auto _ : state) {
    absl::StatusOr<LoopbackResult> took = TimeLoopbackTransfer(transfer);
    if (!took.ok()) {
      state.SkipWithError(took.status().ToString().c_str());
      break;
    }
    state.SetIterationTime(absl::ToDoubleSeconds(took->elapsed));
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kBytes));
}
BENCHMARK(BM_LoopbackTcp)
    ->ArgsProduct({{1, 2, 4}, {0, 1}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace tessera

BENCHMARK_MAIN();
