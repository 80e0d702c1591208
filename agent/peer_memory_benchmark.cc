// Restoring from a buddy, without the rest of a load: a 256 MiB resident copy read over 1, 2
// and 4 connections with PeerMemory.ReadMemoryCopy (second argument 1: new connections for
// every read, as a load makes them; 0: kept) and over the bulk port (agent/memory_bulk.h, new
// connections every read), against the physical limit on the same machine in the same run —
// plain loopback TCP sockets moving the same bytes from memory into a preallocated buffer over
// as many connections (the kernel's two copies, nothing else). Server and client share this
// process, as two agents share a node's cores. The destination is faulted in once, so page
// faults are not measured. BM_PutMemoryCopy compares the two ways of replicating a copy to a
// buddy (gRPC against the bulk port). BM_FetchVerified is a lost node's trainer reading the
// same copy itself (client/peer_fetch.h): what has arrived (up to 1 MiB a time) received
// straight into the destination and hashed there, every 4 MiB block checked.
//
//   bazel run -c opt //agent:peer_memory_benchmark
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "agent/buddy_store.h"
#include "agent/memory_bulk.h"
#include "agent/memory_tier.h"
#include "agent/peer_memory.h"
#include "benchmark/benchmark.h"
#include "client/peer_fetch.h"
#include "common/checksum.h"
#include "grpcpp/grpcpp.h"

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

// A bulk port on loopback for job "job" over `tier` and `store`.
absl::StatusOr<std::unique_ptr<MemoryBulkServer>> BulkOnLoopback(const MemoryTier& tier,
                                                                 BuddyStore& store) {
  MemoryBulkServerOptions options;
  options.listen_address = "127.0.0.1:0";
  return MemoryBulkServer::Start("job", &tier, &store, options);
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
  PeerMemoryService service("job", &tier, &store);
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
    absl::Status status = ReadMemoryCopy(channels, "job", copy, Dest(), absl::Minutes(1));
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
    absl::Status status = ReadMemoryCopyBulk(holder.copy.bulk_address(), "job", holder.copy, Dest(),
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
        FetchVerified("job", holder.copy, {slot}, blocks, static_cast<int>(state.range(0)),
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
  PeerMemoryService service("job", &tier, &store);
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
    absl::Status status = SendMemoryCopyToBuddy("job", buddy, copy, Payload()->data(),
                                                absl::Minutes(1), nullptr, nullptr);
    if (!status.ok()) state.SkipWithError(status.ToString().c_str());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kBytes));
  server->Shutdown();
}
BENCHMARK(BM_PutMemoryCopy)->Arg(0)->Arg(1)->UseRealTime()->Unit(benchmark::kMillisecond);

void BM_LoopbackTcp(benchmark::State& state) {
  const int streams = static_cast<int>(state.range(0));
  const uint64_t per_stream = kBytes / streams;
  const char* payload = Payload()->data();
  for (auto _ : state) {
    int listener = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
    listen(listener, streams);
    std::vector<std::thread> threads;
    for (int i = 0; i < streams; ++i) {
      threads.emplace_back([&addr, payload, per_stream, i] {
        int s = socket(AF_INET, SOCK_STREAM, 0);
        connect(s, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
        for (uint64_t sent = 0; sent < per_stream;) {
          ssize_t n = send(s, payload + i * per_stream + sent, per_stream - sent, 0);
          if (n <= 0) break;
          sent += n;
        }
        close(s);
      });
      int conn = accept(listener, nullptr, nullptr);
      threads.emplace_back([conn, per_stream, i] {
        char* dest = Dest() + i * per_stream;
        for (uint64_t got = 0; got < per_stream;) {
          ssize_t n = recv(conn, dest + got, per_stream - got, 0);
          if (n <= 0) break;
          got += n;
        }
        close(conn);
      });
    }
    for (std::thread& t : threads) t.join();
    close(listener);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kBytes));
}
BENCHMARK(BM_LoopbackTcp)->Arg(1)->Arg(2)->Arg(4)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace tessera

BENCHMARK_MAIN();
