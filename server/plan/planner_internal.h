// INTERNAL to //server/plan:planner, not an API: include server/plan/planner.h instead. This is
// a private header of that library (in its srcs, not its hdrs); no other target includes it.
//
// The Planner (one instance per BuildGlobalPlan call, one method per rule) and the plain
// structs its passes share, declared here so that its methods are defined by concept:
//   planner.cc   Run: the passes in order, after BuildGlobalPlan has checked rule 0;
//   validate.cc  rules 1 to 5: pieces and keys, shapes, optimizer state, chunks and tiling;
//   assign.cc    the total bytes, each chunk's writer and the pieces it is assembled from;
//   encode.cc    Emit: the manifest skeleton and every rank's assignment in wire format.
//
// Thread-safety: a Planner is not thread-safe: one thread calls Run, once. Its passes over
// every shard, rank or key run on threads of their own (parallel_runs.h), each writing only
// its run's slots, and join before the pass returns.
#ifndef TESSERA_SERVER_PLAN_PLANNER_INTERNAL_H_
#define TESSERA_SERVER_PLAN_PLANNER_INTERNAL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/layout.h"
#include "common/status.h"
#include "common/tensor_key.h"
#include "server/plan/parallel_runs.h"
#include "server/plan/plan_tiling.h"
#include "server/plan/planner.h"
#include "tessera/v1/types.pb.h"

namespace tessera {
namespace plan_internal {

// ---------------------------------------------------------------------------------------------
// Errors

inline std::string RankName(const MeshLayout& layout, uint32_t rank) {
  return absl::StrCat("rank ", rank, " (", layout.CoordString(rank), ")");
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

  // The passes in the order of the rules; the first error ends the run (planner.cc).
  absl::StatusOr<GlobalPlan> Run();

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
  static bool SamePiece(const Piece& a, const Piece& b) {
    return a.ranged == b.ranged && a.begin == b.begin && a.end == b.end;  // boxes already equal
  }

  // validate.cc: rules 1 to 5, one method each, and their errors.
  struct RunKeys;
  absl::Status CollectPieces();
  absl::Status NameKeys();
  absl::Status CheckShapes();
  absl::Status CheckOptimizerState();
  absl::Status CompareStateKeySets(absl::Span<const uint32_t> group,
                                   const std::vector<std::pair<uint32_t, uint32_t>>& claims);
  absl::Status BuildChunks();
  absl::Status KeyChunks(uint32_t k, std::vector<Chunk>* out);
  static bool PieceLess(const Piece& a, const Piece& b);
  absl::Status ExtraChunk(const KeyInfo& key, std::vector<Chunk>* out) const;
  absl::Status BoxChunk(uint32_t k, uint32_t i, uint32_t j, std::vector<Chunk>* out) const;
  absl::Status CheckReplicas(uint32_t c, uint32_t d) const;
  std::string PieceString(const Piece& p) const;
  PlanError Error(v1::ErrorCode code, const Piece& a, const Piece& b) const;
  absl::Status OverlapError(const Piece& a, const Piece& b, absl::string_view a_holds,
                            absl::string_view b_holds) const;
  absl::Status FlatGapError(uint32_t i, uint32_t j, int64_t gap_begin, int64_t gap_end) const;
  absl::Status CoverageError(const KeyInfo& key, absl::Span<const Chunk> chunks,
                             const std::vector<BoxView>& views) const;

  // assign.cc: the writer of each chunk and its sources.
  void AssignWriters();
  absl::Status CheckTotalBytes() const;
  void ChooseSources();

  // encode.cc: the manifest skeleton and every rank's assignment, in wire format.
  enum class ItemKind : uint8_t;
  struct Item;
  template <typename Fn>
  void ForEachItem(Fn fn) const;
  GlobalPlan Emit();
  void EmitTensors(GlobalPlan* plan) const;
  static uint64_t Int32Varint(int32_t v);
  void EncodeChunkBytes();
  void EncodeItem(const Item& item, std::string* out) const;

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

}  // namespace plan_internal
}  // namespace tessera

#endif  // TESSERA_SERVER_PLAN_PLANNER_INTERNAL_H_
