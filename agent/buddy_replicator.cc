#include "agent/buddy_replicator.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace tessera {

BuddyReplicator::BuddyReplicator(const MemoryTier* tier, uint32_t rank, Send send)
    : tier_(tier), rank_(rank), send_(std::move(send)) {
  thread_ = std::thread([this] { Run(); });
}

BuddyReplicator::~BuddyReplicator() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    cancel_.store(true);
  }
  thread_.join();
}

void BuddyReplicator::SetBuddy(std::optional<v1::MemoryBuddy> buddy) {
  absl::MutexLock lock(&mu_);
  buddy_ = std::move(buddy);
  wake_ = true;
}

void BuddyReplicator::OnPublished() {
  absl::MutexLock lock(&mu_);
  wake_ = true;
}

bool BuddyReplicator::GiveWay(absl::Duration max_wait) {
  const std::optional<v1::MemoryCopy> current = tier_->CurrentCopy();
  absl::MutexLock lock(&mu_);
  if (!sending_.has_value() || !current.has_value() ||
      (sending_->first == current->step() && sending_->second == current->session_id())) {
    return true;  // nothing sent, or the newest copy: its region is not the one a save reuses
  }
  if (given_up_in_a_row_ >= kMaxGiveUpsInARow) {
    LogWarning("the memory copy of step ", sending_->first, " is sent to the buddy to its end: ",
               given_up_in_a_row_, " sends in a row were given up for saves, and the buddy ",
               "holds no newer whole copy; the save stages into a new region");
    return false;
  }
  // Until that send is over — not until no send runs: the newest copy's send may start at
  // once, and it pauses while this agent's trainer is in a save, which waits for us.
  const std::pair<int64_t, std::string> older = *sending_;
  cancel_.store(true);
  auto let_go = [this, &older]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return sending_ != older; };
  if (mu_.AwaitWithTimeout(absl::Condition(&let_go), max_wait)) return true;
  LogWarning("the memory copy of step ", older.first, " being sent to the buddy did not stop ",
             "within ", absl::FormatDuration(max_wait), " (the buddy is not reading?): the save ",
             "stages into a new region");
  return false;
}

void BuddyReplicator::Run() {
  while (true) {
    std::optional<v1::MemoryBuddy> buddy;
    {
      absl::MutexLock lock(&mu_);
      auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || wake_; };
      mu_.Await(absl::Condition(&woken));
      if (stop_) return;
      wake_ = false;
      buddy = buddy_;
    }
    std::optional<v1::MemoryCopy> copy = tier_->CurrentCopy();
    if (!buddy.has_value() || !copy.has_value()) continue;
    const std::string key =
        absl::StrCat(buddy->rank(), "@", buddy->peer_address(), "#", buddy->incarnation(), "/",
                     copy->step(), "/", copy->session_id());
    {
      absl::MutexLock lock(&mu_);
      if (key == sent_) continue;
    }
    // Hold the region while its bytes are read; it may be dropped for a save meanwhile.
    ResidentView view = tier_->Find(copy->step(), copy->session_id());
    auto file = view.files.find(copy->file());
    if (file == view.files.end()) continue;
    copy->set_writer_rank(rank_);
    copy->clear_region();  // the buddy holds it in its heap, not in this region
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
      if (wake_) continue;  // published or re-paired since `copy` was read: look again
      cancel_.store(false);
      sending_ = std::make_pair(copy->step(), copy->session_id());
    }
    const absl::Status sent = send_(*buddy, *copy, file->second.data, cancel_);
    view = ResidentView();  // let the region go before anything else
    absl::MutexLock lock(&mu_);
    sending_.reset();
    if (!sent.ok() && cancel_.load()) {
      if (stop_) return;
      ++given_up_in_a_row_;
      LogInfo("memory copy of step ", copy->step(), " to buddy rank ", buddy->rank(),
              " given up: a save needs its region, and a newer step is committed (saves come "
              "faster than the buddy receives them); sending that one");
      wake_ = true;
      continue;
    }
    if (!sent.ok()) {
      if (failed_ != key) {
        failed_ = key;
        LogWarning("memory copy of step ", copy->step(), " not sent to buddy rank ",
                   buddy->rank(), " at ", buddy->peer_address(), " (", sent.ToString(),
                   "); trying again at each heartbeat");
      }
      continue;
    }
    LogInfo("memory copy of step ", copy->step(), " (", copy->nbytes(),
            " bytes) sent to buddy rank ", buddy->rank(), " on ", buddy->node_id());
    sent_ = key;
    given_up_in_a_row_ = 0;
  }
}

}  // namespace tessera
