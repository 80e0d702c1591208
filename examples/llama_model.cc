#include "examples/llama_model.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/checksum.h"
#include "common/tensor_key.h"

namespace tessera {
namespace {

struct ParamSpec {
  std::string fqn;
  std::vector<int64_t> shape;
  int split_dim;  // TP split axis, or -1 when replicated over tp
  int stage;
};

std::vector<ParamSpec> Params(const LlamaConfig& c, int pp) {
  const int64_t H = c.dim, F = c.ffn, V = c.vocab;
  std::vector<ParamSpec> params;
  params.push_back({"tok_embeddings.weight", {V, H}, 0, 0});
  const int per_stage = c.layers / pp;
  for (int i = 0; i < c.layers; ++i) {
    const int stage = i / per_stage;
    const std::string p = absl::StrCat("layers.", i, ".");
    for (const char* w : {"wq", "wk", "wv"}) {
      params.push_back({absl::StrCat(p, "attention.", w, ".weight"), {H, H}, 0, stage});
    }
    params.push_back({p + "attention.wo.weight", {H, H}, 1, stage});
    params.push_back({p + "feed_forward.w1.weight", {F, H}, 0, stage});
    params.push_back({p + "feed_forward.w2.weight", {H, F}, 1, stage});
    params.push_back({p + "feed_forward.w3.weight", {F, H}, 0, stage});
    params.push_back({p + "attention_norm.weight", {H}, -1, stage});
    params.push_back({p + "ffn_norm.weight", {H}, -1, stage});
  }
  params.push_back({"norm.weight", {H}, -1, pp - 1});
  params.push_back({"output.weight", {V, H}, 0, pp - 1});
  return params;
}

uint32_t Degree(const MeshLayout& layout, const char* name) {
  std::optional<size_t> i = layout.DimIndex(name);
  return i.has_value() ? layout.degree(*i) : 1;
}

uint32_t Coord(const MeshLayout& layout, uint32_t rank, const char* name) {
  std::optional<size_t> i = layout.DimIndex(name);
  return i.has_value() ? layout.Coords(rank)[*i] : 0;
}

// Global row-major index of the `local`-th element of `box` within `shape`.
int64_t GlobalIndex(const std::vector<int64_t>& shape, const Box& box, int64_t local) {
  int64_t index = 0;
  int64_t rem = local;
  std::vector<int64_t> coord(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    coord[d] = box.offsets[d] + rem % box.lengths[d];
    rem /= box.lengths[d];
  }
  for (size_t d = 0; d < shape.size(); ++d) index = index * shape[d] + coord[d];
  return index;
}

std::string KeyOf(const LlamaPiece& piece, uint32_t rank) {
  return TensorKey(piece.kind, piece.fqn, piece.state_key, rank);
}

}  // namespace

LlamaConfig LlamaConfig::ForTotalBytes(uint64_t bytes, int layers) {
  // Per layer ~ 4H^2 + 3HF params with F ~ 2.75H, plus embeddings 2VH with V = 4H; times 3
  // (params + exp_avg + exp_avg_sq) times 4 bytes.
  LlamaConfig c;
  c.layers = layers;
  const double per_h2 = (4.0 + 3 * 2.75) * layers + 8.0;
  double h = std::sqrt(static_cast<double>(bytes) / (12.0 * per_h2));
  c.dim = std::max<int64_t>(64, static_cast<int64_t>(h) / 64 * 64);
  c.ffn = c.dim * 11 / 4 / 64 * 64;
  c.vocab = c.dim * 4;
  return c;
}

absl::StatusOr<std::vector<LlamaPiece>> LlamaPieces(const LlamaConfig& config,
                                                    const MeshLayout& layout, uint32_t rank,
                                                    OptimizerMode optimizer) {
  for (size_t i = 0; i < layout.dim_count(); ++i) {
    const std::string& name = layout.dim_name(i);
    if (name != "pp" && name != "tp" && name != "dp") {
      return absl::InvalidArgumentError(absl::StrCat("the llama example knows pp, tp and dp, not ", name));
    }
  }
  const uint32_t pp = Degree(layout, "pp"), tp = Degree(layout, "tp"), dp = Degree(layout, "dp");
  if (config.layers % pp != 0 || config.dim % tp != 0 || config.ffn % tp != 0 ||
      config.vocab % tp != 0) {
    return absl::InvalidArgumentError(absl::StrCat("pp=", pp, " tp=", tp,
                                                   " do not divide the model's layers/dims"));
  }
  const uint32_t my_pp = Coord(layout, rank, "pp"), my_tp = Coord(layout, rank, "tp"),
                 my_dp = Coord(layout, rank, "dp");
  const bool has_dp = layout.DimIndex("dp").has_value();
  const bool has_tp = layout.DimIndex("tp").has_value();
  std::vector<LlamaPiece> pieces;
  for (const ParamSpec& p : Params(config, static_cast<int>(pp))) {
    if (p.stage != static_cast<int>(my_pp)) continue;
    LlamaPiece param;
    param.fqn = p.fqn;
    param.global_shape = p.shape;
    param.box = FullBox(p.shape);
    if (p.split_dim >= 0) {
      const int64_t len = p.shape[p.split_dim] / tp;
      param.box.offsets[p.split_dim] = len * my_tp;
      param.box.lengths[p.split_dim] = len;
    } else if (has_tp) {
      param.replicated_over.push_back("tp");
    }
    if (has_dp) param.replicated_over.insert(param.replicated_over.begin(), "dp");
    const int64_t elements = *Volume(param.box);
    param.nbytes = static_cast<uint64_t>(elements) * 4;
    pieces.push_back(param);

    for (const char* key : {"exp_avg", "exp_avg_sq"}) {
      LlamaPiece state = param;
      state.kind = v1::SHARD_KIND_OPTIMIZER;
      if (optimizer == OptimizerMode::kAbsent) {
        state.state_absent = true;
        state.nbytes = 0;
        state.replicated_over.clear();
        pieces.push_back(state);
        break;  // one absent marker per parameter
      }
      state.state_key = key;
      if (optimizer == OptimizerMode::kDistributed) {
        // Uneven slices of the TP-local box across dp: the first ranks get one more element.
        const int64_t base = elements / dp, extra = elements % dp;
        state.has_flat_range = true;
        state.flat_begin = my_dp * base + std::min<int64_t>(my_dp, extra);
        state.flat_end = state.flat_begin + base + (static_cast<int64_t>(my_dp) < extra ? 1 : 0);
        state.nbytes = static_cast<uint64_t>(state.flat_end - state.flat_begin) * 4;
        state.replicated_over.clear();
        if (p.split_dim < 0 && has_tp) state.replicated_over.push_back("tp");
      }
      pieces.push_back(state);
    }
  }
  LlamaPiece rng;
  rng.fqn = "rng_state";
  rng.kind = v1::SHARD_KIND_EXTRA;
  rng.global_shape = {64};
  rng.box = FullBox(rng.global_shape);
  rng.nbytes = 64;
  pieces.push_back(rng);
  return pieces;
}

float ValueAt(const std::string& key, int64_t index, int64_t step) {
  const uint64_t seed = Xxh3(key.data(), key.size());
  const uint64_t x = (static_cast<uint64_t>(index) * 0x9E3779B97F4A7C15ull) ^ seed;
  const uint64_t y = (x ^ (x >> 29)) * 0xBF58476D1CE4E5B9ull;
  return static_cast<float>((y >> 40) & 0xFFFFFF) / 16777216.0f - 0.5f +
         static_cast<float>(step) * 1e-3f;
}

void FillPiece(const LlamaPiece& piece, uint32_t rank, int64_t step, void* out) {
  if (piece.nbytes == 0) return;
  const std::string key = KeyOf(piece, rank);
  if (piece.kind == v1::SHARD_KIND_EXTRA) {
    auto* bytes = static_cast<unsigned char*>(out);
    for (uint64_t i = 0; i < piece.nbytes; ++i) {
      bytes[i] = static_cast<unsigned char>((ValueAt(key, static_cast<int64_t>(i), step) + 1) * 100);
    }
    return;
  }
  auto* values = static_cast<float*>(out);
  const int64_t begin = piece.has_flat_range ? piece.flat_begin : 0;
  const int64_t count = static_cast<int64_t>(piece.nbytes / 4);
  for (int64_t i = 0; i < count; ++i) {
    values[i] = ValueAt(key, GlobalIndex(piece.global_shape, piece.box, begin + i), step);
  }
}

int64_t FirstMismatch(const LlamaPiece& piece, uint32_t rank, int64_t step, const void* data) {
  std::vector<unsigned char> expected(piece.nbytes);
  FillPiece(piece, rank, step, expected.data());
  const auto* got = static_cast<const unsigned char*>(data);
  for (uint64_t i = 0; i < piece.nbytes; ++i) {
    if (got[i] != expected[i]) return static_cast<int64_t>(i);
  }
  return -1;
}

}  // namespace tessera
