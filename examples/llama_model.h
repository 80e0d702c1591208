// A llama-like model sharded the way torchtitan / Megatron shard it, for demos, end-to-end
// tests and benchmarks: which pieces of which tensors one rank of a PP x TP x DP mesh holds,
// with deterministic contents, so that any rank of any layout can check what it loaded.
//
// Tensors (fqns use global layer numbers, as they must):
//   tok_embeddings.weight [V, H]            stage 0,    TP-split on dim 0 (vocab parallel)
//   layers.i.attention.w{q,k,v}.weight [H, H]  its stage, TP-split dim 0 (column parallel)
//   layers.i.attention.wo.weight [H, H]     TP-split dim 1 (row parallel)
//   layers.i.feed_forward.w{1,3}.weight [F, H]  dim 0;  w2 [H, F] dim 1
//   layers.i.{attention,ffn}_norm.weight [H]  replicated over tp (and dp)
//   norm.weight [H], output.weight [V, H]   last stage (output vocab parallel)
// Optimizer state (AdamW exp_avg, exp_avg_sq) per parameter, either replicated like the
// parameter over dp, sliced across dp as flat ranges of the TP-local box (a distributed
// optimizer, uneven slices), or absent (before the first step). Each rank also saves an
// extra: 64 bytes of "RNG state".
//
// Value of element i (global row-major index) of tensor key k at step s: ValueAt(k, i, s).
//
// Thread-safety: immutable values and pure functions.
#ifndef TESSERA_EXAMPLES_LLAMA_MODEL_H_
#define TESSERA_EXAMPLES_LLAMA_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/box.h"
#include "common/layout.h"
#include "tessera/v1/types.pb.h"

namespace tessera {

struct LlamaConfig {
  int layers = 4;
  int64_t dim = 256;      // H
  int64_t ffn = 704;      // F
  int64_t vocab = 1024;   // V
  // Sizes giving about `bytes` of parameters + AdamW state (float32) in total.
  static LlamaConfig ForTotalBytes(uint64_t bytes, int layers);
};

enum class OptimizerMode { kReplicated, kDistributed, kAbsent };

// One piece this rank holds. Optimizer pieces name their parameter in `fqn`.
struct LlamaPiece {
  std::string fqn;
  v1::ShardKind kind = v1::SHARD_KIND_PARAM;
  std::string state_key;
  bool state_absent = false;
  std::vector<int64_t> global_shape;
  Box box;
  bool has_flat_range = false;
  int64_t flat_begin = 0, flat_end = 0;
  std::vector<std::string> replicated_over;
  uint64_t nbytes = 0;     // float32 elements x 4 (extras: raw bytes)
};

// The pieces `rank` of `layout` holds. The layout's dims may include pp, tp and dp (missing
// ones count as degree 1; others are rejected). Errors: InvalidArgument if a degree does not
// divide what it splits (layers by pp, dim/ffn/vocab by tp).
absl::StatusOr<std::vector<LlamaPiece>> LlamaPieces(const LlamaConfig& config,
                                                    const MeshLayout& layout, uint32_t rank,
                                                    OptimizerMode optimizer);

// Deterministic value of element `index` of tensor `key` at `step`.
float ValueAt(const std::string& key, int64_t index, int64_t step);

// Fills `out` (piece.nbytes bytes) with the piece's contents at `step`.
void FillPiece(const LlamaPiece& piece, uint32_t rank, int64_t step, void* out);

// Index of the first element of `data` that differs from FillPiece's, or -1 if none.
int64_t FirstMismatch(const LlamaPiece& piece, uint32_t rank, int64_t step, const void* data);

}  // namespace tessera

#endif  // TESSERA_EXAMPLES_LLAMA_MODEL_H_
