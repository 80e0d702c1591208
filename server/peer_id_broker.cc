#include "server/peer_id_broker.h"

#include "absl/strings/str_cat.h"

namespace tessera {

absl::Status PeerIdBroker::Post(const std::string& session_id, const std::string& group,
                                const std::string& unique_id, absl::Time now) {
  if (unique_id.empty()) return absl::InvalidArgumentError("empty peer id");
  std::vector<std::pair<absl::Time, Callback>> ready;
  {
    absl::MutexLock lock(&mu_);
    Group& g = groups_[Key{session_id, group}];
    if (!g.unique_id.empty()) {
      if (g.unique_id != unique_id) {
        return absl::InvalidArgumentError(
            absl::StrCat("group ", group, " of session ", session_id, " already has an id"));
      }
      return absl::OkStatus();
    }
    g.unique_id = unique_id;
    g.posted = now;
    ready.swap(g.waiters);
  }
  for (auto& [deadline, done] : ready) done(unique_id);
  return absl::OkStatus();
}

void PeerIdBroker::Wait(const std::string& session_id, const std::string& group,
                        absl::Time deadline, Callback done) {
  absl::StatusOr<std::string> id;
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) {
      id = absl::UnavailableError("the coordinator is shutting down");
    } else {
      Group& g = groups_[Key{session_id, group}];
      if (g.unique_id.empty()) {
        g.waiters.emplace_back(deadline, std::move(done));
        return;
      }
      id = g.unique_id;
    }
  }
  done(std::move(id));
}

void PeerIdBroker::Expire(absl::Time now, absl::Duration retention) {
  std::vector<Callback> expired;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = groups_.begin(); it != groups_.end();) {
      Group& g = it->second;
      for (auto w = g.waiters.begin(); w != g.waiters.end();) {
        if (w->first <= now) {
          expired.push_back(std::move(w->second));
          w = g.waiters.erase(w);
        } else {
          ++w;
        }
      }
      if (!g.unique_id.empty() && g.posted + retention < now && g.waiters.empty()) {
        groups_.erase(it++);
      } else if (g.unique_id.empty() && g.waiters.empty()) {
        groups_.erase(it++);
      } else {
        ++it;
      }
    }
  }
  for (Callback& done : expired) {
    done(absl::DeadlineExceededError("the group's leader did not post its peer id in time"));
  }
}

void PeerIdBroker::Forget(const std::string& session_id) {
  std::vector<Callback> aborted;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = groups_.begin(); it != groups_.end();) {
      if (it->first.first == session_id) {
        for (auto& [deadline, done] : it->second.waiters) aborted.push_back(std::move(done));
        groups_.erase(it++);
      } else {
        ++it;
      }
    }
  }
  for (Callback& done : aborted) done(absl::AbortedError("the session ended"));
}

void PeerIdBroker::Shutdown() {
  std::vector<Callback> stopped;
  {
    absl::MutexLock lock(&mu_);
    shut_down_ = true;
    for (auto& [key, g] : groups_) {
      for (auto& [deadline, done] : g.waiters) stopped.push_back(std::move(done));
      g.waiters.clear();
    }
  }
  for (Callback& done : stopped) done(absl::UnavailableError("the coordinator is shutting down"));
}

}  // namespace tessera
