// Prometheus metrics of the coordinator, collected at scrape time from the SessionManager's
// counters and the AgentRegistry (nothing in the state machine knows about Prometheus).
//
//   tessera_sessions_committed_total                  counter
//   tessera_sessions_aborted_total{reason}            counter, reason = ErrorCode name
//   tessera_sessions_in_flight                        gauge
//   tessera_bytes_committed_total                     counter
//   tessera_phase_seconds{phase}                      summary (sum and count of completed phases)
//   tessera_trainer_stall_seconds                     summary (one sample per rank per save)
//   tessera_agents_alive{job}                         gauge
//   tessera_memory_tier_bytes{job}                    gauge (checkpoint bytes live agents hold)
//
// Thread-safety: Collect() may run concurrently with everything else.
#ifndef TESSERA_SERVER_METRICS_H_
#define TESSERA_SERVER_METRICS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "prometheus/collectable.h"
#include "prometheus/exposer.h"
#include "server/agent_registry.h"
#include "server/session_manager.h"

namespace tessera {

class CoordinatorMetrics : public prometheus::Collectable {
 public:
  // Both must outlive the collector.
  CoordinatorMetrics(const SessionManager* sessions, const AgentRegistry* registry)
      : sessions_(sessions), registry_(registry) {}

  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const SessionManager* const sessions_;
  const AgentRegistry* const registry_;
};

// Serves `collectable` at http://<listen>/metrics. Errors: Unavailable if it cannot bind.
absl::StatusOr<std::unique_ptr<prometheus::Exposer>> ServeMetrics(
    const std::string& listen, std::shared_ptr<prometheus::Collectable> collectable);

}  // namespace tessera

#endif  // TESSERA_SERVER_METRICS_H_
