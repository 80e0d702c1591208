#include "server/plan/planner.h"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/hash/hash.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/types/span.h"
#include "common/box.h"
#include "common/checksum.h"
#include "common/dtype.h"
#include "common/plan_fingerprint.h"
#include "common/shard_rules.h"
#include "common/status.h"
#include "common/tensor_key.h"
#include "common/threads.h"
#include "server/plan/parallel_runs.h"
#include "server/plan/plan_tiling.h"
#include "server/plan/plan_wire.h"
#include "tessera/v1/coordinator_state.pb.h"

namespace tessera {

using plan_internal::ForEachInRuns;
using plan_internal::PassThreads;
using plan_internal::SplitRuns;

namespace {

using Int64s = google::protobuf::RepeatedField<int64_t>;

absl::Span<const int64_t> SpanOf(const Int64s& field) {
  return absl::Span<const int64_t>(field.data(), field.size());
}

std::string BoxString(const v1::Box& box) { return BoxToString(BoxFromProto(box)); }

// ---------------------------------------------------------------------------------------------
// Errors

std::string RankName(const MeshLayout& layout, uint32_t rank) {
  return absl::StrCat("rank ", rank, " (", layout.CoordString(rank), ")");
}

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

// Collects an ErrorDetail; Build() makes the InvalidArgument status every planning error is.
class PlanError {
 public:
  PlanError(const MeshLayout& layout, v1::ErrorCode code) : layout_(layout) {
    detail_.set_code(code);
  }
  PlanError& Fqn(absl::string_view fqn) {
    std::string printable = PrintableName(fqn);
    for (const std::string& f : detail_.fqns()) {
      if (f == printable) return *this;
    }
    detail_.add_fqns(std::move(printable));
    return *this;
  }
  PlanError& Rank(uint32_t rank) {
    for (const v1::RankRef& r : detail_.ranks()) {
      if (r.rank() == rank) return *this;
    }
    v1::RankRef* ref = detail_.add_ranks();
    ref->set_rank(rank);
    if (rank < layout_.world_size()) ref->set_coords(layout_.CoordString(rank));
    return *this;
  }
  PlanError& Region(const v1::Box& region) {
    *detail_.mutable_region() = region;
    return *this;
  }
  PlanError& StateKey(absl::string_view state_key) {
    detail_.set_state_key(PrintableName(state_key));
    return *this;
  }
  absl::Status Build(std::string message) {
    detail_.set_message(std::move(message));
    return MakeError(absl::StatusCode::kInvalidArgument, detail_);
  }

 private:
  const MeshLayout& layout_;
  v1::ErrorDetail detail_;
};

// ---------------------------------------------------------------------------------------------
// Pieces and keys

// One ShardDesc of one rank, validated, with what the rules need precomputed.
struct Piece {
  const v1::ShardDesc* shard;
  // shard->box()'s coordinates, cached so that sorting and tiling never chase the shard.
  const int64_t* offsets;
  const int64_t* lengths;
  uint64_t mask;  // replicated_over as a DimMask
  int64_t begin;  // flat range within the box; [0, box volume) when !ranged
  int64_t end;
  uint32_t rank;
  int32_t local;     // index in the rank's local plan
  uint32_t key;      // index into Planner::keys_
  uint8_t box_rank;  // <= kMaxTensorAxes (common/shard_rules.h)
  uint8_t dtype;     // a v1::DType
  bool ranged;
  bool shape_differs;  // dtype or global shape differs from the key's first claim

  // Elements this rank holds (the flat range's if it has one).
  int64_t elements() const { return end - begin; }
  BoxView box() const { return BoxView{{offsets, box_rank}, {lengths, box_rank}}; }
  v1::DType dtype_enum() const { return static_cast<v1::DType>(dtype); }
};

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

// What identifies a tensor key, without building the key string for every piece.
struct KeyRef {
  absl::string_view fqn;
  absl::string_view state_key;
  v1::ShardKind kind;
  bool absent;          // optimizer state declared absent: key "<fqn>#"
  uint32_t extra_rank;  // SHARD_KIND_EXTRA: the owning rank

