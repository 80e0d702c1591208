// The GPU benchmark's tensors (tests/gpu/run.sh): one rank's row blocks of int32 tensors of a
// tp=N layout, with contents that any rank of any other layout can recompute, so a load onto
// another layout is checked byte for byte without the saver's data.
//
// Tensor i ("gpubench.w<iii>") has kCols int32 columns and `rows_per_saved_rank x saved_world`
// rows; saved rank r holds rows [r x rows_per_saved_rank, (r + 1) x rows_per_saved_rank).
// Element (g, c) holds Base(i, g, c), a hash (never zeros, different in every column), except
// the first row of every saved rank's block, which after save step s holds Stamp(i, s, g, c):
// a save that persisted stale staging instead of this step's device bytes reads back wrong.
//
// Thread-safety: pure functions; the Fill/Count functions split their work across threads.
#ifndef TESSERA_TESTS_GPU_BENCH_TENSORS_H_
#define TESSERA_TESTS_GPU_BENCH_TENSORS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tessera::gpubench {

inline constexpr int64_t kCols = 1024;  // int32 per row: 4 KiB rows
inline constexpr int64_t kRowBytes = kCols * 4;

// One tensor's piece on this rank.
struct Piece {
  int index = 0;
  std::string fqn;                // "gpubench.w000", ...
  int64_t global_rows = 0;        // rows of the whole tensor
  int64_t row0 = 0;               // first global row this rank holds
  int64_t rows = 0;               // rows this rank holds
  int64_t rows_per_saved_rank = 0;
  uint64_t nbytes() const { return static_cast<uint64_t>(rows) * kRowBytes; }
};

// The pieces rank `rank` of a `world`-rank layout holds of a checkpoint saved by
// `saved_world` ranks with `mib_per_saved_rank` MiB each, in tensors of at most `tensor_mib`
// MiB per saved rank (the last one smaller if needed).
// Errors: InvalidArgument if a size is zero or not a whole number of rows, if rank is outside
// [0, world), or if a tensor's rows do not split evenly across `world` ranks.
absl::StatusOr<std::vector<Piece>> Pieces(uint64_t mib_per_saved_rank, int saved_world,
                                          int world, int rank, uint64_t tensor_mib = 64);

int32_t Base(int index, int64_t row, int64_t col);
int32_t Stamp(int index, int64_t step, int64_t row, int64_t col);

// The value element (row, col) of tensor `index` holds after save step `step`.
int32_t Expected(int index, int64_t step, int64_t rows_per_saved_rank, int64_t row, int64_t col);

// Writes the contents `piece` holds after save step `step` into `dst` (piece.nbytes()).
void Fill(const Piece& piece, int64_t step, int32_t* dst, int threads);

// Writes only the row(s) that change from one step to the next: the stamped first row of the
// piece's block (a saver's piece starts at a saved rank's boundary), kCols int32.
void FillStampRow(const Piece& piece, int64_t step, int32_t* row);

// Elements of `data` (piece.nbytes()) that differ from what `piece` holds after `step`.
uint64_t CountMismatches(const Piece& piece, int64_t step, const int32_t* data, int threads);

}  // namespace tessera::gpubench

#endif  // TESSERA_TESTS_GPU_BENCH_TENSORS_H_
