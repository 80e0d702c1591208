#include "server/session/effects_carrier.h"

#include <utility>

#include "common/log.h"

namespace tessera {

bool CarryEffects(Effects effects, EffectsPort& port) {
  if (!effects.batch.empty()) {
    if (absl::Status persisted = port.Persist(effects.batch); !persisted.ok()) {
      LogError("the state store refused a write (", persisted.ToString(),
               "); recovering the job from the store");
      port.Recover();
      return false;
    }
    if (effects.persisted_state != v1::SESSION_STATE_UNSPECIFIED) {
      port.Persisted(effects.persisted_state);
    }
  }
  port.Observe(effects);
  if (!effects.memory_committed.empty()) port.MemoryCommitted(effects.memory_committed);
  if (!effects.commands.empty()) port.Deliver(std::move(effects.commands));
  if (effects.plan.has_value()) port.StartPlan(std::move(*effects.plan));
  if (effects.commit.has_value()) port.StartCommit(std::move(*effects.commit));
  if (effects.retention.has_value() || !effects.remove_dirs.empty()) {
    port.StartCleanup(std::move(effects.retention), std::move(effects.remove_dirs));
  }
  return true;
}

}  // namespace tessera
