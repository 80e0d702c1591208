#include "agent/lease_keeper.h"

namespace tessera {

void LeaseKeeper::Renewed(absl::Time sent, absl::Duration lease, bool kept) {
  if (renewed_once_ && !kept) ++generation_;
  renewed_once_ = true;
  registered_ = true;
  renewed_ = sent;
  lease_ = lease;
}

std::optional<uint64_t> LeaseKeeper::Generation(absl::Time now) const {
  if (!registered_ || now - renewed_ > lease_) return std::nullopt;
  return generation_;
}

}  // namespace tessera
