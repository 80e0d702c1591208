#include "tests/sim/sim_job.h"

#include <string>
#include <utility>

#include "common/dtype.h"
#include "common/tensor_key.h"
#include "xxhash.h"

namespace tessera::sim {
namespace {

v1::ShardDesc Piece(const std::string& fqn, int64_t size, int64_t offset, int64_t length,
                    std::vector<std::string> replicated_over) {
  v1::ShardDesc s;
  s.set_fqn(fqn);
  s.set_kind(v1::SHARD_KIND_PARAM);
  s.set_dtype(v1::DTYPE_F32);
  s.add_global_shape(size);
  s.mutable_box()->add_offsets(offset);
  s.mutable_box()->add_lengths(length);
  for (std::string& dim : replicated_over) s.add_replicated_over(std::move(dim));
  s.set_nbytes(length * 4);
  return s;
}

// Optimizer state `key` of the piece at [offset, offset + length): its flat range [b, e).
v1::ShardDesc Slice(v1::ShardDesc piece, const std::string& state_key, int64_t b, int64_t e) {
  piece.set_kind(v1::SHARD_KIND_OPTIMIZER);
  piece.set_state_key(state_key);
  piece.mutable_flat_range()->set_begin(b);
  piece.mutable_flat_range()->set_end(e);
  piece.set_nbytes((e - b) * 4);
  return piece;
}

v1::ShardDesc Extra(const std::string& fqn, int64_t bytes) {
  v1::ShardDesc s;
  s.set_fqn(fqn);
  s.set_kind(v1::SHARD_KIND_EXTRA);
  s.set_dtype(v1::DTYPE_U8);
  s.add_global_shape(bytes);
  s.mutable_box()->add_offsets(0);
  s.mutable_box()->add_lengths(bytes);
  s.set_nbytes(bytes);
  return s;
}

}  // namespace

SimJob MakeSimJob(uint32_t world, bool dp_sliced_state) {
  SimJob job;
  job.world = world;
  job.shards.resize(world);
  if (world == 1) {
    job.layout_spec = "dp=1";
    auto& s = job.shards[0];
    s.push_back(Piece("w", 96, 0, 96, {"dp"}));
    s.push_back(Piece("b", 24, 0, 24, {"dp"}));
    if (dp_sliced_state) s.push_back(Slice(Piece("w", 96, 0, 96, {"dp"}), "exp_avg", 0, 96));
    s.push_back(Extra("rng", 16));
  } else if (world == 2) {
    job.layout_spec = "dp=2";
    for (uint32_t r = 0; r < 2; ++r) {
      auto& s = job.shards[r];
      s.push_back(Piece("w", 96, 0, 96, {"dp"}));  // replicated: one writes, one hashes
      // FSDP-like uneven shards of the bias: 13 and 11 elements.
      s.push_back(r == 0 ? Piece("b", 24, 0, 13, {}) : Piece("b", 24, 13, 11, {}));
      // The weight's AdamW state, sliced over dp: gathered by a DP leader.
      if (dp_sliced_state) {
        s.push_back(Slice(Piece("w", 96, 0, 96, {"dp"}), "exp_avg", r * 40, r == 0 ? 40 : 96));
      }
      s.push_back(Extra("rng", 16));
    }
  } else {
    job.layout_spec = "tp=2,dp=2";  // rank = tp * 2 + dp
    for (uint32_t r = 0; r < 4; ++r) {
      const int64_t tp = r / 2, dp = r % 2;
      auto& s = job.shards[r];
      const v1::ShardDesc wq = Piece("wq", 64, tp * 32, 32, {"dp"});
      s.push_back(wq);
      s.push_back(Piece("norm", 8, 0, 8, {"tp", "dp"}));
      if (dp_sliced_state) s.push_back(Slice(wq, "exp_avg", dp * 16, dp * 16 + 16));
      s.push_back(Extra("rng", 8));
    }
  }
  return job;
}

uint8_t ExpectedByte(const std::string& key, int64_t step, uint64_t offset) {
  const uint64_t seed = XXH3_64bits(key.data(), key.size()) ^ (static_cast<uint64_t>(step) << 32);
  uint64_t x = seed + offset * 0x9E3779B97F4A7C15ull;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  return static_cast<uint8_t>(x);
}

void FillShard(const v1::ShardDesc& shard, uint32_t rank, int64_t step, uint8_t* out) {
  const std::string key = TensorKeyOf(shard, rank);
  const uint64_t element = DTypeSize(shard.dtype());
  uint64_t first = static_cast<uint64_t>(shard.box().offsets(0));  // 1-D
  if (shard.has_flat_range()) first += static_cast<uint64_t>(shard.flat_range().begin());
  for (uint64_t i = 0; i < shard.nbytes(); ++i) out[i] = ExpectedByte(key, step, first * element + i);
}

}  // namespace tessera::sim
