// tessera-plan-flood: one job's large plan for a real tessera-coordinator, so that a test can
// save another job while this one plans (tests/faults/long_plan_test.sh).
//
// Registers one fake agent per rank of a pp x tp x dp mesh (default 4 x 8 x 32 = 1,024 ranks),
// heartbeats for all of them, and submits each rank's local plan of --shards_per_rank pieces
// shaped like a llama model under a distributed optimizer: every parameter a TP-split bf16
// matrix replicated over dp (every tenth a norm replicated over tp and dp), and three f32
// optimizer states as flat DP slices of it: the planning benchmarks' plans
// (server/testing/llama_plans.h).
// Validating the global plan takes the coordinator seconds on 2 cores.
//
// stderr, one line per event:
//   plan-flood: registered N agents
//   plan-flood: all N plans submitted: session S
// Then it keeps heartbeating (no command streams: the job's PIN waits for agents that never
// read it) until it is killed or --hold_s passes. Exit status 1 if a registration or a
// submission failed, else 0.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/layout.h"
#include "common/program.h"
#include "grpcpp/grpcpp.h"
#include "server/testing/llama_plans.h"
#include "tessera/v1/coordinator.grpc.pb.h"

ABSL_FLAG(std::string, coordinator, "", "host:port of the tessera-coordinator; required");
ABSL_FLAG(std::string, job, "planflood", "job id");
ABSL_FLAG(int64_t, step, 1, "step of the save");
ABSL_FLAG(int32_t, pp, 4, "pipeline degree");
ABSL_FLAG(int32_t, tp, 8, "tensor-parallel degree (divides 1024)");
ABSL_FLAG(int32_t, dp, 32, "data-parallel degree (divides 4096 / tp)");
ABSL_FLAG(int32_t, shards_per_rank, 1000, "pieces per rank (rounded up to a multiple of 4)");
ABSL_FLAG(int32_t, threads, 2,
          "threads that register and submit (more starve the heartbeats on 2 cores)");
ABSL_FLAG(int32_t, channels, 16, "gRPC connections the fake agents share");
ABSL_FLAG(int32_t, hold_s, 300, "keep heartbeating this long after submitting, at most");

