#include "agent/peer/peer_address_book.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tessera {

void PeerAddressBook::Set(const std::string& session,
                          std::map<uint32_t, std::string> addresses) {
  absl::MutexLock lock(&mu_);
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->session == session) {
      entries_.erase(it);
      break;
    }
  }
  entries_.push_front({session, std::move(addresses)});
  // Evict by age, never by name: session ids do not sort by time ("s110-…" < "s20-…").
  while (entries_.size() > capacity_) entries_.pop_back();
}

absl::StatusOr<std::string> PeerAddressBook::Resolve(const std::string& session,
                                                     uint32_t rank) const {
  absl::MutexLock lock(&mu_);
  for (const Entry& entry : entries_) {
    if (entry.session != session) continue;
    auto it = entry.addresses.find(rank);
    if (it != entry.addresses.end() && !it->second.empty()) return it->second;
    break;
  }
  return absl::UnavailableError(
      absl::StrCat("no address known for rank ", rank, " in session ", session));
}

}  // namespace tessera
