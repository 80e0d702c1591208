// BuddyReplicator: sends this agent's resident copy (agent/memory_tier.h) to its memory buddy
// on another node (DESIGN.md "Memory tier"), in the background.
//
// The coordinator names the buddy in every heartbeat reply (SetBuddy); the memory tier says
// when a save committed a new copy (OnPublished). Whenever the copy the buddy should hold —
// (buddy and its incarnation, step, session) — differs from the last one sent whole, a thread
// sends it (over the buddy's bulk port, else PeerMemory.PutMemoryCopy) from the resident
// region, holding it: the staging pool never hands a held region to a save
// (agent/staging_pool.h), so the bytes stay the commit's.
// Sending starts after the commit, so it never competes with the save's disk write, and the
// Send given (agent_main) pauses while a trainer is blocked in a save. A failed
// send is logged (once per copy and buddy) and tried again at the next SetBuddy (the next
// heartbeat). At most one send runs at a time; destruction cancels it between chunks. A save
// about to acquire staging calls GiveWay: a send of a copy older than the newest commit holds
// the region that save reuses (saves alternate between two sets), and would make it create a
// new one on the trainer's time; that send is given up and the newest copy sent instead (the
// buddy keeps what it held whole before).
//
// Thread-safety: all methods are safe for concurrent use.
#ifndef TESSERA_AGENT_BUDDY_REPLICATOR_H_
#define TESSERA_AGENT_BUDDY_REPLICATOR_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/memory_tier.h"
#include "tessera/v1/coordinator.pb.h"
#include "tessera/v1/types.pb.h"

namespace tessera {

class BuddyReplicator {
 public:
  // Sends `copy` (header, writer_rank set, no region) with its copy.nbytes() bytes at `data`
  // to `buddy` (agent/memory_bulk.h SendMemoryCopyToBuddy), giving up between chunks once
  // `cancel` is true. Returns the receiver's error or the transport's.
  using Send = std::function<absl::Status(const v1::MemoryBuddy& buddy,
                                          const v1::MemoryCopy& copy, const char* data,
                                          const std::atomic<bool>& cancel)>;

  // `tier` must outlive the replicator. `rank` is this agent's (the copies' writer_rank).
  BuddyReplicator(const MemoryTier* tier, uint32_t rank, Send send);
  ~BuddyReplicator();  // stops the thread (a send in progress is cancelled between chunks)

  // The buddy the coordinator named (nullopt: none).
  void SetBuddy(std::optional<v1::MemoryBuddy> buddy) ABSL_LOCKS_EXCLUDED(mu_);

  // The memory tier published a new resident copy.
  void OnPublished() ABSL_LOCKS_EXCLUDED(mu_);

  // A save is about to acquire staging: if the send in progress is of a copy older than the
  // tier's current one, cancels it and returns once it has let that copy's region go (one
  // chunk, or the Send's pause for a trainer's save to notice) — or after `max_wait`, if the
  // send is stuck (a buddy that stopped reading holds a write until the Send's deadline): the
  // save then finds the region held and makes another, as it would without GiveWay. After
  // kMaxGiveUpsInARow sends given up in a row (saves coming faster than the buddy receives
  // copies) it lets the send finish instead, so that the buddy gets a whole copy: logged, and
  // the save makes another region. Returns false when the region stays held (those two
  // cases); at once true if no such send runs.
  bool GiveWay(absl::Duration max_wait) ABSL_LOCKS_EXCLUDED(mu_);

  static constexpr int kMaxGiveUpsInARow = 2;

 private:
  void Run();

  const MemoryTier* const tier_;
  const uint32_t rank_;
  const Send send_;

  mutable absl::Mutex mu_;
  std::optional<v1::MemoryBuddy> buddy_ ABSL_GUARDED_BY(mu_);
  bool wake_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::string sent_ ABSL_GUARDED_BY(mu_);    // key of the last copy sent whole
  std::string failed_ ABSL_GUARDED_BY(mu_);  // key of the last failure logged
  // The copy being sent, if a send is in progress: (step, session id).
  std::optional<std::pair<int64_t, std::string>> sending_ ABSL_GUARDED_BY(mu_);
  int given_up_in_a_row_ ABSL_GUARDED_BY(mu_) = 0;  // sends cancelled by GiveWay since one ended
  // Set (under mu_) to stop the send in progress: at destruction, or by GiveWay. Cleared
  // (under mu_) before each send unless stopping.
  std::atomic<bool> cancel_{false};

  std::thread thread_;  // last: joins before the fields above go away
};

}  // namespace tessera

#endif  // TESSERA_AGENT_BUDDY_REPLICATOR_H_
