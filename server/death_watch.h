// DeathWatch: finds an agent dead within moments of its process ending — SIGKILL, SIGTERM, a
// crash — instead of at its lease's end, without mistaking a blip of the network or a pause of
// the coordinator for a death (DESIGN.md "Liveness"; docs/decisions/0038-death-by-refused-port.md).
//
// A process that ends closes its connections at once: its command stream ends on the
// coordinator (CommandStreams' on_broken). But a stream also ends when the network between
// them resets it (a proxy, a NAT, a load balancer), so that end is only a suspicion. The proof
// is the agent's own peer port (RegisterAgentRequest.peer_address): once its process is gone,
// its host refuses connections to the port (ECONNREFUSED); a live agent's port accepts them,
// and across a partition nothing answers — unknown, and the lease decides, as before.
//
//   registered ──probe──► verified (the port accepted a connection from here)
//                            │ stream broke
//                            ▼
//                         suspect ──probe every `period`──► refused: MarkDead, on_death(job)
//                            │                              accepting / unknown: stay suspect
//                            └── its stream opened again, or it registered again: not suspect
//   A refusal counts only once the address was seen accepting (verified): a wrongly advertised
//   address must never kill a live agent. An agent not verified yet is probed again when its
//   stream opens.
//
// Thread-safety: all methods are safe for concurrent use; probes run on the watch's own
// thread, a round's all at once (ProbePorts), so a round lasts at most `probe_timeout`.
#ifndef TESSERA_SERVER_DEATH_WATCH_H_
#define TESSERA_SERVER_DEATH_WATCH_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/agent_registry.h"

namespace tessera {

struct DeathWatchOptions {
  // A connection attempt's limit. Default: 500 ms.
  absl::Duration probe_timeout = absl::Milliseconds(500);
  // How often a suspect is probed. Default: 250 ms.
  absl::Duration period = absl::Milliseconds(250);
};

class DeathWatch {
 public:
  // `registry` must outlive the watch. `on_death(job_id)` runs on the watch's thread after
  // the registry recorded a death of one of the job's agents (SessionManager::AgentsChanged).
  DeathWatch(AgentRegistry* registry, std::function<void(const std::string& job_id)> on_death,
             DeathWatchOptions options = {});
  ~DeathWatch();  // stops the thread

  DeathWatch(const DeathWatch&) = delete;
  DeathWatch& operator=(const DeathWatch&) = delete;

  // (job, rank, incarnation) registered, with this peer address: it is probed once, so that a
  // later refusal of that address can count.
  void Registered(const std::string& job_id, uint32_t rank, uint64_t incarnation,
                  const std::string& peer_address) ABSL_LOCKS_EXCLUDED(mu_);
  // Its command stream `serial` opened (CommandStreams::Events): not a suspect (and probed
  // again if not verified yet).
  void StreamOpened(const std::string& job_id, uint32_t rank, uint64_t incarnation,
                    uint64_t serial) ABSL_LOCKS_EXCLUDED(mu_);
  // Its command stream `serial` broke (the agent's side went away, not the coordinator's): a
  // suspect, probed until it is found dead or a newer stream opens. A break of a stream older
  // than the last opened one is old news: ignored.
  void StreamBroken(const std::string& job_id, uint32_t rank, uint64_t incarnation,
                    uint64_t serial) ABSL_LOCKS_EXCLUDED(mu_);

  // Agents found dead so far.
  uint64_t deaths() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  using Key = std::pair<std::string, uint32_t>;
  struct Watched {
    uint64_t incarnation = 0;
    std::string peer_address;
    bool verified = false;  // its port accepted a connection from here
    bool probe_to_verify = false;
    bool suspect = false;
    uint64_t opened_serial = 0;  // of its newest stream
  };

  void Run();

  AgentRegistry* const registry_;
  const std::function<void(const std::string&)> on_death_;
  const DeathWatchOptions options_;

  mutable absl::Mutex mu_;
  std::map<Key, Watched> agents_ ABSL_GUARDED_BY(mu_);
  bool work_ ABSL_GUARDED_BY(mu_) = false;  // something to probe was added
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t deaths_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;  // last
};

}  // namespace tessera

#endif  // TESSERA_SERVER_DEATH_WATCH_H_
