// BuddyStore: the copies an agent holds as the memory buddy of agents on other nodes
// (DESIGN.md "Memory tier"): each sender's last committed data file, in this agent's heap,
// so a replacement of the sender's node can restore from it (PeerMemory.ReadMemoryCopy).
//
// One copy per writer rank: a newer one replaces it once it arrived whole (newer: reserved
// later — a sender sends its saves in order, whatever their steps, e.g. after a rollback; a
// put that completes after one reserved later is not kept). Bounded by a byte budget that counts
// everything held and every buffer being received — a sender's earlier put too, until its receive
// ends (a sender that gave up on it may already be sending the next): the copy a sender replaces
// stays (readable) while its successor arrives only if both fit; otherwise it is let go when
// the successor's room is reserved (its memory is freed when a read still holding it ends).
// If the successor then does not arrive whole, the store holds no copy of that sender.
//
// Thread-safety: all methods are safe for concurrent use.
#ifndef TESSERA_AGENT_BUDDY_STORE_H_
#define TESSERA_AGENT_BUDDY_STORE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "tessera/v1/types.pb.h"

namespace tessera {

// Bytes in memory, uninitialized when made.
class MemoryBuffer {
 public:
  // A buffer of `size` bytes. Errors: ResourceExhausted if they cannot be allocated (sizes
  // come from peers: a failed allocation is an answer, not the process's end).
  static absl::StatusOr<std::shared_ptr<MemoryBuffer>> Make(uint64_t size);

  char* data() { return data_.get(); }
  const char* data() const { return data_.get(); }
  uint64_t size() const { return size_; }

 private:
  MemoryBuffer(std::unique_ptr<char[]> data, uint64_t size)
      : data_(std::move(data)), size_(size) {}

  std::unique_ptr<char[]> data_;
  uint64_t size_;
};

struct HeldCopy {
  v1::MemoryCopy copy;
  std::shared_ptr<const MemoryBuffer> bytes;  // copy.nbytes() bytes
};

class BuddyStore {
 public:
  explicit BuddyStore(uint64_t budget_bytes) : budget_bytes_(budget_bytes) {}

  // Reserves room for `copy` (copy.writer_rank names the sender) and returns a buffer to
  // receive it into; the room counts until Keep or Abandon of that buffer.
  // Lets go of the writer's held copy first if the two would not fit together (logged).
  // Errors: ResourceExhausted if it would not fit the budget beside the other senders' held
  // copies and every copy being received, or could not be allocated (nothing is allocated for
  // a copy larger than the whole budget).
  absl::StatusOr<std::shared_ptr<MemoryBuffer>> Reserve(const v1::MemoryCopy& copy)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Keeps `bytes` (a buffer Reserve returned for `copy`) as the copy of copy.writer_rank,
  // replacing the one held unless that one was reserved later (then `bytes` is dropped,
  // logged). Its region name, if any, is cleared: the bytes live in this agent's heap.
  void Keep(v1::MemoryCopy copy, std::shared_ptr<const MemoryBuffer> bytes)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Gives back the room reserved for `buffer` (Reserve's) whose copy did not arrive whole.
  void Abandon(const MemoryBuffer* buffer) ABSL_LOCKS_EXCLUDED(mu_);

  // The copy of `file` of checkpoint (step, session_id), if held.
  std::optional<HeldCopy> Find(int64_t step, absl::string_view session_id,
                               absl::string_view file) const ABSL_LOCKS_EXCLUDED(mu_);

  // Every copy held (for heartbeats), by writer rank.
  std::vector<v1::MemoryCopy> Copies() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const uint64_t budget_bytes_;
  mutable absl::Mutex mu_;
  // A copy held or being received, and when its room was reserved (order of Reserve calls).
  struct Held {
    HeldCopy held;
    uint64_t reserved = 0;
  };
  struct Arriving {
    uint64_t bytes = 0;
    uint64_t reserved = 0;
  };
  uint64_t reservations_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint32_t, Held> copies_ ABSL_GUARDED_BY(mu_);                   // by writer rank
  std::map<const MemoryBuffer*, Arriving> incoming_ ABSL_GUARDED_BY(mu_);  // by buffer
};

}  // namespace tessera

#endif  // TESSERA_AGENT_BUDDY_STORE_H_
