#include "agent/lease_keeper.h"

namespace tessera {

void LeaseKeeper::Renewed(absl::Time sent, absl::Duration lease, bool kept,
                          uint64_t coordinator) {
  if (renewed_once_) {
    // Lapsed while registered, and renewed by another process than the one that held it:
    // that one may have given it up before it went.
    const bool lapsed_across_restart =
        (lapsed_ || (registered_ && sent - renewed_ > lease_)) && coordinator != coordinator_;
    if (!kept || lapsed_across_restart) ++generation_;
  }
  lapsed_ = false;
  renewed_once_ = true;
  registered_ = true;
  renewed_ = sent;
  lease_ = lease;
  coordinator_ = coordinator;
}

std::optional<uint64_t> LeaseKeeper::Generation(absl::Time now) const {
  if (!registered_ || now - renewed_ > lease_) return std::nullopt;
  return generation_;
}

}  // namespace tessera
