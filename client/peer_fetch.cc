#include "client/peer_fetch.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/bulk_wire.h"
#include "common/status.h"

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

}  // namespace

absl::StatusOr<VerifiedCopyResult> FetchVerified(const std::string& job, const v1::MemoryCopy& copy,
                                                 absl::Span<const SlotCopy> slots,
                                                 absl::Span<const BlockCheck> blocks,
                                                 int max_streams, absl::Time deadline) {
  ASSIGN_OR_RETURN(const std::vector<std::vector<size_t>> by_block,
                   SlotsByBlock(copy.nbytes(), slots, blocks));
  VerifiedCopyResult result;
  if (blocks.empty()) return result;
  const std::vector<Share> shares = Shares(blocks, max_streams);
  std::vector<absl::Status> errors(shares.size());
  std::vector<char> bad(blocks.size(), 0);
  std::atomic<bool> failed{false};  // the first error stops the other streams between blocks
  auto fetch = [&](size_t i) {
    const Share& share = shares[i];
    auto piece = std::make_unique<char[]>(kVerifiedCopyPiece);
    StreamingHasher hasher;
    size_t b = share.first;
    while (b < share.last && !failed.load()) {
      // One connection per run of contiguous blocks.
      size_t end = b + 1;
      while (end < share.last &&
             blocks[end].offset == blocks[end - 1].offset + blocks[end - 1].length) {
        ++end;
      }
      const uint64_t run_begin = blocks[b].offset;
      const uint64_t run_end = blocks[end - 1].offset + blocks[end - 1].length;
      absl::StatusOr<TcpSocket> socket =
          OpenBulkRead(copy.bulk_address(), job, copy, run_begin, run_end, deadline);
      if (!socket.ok()) {
        errors[i] = socket.status();
        failed.store(true);
        return;
      }
      // A piece one slot holds whole is received straight into it (the kernel's copy is the
      // only one; it is hashed from there); any other, into `piece`, then copied.
      auto received = [&](uint64_t begin, uint64_t piece_end) -> absl::StatusOr<const char*> {
        char* into = piece.get();
        for (size_t s : by_block[b]) {
          if (slots[s].offset <= begin && piece_end <= slots[s].offset + slots[s].size) {
            into = static_cast<char*>(slots[s].dst) + (begin - slots[s].offset);
            break;
          }
        }
        RETURN_IF_ERROR(socket->RecvAll(into, piece_end - begin, deadline));
        return into;
      };
      for (; b < end && !failed.load(); ++b) {
        absl::StatusOr<bool> matched =
            CopyAndCheckBlock(received, slots, blocks[b], by_block[b], hasher);
        if (!matched.ok()) {
          errors[i] = matched.status();
          failed.store(true);
          return;
        }
        if (!*matched) bad[b] = 1;
      }
    }
  };
  std::vector<std::thread> threads;
  for (size_t i = 1; i < shares.size(); ++i) threads.emplace_back(fetch, i);
  fetch(0);
  for (std::thread& t : threads) t.join();
  for (const absl::Status& error : errors) {
    if (!error.ok()) return error;
  }
  for (size_t b = 0; b < blocks.size(); ++b) {
    if (bad[b]) result.mismatched.push_back(b);
  }
  result.threads = static_cast<int>(shares.size());
  return result;
}

}  // namespace tessera
