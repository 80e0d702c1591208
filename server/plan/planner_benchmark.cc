// The planner at DESIGN.md's target scale: 1,024 ranks (pp=4, tp=8, dp=32) x 1,000 shards.
//
// Each pipeline stage holds 250 parameters. Every rank holds, per parameter, its TP shard
// (replicated over dp) and three distributed-optimizer states (exp_avg, exp_avg_sq,
// fp32_param) as flat DP slices of that shard; every tenth parameter is a norm weight
// replicated over dp and tp, whose optimizer slices are replicated over tp. So the plan has
// 1,024,000 pieces, 4,000 tensor keys, 29,200 chunks (three quarters gathered from 32 slices),
// about 250,000 replica hashes and 680,000 slice sends.
//
// Prints the time of a first plan (BuildGlobalPlan, which includes the fingerprint), of a
// cached plan (FingerprintPlans over every shard + PlanCache::Lookup; and the coordinator's
// path, CombineFingerprints of per-rank fingerprints taken when the plans arrived + Lookup),
// then the process's peak RSS. DESIGN.md's targets: first plan < 2 s and < 1 GiB; cached
// plan < 50 ms. Wall ("Time") and process CPU time are both shown: on a shared machine the
// first is inflated by other processes.
//
//   bazel run //server/plan:planner_benchmark
#include <sys/resource.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "server/plan/fingerprint.h"
#include "server/plan/plan_cache.h"
#include "server/plan/planner.h"
#include "server/testing/llama_plans.h"

namespace tessera {
namespace {

constexpr uint32_t kPp = 4, kTp = 8, kDp = 32;
constexpr int kParamsPerStage = 250;

MeshLayout BenchLayout() {
  v1::Layout proto;
  for (auto [name, degree] :
       {std::pair<const char*, uint32_t>{"pp", kPp}, {"tp", kTp}, {"dp", kDp}}) {
    v1::MeshDim* dim = proto.add_dims();
    dim->set_name(name);
    dim->set_degree(degree);
  }
  return *MeshLayout::FromProto(proto);
}

std::vector<LocalPlan> BenchPlans(const MeshLayout& layout) {
  std::vector<LocalPlan> plans(layout.world_size());
  for (uint32_t rank = 0; rank < layout.world_size(); ++rank) {
    plans[rank].rank = rank;
    plans[rank].shards = LlamaRankShards(layout, rank, kParamsPerStage);
  }
  return plans;
}

long PeakRssMiB() {
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss / 1024;  // KiB on Linux
}

struct Fixture {
  MeshLayout layout = BenchLayout();
  std::vector<LocalPlan> plans = BenchPlans(layout);
  long input_rss_mib = PeakRssMiB();
};

Fixture& GetFixture() {
  static Fixture* fixture = new Fixture();
  return *fixture;
}

void BM_FirstPlan(benchmark::State& state) {
  Fixture& f = GetFixture();
  size_t pieces = 0;
  for (const LocalPlan& p : f.plans) pieces += p.shards.size();
  size_t chunks = 0, assignment_bytes = 0;
  for (auto _ : state) {
    absl::StatusOr<GlobalPlan> plan = BuildGlobalPlan(f.layout, f.plans);
    if (!plan.ok()) {
      state.SkipWithError(std::string(plan.status().message()).c_str());
      return;
    }
    chunks = 0;
    for (const v1::TensorEntry& t : plan->tensors) chunks += t.chunks_size();
    assignment_bytes = 0;
    for (const std::string& a : plan->assignments) assignment_bytes += a.size();
  }
  state.counters["pieces"] = pieces;
  state.counters["chunks"] = chunks;
  // What the PINs carry (and the plan record stores): the encoded assignments.
  state.counters["assignments_MB"] = assignment_bytes / 1e6;
  state.counters["peak_rss_MiB"] = PeakRssMiB();
}
BENCHMARK(BM_FirstPlan)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3)
    ->MeasureProcessCPUTime()
    ->UseRealTime();

void BM_CachedPlan(benchmark::State& state) {
  Fixture& f = GetFixture();
  PlanCache cache;
  {
    absl::StatusOr<GlobalPlan> plan = BuildGlobalPlan(f.layout, f.plans);
    if (!plan.ok()) {
      state.SkipWithError(std::string(plan.status().message()).c_str());
      return;
    }
    cache.Insert("job", std::make_shared<const GlobalPlan>(*std::move(plan)));
  }
  for (auto _ : state) {
    std::shared_ptr<const GlobalPlan> hit =
        cache.Lookup("job", FingerprintPlans(f.layout, f.plans));
    if (hit == nullptr) {
      state.SkipWithError("cache miss");
      return;
    }
    benchmark::DoNotOptimize(hit.get());
  }
}
BENCHMARK(BM_CachedPlan)
    ->Unit(benchmark::kMillisecond)
    ->MinTime(1.0)
    ->MeasureProcessCPUTime()
    ->UseRealTime();

// The coordinator's path: each rank's fingerprint is computed when its plan arrives, so a
// save only combines 1,024 numbers and looks the plan up.
void BM_CachedPlanFromRankFingerprints(benchmark::State& state) {
  Fixture& f = GetFixture();
  std::vector<uint64_t> per_rank;
  for (const LocalPlan& p : f.plans) per_rank.push_back(FingerprintLocalPlan(p));
  PlanCache cache;
  auto plan = std::make_shared<GlobalPlan>();
  plan->fingerprint = FingerprintPlans(f.layout, f.plans);
  cache.Insert("job", plan);
  for (auto _ : state) {
    std::shared_ptr<const GlobalPlan> hit =
        cache.Lookup("job", CombineFingerprints(f.layout, per_rank));
    if (hit == nullptr) {
      state.SkipWithError("cache miss");
      return;
    }
    benchmark::DoNotOptimize(hit.get());
  }
}
BENCHMARK(BM_CachedPlanFromRankFingerprints)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  std::printf("peak RSS: %ld MiB (of which the 1,024 local plans: %ld MiB)\n",
              tessera::PeakRssMiB(), tessera::GetFixture().input_rss_mib);
  return 0;
}
