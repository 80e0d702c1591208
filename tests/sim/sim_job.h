// SimJob: what the simulated trainers save — a small job of 1-D tensors whose every byte is a
// pure function of (tensor key, step, byte offset), so the simulation can tell exactly what a
// committed checkpoint must hold.
//
// Layouts (by world size):
//   1 rank   "dp=1": a weight, a bias, optimizer state, an extra.
//   2 ranks  "dp=2": a weight replicated over dp (hashed), a bias sharded over dp (FSDP-like,
//            uneven), AdamW state of the weight sliced over dp (gathered by a DP leader), an
//            extra per rank.
//   4 ranks  "tp=2,dp=2": a weight sharded over tp and replicated over dp, a norm replicated
//            over both, the weight's optimizer state sliced over dp within each tp shard.
#ifndef TESSERA_TESTS_SIM_SIM_JOB_H_
#define TESSERA_TESTS_SIM_SIM_JOB_H_

#include <cstdint>
#include <string>
#include <vector>

#include "tessera/v1/types.pb.h"

namespace tessera::sim {

struct SimJob {
  std::string layout_spec;       // "tp=2,dp=2"
  uint32_t world = 0;
  // The shards each rank holds at a step (the same at every step).
  std::vector<std::vector<v1::ShardDesc>> shards;
};

// The job for `world` ranks (1, 2 or 4). `dp_sliced_state`: the optimizer state is flattened
// and sliced over dp (a distributed optimizer: ranks exchange slices at GATHER); without it
// the job holds no optimizer state, so no rank exchanges anything (PinCommand
// .write_when_staged applies to every rank).
SimJob MakeSimJob(uint32_t world, bool dp_sliced_state = true);

// The byte at `offset` of tensor `key` at `step`.
uint8_t ExpectedByte(const std::string& key, int64_t step, uint64_t offset);

// Fills `out[0, n)` with the bytes of `shard` (its box, or its flat range of the box) at
// `step`, as the trainer of `rank` stages them. Extras are per rank.
void FillShard(const v1::ShardDesc& shard, uint32_t rank, int64_t step, uint8_t* out);

}  // namespace tessera::sim

#endif  // TESSERA_TESTS_SIM_SIM_JOB_H_
