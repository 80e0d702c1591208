#include "server/session/effects.h"

#include <iterator>
#include <utility>

namespace tessera {

void SessionStats::Add(const SessionStats& other) {
  commits += other.commits;
  bytes_committed += other.bytes_committed;
  for (const auto& [reason, n] : other.aborts_by_reason) aborts_by_reason[reason] += n;
  for (const auto& [phase, t] : other.phase_seconds) {
    phase_seconds[phase].count += t.count;
    phase_seconds[phase].seconds += t.seconds;
  }
  trainer_stall.count += other.trainer_stall.count;
  trainer_stall.seconds += other.trainer_stall.seconds;
}

void Effects::Append(Effects other) {
  batch.Append(std::move(other.batch));
  if (other.persisted_state != v1::SESSION_STATE_UNSPECIFIED) {
    persisted_state = other.persisted_state;
  }
  commands.insert(commands.end(), std::make_move_iterator(other.commands.begin()),
                  std::make_move_iterator(other.commands.end()));
  if (other.plan.has_value()) plan = std::move(other.plan);
  if (other.commit.has_value()) commit = std::move(other.commit);
  if (other.retention.has_value()) retention = std::move(other.retention);
  remove_dirs.insert(remove_dirs.end(), std::make_move_iterator(other.remove_dirs.begin()),
                     std::make_move_iterator(other.remove_dirs.end()));
  if (!other.memory_committed.empty()) memory_committed = std::move(other.memory_committed);
  stats.Add(other.stats);
  changed = changed || other.changed;
}

}  // namespace tessera