namespace tessera {
namespace {

// Runs fn(i) for i in [0, n) on `threads` threads.
template <typename Fn>
void ParallelFor(int n, int threads, Fn fn) {
  std::atomic<int> next{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < std::max(1, threads); ++t) {
    pool.emplace_back([&] {
      for (int i = next++; i < n; i = next++) fn(i);
    });
  }
  for (std::thread& t : pool) t.join();
}

grpc::Status Call(absl::Duration timeout,
                  const std::function<grpc::Status(grpc::ClientContext*)>& call) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  return call(&context);
}

int Main() {
  const std::string target = absl::GetFlag(FLAGS_coordinator);
  if (target.empty()) {
    std::fprintf(stderr, "tessera-plan-flood: --coordinator is required\n");
    return 2;
  }
  const std::string job = absl::GetFlag(FLAGS_job);
  const int threads = absl::GetFlag(FLAGS_threads);
  absl::StatusOr<v1::Layout> layout =
      ParseLayoutSpec(absl::StrCat("pp=", absl::GetFlag(FLAGS_pp), ",tp=", absl::GetFlag(FLAGS_tp),
                                   ",dp=", absl::GetFlag(FLAGS_dp)));
  if (!layout.ok()) {
    std::fprintf(stderr, "tessera-plan-flood: %s\n", layout.status().ToString().c_str());
    return 2;
  }
  absl::StatusOr<MeshLayout> mesh = MeshLayout::FromProto(*layout);
  if (!mesh.ok()) {
    std::fprintf(stderr, "tessera-plan-flood: %s\n", mesh.status().ToString().c_str());
    return 2;
  }
  const int world = static_cast<int>(mesh->world_size());
  const int params = (absl::GetFlag(FLAGS_shards_per_rank) + 3) / 4;

  std::vector<std::unique_ptr<v1::Coordinator::Stub>> stubs;
  for (int c = 0; c < std::max(1, absl::GetFlag(FLAGS_channels)); ++c) {
    grpc::ChannelArguments args;
    args.SetInt("tessera.plan_flood.channel", c);  // distinct args: distinct connections
    args.SetMaxSendMessageSize(256 << 20);
    stubs.push_back(v1::Coordinator::NewStub(
        grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args)));
  }
  auto stub = [&](int rank) { return stubs[rank % stubs.size()].get(); };
  // Heartbeats on connections of their own, never queued behind a plan of megabytes.
  std::vector<std::unique_ptr<v1::Coordinator::Stub>> beat_stubs;
  for (int c = 0; c < 4; ++c) {
    grpc::ChannelArguments args;
    args.SetInt("tessera.plan_flood.heartbeat_channel", c);
    beat_stubs.push_back(v1::Coordinator::NewStub(
        grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args)));
  }
  auto incarnation = [](int rank) { return 0x9a7f100d00000000ull + rank; };

  absl::Mutex mu;
  std::string error;  // the first failure
  auto failed = [&](int rank, const char* what, const grpc::Status& s) {
    absl::MutexLock lock(&mu);
    if (error.empty()) error = absl::StrCat("rank ", rank, ": ", what, ": ", s.error_message());
  };

  std::atomic<uint32_t> heartbeat_ms{1000};
  ParallelFor(world, threads, [&](int r) {
    v1::RegisterAgentRequest request;
    request.set_job_id(job);
    request.mutable_coord()->set_rank(r);
    for (uint32_t c : mesh->Coords(r)) request.mutable_coord()->add_index(c);
    *request.mutable_layout() = *layout;
    request.set_incarnation(incarnation(r));
    request.set_node_id(absl::StrCat("floodnode-", r / 8));
    request.set_peer_address(absl::StrCat("127.0.0.1:", 20000 + r));
    request.set_storage_root_mounted(true);
    v1::RegisterAgentResponse response;
    grpc::Status s = Call(absl::Seconds(60), [&](grpc::ClientContext* ctx) {
      return stub(r)->RegisterAgent(ctx, request, &response);
    });
    if (!s.ok()) failed(r, "RegisterAgent", s);
    if (response.heartbeat_interval_ms() > 0) heartbeat_ms = response.heartbeat_interval_ms();
  });
  if (!error.empty()) {
    std::fprintf(stderr, "plan-flood: %s\n", error.c_str());
    return 1;
  }
  std::fprintf(stderr, "plan-flood: registered %d agents\n", world);

  std::atomic<bool> stop{false};
  std::atomic<int> beats_failed{0};
  std::atomic<int64_t> slowest_round_ms{0};
  std::thread heartbeats([&] {
    while (!stop) {
      const absl::Time start = absl::Now();
      const absl::Time next = start + absl::Milliseconds(heartbeat_ms.load());
      ParallelFor(world, 8, [&](int r) {
        v1::HeartbeatRequest request;
        request.set_job_id(job);
        request.set_rank(r);
        request.set_incarnation(incarnation(r));
        v1::HeartbeatResponse response;
        grpc::Status s = Call(absl::Seconds(30), [&](grpc::ClientContext* ctx) {
          return beat_stubs[r % beat_stubs.size()]->Heartbeat(ctx, request, &response);
        });
        if (!s.ok()) ++beats_failed;  // a missed beat is covered by the lease
      });
      const int64_t took = absl::ToInt64Milliseconds(absl::Now() - start);
      if (took > slowest_round_ms) slowest_round_ms = took;
      while (!stop && absl::Now() < next) absl::SleepFor(absl::Milliseconds(20));
    }
  });

  std::string session;
  ParallelFor(world, threads, [&](int r) {
    v1::SubmitLocalPlanRequest request;
    request.set_job_id(job);
    request.set_rank(r);
    request.set_incarnation(incarnation(r));
    request.set_step(absl::GetFlag(FLAGS_step));
    for (v1::ShardDesc& s : LlamaRankShards(*mesh, r, params)) {
      *request.add_shards() = std::move(s);
    }
    v1::SubmitLocalPlanResponse response;
    grpc::Status s = Call(absl::Seconds(300), [&](grpc::ClientContext* ctx) {
      return stub(r)->SubmitLocalPlan(ctx, request, &response);
    });
    if (!s.ok()) failed(r, "SubmitLocalPlan", s);
    absl::MutexLock lock(&mu);
    if (session.empty()) session = response.session_id();
  });
  int rc = 0;
  if (!error.empty()) {
    std::fprintf(stderr, "plan-flood: %s\n", error.c_str());
    rc = 1;
  } else {
    std::fprintf(stderr,
                 "plan-flood: all %d plans submitted: session %s (heartbeats: %d failed, "
                 "slowest round of %d %lld ms)\n",
                 world, session.c_str(), beats_failed.load(), world,
                 static_cast<long long>(slowest_round_ms.load()));
    absl::SleepFor(absl::Seconds(absl::GetFlag(FLAGS_hold_s)));  // heartbeating until killed
  }
  stop = true;
  heartbeats.join();
  return rc;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  tessera::InitProgram(
      "registers the fake agents of a large mesh and submits their plans to a real "
      "coordinator, then heartbeats until killed.\n\nUsage: tessera-plan-flood "
      "--coordinator=HOST:PORT [flags]",
      argc, argv);
  return tessera::Main();
}
