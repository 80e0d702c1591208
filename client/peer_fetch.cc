#include "client/peer_fetch.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "common/bulk_wire.h"
#include "common/socket_group.h"
#include "common/status.h"
#include "common/threads.h"

namespace tessera {
namespace {

// Blocks [first, last) of the fetch: one stream's share.
struct Share {
  size_t first = 0;
  size_t last = 0;
};

// Splits `blocks` into at most `streams` consecutive shares of about equal bytes, none empty.
std::vector<Share> Shares(absl::Span<const BlockCheck> blocks, int streams) {
  uint64_t total = 0;
  for (const BlockCheck& block : blocks) total += block.length;
  const uint64_t most = static_cast<uint64_t>(std::max(streams, 1));
  std::vector<Share> shares;
  uint64_t taken = 0;
  size_t first = 0;
  for (size_t b = 0; b < blocks.size(); ++b) {
    taken += blocks[b].length;
    // The share ends once it holds its part of the total (rounded up), or at the last block.
    const uint64_t due = (total * (shares.size() + 1) + most - 1) / most;
    if (taken >= due || b + 1 == blocks.size()) {
      shares.push_back(Share{first, b + 1});
      first = b + 1;
    }
  }
  return shares;
}

// Blocks at most this far apart are read over one connection, the bytes between them received
// and dropped: chunk bodies start 4 KiB-aligned, so a file's blocks are contiguous only where
// chunk sizes happen to be whole pages, and a connection per gap would cost a connect and a
// request round trip each (hundreds for a model of many odd-sized tensors).
constexpr uint64_t kMaxSkippedGap = kVerifiedCopyPiece;

uint64_t End(const BlockCheck& block) { return block.offset + block.length; }

}  // namespace

absl::StatusOr<VerifiedCopyResult> FetchVerified(const PeerCredential& credential,
                                                 const v1::MemoryCopy& copy,
                                                 absl::Span<const SlotCopy> slots,
                                                 absl::Span<const BlockCheck> blocks,
                                                 int max_streams, TimeLimit limit) {
  ASSIGN_OR_RETURN(const std::vector<std::vector<size_t>> by_block,
                   SlotsByBlock(copy.nbytes(), slots, blocks));
  VerifiedCopyResult result;
  if (blocks.empty()) return result;
  const std::vector<Share> shares = Shares(blocks, max_streams);
  std::vector<char> bad(blocks.size(), 0);  // each written by one stream, read after the joins
  SocketGroup group;                        // the first error ends every stream
  auto fetch = [&](size_t i) {
    const Share& share = shares[i];
    auto piece = std::make_unique<char[]>(kReceiveThenHashBytes);
    StreamingHasher hasher;
    size_t b = share.first;
    while (b < share.last && !group.failed()) {
      // One connection per run of blocks no more than kMaxSkippedGap apart.
      size_t end = b + 1;
      while (end < share.last && blocks[end].offset - End(blocks[end - 1]) <= kMaxSkippedGap) {
        ++end;
      }
      const uint64_t run_begin = blocks[b].offset;
      const uint64_t run_end = End(blocks[end - 1]);
      std::optional<TcpSocket> socket;
      if (run_end > run_begin) {  // blocks of no bytes need no connection
        absl::StatusOr<TcpSocket> opened =
            TcpSocket::Connect(copy.bulk_address(), limit.StepDeadline());
        if (!opened.ok()) return group.Fail(opened.status());
        socket.emplace(*std::move(opened));
        if (!group.Open(*socket)) return;
      }
      absl::Cleanup unregister = [&] {
        if (socket.has_value()) group.Close(*socket);
      };
      if (socket.has_value()) {
        absl::Status asked =
            RequestBulkRead(*socket, copy.bulk_address(), credential, copy, run_begin, run_end,
                            limit.StepDeadline());
        if (!asked.ok()) return group.Fail(std::move(asked));
      }
      uint64_t at = run_begin;  // the next byte the connection delivers
      // What has arrived goes straight into the slot that holds the piece's first byte, up to
      // that slot's end (the kernel's copy is the only one; it is hashed from there); bytes no
      // slot holds (padding), into `piece`, up to the next slot's start.
      auto received = [&](uint64_t begin,
                          uint64_t block_end) -> absl::StatusOr<absl::Span<const char>> {
        char* into = piece.get();
        uint64_t most = std::min(kReceiveThenHashBytes, block_end - begin);
        uint64_t next_slot = block_end;  // where the padding from `begin` ends
        for (size_t s : by_block[b]) {
          const SlotCopy& slot = slots[s];
          if (slot.offset <= begin && begin < slot.offset + slot.size) {
            into = static_cast<char*>(slot.dst) + (begin - slot.offset);
            most = std::min(most, slot.offset + slot.size - begin);
            next_slot = block_end;
            break;
          }
          if (slot.offset > begin) next_slot = std::min(next_slot, slot.offset);
        }
        most = std::min(most, next_slot - begin);
        ASSIGN_OR_RETURN(const size_t got, socket->RecvSome(into, most, limit));
        at = begin + got;
        return absl::Span<const char>(into, got);
      };
      for (; b < end; ++b) {
        absl::Status skipped;
        while (skipped.ok() && at < blocks[b].offset) {  // the gap before this block: dropped
          const uint64_t n = std::min(kReceiveThenHashBytes, blocks[b].offset - at);
          skipped = socket->RecvAll(piece.get(), n, limit);
          at += n;
        }
        absl::StatusOr<bool> matched =
            skipped.ok() ? CopyAndCheckBlock(received, slots, blocks[b], by_block[b], hasher)
                         : skipped;
        if (!matched.ok()) return group.Fail(matched.status());
        if (!*matched) bad[b] = 1;
        if (group.failed()) return;
      }
    }
  };
  RunOnThreads(shares.size(), fetch);
  RETURN_IF_ERROR(group.first_error());
  for (size_t b = 0; b < blocks.size(); ++b) {
    if (bad[b]) result.mismatched.push_back(b);
  }
  result.threads = static_cast<int>(shares.size());
  return result;
}

}  // namespace tessera
