// After the rules: the checkpoint's total bytes, one writer per chunk (planner.h, after rule 5)
// and the pieces each chunk is assembled from.
#include "server/plan/planner_internal.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/dtype.h"

namespace tessera {
namespace plan_internal {

// Rule 7: one writer per chunk, balancing bytes written per rank. Chunks with one possible
// writer are placed first; the others go, largest first, to their least-loaded claimant.
void Planner::AssignWriters() {
  load_.assign(layout_.world_size(), 0);
  std::vector<uint32_t> flexible;
  for (uint32_t c = 0; c < chunks_.size(); ++c) {
    Chunk& chunk = chunks_[c];
    const uint32_t r0 = piece(chunk.begin).rank;
    bool single = true;
    for (uint32_t x = chunk.begin + 1; x < chunk.end && single; ++x) {
      single = piece(x).rank == r0;
    }
    if (single) {
      chunk.writer = r0;
      load_[r0] += chunk.nbytes;
    } else {
      flexible.push_back(c);
    }
  }
  std::stable_sort(flexible.begin(), flexible.end(),
                   [&](uint32_t a, uint32_t b) { return chunks_[a].nbytes > chunks_[b].nbytes; });
  for (uint32_t c : flexible) {
    Chunk& chunk = chunks_[c];
    uint32_t best = piece(chunk.begin).rank;
    for (uint32_t x = chunk.begin + 1; x < chunk.end; ++x) {
      const uint32_t r = piece(x).rank;
      if (load_[r] < load_[best] || (load_[r] == load_[best] && r < best)) best = r;
    }
    chunk.writer = best;
    load_[best] += chunk.nbytes;
  }
}

// The checkpoint's bytes must fit the manifest's uint64 total_bytes, which ValidateManifest
// checks when it is committed: a plan that could never be committed is refused here, before
// a byte is copied, and the per-rank sums below (each a part of the total) cannot wrap.
absl::Status Planner::CheckTotalBytes() const {
  uint64_t total = 0;
  for (const Chunk& chunk : chunks_) {
    if (__builtin_add_overflow(total, chunk.nbytes, &total)) {
      return PlanError(layout_, v1::ERROR_CODE_PLAN_TOO_LARGE)
          .Build("The checkpoint would hold more than 2^64 bytes; no manifest can describe it.");
    }
  }
  return absl::OkStatus();
}

// Picks the pieces each chunk is assembled from: the writer's own piece, or for a gathered
// box one piece per distinct flat range — the leader's own copy if it holds one, else the
// replica that has sent the fewest bytes so far.
void Planner::ChooseSources() {
  std::vector<uint64_t> sent(layout_.world_size(), 0);
  sources_.reserve(chunks_.size());
  for (Chunk& chunk : chunks_) {
    chunk.sources_begin = static_cast<uint32_t>(sources_.size());
    for (uint32_t x = chunk.begin; x < chunk.end;) {
      uint32_t y = x + 1;
      while (y < chunk.end && SamePiece(piece(x), piece(y))) ++y;
      uint32_t chosen = x;
      for (uint32_t z = x; z < y; ++z) {
        const uint32_t candidate = z;
        if (piece(candidate).rank == chunk.writer) {
          chosen = candidate;
          break;
        }
        if (sent[piece(candidate).rank] < sent[piece(chosen).rank]) chosen = candidate;
      }
      sources_.push_back(chosen);
      const Piece& p = piece(chosen);
      if (p.rank != chunk.writer) {
        sent[p.rank] += static_cast<uint64_t>(p.elements()) * DTypeSize(p.dtype_enum());
      }
      x = y;
    }
    chunk.sources_end = static_cast<uint32_t>(sources_.size());
  }
}

}  // namespace plan_internal
}  // namespace tessera
