#include "client/verified_copy.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/parallel_copy.h"
#include "common/status.h"

namespace tessera {
namespace {

uint64_t End(const BlockCheck& block) { return block.offset + block.length; }

}  // namespace

absl::StatusOr<std::vector<std::vector<size_t>>> SlotsByBlock(uint64_t region_size,
                                                              absl::Span<const SlotCopy> slots,
                                                              absl::Span<const BlockCheck> blocks) {
  for (size_t b = 0; b < blocks.size(); ++b) {
    const BlockCheck& block = blocks[b];
    if (block.offset > region_size || block.length > region_size - block.offset) {
      return absl::InvalidArgumentError(absl::StrCat("block ", b, " [", block.offset, ", +",
                                                     block.length, ") is outside the ", region_size,
                                                     "-byte region"));
    }
    if (b > 0 && block.offset < End(blocks[b - 1])) {
      return absl::InvalidArgumentError(absl::StrCat("block ", b, " at ", block.offset,
                                                     " overlaps or precedes block ", b - 1,
                                                     " ending at ", End(blocks[b - 1])));
    }
  }
  std::vector<std::vector<size_t>> by_block(blocks.size());
  for (size_t s = 0; s < slots.size(); ++s) {
    const SlotCopy& slot = slots[s];
    if (slot.size == 0) continue;
    if (slot.offset > region_size || slot.size > region_size - slot.offset) {
      return absl::InvalidArgumentError(absl::StrCat("slot ", s, " [", slot.offset, ", +",
                                                     slot.size, ") is outside the ", region_size,
                                                     "-byte region"));
    }
    // The first block ending after the slot's start; then blocks must follow one another
    // without a gap until the slot's end.
    auto it =
        std::upper_bound(blocks.begin(), blocks.end(), slot.offset,
                         [](uint64_t at, const BlockCheck& block) { return at < End(block); });
    uint64_t covered = slot.offset;
    const uint64_t slot_end = slot.offset + slot.size;
    for (; it != blocks.end() && covered < slot_end && it->offset <= covered; ++it) {
      by_block[it - blocks.begin()].push_back(s);
      covered = End(*it);
    }
    if (covered < slot_end) {
      return absl::InvalidArgumentError(
          absl::StrCat("slot ", s, " [", slot.offset, ", +", slot.size, "): bytes from ", covered,
                       " lie in no block, so they could not be checked"));
    }
  }
  return by_block;
}

namespace {

// memcpy, in runs the C library copies with vector registers when `dst` and `src` are not
// equally aligned: for a 64 KiB piece glibc uses `rep movsb`, which on AMD Zen runs at less
// than half speed when the two differ modulo 64 (verified_copy_benchmark: 53 ms against 22 ms
// for 256 MiB on two threads, destination 16 bytes off; a whole-buffer memcpy does not use it).
// Runs of at most 2 KiB stay below glibc's rep-movsb threshold.
void CopyPiece(char* dst, const char* src, uint64_t n) {
  constexpr uint64_t kRun = 2048;
  if (((reinterpret_cast<uintptr_t>(dst) - reinterpret_cast<uintptr_t>(src)) & 63) == 0) {
    std::memcpy(dst, src, n);
    return;
  }
  for (uint64_t done = 0; done < n; done += kRun) {
    std::memcpy(dst + done, src + done, std::min(kRun, n - done));
  }
}

}  // namespace

absl::StatusOr<bool> CopyAndCheckBlock(PieceSource source, absl::Span<const SlotCopy> slots,
                                       const BlockCheck& block,
                                       const std::vector<size_t>& block_slots,
                                       StreamingHasher& hasher) {
  hasher.Reset();
  for (uint64_t begin = block.offset, end = 0; begin < End(block); begin = end) {
    ASSIGN_OR_RETURN(const absl::Span<const char> got, source(begin, End(block)));
    if (got.empty() || got.size() > End(block) - begin) {
      return absl::InternalError(absl::StrCat("a piece source returned ", got.size(),
                                              " bytes at ", begin, " for up to ",
                                              End(block) - begin));
    }
    const char* piece = got.data();
    end = begin + got.size();
    for (size_t s : block_slots) {
      const SlotCopy& slot = slots[s];
      const uint64_t from = std::max(begin, slot.offset);
      const uint64_t to = std::min(end, slot.offset + slot.size);
      char* dst = static_cast<char*>(slot.dst) + (from - slot.offset);
      const char* src = piece + (from - begin);
      // A source may have put the piece in its destination already (client/peer_fetch.h).
      if (from < to && dst != src) CopyPiece(dst, src, to - from);
    }
    hasher.Update(piece, end - begin);
  }
  return hasher.Digest() == block.xxh3;
}

namespace {

// For each of `blocks`, whether `checked_ahead` holds the same block: both sorted by offset.
std::vector<char> CheckedAhead(absl::Span<const BlockCheck> blocks,
                               absl::Span<const BlockCheck> checked_ahead) {
  std::vector<char> ahead(blocks.size(), 0);
  auto it = checked_ahead.begin();
  for (size_t b = 0; b < blocks.size() && it != checked_ahead.end(); ++b) {
    while (it != checked_ahead.end() && it->offset < blocks[b].offset) ++it;
    if (it != checked_ahead.end() && it->offset == blocks[b].offset &&
        it->length == blocks[b].length && it->xxh3 == blocks[b].xxh3) {
      ahead[b] = 1;
    }
  }
  return ahead;
}

// The bytes of `block` that the slots `block_slots` hold, appended to `items` as copies from
// `region`; an item that continues the last one in both region and slot extends it.
void AppendBlockCopies(const char* region, absl::Span<const SlotCopy> slots,
                       const BlockCheck& block, const std::vector<size_t>& block_slots,
                       std::vector<CopyItem>& items) {
  for (size_t s : block_slots) {
    const SlotCopy& slot = slots[s];
    const uint64_t from = std::max(block.offset, slot.offset);
    const uint64_t to = std::min(End(block), slot.offset + slot.size);
    if (from >= to) continue;
    char* dst = static_cast<char*>(slot.dst) + (from - slot.offset);
    const char* src = region + from;
    if (!items.empty()) {
      CopyItem& last = items.back();
      if (static_cast<char*>(last.dst) + last.size == dst &&
          static_cast<const char*>(last.src) + last.size == src) {
        last.size += to - from;
        continue;
      }
    }
    items.push_back(CopyItem{dst, src, to - from});
  }
}

}  // namespace

absl::StatusOr<VerifiedCopyResult> VerifiedCopy(const char* region, uint64_t region_size,
                                                absl::Span<const SlotCopy> slots,
                                                absl::Span<const BlockCheck> blocks,
                                                absl::Span<const BlockCheck> checked_ahead,
                                                int max_threads, uint64_t parallel_min_bytes) {
  ASSIGN_OR_RETURN(const std::vector<std::vector<size_t>> by_block,
                   SlotsByBlock(region_size, slots, blocks));
  VerifiedCopyResult result;
  if (blocks.empty()) return result;
  // Blocks checked ahead are only copied, as a plain load copies (ParallelCopy: long runs
  // split evenly across the threads), before the others are copied and checked.
  const std::vector<char> ahead = CheckedAhead(blocks, checked_ahead);
  std::vector<CopyItem> ahead_copies;
  uint64_t total = 0;  // bytes of the blocks to hash
  size_t to_hash = 0;  // and how many
  for (size_t b = 0; b < blocks.size(); ++b) {
    if (ahead[b]) {
      result.checked_ahead_bytes += blocks[b].length;
      AppendBlockCopies(region, slots, blocks[b], by_block[b], ahead_copies);
    } else {
      total += blocks[b].length;
      ++to_hash;
    }
  }
  result.threads = ParallelCopy(ahead_copies, max_threads, parallel_min_bytes);
  if (total == 0) return result;
  const int threads = (max_threads <= 1 || total <= parallel_min_bytes)
                          ? 1
                          : static_cast<int>(std::min<uint64_t>(max_threads, to_hash));
  // Each thread takes the next block not yet taken.
  std::atomic<size_t> next{0};
  std::vector<char> bad(blocks.size(), 0);
  auto in_region = [region](uint64_t begin,
                            uint64_t end) -> absl::StatusOr<absl::Span<const char>> {
    return absl::Span<const char>(region + begin, std::min(kVerifiedCopyPiece, end - begin));
  };
  auto worker = [&] {
    StreamingHasher hasher;
    for (size_t b = next.fetch_add(1); b < blocks.size(); b = next.fetch_add(1)) {
      if (ahead[b]) continue;
      // The region is at hand: the source cannot fail.
      if (!*CopyAndCheckBlock(in_region, slots, blocks[b], by_block[b], hasher)) bad[b] = 1;
    }
  };
  std::vector<std::thread> workers;
  for (int t = 1; t < threads; ++t) workers.emplace_back(worker);
  worker();
  for (std::thread& w : workers) w.join();
  for (size_t b = 0; b < blocks.size(); ++b) {
    if (bad[b]) result.mismatched.push_back(b);
  }
  result.threads = std::max(result.threads, threads);
  return result;
}

}  // namespace tessera