  bool operator==(const KeyRef& o) const {
    return fqn == o.fqn && state_key == o.state_key && kind == o.kind && absent == o.absent &&
           extra_rank == o.extra_rank;
  }
  template <typename H>
  friend H AbslHashValue(H h, const KeyRef& k) {
    return H::combine(std::move(h), k.fqn, k.state_key, static_cast<int>(k.kind), k.absent,
                      k.extra_rank);
  }
};

struct KeyInfo {
  KeyRef ref;
  std::string name;    // TensorKey()
  uint32_t begin = 0;  // pieces of the key: Planner::pieces_[begin, end)
  uint32_t end = 0;
  v1::DType dtype;             // of the first claim, in (rank, shard) order
  std::vector<int64_t> shape;  // ditto
};

// A distinct chunk: one box of one key, written once.
struct Chunk {
  uint32_t key;
  uint32_t begin, end;  // its pieces: Planner::pieces_[begin, end), sorted by (range, rank)
  uint64_t nbytes;
  uint32_t writer = 0;                          // the writer, or the DP leader of a gathered box
  bool gathered;                                // the pieces are flat ranges of the box
  uint32_t sources_begin = 0, sources_end = 0;  // Planner::sources_[begin, end)
};

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

// ---------------------------------------------------------------------------------------------
// The planner proper: one instance per BuildGlobalPlan call, one method per rule.

class Planner {
 public:
  Planner(const MeshLayout& layout, std::vector<const LocalPlan*> by_rank, size_t total_shards,
          size_t threads)
      : layout_(layout),
        by_rank_(std::move(by_rank)),
        total_shards_(total_shards),
        requested_threads_(threads) {}

  absl::StatusOr<GlobalPlan> Run() {
    RETURN_IF_ERROR(CollectPieces());
    RETURN_IF_ERROR(NameKeys());
    RETURN_IF_ERROR(CheckShapes());
    RETURN_IF_ERROR(CheckOptimizerState());
    RETURN_IF_ERROR(BuildChunks());
    RETURN_IF_ERROR(CheckTotalBytes());
    AssignWriters();
    return Emit();
  }

 private:
  const Piece& piece(uint32_t i) const { return pieces_[i]; }
  absl::string_view Fqn(const Piece& p) const { return p.shard->fqn(); }
  const std::string& KeyName(const Piece& p) const { return keys_[p.key].name; }

  size_t Threads(size_t work) const { return PassThreads(work, requested_threads_); }

  static KeyRef RefOf(const Piece& p) {
    const v1::ShardDesc& s = *p.shard;
    return KeyRef{s.fqn(), s.state_key(), s.kind(), s.state_absent(),
                  s.kind() == v1::SHARD_KIND_EXTRA ? p.rank : 0u};
  }

