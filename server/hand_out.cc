#include "server/hand_out.h"

#include <algorithm>

#include "common/threads.h"

namespace tessera {

size_t HandOutThreads(size_t commands, size_t max_threads) {
  if (commands < kParallelHandOutFrom) return 1;
  if (max_threads == 0) {
    max_threads = std::min(static_cast<size_t>(UsableCpus()), kMaxHandOutThreads);
  }
  return max_threads;
}

void HandOut(CommandSink& sink, const std::string& job_id, std::vector<Outgoing>& commands,
             size_t max_threads) {
  const size_t threads = HandOutThreads(commands.size(), max_threads);
  RunOnThreads(threads, [&](size_t t) {
    for (Outgoing& o : commands) {
      if (o.rank % threads != t) continue;
      if (o.pin_plan != nullptr && o.rank < o.pin_plan->assignments.size()) {
        sink.SendPin(job_id, o.rank, o.command, o.pin_plan->assignments[o.rank]);
      } else {
        sink.Send(job_id, o.rank, o.command);
      }
      // Free each command as soon as it is handed over. Not `o = Outgoing()`: the other
      // threads read every command's rank to find theirs.
      o.command = v1::Command();
      o.pin_plan.reset();
    }
  });
}

}  // namespace tessera
