// The global planner: turns every rank's local plan (the tensor pieces it holds) into one
// validated global save plan — what each rank writes, hashes and sends — and the manifest
// skeleton of the checkpoint. DESIGN.md "Global planning rules" and "Gathering optimizer state
// across DP" are implemented in this package, one rule per function: rule 0 in BuildGlobalPlan
// (planner.cc), rules 1 to 5 in validate.cc, the writers in assign.cc, the wire encoding of
// the assignments in encode.cc (planner_internal.h declares the Planner they share).
//
// The rules, in the order they are checked (the first violation is returned, so the error a
// plan gets is deterministic):
//   0. One local plan per rank of the layout (LAYOUT_MISMATCH); limits (PLAN_TOO_LARGE).
//   1. Every shard is well formed (MALFORMED_SHARD): a valid fqn (and state_key), a known kind
//      and dtype, at most 64 axes, a box inside the global shape, a flat range inside the box,
//      nbytes = elements x dtype size (0 for state_absent), replicated_over naming mesh dims,
//      state_key/state_absent on optimizer shards only, extras U8, 1-d and whole; and no rank
//      lists one piece twice. Extras' replicated_over is ignored: they belong to their rank.
//   2. All claims of a tensor key agree on dtype and global shape (SHAPE_MISMATCH).
//   3. Optimizer state: every rank that declares state for a parameter declares the same set of
//      state keys, or every one declares it absent (OPTIMIZER_STATE_MISMATCH). Checked per
//      parameter fqn across the job, which is stronger than per DP group and also covers
//      FSDP-style boxes, where each DP rank holds a different box. A rank that declares nothing
//      for the parameter is not compared (a distributed optimizer may give it no slice).
//   4. Identical pieces (key, box and flat range) from several ranks are replicas only if all
//      claimants declare the same `replicated_over` (else REPLICATION_MISMATCH) and lie in one
//      replica group of it (else DUPLICATE_FQN — the torchtitan PP bug). The claimants need
//      not be every member of the group: a tied embedding declared {dp, pp} is held by the
//      first and last of four stages only. A false replica claim is caught later, when the
//      replicas' hashes are compared (REPLICA_DIVERGED).
//   5. Distinct pieces of a key do not overlap (OVERLAPPING_SHARDS), and tile the global shape
//      exactly (INCOMPLETE_COVERAGE, naming a missing region). The flat ranges of one box tile
//      the box; such a box becomes one chunk, gathered by a DP leader. Pieces with no element
//      (FSDP2's empty shards) are legal and produce nothing. EXTRA pieces have no coverage rule.
// Then every chunk gets one writer: chunks only one rank holds first, then the others largest
// first, each to its least-loaded holder (bytes written per rank), ties to the lowest rank. A
// gathered box's writer is its DP leader; each distinct flat range is sourced from the
// leader's own copy if it has one, else from the replica that has sent the fewest bytes.
// Non-writing replicas of a whole box get a HashItem. Known gap: replicas of a flat range
// that do not send (a partially distributed optimizer, replicated over some DP dim) get no
// item, because v1's HashItem carries no flat range.
//
// Complexity: O(n log n) in the number of pieces n, never pairwise across ranks. Pieces are
// grouped by key with a hash map and sorted by box within a key. Exact tiling of a key by its
// d-dimensional chunks is decided with signed corner counts (plan_tiling.h): O(c 2^a log c)
// for c chunks sharded along a axes. Only the error path searches for the overlapping pair or
// the missing region. At DESIGN.md's scale (1,024 ranks x 1,000 shards) a first plan takes
// well under a second and the planner's own memory is a fraction of the local plans'
// (planner_benchmark.cc).
//
// Thread-safety: BuildGlobalPlan and the fingerprint functions (fingerprint.h) are pure
// functions. On plans of 65,536 shards or more, their passes over every shard, rank or key
// (validation with the grouping of pieces by key, fingerprints, rules 4 and 5 per key, encoding
// the assignments, FillDerived) run on up to 8 threads of their own, one per core
// (parallel_runs.h). Each thread takes a contiguous run of ranks (or of keys in name order) and
// the lowest run's error wins, so the error is the one a single thread would find first.
// PlanCache (plan_cache.h) is safe for concurrent use.
#ifndef TESSERA_SERVER_PLAN_PLANNER_H_
#define TESSERA_SERVER_PLAN_PLANNER_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/layout.h"
#include "tessera/v1/coordinator.pb.h"
#include "tessera/v1/manifest.pb.h"
#include "tessera/v1/types.pb.h"

