// VerifiedCopy: copies shards out of a load region while checking the region's checksum
// blocks, so that a restore reads each byte once (DESIGN.md "Memory tier": checked by the
// trainer).
//
// A load served in place hands the trainer the agent's resident region and, unverified, the
// checksum blocks its slots touch (LoadResponse.unverified_blocks): the agent does not read
// the region at all. The trainer checks every block in the pass that copies it out: each
// piece of a block (kVerifiedCopyPiece bytes) is first copied into the destinations it
// belongs to, then hashed from the region while it is still in this core's cache. Reading the
// bytes once instead of twice (the agent's verification pass, then the trainer's copy) is
// what brings a restore from memory near a memcpy of the same bytes.
//
// What is checked is the region, a piece right after the piece was copied out: the agent keeps
// the region unwritten while the load holds it, so the copy holds the bytes that were hashed.
//
// Checked ahead: a block the caller already found to hash to the same XXH3 at the same place
// in the same region (client/resident_prefetch.h, while the trainer built its model) is only
// copied. The rule is the block's identity — offset, length and XXH3 all equal — so a region
// the agent rewrote since (another step, other bytes) never passes on an older check.
//
// Thread-safety: a pure function over caller memory; the destinations must not overlap the
// region or each other.
#ifndef TESSERA_CLIENT_VERIFIED_COPY_H_
#define TESSERA_CLIENT_VERIFIED_COPY_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/checksum.h"

namespace tessera {

// Copy region[offset, offset + size) to dst.
struct SlotCopy {
  void* dst = nullptr;
  uint64_t offset = 0;
  uint64_t size = 0;
};

// Bytes copied, then hashed, at a time: small enough to stay in a core's L2 between the copy
// and the hash, large enough that the per-piece calls cost nothing.
inline constexpr uint64_t kVerifiedCopyPiece = uint64_t{64} << 10;

struct VerifiedCopyResult {
  // Indices into `blocks` whose bytes do not hash to their xxh3, ascending. Destinations that
  // overlap them hold unverified bytes: the caller must not use them.
  std::vector<size_t> mismatched;
  int threads = 0;  // threads that copied (0: nothing copied)
  uint64_t checked_ahead_bytes = 0;  // of the blocks' bytes, those only copied (checked ahead)
};

// Where a block's bytes come from, one piece at a time and in order: asked for the bytes
// [begin, end) of the region (offsets from its first byte; `end` is the block's), returns the
// next piece, some of them from `begin` on (at least one byte), valid until the next call —
// where they lie in a mapped region (VerifiedCopy: kVerifiedCopyPiece at a time), or what
// has arrived, received into a buffer or straight into the slot that holds them
// (client/peer_fetch.h; nothing is copied then) — or why they cannot be had.
using PieceSource =
    absl::FunctionRef<absl::StatusOr<absl::Span<const char>>(uint64_t begin, uint64_t end)>;

// VerifiedCopy's rule for its arguments, checked against a region of `region_size` bytes;
// returns, for each block, the slots that have bytes in it (indices into `slots`).
// Errors: InvalidArgument naming the block or slot that breaks it.
absl::StatusOr<std::vector<std::vector<size_t>>> SlotsByBlock(uint64_t region_size,
                                                              absl::Span<const SlotCopy> slots,
                                                              absl::Span<const BlockCheck> blocks);

// One block of VerifiedCopy: takes its bytes from `source`, a piece at a time, copies each
// piece into the slots `block_slots` that have bytes in it, then hashes it while it is still
// in this core's cache; true if the block matches its XXH3. Errors: `source`'s (the slots
// then hold some of the block's bytes, unchecked), or Internal if it returned no bytes or
// more than were asked for.
absl::StatusOr<bool> CopyAndCheckBlock(PieceSource source, absl::Span<const SlotCopy> slots,
                                       const BlockCheck& block,
                                       const std::vector<size_t>& block_slots,
                                       StreamingHasher& hasher);

// Copies every slot and checks every block of `region`, on up to `max_threads` threads (each
// takes the next whole block; one thread when the blocks total at most `parallel_min_bytes`).
// `blocks` must be sorted by offset, not overlap, and lie inside [0, region_size); every byte
// of every slot must lie in some block (bytes no block covers would be copied unchecked).
// A block equal to one of `checked_ahead` (offset, length and XXH3; sorted by offset) is
// copied without being hashed — the caller found these bytes of this region to match before
// — as ParallelCopy copies (client/parallel_copy.h), ahead of the blocks it hashes.
// Errors: InvalidArgument naming the block or slot that breaks this; nothing is copied then.
absl::StatusOr<VerifiedCopyResult> VerifiedCopy(const char* region, uint64_t region_size,
                                                absl::Span<const SlotCopy> slots,
                                                absl::Span<const BlockCheck> blocks,
                                                absl::Span<const BlockCheck> checked_ahead,
                                                int max_threads, uint64_t parallel_min_bytes);

}  // namespace tessera

#endif  // TESSERA_CLIENT_VERIFIED_COPY_H_
