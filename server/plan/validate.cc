// Rules 1 to 5 of planner.h, in the order they are checked: the Planner's validation passes
// (one method per rule) and the errors they build.
#include "server/plan/planner_internal.h"

#include <algorithm>
#include <iterator>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/types/span.h"
#include "common/box.h"
#include "common/dtype.h"
#include "common/plan_fingerprint.h"
#include "common/shard_rules.h"
#include "common/status.h"
#include "common/tensor_key.h"
#include "common/threads.h"
#include "server/plan/parallel_runs.h"
#include "server/plan/plan_tiling.h"

namespace tessera {
namespace plan_internal {
namespace {

using Int64s = google::protobuf::RepeatedField<int64_t>;

absl::Span<const int64_t> SpanOf(const Int64s& field) {
  return absl::Span<const int64_t>(field.data(), field.size());
}

std::string BoxString(const v1::Box& box) { return BoxToString(BoxFromProto(box)); }

// ---------------------------------------------------------------------------------------------
// Errors

// "{dp, tp}" for a replicated_over mask.
std::string MaskString(const MeshLayout& layout, uint64_t mask) {
  std::vector<std::string> names;
  for (size_t i = 0; i < layout.dim_count(); ++i) {
    if ((mask >> i) & 1) names.push_back(layout.dim_name(i));
  }
  return absl::StrCat("{", absl::StrJoin(names, ", "), "}");
}

// Names of the dims on which two ranks' coordinates differ.
std::string DifferingDims(const MeshLayout& layout, uint32_t a, uint32_t b) {
  std::vector<uint32_t> ca = layout.Coords(a), cb = layout.Coords(b);
  std::vector<std::string> names;
  for (size_t i = 0; i < ca.size(); ++i) {
    if (ca[i] != cb[i]) names.push_back(layout.dim_name(i));
  }
  return absl::StrJoin(names, ", ");
}

// ---------------------------------------------------------------------------------------------
// Pieces and keys

// -1, 0, 1 like memcmp: lexicographic by offsets, then lengths (Box::operator<'s order).
// Pieces of one key have equal box ranks (checked before any sort).
int CompareBoxes(const Piece& a, const Piece& b) {
  for (int i = 0; i < a.box_rank; ++i) {
    if (a.offsets[i] != b.offsets[i]) return a.offsets[i] < b.offsets[i] ? -1 : 1;
  }
  for (int i = 0; i < a.box_rank; ++i) {
    if (a.lengths[i] != b.lengths[i]) return a.lengths[i] < b.lengths[i] ? -1 : 1;
  }
  return 0;
}

// Rule 1: one shard is well formed (common/shard_rules.h). Fills `piece` (but its key).
absl::Status ValidateShard(const MeshLayout& layout, uint32_t rank, int32_t index,
                           const v1::ShardDesc& s, Piece* piece) {
  ShardExtent extent;
  if (absl::Status why = CheckShardForm(layout, s, &extent); !why.ok()) {
    PlanError error(layout, v1::ERROR_CODE_MALFORMED_SHARD);
    error.Fqn(s.fqn()).Rank(rank);
    if (!s.state_key().empty()) error.StateKey(s.state_key());
    return error.Build(absl::StrCat("Shard ", index, " (\"", PrintableName(s.fqn()), "\") of ",
                                    RankName(layout, rank), " is malformed: ", why.message(),
                                    "; fix how this rank describes its tensors."));
  }
  piece->shard = &s;
  piece->offsets = s.box().offsets().data();
  piece->lengths = s.box().lengths().data();
  piece->box_rank = static_cast<uint8_t>(s.global_shape_size());
  piece->dtype = static_cast<uint8_t>(s.dtype());
  piece->shape_differs = false;
  piece->rank = rank;
  piece->local = index;
  piece->ranged = s.has_flat_range();
  piece->begin = extent.begin;
  piece->end = extent.end;
  piece->mask = extent.replicated_mask;
  return absl::OkStatus();
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The planner's validation passes

// The keys one run of ranks claims, in order of first appearance in the run.
struct Planner::RunKeys {
  absl::flat_hash_map<KeyRef, uint32_t> index;  // -> local key
  std::vector<uint32_t> first_piece;            // per local key: its first piece
  std::vector<uint32_t> count;                  // per local key: its pieces in the run
  std::vector<uint32_t> global;                 // per local key: its index in keys_
  std::vector<uint32_t> next;                   // per local key: where its next piece goes

  uint32_t Add(const KeyRef& ref, uint32_t piece) {
    auto [it, inserted] = index.try_emplace(ref, static_cast<uint32_t>(first_piece.size()));
    if (inserted) {
      first_piece.push_back(piece);
      count.push_back(0);
    }
    ++count[it->second];
    return it->second;
  }
};

// Rule 1, the ranks' fingerprints and staged bytes, and the grouping of pieces by key, so
// that each key's pieces are contiguous in (rank, shard) order in pieces_, with the
// comparisons rule 2 needs. Three passes:
//   1. each thread takes a contiguous run of ranks: it validates their shards and numbers
//      the keys it meets (RunKeys); it stops at its first error, and the first run's error
//      is the lowest rank's, the one a single thread finds first;
//   2. the runs' keys are merged in run order, so keys_ is in order of first appearance
//      and a key's dtype and shape are those of its first claim; each key's range in
//      pieces_ is split among the runs in run order (a stable counting sort);
//   3. each thread moves its run's pieces to their places in pieces_.
absl::Status Planner::CollectPieces() {
  const uint32_t world = static_cast<uint32_t>(by_rank_.size());
  std::vector<size_t> rank_begin(world + 1, 0);
  for (uint32_t rank = 0; rank < world; ++rank) {
    rank_begin[rank + 1] = rank_begin[rank] + by_rank_[rank]->shards.size();
  }
  const size_t threads = Threads(total_shards_);
  const std::vector<uint32_t> runs = SplitRuns(rank_begin, threads);
  // In (rank, shard) order; key is the local key of the piece's run until pass 3.
  std::unique_ptr<Piece[]> pieces(new Piece[total_shards_]);
  rank_fingerprints_.resize(world);
  staged_bytes_.assign(world, 0);
  std::vector<RunKeys> run_keys(threads);
  RETURN_IF_ERROR(ForEachInRuns(runs, [&](size_t t, uint32_t rank) -> absl::Status {
    const std::vector<v1::ShardDesc>& shards = by_rank_[rank]->shards;
    LocalPlanHasher hasher(rank, shards.size());
    for (size_t i = 0; i < shards.size(); ++i) {
      const uint32_t index = static_cast<uint32_t>(rank_begin[rank] + i);
      Piece& p = pieces[index];
      RETURN_IF_ERROR(ValidateShard(layout_, rank, static_cast<int32_t>(i), shards[i], &p));
      hasher.Add(shards[i]);
      staged_bytes_[rank] += shards[i].nbytes();
      p.key = run_keys[t].Add(RefOf(p), index);
    }
    rank_fingerprints_[rank] = hasher.Finish();
    return absl::OkStatus();
  }));

  absl::flat_hash_map<KeyRef, uint32_t> key_index;
  std::vector<uint32_t> counts;
  for (RunKeys& local : run_keys) {
    local.global.resize(local.first_piece.size());
    for (size_t l = 0; l < local.first_piece.size(); ++l) {
      const Piece& first = pieces[local.first_piece[l]];
      auto [it, inserted] =
          key_index.try_emplace(RefOf(first), static_cast<uint32_t>(keys_.size()));
      if (inserted) {
        KeyInfo& key = keys_.emplace_back();
        key.ref = it->first;
        key.dtype = first.shard->dtype();
        key.shape.assign(first.shard->global_shape().begin(), first.shard->global_shape().end());
        counts.push_back(0);
      }
      local.global[l] = it->second;
      counts[it->second] += local.count[l];
    }
  }
  uint32_t offset = 0;
  for (size_t k = 0; k < keys_.size(); ++k) {
    keys_[k].begin = keys_[k].end = offset;
    offset += counts[k];
  }
  for (RunKeys& local : run_keys) {  // keys_[k].end: where the next run's pieces go
    local.next.resize(local.global.size());
    for (size_t l = 0; l < local.global.size(); ++l) {
      local.next[l] = keys_[local.global[l]].end;
      keys_[local.global[l]].end += local.count[l];
    }
  }

  pieces_.reset(new Piece[total_shards_]);
  RunOnThreads(threads, [&](size_t t) {
    RunKeys& local = run_keys[t];
    for (size_t i = rank_begin[runs[t]]; i < rank_begin[runs[t + 1]]; ++i) {
      Piece p = pieces[i];
      const uint32_t l = p.key;
      p.key = local.global[l];
      const KeyInfo& key = keys_[p.key];
      const v1::ShardDesc& s = *p.shard;
      p.shape_differs =
          s.dtype() != key.dtype || SpanOf(s.global_shape()) != absl::MakeConstSpan(key.shape);
      pieces_[local.next[l]++] = p;
    }
  });
  return absl::OkStatus();
}

// Builds key names and the key order of everything that follows. Two different KeyRefs
// can only name the same key through the "#rank<R>" suffix of extras (an optimizer state
// called "rank3" of "x" and rank 3's extra "x"): rejected rather than silently merged.
absl::Status Planner::NameKeys() {
  sorted_keys_.resize(keys_.size());
  for (uint32_t k = 0; k < keys_.size(); ++k) {
    const KeyRef& r = keys_[k].ref;
    keys_[k].name = TensorKey(r.kind, r.fqn, r.absent ? "" : r.state_key, r.extra_rank);
    sorted_keys_[k] = k;
  }
  std::sort(sorted_keys_.begin(), sorted_keys_.end(),
            [&](uint32_t a, uint32_t b) { return keys_[a].name < keys_[b].name; });
  for (size_t i = 1; i < sorted_keys_.size(); ++i) {
    const KeyInfo& a = keys_[sorted_keys_[i - 1]];
    const KeyInfo& b = keys_[sorted_keys_[i]];
    if (a.name != b.name) continue;
    const Piece& pa = piece(a.begin);
    const Piece& pb = piece(b.begin);
    return PlanError(layout_, v1::ERROR_CODE_MALFORMED_SHARD)
        .Fqn(a.ref.fqn)
        .Fqn(b.ref.fqn)
        .Rank(pa.rank)
        .Rank(pb.rank)
        .Build(absl::StrCat("Tensor key \"", a.name, "\" names two different tensors (of ",
                            RankName(layout_, pa.rank), " and ", RankName(layout_, pb.rank),
                            "); rename the optimizer state key or the extra."));
  }
  return absl::OkStatus();
}

// Rule 2: every claim of a key agrees on dtype and global shape (compared in
// CollectPieces; reported here, in key order).
absl::Status Planner::CheckShapes() {
  for (uint32_t k : sorted_keys_) {
    const KeyInfo& key = keys_[k];
    const Piece& first = piece(key.begin);
    for (uint32_t i = key.begin + 1; i < key.end; ++i) {
      const Piece& p = piece(i);
      if (!p.shape_differs) continue;
      auto describe = [](const v1::ShardDesc& s) {
        return absl::StrCat(DTypeName(s.dtype()), "[", absl::StrJoin(s.global_shape(), ", "),
                            "]");
      };
      PlanError error(layout_, v1::ERROR_CODE_SHAPE_MISMATCH);
      error.Fqn(key.ref.fqn).Rank(first.rank).Rank(p.rank);
      if (!key.ref.state_key.empty()) error.StateKey(key.ref.state_key);
      return error.Build(absl::StrCat("Tensor \"", key.name, "\" is ", describe(*first.shard),
                                      " on ", RankName(layout_, first.rank), " but ",
                                      describe(*p.shard), " on ", RankName(layout_, p.rank),
                                      "; every rank must describe the same global tensor."));
    }
  }
  return absl::OkStatus();
}

// Rule 3 (OPTIMIZER_STATE_MISMATCH): per parameter fqn, every rank that declares optimizer
// state declares the same set of state keys, or all declare it absent. This is the Megatron
// "KeyError: 'exp_avg'" case, reported instead of crashing a gather.
absl::Status Planner::CheckOptimizerState() {
  std::vector<uint32_t> opt_keys;  // optimizer keys, grouped by fqn, absent first
  for (uint32_t k : sorted_keys_) {
    if (keys_[k].ref.kind == v1::SHARD_KIND_OPTIMIZER) opt_keys.push_back(k);
  }
  std::stable_sort(opt_keys.begin(), opt_keys.end(), [&](uint32_t a, uint32_t b) {
    const KeyRef &ra = keys_[a].ref, &rb = keys_[b].ref;
    if (ra.fqn != rb.fqn) return ra.fqn < rb.fqn;
    if (ra.absent != rb.absent) return ra.absent;
    return ra.state_key < rb.state_key;
  });
  std::vector<std::pair<uint32_t, uint32_t>> claims;  // (rank, key index within the fqn)
  for (size_t g = 0; g < opt_keys.size();) {
    size_t h = g + 1;
    while (h < opt_keys.size() && keys_[opt_keys[h]].ref.fqn == keys_[opt_keys[g]].ref.fqn) ++h;
    absl::Span<const uint32_t> group(opt_keys.data() + g, h - g);
    claims.clear();
    for (uint32_t j = 0; j < group.size(); ++j) {
      const KeyInfo& key = keys_[group[j]];
      for (uint32_t i = key.begin; i < key.end; ++i) claims.emplace_back(piece(i).rank, j);
    }
    std::sort(claims.begin(), claims.end());
    claims.erase(std::unique(claims.begin(), claims.end()), claims.end());
    RETURN_IF_ERROR(CompareStateKeySets(group, claims));
    g = h;
  }
  return absl::OkStatus();
}

absl::Status Planner::CompareStateKeySets(
    absl::Span<const uint32_t> group, const std::vector<std::pair<uint32_t, uint32_t>>& claims) {
  const bool has_absent = keys_[group[0]].ref.absent;  // absent sorts first
  // Runs of `claims` per rank; the first rank's run is the reference.
  auto run_end = [&](size_t i) {
    size_t j = i;
    while (j < claims.size() && claims[j].first == claims[i].first) ++j;
    return j;
  };
  auto describe = [&](size_t i, size_t j) {
    if (has_absent && claims[i].second == 0 && j - i == 1)
      return std::string("no state (absent)");
    std::vector<std::string> names;
    for (size_t x = i; x < j; ++x) {
      const KeyRef& r = keys_[group[claims[x].second]].ref;
      names.push_back(r.absent ? "absent" : std::string(r.state_key));
    }
    return absl::StrCat("[", absl::StrJoin(names, ", "), "]");
  };
  const size_t ref_end = run_end(0);
  for (size_t i = 0; i < claims.size();) {
    const size_t j = run_end(i);
    const bool mixed = has_absent && claims[i].second == 0 && j - i > 1;
    const bool same = std::equal(
        claims.begin() + i, claims.begin() + j, claims.begin(), claims.begin() + ref_end,
        [](const auto& x, const auto& y) { return x.second == y.second; });
    if (same && !mixed) {
      i = j;
      continue;
    }
    const uint32_t ref_rank = claims[0].first, rank = claims[i].first;
    // A state key on one side only, for ErrorDetail.state_key.
    std::vector<uint32_t> a, b, diff;
    for (size_t x = 0; x < ref_end; ++x) a.push_back(claims[x].second);
    for (size_t x = i; x < j; ++x) b.push_back(claims[x].second);
    std::set_symmetric_difference(a.begin(), a.end(), b.begin(), b.end(),
                                  std::back_inserter(diff));
    if (mixed) diff.assign(b.begin() + 1, b.end());
    PlanError error(layout_, v1::ERROR_CODE_OPTIMIZER_STATE_MISMATCH);
    const absl::string_view fqn = keys_[group[0]].ref.fqn;
    error.Fqn(fqn).Rank(ref_rank).Rank(rank);
    for (uint32_t d : diff) {
      if (!keys_[group[d]].ref.absent) {
        error.StateKey(keys_[group[d]].ref.state_key);
        break;
      }
    }
    if (mixed) {
      return error.Build(absl::StrCat("Optimizer state of \"", fqn,
                                      "\" is both declared absent and present (", describe(i, j),
                                      ") on ", RankName(layout_, rank),
                                      "; a rank either has state for a parameter or not."));
    }
    return error.Build(absl::StrCat(
        "Optimizer state of \"", fqn, "\" is ", describe(0, ref_end), " on ",
        RankName(layout_, ref_rank), " but ", describe(i, j), " on ", RankName(layout_, rank),
        "; every rank holding the parameter must declare the same state keys, or all must "
        "declare the state absent."));
  }
  return absl::OkStatus();
}

// Rules 4 and 5 for every key, producing the distinct chunks in key order, then box order.
// Keys are independent: each thread takes a contiguous run of keys in name order (of about
// equal pieces) and stops at its first error; the first run's error is the one a single
// thread finds first.
absl::Status Planner::BuildChunks() {
  std::vector<size_t> prefix(sorted_keys_.size() + 1, 0);
  for (size_t i = 0; i < sorted_keys_.size(); ++i) {
    const KeyInfo& key = keys_[sorted_keys_[i]];
    prefix[i + 1] = prefix[i] + (key.end - key.begin);
  }
  const size_t threads = Threads(total_shards_);
  const std::vector<uint32_t> runs = SplitRuns(prefix, threads);
  std::vector<std::vector<Chunk>> chunks(threads);
  RETURN_IF_ERROR(ForEachInRuns(runs, [&](size_t t, uint32_t i) {
    return KeyChunks(sorted_keys_[i], &chunks[t]);
  }));
  size_t total = 0;
  for (const std::vector<Chunk>& run : chunks) total += run.size();
  chunks_.reserve(total);
  for (const std::vector<Chunk>& run : chunks) {
    chunks_.insert(chunks_.end(), run.begin(), run.end());
  }
  return absl::OkStatus();
}

// Rules 4 and 5 for key `k`: appends its distinct chunks to `out`, in box order. Sorts the
// key's pieces in place: non-empty ones by (box, range, rank), empty ones last.
absl::Status Planner::KeyChunks(uint32_t k, std::vector<Chunk>* out) {
  const KeyInfo& key = keys_[k];
  if (key.ref.absent) return absl::OkStatus();  // no chunks: nothing is staged
  if (key.ref.kind == v1::SHARD_KIND_EXTRA) return ExtraChunk(key, out);
  const size_t first_chunk = out->size();
  Piece* begin = pieces_.get() + key.begin;
  Piece* end = pieces_.get() + key.end;
  const uint32_t live_end =
      key.begin +
      static_cast<uint32_t>(
          std::partition(begin, end, [](const Piece& p) { return p.elements() > 0; }) - begin);
  std::sort(begin, pieces_.get() + live_end, PieceLess);
  for (uint32_t i = key.begin; i < live_end;) {
    uint32_t j = i + 1;
    while (j < live_end && CompareBoxes(piece(i), piece(j)) == 0) ++j;
    RETURN_IF_ERROR(BoxChunk(k, i, j, out));
    i = j;
  }
  const absl::Span<const Chunk> mine = absl::MakeConstSpan(*out).subspan(first_chunk);
  std::vector<BoxView> views;
  views.reserve(mine.size());
  for (const Chunk& chunk : mine) views.push_back(piece(chunk.begin).box());
  if (!TilesExactly(key.shape, views)) return CoverageError(key, mine, views);
  return absl::OkStatus();
}

bool Planner::PieceLess(const Piece& a, const Piece& b) {
  if (int c = CompareBoxes(a, b); c != 0) return c < 0;
  if (a.ranged != b.ranged) return !a.ranged;
  if (a.begin != b.begin) return a.begin < b.begin;
  if (a.end != b.end) return a.end < b.end;
  if (a.rank != b.rank) return a.rank < b.rank;
  return a.local < b.local;
}

absl::Status Planner::ExtraChunk(const KeyInfo& key, std::vector<Chunk>* out) const {
  const Piece& p = piece(key.begin);
  if (key.end - key.begin > 1) {
    const Piece& q = piece(key.begin + 1);
    return PlanError(layout_, v1::ERROR_CODE_MALFORMED_SHARD)
        .Fqn(key.ref.fqn)
        .Rank(p.rank)
        .Build(absl::StrCat(RankName(layout_, p.rank), " lists extra \"", key.ref.fqn,
                            "\" twice (shards ", p.local, " and ", q.local,
                            "); give each extra piece of a rank its own name."));
  }
  if (p.elements() == 0) return absl::OkStatus();
  out->push_back(Chunk{p.key, key.begin, key.begin + 1, p.shard->nbytes(), p.rank, false});
  return absl::OkStatus();
}

// The pieces pieces_[i, j) of key `k` share one box: identical ones must be replicas
// (rule 4); whole-box and flat-range claims must not mix; flat ranges must tile the box.
absl::Status Planner::BoxChunk(uint32_t k, uint32_t i, uint32_t j, std::vector<Chunk>* out) const {
  const Piece& first = piece(i);
  const v1::Box& box = first.shard->box();
  int64_t covered = 0;  // flat elements of the box tiled so far
  uint32_t prev_claim = i;
  for (uint32_t c = i; c < j;) {
    uint32_t d = c + 1;
    while (d < j && SamePiece(piece(c), piece(d))) ++d;
    RETURN_IF_ERROR(CheckReplicas(c, d));
    const Piece& p = piece(c);
    if (!first.ranged && c != i) {
      return OverlapError(first, p, absl::StrCat("holds box ", BoxString(box), " whole"),
                          absl::StrCat("holds flat range [", p.begin, ", ", p.end, ") of it"));
    }
    if (first.ranged) {
      if (p.begin < covered) {
        const Piece& q = piece(prev_claim);
        return OverlapError(
            q, p,
            absl::StrCat("holds flat range [", q.begin, ", ", q.end, ") of box ", BoxString(box)),
            absl::StrCat("holds flat range [", p.begin, ", ", p.end, ")"));
      }
      if (p.begin > covered) return FlatGapError(i, j, covered, p.begin);
      covered = p.end;
    }
    prev_claim = c;
    c = d;
  }
  const int64_t box_volume =
      first.ranged ? CheckedVolume(SpanOf(box.lengths())).value() : first.elements();
  if (first.ranged && covered != box_volume) return FlatGapError(i, j, covered, box_volume);
  out->push_back(Chunk{k, i, j,
                          static_cast<uint64_t>(box_volume) * DTypeSize(first.dtype_enum()), 0,
                          first.ranged});
  return absl::OkStatus();
}

// Rule 4: identical pieces pieces_[c, d) (sorted by rank) are replicas.
absl::Status Planner::CheckReplicas(uint32_t c, uint32_t d) const {
  const Piece& first = piece(c);
  const uint32_t group = layout_.ReplicaGroupKey(first.rank, first.mask);
  for (uint32_t x = c + 1; x < d; ++x) {
    const Piece& prev = piece(x - 1);
    const Piece& p = piece(x);
    if (p.rank == prev.rank) {
      return Error(v1::ERROR_CODE_MALFORMED_SHARD, p, p)
          .Build(absl::StrCat(RankName(layout_, p.rank), " lists ", PieceString(p),
                              " twice (shards ", prev.local, " and ", p.local,
                              "); each piece of a tensor must be listed once."));
    }
    if (p.mask != first.mask) {
      return Error(v1::ERROR_CODE_REPLICATION_MISMATCH, first, p)
          .Build(absl::StrCat(PieceString(p), " is declared replicated over ",
                              MaskString(layout_, first.mask), " by ",
                              RankName(layout_, first.rank), " but over ",
                              MaskString(layout_, p.mask), " by ", RankName(layout_, p.rank),
                              "; every replica must declare the same replicated_over."));
    }
    if (layout_.ReplicaGroupKey(p.rank, p.mask) != group) {
      return Error(v1::ERROR_CODE_DUPLICATE_FQN, first, p)
          .Build(absl::StrCat(
              PieceString(p), " is claimed by both ", RankName(layout_, first.rank), " and ",
              RankName(layout_, p.rank), ", which differ in ",
              DifferingDims(layout_, first.rank, p.rank), " outside replicated_over ",
              MaskString(layout_, first.mask),
              ", so they cannot be replicas; give the tensors each rank owns distinct names "
              "(e.g. global layer indices on every pipeline stage), or list the dims a truly "
              "shared tensor is replicated over."));
    }
  }
  return absl::OkStatus();
}

// "tensor "k" box [0:4, 0:8]" or "... flat range [0, 16) of box [...]".
std::string Planner::PieceString(const Piece& p) const {
  std::string s = absl::StrCat("tensor \"", KeyName(p), "\" box ", BoxString(p.shard->box()));
  if (p.ranged) absl::StrAppend(&s, " flat range [", p.begin, ", ", p.end, ")");
  return s;
}

PlanError Planner::Error(v1::ErrorCode code, const Piece& a, const Piece& b) const {
  PlanError error(layout_, code);
  error.Fqn(Fqn(a)).Rank(a.rank).Rank(b.rank);
  const KeyRef& ref = keys_[a.key].ref;
  if (ref.kind == v1::SHARD_KIND_OPTIMIZER && !ref.absent) error.StateKey(ref.state_key);
  return error;
}

absl::Status Planner::OverlapError(const Piece& a, const Piece& b, absl::string_view a_holds,
                                   absl::string_view b_holds) const {
  return Error(v1::ERROR_CODE_OVERLAPPING_SHARDS, a, b)
      .Build(absl::StrCat("Pieces of tensor \"", KeyName(a),
                          "\" overlap: ", RankName(layout_, a.rank), " ", a_holds, " and ",
                          RankName(layout_, b.rank), " ", b_holds,
                          "; the pieces of a tensor must be disjoint or exact replicas."));
}

absl::Status Planner::FlatGapError(uint32_t i, uint32_t j, int64_t gap_begin,
                                   int64_t gap_end) const {
  const Piece& first = piece(i);
  PlanError error = Error(v1::ERROR_CODE_INCOMPLETE_COVERAGE, first, first);
  for (uint32_t x = i; x < j && x < i + 8; ++x) error.Rank(piece(x).rank);
  error.Region(first.shard->box());
  return error.Build(absl::StrCat(
      "Flat elements [", gap_begin, ", ", gap_end, ") of box ", BoxString(first.shard->box()),
      " of tensor \"", KeyName(first),
      "\" are held by no rank; the flat ranges of a box must tile it (is a rank's optimizer "
      "slice missing from its plan?)."));
}

// Rule 5 failed for `key`, whose chunks are `chunks`: find the overlapping pair, else a
// missing region.
absl::Status Planner::CoverageError(const KeyInfo& key, absl::Span<const Chunk> chunks,
                                    const std::vector<BoxView>& views) const {
  auto claimant = [&](size_t view) -> const Piece& { return piece(chunks[view].begin); };
  if (std::optional<std::pair<size_t, size_t>> pair = FindOverlap(views); pair.has_value()) {
    const Piece& a = claimant(pair->first);
    const Piece& b = claimant(pair->second);
    return OverlapError(a, b, absl::StrCat("holds box ", BoxString(a.shard->box())),
                        absl::StrCat("holds box ", BoxString(b.shard->box())));
  }
  std::optional<Box> gap = FindUncovered(key.shape, views);
  if (!gap.has_value()) {
    return absl::InternalError(absl::StrCat("planner: tiling test failed for \"", key.name,
                                            "\" but no overlap or gap was found"));
  }
  PlanError error(layout_, v1::ERROR_CODE_INCOMPLETE_COVERAGE);
  error.Fqn(key.ref.fqn).Region(BoxToProto(*gap));
  if (key.ref.kind == v1::SHARD_KIND_OPTIMIZER) error.StateKey(key.ref.state_key);
  return error.Build(absl::StrCat(
      "Region ", BoxToString(*gap), " of tensor \"", key.name, "\" (shape [",
      absl::StrJoin(key.shape, ", "),
      "]) is held by no rank; the pieces of a tensor must cover it (is a rank or a pipeline "
      "stage missing this tensor?)."));
}

}  // namespace plan_internal
}  // namespace tessera
