// Test fixture shared by the transport tests: one box of optimizer state split into uneven,
// random flat ranges across DP ranks, the leader's staging slot, and the Exchange() arguments
// of each rank.
//
// Thread-safety: build it on one thread; afterwards each rank's buffers are touched only by
// that rank's Exchange().
#ifndef TESSERA_AGENT_PEER_GATHER_FIXTURE_TEST_UTIL_H_
#define TESSERA_AGENT_PEER_GATHER_FIXTURE_TEST_UTIL_H_

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "agent/peer/peer_transport.h"
#include "common/box.h"

namespace tessera {
namespace testing {

class DpBox {
 public:
  // Splits `box` (elements of `elem_size` bytes) across `ranks` at cut points drawn from
  // `seed`; if `empty_rank_index` is in range, that rank's range is empty. The bytes come from
  // `data_seed` (default: `seed`), so two boxes can share cut points and differ in content.
  // `leader` must be in `ranks`.
  DpBox(uint32_t seed, std::string key, Box box, size_t elem_size, std::vector<uint32_t> ranks,
        uint32_t leader, int empty_rank_index = -1, uint32_t data_seed = 0)
      : key_(std::move(key)), box_(std::move(box)), elem_size_(elem_size), ranks_(ranks),
        leader_(leader) {
    int64_t volume = 1;
    for (int64_t l : box_.lengths) volume *= l;
    std::mt19937_64 rng(seed);
    std::vector<int64_t> cuts = {0, volume};
    for (size_t i = 1; i < ranks_.size(); ++i) {
      cuts.push_back(std::uniform_int_distribution<int64_t>(0, volume)(rng));
    }
    std::sort(cuts.begin(), cuts.end());
    if (empty_rank_index >= 0 && empty_rank_index < static_cast<int>(ranks_.size())) {
      // Collapse that rank's range onto its begin (its neighbour takes the elements).
      const size_t i = empty_rank_index;
      if (i + 1 < ranks_.size()) {
        cuts[i + 1] = cuts[i];
      } else {
        cuts[i] = cuts[i + 1];
      }
    }
    cuts_ = cuts;
    std::mt19937_64 data_rng(data_seed != 0 ? data_seed : seed);
    expected_.resize(volume * elem_size_);
    for (char& c : expected_) c = static_cast<char>(data_rng());
    leader_slot_.assign(expected_.size(), '\0');
    for (size_t i = 0; i < ranks_.size(); ++i) {
      const std::string bytes = expected_.substr(cuts_[i] * elem_size_,
                                                 (cuts_[i + 1] - cuts_[i]) * elem_size_);
      if (ranks_[i] == leader_) {
        // The leader's own range is already in place in its slot.
        std::copy(bytes.begin(), bytes.end(), leader_slot_.begin() + cuts_[i] * elem_size_);
      } else {
        staged_[ranks_[i]] = bytes;
      }
    }
  }

  // What `rank` sends (nothing for the leader).
  std::vector<SliceSend> Sends(uint32_t rank) const {
    std::vector<SliceSend> sends;
    for (size_t i = 0; i < ranks_.size(); ++i) {
      if (ranks_[i] != rank || rank == leader_) continue;
      const std::string& bytes = staged_.at(rank);
      SliceSend s;
      s.key = key_;
      s.box = box_;
      s.begin = cuts_[i];
      s.end = cuts_[i + 1];
      s.data = bytes.data();
      s.nbytes = bytes.size();
      s.leader_rank = leader_;
      sends.push_back(s);
    }
    return sends;
  }

  // What the leader receives (nothing for other ranks), into its slot.
  std::vector<SliceRecv> Recvs(uint32_t rank) {
    std::vector<SliceRecv> recvs;
    if (rank != leader_) return recvs;
    for (size_t i = 0; i < ranks_.size(); ++i) {
      if (ranks_[i] == leader_) continue;
      SliceRecv r;
      r.key = key_;
      r.box = box_;
      r.from_rank = ranks_[i];
      r.begin = cuts_[i];
      r.end = cuts_[i + 1];
      r.dest = &leader_slot_[cuts_[i] * elem_size_];
      r.nbytes = (cuts_[i + 1] - cuts_[i]) * elem_size_;
      recvs.push_back(r);
    }
    return recvs;
  }

  const std::string& expected() const { return expected_; }
  const std::string& leader_slot() const { return leader_slot_; }
  uint32_t leader() const { return leader_; }
  const std::vector<int64_t>& cuts() const { return cuts_; }
  size_t slice_bytes(size_t rank_index) const {
    return (cuts_[rank_index + 1] - cuts_[rank_index]) * elem_size_;
  }

 private:
  std::string key_;
  Box box_;
  size_t elem_size_;
  std::vector<uint32_t> ranks_;
  uint32_t leader_;
  std::vector<int64_t> cuts_;
  std::string expected_;
  std::string leader_slot_;
  std::map<uint32_t, std::string> staged_;
};

// A Notification that may be notified any number of times, from any thread (hooks that fire
// once per parked stream).
class OnceNotification {
 public:
  void Notify() {
    absl::MutexLock lock(&mu_);
    if (!notification_.HasBeenNotified()) notification_.Notify();
  }
  void WaitForNotification() const { notification_.WaitForNotification(); }
  bool HasBeenNotified() const { return notification_.HasBeenNotified(); }

 private:
  absl::Mutex mu_;
  absl::Notification notification_;
};

// Concatenates the Exchange() arguments of several boxes for one rank.
inline std::vector<SliceSend> AllSends(const std::vector<DpBox*>& boxes, uint32_t rank) {
  std::vector<SliceSend> out;
  for (const DpBox* b : boxes) {
    for (const SliceSend& s : b->Sends(rank)) out.push_back(s);
  }
  return out;
}

inline std::vector<SliceRecv> AllRecvs(const std::vector<DpBox*>& boxes, uint32_t rank) {
  std::vector<SliceRecv> out;
  for (DpBox* b : boxes) {
    for (const SliceRecv& r : b->Recvs(rank)) out.push_back(r);
  }
  return out;
}

}  // namespace testing
}  // namespace tessera

#endif  // TESSERA_AGENT_PEER_GATHER_FIXTURE_TEST_UTIL_H_