namespace tessera {

// One rank's local plan: the pieces it holds, in the order it submitted them. Assignment
// items refer to pieces by their index in `shards`.
struct LocalPlan {
  uint32_t rank = 0;
  std::vector<v1::ShardDesc> shards;
};

struct PlannerOptions {
  // Most shards one rank may submit; more is PLAN_TOO_LARGE.
  // Default: 1 << 20.
  size_t max_shards_per_rank = size_t{1} << 20;
  // Most shards all ranks together may submit; more is PLAN_TOO_LARGE.
  // Default: 1 << 26.
  size_t max_total_shards = size_t{1} << 26;
  // Threads of the planner's passes on plans of 65,536 shards or more; smaller plans use one.
  // The plan and the error returned do not depend on it. 0: one per core; at most 8.
  // Default: 0.
  size_t threads = 0;
};

// A validated global plan.
struct GlobalPlan {
  // FingerprintPlans() (fingerprint.h) of the layout and local plans this plan was built from.
  uint64_t fingerprint = 0;
  // Index = rank: the rank's v1::RankAssignment, serialized — what its PinCommand carries and
  // what the session persists. Kept serialized because at a million pieces the parsed
  // messages take about three times the memory (DESIGN.md's < 1 GiB target). A rank
  // that writes anything has file = DataFileName(rank). Assignment(rank) parses one.
  std::vector<std::string> assignments;
  // The manifest skeleton, sorted by key: key, fqn, kind, state_key, rank (extras), dtype,
  // global_shape, state_absent, and chunks (sorted by box) with box, file, nbytes and
  // writer_rank. Offsets and checksums are filled in when the chunks are reported.
  // An optimizer state no rank has yet is one entry keyed "<fqn>#" with state_absent = true
  // and no chunks. A tensor with no element has an entry with no chunks.
  std::vector<v1::TensorEntry> tensors;
  // Index = rank: bytes of the chunks the rank writes.
  std::vector<uint64_t> bytes_written_by_rank;
  // Sum of all chunk bytes (each byte of the checkpoint counted once).
  uint64_t total_bytes = 0;
  // Index = rank: FingerprintLocalPlan of the rank's local plan. A submission that carries
  // only a fingerprint is matched against this (coordinator.proto shards_omitted).
  std::vector<uint64_t> rank_fingerprints;
  // Index = rank: bytes of the rank's shards (what it stages besides gathered slices), for
  // host-RAM admission when the shards themselves were not sent.
  std::vector<uint64_t> staged_bytes_by_rank;
  // Index = rank: the ranks it exchanges DP slices with (AssignmentPeers of its assignment:
  // the leaders it sends to, the peers it gathers from), sorted. What the rank's
  // GatherCommand.peer_addresses covers. Filled by BuildGlobalPlan and FillDerived.
  std::vector<std::vector<uint32_t>> peers;
  // ChunkId(key, box) -> the chunk's index in plan order (`tensors` in order, each tensor's
  // chunks in order: HashItem.chunk), for the agents' chunk reports, which name key and box.
  // Filled by BuildGlobalPlan and FillDerived: built once per plan, so a session of a cached
  // plan does not rebuild it on the way to PINNING (ChunkLedger reads it).
  absl::flat_hash_map<std::string, uint32_t> chunk_index;

  // assignments[rank], parsed.
  // Errors: OutOfRange if there is no such rank; DataLoss if the bytes do not parse.
  absl::StatusOr<v1::RankAssignment> Assignment(uint32_t rank) const;
};

// "data-00003.safetensors": the data file rank 3 writes.
std::string DataFileName(uint32_t rank);

// Sets what follows from a plan's assignments and tensors (for a plan restored from its
// record): plan->peers and plan->chunk_index.
// Errors: DataLoss if an assignment does not parse or two chunks have one ChunkId (both
// fields are then left empty).
absl::Status FillDerived(GlobalPlan* plan);

// Identifies a chunk within a plan: its tensor's key and its box (offsets and lengths).
std::string ChunkId(absl::string_view key, const v1::Box& box);

// The encoding of GlobalPlan.assignments (PlanRecord.assignment_format): 2 — HashItems and
// GatherSends name their local shard (and a HashItem its chunk's index in `tensors`) instead
// of carrying the chunk's key and box: at 16,384 ranks x 300 shards 140 MB of assignments
// instead of 373 MB (DESIGN.md "Plan caching"). A stored plan of another format is not used.
inline constexpr uint32_t kAssignmentFormat = 2;

// The v1::PlanRecord (coordinator_state.proto) of `plan`, encoded: fingerprint, assignments,
// tensors, bytes_written_by_rank, total_bytes, rank_fingerprints, staged_bytes_by_rank and
// kAssignmentFormat; the bytes of building the record and serializing it, without the
// record's copy of every assignment and tensor. Errors: none.
std::string EncodePlanRecord(const GlobalPlan& plan);

// Validates the local plans against the rules above and builds the global plan. `plans` must
// hold exactly one LocalPlan per rank of `layout`, in any order.
// Errors: InvalidArgument with an ErrorDetail (common/status.h) for every rule violation:
// LAYOUT_MISMATCH if a rank's plan is missing, repeated or out of the mesh; PLAN_TOO_LARGE over
// `options`' limits; MALFORMED_SHARD, SHAPE_MISMATCH, OPTIMIZER_STATE_MISMATCH,
// REPLICATION_MISMATCH, DUPLICATE_FQN, OVERLAPPING_SHARDS, INCOMPLETE_COVERAGE as described in
// the header comment. The detail names the fqn(s), the ranks with their mesh coordinates, the
// state key where it matters, and the missing region for INCOMPLETE_COVERAGE. Internal only
// on a bug in the planner itself.
absl::StatusOr<GlobalPlan> BuildGlobalPlan(const MeshLayout& layout,
                                           const std::vector<LocalPlan>& plans,
                                           const PlannerOptions& options = {});

}  // namespace tessera

#endif  // TESSERA_SERVER_PLAN_PLANNER_H_
