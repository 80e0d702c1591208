#include "tests/sim/sim_state_store.h"

namespace tessera::sim {

absl::Status SimStateStore::Commit(const StoreBatch& batch) {
  const Fault fault = hook_ && !batch.empty() ? hook_(batch) : Fault::kNone;
  if (fault == Fault::kBefore) return absl::UnavailableError("simulated store: write refused");
  absl::Status applied = store_.Commit(batch);
  if (!applied.ok()) return applied;
  if (fault == Fault::kAfter) {
    return absl::UnavailableError("simulated store: the write reached the disk but failed");
  }
  return absl::OkStatus();
}

}  // namespace tessera::sim
