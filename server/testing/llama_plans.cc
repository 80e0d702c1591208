#include "server/testing/llama_plans.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace tessera {

std::vector<v1::ShardDesc> LlamaRankShards(const MeshLayout& layout, uint32_t rank,
                                           int params_per_stage) {
  const int64_t tp_degree = layout.degree(1), dp_degree = layout.degree(2);
  const std::vector<uint32_t> c = layout.Coords(rank);
  const uint32_t stage = c[0], tp = c[1], dp = c[2];
  std::vector<v1::ShardDesc> shards;
  shards.reserve(4 * params_per_stage);
  for (int p = 0; p < params_per_stage; ++p) {
    const int layer = stage * params_per_stage + p;
    v1::ShardDesc param;
    param.set_kind(v1::SHARD_KIND_PARAM);
    param.set_dtype(v1::DTYPE_BF16);
    param.add_replicated_over("dp");
    int64_t volume = 0;
    if (p % 10 == 0) {
      param.set_fqn(absl::StrCat("layers.", layer, ".attention_norm.weight"));
      param.add_global_shape(4096);
      param.mutable_box()->add_offsets(0);
      param.mutable_box()->add_lengths(4096);
      param.add_replicated_over("tp");
      volume = 4096;
    } else {
      param.set_fqn(absl::StrCat("layers.", layer, ".attention.w", p % 10, ".weight"));
      const int64_t rows = 1024 * (1 + p % 4), cols = 4096;
      param.add_global_shape(rows);
      param.add_global_shape(cols);
      const int axis = p % 2;  // column- or row-parallel
      const int64_t split = (axis == 0 ? rows : cols) / tp_degree;
      param.mutable_box()->add_offsets(axis == 0 ? split * tp : 0);
      param.mutable_box()->add_offsets(axis == 1 ? split * tp : 0);
      param.mutable_box()->add_lengths(axis == 0 ? split : rows);
      param.mutable_box()->add_lengths(axis == 1 ? split : cols);
      volume = (axis == 0 ? split : rows) * (axis == 1 ? split : cols);
    }
    param.set_nbytes(volume * 2);
    const int64_t slice = volume / dp_degree;
    for (const char* key : {"exp_avg", "exp_avg_sq", "fp32_param"}) {
      v1::ShardDesc state = param;
      state.set_kind(v1::SHARD_KIND_OPTIMIZER);
      state.set_dtype(v1::DTYPE_F32);
      state.set_state_key(key);
      state.clear_replicated_over();
      if (p % 10 == 0) state.add_replicated_over("tp");
      state.mutable_flat_range()->set_begin(slice * dp);
      state.mutable_flat_range()->set_end(slice * (dp + 1));
      state.set_nbytes(slice * 4);
      shards.push_back(std::move(state));
    }
    shards.push_back(std::move(param));
  }
  return shards;
}

}  // namespace tessera