  // The keys one run of ranks claims, in order of first appearance in the run.
  struct RunKeys {
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
  absl::Status CollectPieces() {
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
  absl::Status NameKeys() {
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
  absl::Status CheckShapes() {
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
  absl::Status CheckOptimizerState() {
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

  absl::Status CompareStateKeySets(absl::Span<const uint32_t> group,
                                   const std::vector<std::pair<uint32_t, uint32_t>>& claims) {
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
  absl::Status BuildChunks() {
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
  absl::Status KeyChunks(uint32_t k, std::vector<Chunk>* out) {
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

  static bool PieceLess(const Piece& a, const Piece& b) {
    if (int c = CompareBoxes(a, b); c != 0) return c < 0;
    if (a.ranged != b.ranged) return !a.ranged;
    if (a.begin != b.begin) return a.begin < b.begin;
    if (a.end != b.end) return a.end < b.end;
    if (a.rank != b.rank) return a.rank < b.rank;
    return a.local < b.local;
  }
  static bool SamePiece(const Piece& a, const Piece& b) {
    return a.ranged == b.ranged && a.begin == b.begin && a.end == b.end;  // boxes already equal
  }

  absl::Status ExtraChunk(const KeyInfo& key, std::vector<Chunk>* out) const {
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
  absl::Status BoxChunk(uint32_t k, uint32_t i, uint32_t j, std::vector<Chunk>* out) const {
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
  absl::Status CheckReplicas(uint32_t c, uint32_t d) const {
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
  std::string PieceString(const Piece& p) const {
    std::string s = absl::StrCat("tensor \"", KeyName(p), "\" box ", BoxString(p.shard->box()));
    if (p.ranged) absl::StrAppend(&s, " flat range [", p.begin, ", ", p.end, ")");
    return s;
  }

  PlanError Error(v1::ErrorCode code, const Piece& a, const Piece& b) const {
    PlanError error(layout_, code);
    error.Fqn(Fqn(a)).Rank(a.rank).Rank(b.rank);
    const KeyRef& ref = keys_[a.key].ref;
    if (ref.kind == v1::SHARD_KIND_OPTIMIZER && !ref.absent) error.StateKey(ref.state_key);
    return error;
  }

  absl::Status OverlapError(const Piece& a, const Piece& b, absl::string_view a_holds,
                            absl::string_view b_holds) const {
    return Error(v1::ERROR_CODE_OVERLAPPING_SHARDS, a, b)
        .Build(absl::StrCat("Pieces of tensor \"", KeyName(a),
                            "\" overlap: ", RankName(layout_, a.rank), " ", a_holds, " and ",
                            RankName(layout_, b.rank), " ", b_holds,
                            "; the pieces of a tensor must be disjoint or exact replicas."));
  }

  absl::Status FlatGapError(uint32_t i, uint32_t j, int64_t gap_begin, int64_t gap_end) const {
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
  absl::Status CoverageError(const KeyInfo& key, absl::Span<const Chunk> chunks,
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

  // Rule 7: one writer per chunk, balancing bytes written per rank. Chunks with one possible
  // writer are placed first; the others go, largest first, to their least-loaded claimant.
  void AssignWriters() {
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
  absl::Status CheckTotalBytes() const {
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
  void ChooseSources() {
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

  // What one rank does for one chunk.
  enum class ItemKind : uint8_t { kWrite, kHash, kSend };
  struct Item {  // with its piece's fields copied, so encoding reads items sequentially
    uint32_t chunk;
    int32_t local;  // kHash, kSend: the rank's piece
    int64_t begin;  // kSend, ranged kHash: its flat range
    int64_t end;
    ItemKind kind;
    bool ranged = false;     // kHash of a replicated flat-range slice
    uint32_t reference = 0;  // ranged kHash: the rank whose slice is gathered
  };

  // Calls fn(rank, Item) for every item of every rank, in chunk order.
  template <typename Fn>
  void ForEachItem(Fn fn) const {
    for (uint32_t c = 0; c < chunks_.size(); ++c) {
      const Chunk& chunk = chunks_[c];
      fn(chunk.writer, Item{c, 0, 0, 0, ItemKind::kWrite});
      if (chunk.gathered) {
        for (uint32_t x = chunk.sources_begin; x < chunk.sources_end; ++x) {
          const Piece& p = piece(sources_[x]);
          if (p.rank != chunk.writer) fn(p.rank, Item{c, p.local, p.begin, p.end, ItemKind::kSend});
        }
        // A slice held by several ranks (replicas of a flat range): every holder hashes it,
        // so the coordinator can check them against the one that is gathered.
        uint32_t group = chunk.sources_begin;
        for (uint32_t x = chunk.begin; x < chunk.end; ++group) {
          uint32_t y = x + 1;
          while (y < chunk.end && SamePiece(piece(x), piece(y))) ++y;
          if (y - x > 1) {
            const uint32_t reference = piece(sources_[group]).rank;
            for (uint32_t z = x; z < y; ++z) {
              const Piece& p = piece(z);
              fn(p.rank, Item{c, p.local, p.begin, p.end, ItemKind::kHash, true, reference});
            }
          }
          x = y;
        }
      } else {
        for (uint32_t x = chunk.begin; x < chunk.end; ++x) {
          const Piece& p = piece(x);
          if (p.rank != chunk.writer) fn(p.rank, Item{c, p.local, 0, 0, ItemKind::kHash});
        }
      }
    }
  }

  GlobalPlan Emit() {
    const uint32_t world = layout_.world_size();
    GlobalPlan plan;
    plan.fingerprint = CombineFingerprints(layout_, rank_fingerprints_);
    plan.rank_fingerprints = rank_fingerprints_;
    plan.staged_bytes_by_rank = staged_bytes_;
    plan.bytes_written_by_rank = load_;
    for (uint64_t bytes : load_) plan.total_bytes += bytes;
    EmitTensors(&plan);

    // Group the items by rank (a counting sort), then encode each rank's assignment straight
    // into wire format (plan_wire.h): items of one chunk share its pre-encoded key and box.
    ChooseSources();
    std::vector<uint32_t> offsets(world + 1, 0);
    ForEachItem([&](uint32_t rank, const Item&) { ++offsets[rank + 1]; });
    for (uint32_t r = 0; r < world; ++r) offsets[r + 1] += offsets[r];
    std::vector<Item> items(offsets[world]);
    {
      std::vector<uint32_t> next(offsets.begin(), offsets.end() - 1);
      ForEachItem([&](uint32_t rank, const Item& item) { items[next[rank]++] = item; });
    }
    EncodeChunkBytes();
    plan.assignments.resize(world);
    const size_t threads = Threads(items.size());
    RunOnThreads(threads, [&](size_t t) {
      std::string buffer;  // reused: its capacity grows once per thread, not per rank
      for (uint32_t r = static_cast<uint32_t>(t); r < world; r += static_cast<uint32_t>(threads)) {
        buffer.clear();
        absl::Span<const Item> mine(items.data() + offsets[r], offsets[r + 1] - offsets[r]);
        const bool writes = std::any_of(mine.begin(), mine.end(),
                                        [](const Item& i) { return i.kind == ItemKind::kWrite; });
        if (writes) {
          WireWriter(&buffer).String(v1::RankAssignment::kFileFieldNumber, DataFileName(r));
        }
        // Fields in number order: writes, hashes, sends.
        for (ItemKind kind : {ItemKind::kWrite, ItemKind::kHash, ItemKind::kSend}) {
          for (const Item& item : mine) {
            if (item.kind == kind) EncodeItem(item, &buffer);
          }
        }
        plan.assignments[r] = buffer;
      }
    });
    return plan;
  }

  void EmitTensors(GlobalPlan* plan) const {
    plan->tensors.reserve(sorted_keys_.size());
    size_t c = 0;
    for (uint32_t k : sorted_keys_) {
      const KeyInfo& key = keys_[k];
      v1::TensorEntry& entry = plan->tensors.emplace_back();
      entry.set_key(key.name);
      entry.set_fqn(std::string(key.ref.fqn));
      entry.set_kind(key.ref.kind);
      if (!key.ref.absent) entry.set_state_key(std::string(key.ref.state_key));
      entry.set_state_absent(key.ref.absent);
      if (key.ref.kind == v1::SHARD_KIND_EXTRA) entry.set_rank(key.ref.extra_rank);
      entry.set_dtype(key.dtype);
      entry.mutable_global_shape()->Add(key.shape.begin(), key.shape.end());
      size_t end = c;
      while (end < chunks_.size() && chunks_[end].key == k) ++end;
      entry.mutable_chunks()->Reserve(static_cast<int>(end - c));
      for (; c < end; ++c) {
        const Chunk& chunk = chunks_[c];
        v1::ChunkEntry* ce = entry.add_chunks();
        *ce->mutable_box() = piece(chunk.begin).shard->box();
        ce->set_file(DataFileName(chunk.writer));
        ce->set_nbytes(chunk.nbytes);
        ce->set_writer_rank(chunk.writer);
      }
    }
  }

  static uint64_t Int32Varint(int32_t v) { return static_cast<uint64_t>(static_cast<int64_t>(v)); }

  // Each chunk's encoded WriteItem, which only its writer carries. (HashItems and
  // GatherSends name their local shard and chunk: no key or box to share.)
  void EncodeChunkBytes() {
    write_bytes_.reserve(chunks_.size());
    std::string box;
    for (const Chunk& chunk : chunks_) {
      const std::string& key = keys_[chunk.key].name;
      box = EncodeBox(piece(chunk.begin).shard->box());
      std::string& write = write_bytes_.emplace_back();
      WireWriter w(&write);
      w.String(v1::WriteItem::kKeyFieldNumber, key);
      w.Message(v1::WriteItem::kBoxFieldNumber, box);
      w.Varint(v1::WriteItem::kDtypeFieldNumber, piece(chunk.begin).dtype);
      w.Varint(v1::WriteItem::kNbytesFieldNumber, chunk.nbytes);
      for (uint32_t x = chunk.sources_begin; x < chunk.sources_end; ++x) {
        const Piece& p = piece(sources_[x]);
        WireBuffer source, range;
        source.Varint(v1::ChunkSource::kRankFieldNumber, p.rank);
        source.Varint(v1::ChunkSource::kLocalShardFieldNumber, Int32Varint(p.local));
        if (chunk.gathered) {
          range.Varint(v1::FlatRange::kBeginFieldNumber, static_cast<uint64_t>(p.begin));
          range.Varint(v1::FlatRange::kEndFieldNumber, static_cast<uint64_t>(p.end));
          source.Message(v1::ChunkSource::kRangeFieldNumber, range.view());
        }
        w.Message(v1::WriteItem::kSourcesFieldNumber, source.view());
      }
    }
  }

  // Appends `item` to `out`, an encoded v1::RankAssignment.
  void EncodeItem(const Item& item, std::string* out) const {
    if (item.kind == ItemKind::kWrite) {
      WireWriter(out).Message(v1::RankAssignment::kWritesFieldNumber, write_bytes_[item.chunk]);
      return;
    }
    const Chunk& chunk = chunks_[item.chunk];
    WireBuffer body, range;
    range.Varint(v1::FlatRange::kBeginFieldNumber, static_cast<uint64_t>(item.begin));
    range.Varint(v1::FlatRange::kEndFieldNumber, static_cast<uint64_t>(item.end));
    int field;
    if (item.kind == ItemKind::kHash) {
      field = v1::RankAssignment::kHashesFieldNumber;
      body.Varint(v1::HashItem::kLocalShardFieldNumber, Int32Varint(item.local));
      body.Varint(v1::HashItem::kWriterRankFieldNumber, item.ranged ? item.reference : chunk.writer);
      if (item.ranged) body.Message(v1::HashItem::kRangeFieldNumber, range.view());
      body.Varint(v1::HashItem::kChunkFieldNumber, item.chunk);
    } else {
      field = v1::RankAssignment::kSendsFieldNumber;
      body.Varint(v1::GatherSend::kLocalShardFieldNumber, Int32Varint(item.local));
      body.Message(v1::GatherSend::kRangeFieldNumber, range.view());
      body.Varint(v1::GatherSend::kLeaderRankFieldNumber, chunk.writer);
    }
    WireWriter(out).Message(field, body.view());
  }

  const MeshLayout& layout_;
  const std::vector<const LocalPlan*> by_rank_;  // index = rank
  const size_t total_shards_;
  const size_t requested_threads_;  // PlannerOptions.threads

  std::vector<uint64_t> rank_fingerprints_;  // FingerprintLocalPlan, index = rank
  std::vector<uint64_t> staged_bytes_;       // bytes of the rank's shards, index = rank
  std::unique_ptr<Piece[]> pieces_;  // every shard (total_shards_), grouped by key (see KeyChunks)
  std::vector<KeyInfo> keys_;                // in order of first appearance
  std::vector<uint32_t> sorted_keys_;        // key indices sorted by name
  std::vector<Chunk> chunks_;                // in key-name order, then box order
  std::vector<uint32_t> sources_;            // per chunk, the pieces it is assembled from
  std::vector<std::string> write_bytes_;     // per chunk, its encoded WriteItem
  std::vector<uint64_t> load_;               // bytes written per rank
};

}  // namespace

absl::StatusOr<v1::RankAssignment> GlobalPlan::Assignment(uint32_t rank) const {
  if (rank >= assignments.size()) {
    return absl::OutOfRangeError(
        absl::StrCat("rank ", rank, " is not in a plan of ", assignments.size(), " ranks"));
  }
  v1::RankAssignment assignment;
  if (!assignment.ParseFromString(assignments[rank])) {
    return absl::DataLossError(absl::StrCat("the assignment of rank ", rank, " does not parse"));
  }
  return assignment;
}

std::string DataFileName(uint32_t rank) { return absl::StrFormat("data-%05u.safetensors", rank); }

namespace {

// plan->peers from plan->assignments.
absl::Status FillPeers(GlobalPlan* plan) {
  const uint32_t world = static_cast<uint32_t>(plan->assignments.size());
  size_t bytes = 0;
  for (const std::string& a : plan->assignments) bytes += a.size();
  // A pass over every item, like a pass over every shard: a rank's is independent.
  const size_t threads = PassThreads(bytes / 16);
  std::vector<std::vector<uint32_t>> peers(world);
  std::vector<std::optional<uint32_t>> corrupt(threads);  // the first bad rank of each thread
  RunOnThreads(threads, [&](size_t t) {
    for (uint32_t r = static_cast<uint32_t>(t); r < world; r += static_cast<uint32_t>(threads)) {
      absl::StatusOr<std::vector<uint32_t>> mine = AssignmentPeers(plan->assignments[r], r);
      if (!mine.ok()) {
        corrupt[t] = r;
        return;
      }
      peers[r] = *std::move(mine);
    }
  });
  std::optional<uint32_t> bad;
  for (const std::optional<uint32_t>& r : corrupt) {
    if (r.has_value() && (!bad.has_value() || *r < *bad)) bad = r;
  }
  if (bad.has_value()) {
    plan->peers.clear();
    return absl::DataLossError(absl::StrCat("the assignment of rank ", *bad, " does not parse"));
  }
  plan->peers = std::move(peers);
  return absl::OkStatus();
}

// plan->chunk_index from plan->tensors.
absl::Status IndexChunks(GlobalPlan* plan) {
  absl::flat_hash_map<std::string, uint32_t> index;
  size_t chunks = 0;
  for (const v1::TensorEntry& t : plan->tensors) chunks += t.chunks_size();
  index.reserve(chunks);
  uint32_t next = 0;
  for (const v1::TensorEntry& t : plan->tensors) {
    for (const v1::ChunkEntry& c : t.chunks()) {
      if (!index.emplace(ChunkId(t.key(), c.box()), next++).second) {
        return absl::DataLossError(absl::StrCat("the plan lists chunk ",
                                                ChunkName(t.key(), BoxFromProto(c.box())),
                                                " twice"));
      }
    }
  }
  plan->chunk_index = std::move(index);
  return absl::OkStatus();
}

}  // namespace

std::string ChunkId(absl::string_view key, const v1::Box& box) {
  return ChunkName(key, BoxFromProto(box)) + "|" + absl::StrJoin(box.lengths(), ",");
}

absl::Status FillDerived(GlobalPlan* plan) {
  absl::Status status = FillPeers(plan);
  if (status.ok()) status = IndexChunks(plan);
  if (!status.ok()) {
    plan->peers.clear();
    plan->chunk_index.clear();
  }
  return status;
}

std::string EncodePlanRecord(const GlobalPlan& plan) {
  size_t size = 64 + 11 * plan.bytes_written_by_rank.size();
  for (const std::string& a : plan.assignments) size += a.size() + 6;
  std::string out;
  out.reserve(size);
  WireWriter w(&out);
  if (plan.fingerprint != 0) {  // fixed64
    WireBuffer tag;
    tag.RawVarint((uint64_t{v1::PlanRecord::kFingerprintFieldNumber} << 3) | 1);
    out.append(tag.view().data(), tag.size());
    for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(plan.fingerprint >> (8 * i)));
  }
  for (const std::string& a : plan.assignments) {
    w.Message(v1::PlanRecord::kAssignmentsFieldNumber, a);  // repeated bytes: empty ones too
  }
  std::string tensor;
  for (const v1::TensorEntry& t : plan.tensors) {
    tensor.clear();
    t.AppendToString(&tensor);
    w.Message(v1::PlanRecord::kTensorsFieldNumber, tensor);
  }
  auto packed_varints = [&](int field, const std::vector<uint64_t>& values) {
    if (values.empty()) return;
    std::string packed;
    for (uint64_t b : values) {
      WireBuffer v;
      v.RawVarint(b);
      packed.append(v.view().data(), v.size());
    }
    w.Message(field, packed);
  };
  packed_varints(v1::PlanRecord::kBytesWrittenByRankFieldNumber, plan.bytes_written_by_rank);
  w.Varint(v1::PlanRecord::kTotalBytesFieldNumber, plan.total_bytes);
  if (!plan.rank_fingerprints.empty()) {  // packed fixed64
    std::string packed;
    packed.reserve(8 * plan.rank_fingerprints.size());
    for (uint64_t fp : plan.rank_fingerprints) {
      for (int i = 0; i < 8; ++i) packed.push_back(static_cast<char>(fp >> (8 * i)));
    }
    w.Message(v1::PlanRecord::kRankFingerprintsFieldNumber, packed);
  }
  packed_varints(v1::PlanRecord::kStagedBytesByRankFieldNumber, plan.staged_bytes_by_rank);
  w.Varint(v1::PlanRecord::kAssignmentFormatFieldNumber, kAssignmentFormat);
  return out;
}

absl::StatusOr<GlobalPlan> BuildGlobalPlan(const MeshLayout& layout,
                                           const std::vector<LocalPlan>& plans,
                                           const PlannerOptions& options) {
  const uint32_t world = layout.world_size();
  std::vector<const LocalPlan*> by_rank(world, nullptr);
  size_t total = 0;
  for (const LocalPlan& plan : plans) {
    if (plan.rank >= world) {
      return PlanError(layout, v1::ERROR_CODE_LAYOUT_MISMATCH)
          .Rank(plan.rank)
          .Build(absl::StrCat("A local plan comes from rank ", plan.rank, " but the mesh has ",
                              world, " ranks; every rank must run with the job's layout."));
    }
    if (by_rank[plan.rank] != nullptr) {
      return PlanError(layout, v1::ERROR_CODE_LAYOUT_MISMATCH)
          .Rank(plan.rank)
          .Build(absl::StrCat(RankName(layout, plan.rank),
                              " submitted two local plans; each rank submits exactly one."));
    }
    by_rank[plan.rank] = &plan;
    if (plan.shards.size() > options.max_shards_per_rank) {
      return PlanError(layout, v1::ERROR_CODE_PLAN_TOO_LARGE)
          .Rank(plan.rank)
          .Build(absl::StrCat(RankName(layout, plan.rank), " submitted ", plan.shards.size(),
                              " shards, over the limit of ", options.max_shards_per_rank,
                              " per rank; merge small tensors or raise the limit."));
    }
    total += plan.shards.size();
  }
  if (total > options.max_total_shards) {
    return PlanError(layout, v1::ERROR_CODE_PLAN_TOO_LARGE)
        .Build(absl::StrCat("The job's plans hold ", total, " shards, over the limit of ",
                            options.max_total_shards,
                            " per plan; merge small tensors or raise the limit."));
  }
  for (uint32_t rank = 0; rank < world; ++rank) {
    if (by_rank[rank] == nullptr) {
      return PlanError(layout, v1::ERROR_CODE_LAYOUT_MISMATCH)
          .Rank(rank)
          .Build(absl::StrCat("No local plan from ", RankName(layout, rank),
                              "; every rank of the mesh must submit one."));
    }
  }
  Planner planner(layout, std::move(by_rank), total, options.threads);
  absl::StatusOr<GlobalPlan> plan = planner.Run();
  if (plan.ok()) {
    if (absl::Status derived = FillDerived(&*plan); !derived.ok()) {
      return absl::InternalError(
          absl::StrCat("the planner produced a plan that cannot be read back: ",
                       derived.message()));
    }
  }
  return plan;
}

}  // namespace tessera
