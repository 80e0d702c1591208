// Local plans of a llama-like model under pp × tp × dp with a distributed optimizer, at any
// scale: the input of the planning benchmarks (server/plan/planner_benchmark.cc, the library; and
// tests/bench/plan_load.cc, the real coordinator over gRPC), so both measure the same plans.
//
// Each pipeline stage holds `params_per_stage` parameters (bf16): every tenth a 4,096-element
// norm weight replicated over tp and dp, the others 1,024·k × 4,096 matrices split over tp on
// dim 0 or dim 1 (column- or row-parallel) and replicated over dp. Each parameter has three
// f32 optimizer states (exp_avg, exp_avg_sq, fp32_param) as flat-range slices over dp, so a
// rank holds 4 × params_per_stage pieces.
#ifndef TESSERA_SERVER_TESTING_LLAMA_PLANS_H_
#define TESSERA_SERVER_TESTING_LLAMA_PLANS_H_

#include <cstdint>
#include <vector>

#include "common/layout.h"
#include "tessera/v1/types.pb.h"

namespace tessera {

// The shards rank `rank` of `layout` holds. `layout` must have exactly the dims pp, tp, dp in
// that order, tp dividing 1,024 and dp dividing 4,096 / tp (so every slice is whole).
std::vector<v1::ShardDesc> LlamaRankShards(const MeshLayout& layout, uint32_t rank,
                                           int params_per_stage);

}  // namespace tessera

#endif  // TESSERA_SERVER_TESTING_LLAMA_PLANS_H_
