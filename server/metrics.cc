#include "server/metrics.h"

#include <exception>

#include "absl/strings/str_cat.h"
#include "prometheus/client_metric.h"
#include "prometheus/metric_family.h"
#include "prometheus/metric_type.h"

namespace tessera {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

MetricFamily Family(std::string name, std::string help, MetricType type) {
  MetricFamily family;
  family.name = std::move(name);
  family.help = std::move(help);
  family.type = type;
  return family;
}

ClientMetric Labelled(const std::string& label, const std::string& value) {
  ClientMetric metric;
  metric.label.push_back({label, value});
  return metric;
}

}  // namespace

std::vector<MetricFamily> CoordinatorMetrics::Collect() const {
  const SessionStats stats = sessions_->Stats();
  std::vector<MetricFamily> families;

  MetricFamily commits = Family("tessera_sessions_committed_total",
                                "Save sessions committed since start.", MetricType::Counter);
  commits.metric.emplace_back().counter.value = static_cast<double>(stats.commits);
  families.push_back(std::move(commits));

  MetricFamily aborts = Family("tessera_sessions_aborted_total",
                               "Save sessions aborted since start, by reason.",
                               MetricType::Counter);
  for (const auto& [reason, count] : stats.aborts_by_reason) {
    ClientMetric m = Labelled("reason", reason);
    m.counter.value = static_cast<double>(count);
    aborts.metric.push_back(std::move(m));
  }
  families.push_back(std::move(aborts));

  MetricFamily in_flight = Family("tessera_sessions_in_flight",
                                  "Save sessions neither committed nor aborted.",
                                  MetricType::Gauge);
  in_flight.metric.emplace_back().gauge.value = static_cast<double>(stats.sessions_in_flight);
  families.push_back(std::move(in_flight));

  MetricFamily bytes = Family("tessera_bytes_committed_total",
                              "Checkpoint bytes committed since start (replicas counted once).",
                              MetricType::Counter);
  bytes.metric.emplace_back().counter.value = static_cast<double>(stats.bytes_committed);
  families.push_back(std::move(bytes));

  MetricFamily phases = Family("tessera_phase_seconds",
                               "Duration of completed save phases.", MetricType::Summary);
  for (const auto& [phase, timing] : stats.phase_seconds) {
    ClientMetric m = Labelled("phase", phase);
    m.summary.sample_count = timing.count;
    m.summary.sample_sum = timing.seconds;
    phases.metric.push_back(std::move(m));
  }
  families.push_back(std::move(phases));

  MetricFamily stall = Family("tessera_trainer_stall_seconds",
                              "Time trainers were blocked per save (one sample per rank).",
                              MetricType::Summary);
  ClientMetric& s = stall.metric.emplace_back();
  s.summary.sample_count = stats.trainer_stall.count;
  s.summary.sample_sum = stats.trainer_stall.seconds;
  families.push_back(std::move(stall));

  MetricFamily alive = Family("tessera_agents_alive", "Agents whose lease is valid, by job.",
                              MetricType::Gauge);
  MetricFamily memory = Family("tessera_memory_tier_bytes",
                               "Bytes of committed checkpoints live agents hold in memory "
                               "(the memory tier), by job.",
                               MetricType::Gauge);
  for (const std::string& job : registry_->Jobs()) {
    absl::StatusOr<std::vector<v1::AgentInfo>> agents = registry_->ListAgents(job);
    if (!agents.ok()) continue;
    ClientMetric m = Labelled("job", job);
    ClientMetric held = Labelled("job", job);
    for (const v1::AgentInfo& a : *agents) {
      m.gauge.value += a.alive() ? 1 : 0;
      if (a.alive() && a.has_resident()) held.gauge.value += static_cast<double>(a.resident().nbytes());
    }
    alive.metric.push_back(std::move(m));
    memory.metric.push_back(std::move(held));
  }
  families.push_back(std::move(alive));
  families.push_back(std::move(memory));
  return families;
}

absl::StatusOr<std::unique_ptr<prometheus::Exposer>> ServeMetrics(
    const std::string& listen, std::shared_ptr<prometheus::Collectable> collectable) {
  // prometheus-cpp reports a failed bind by throwing; this is the one place we catch.
  try {
    auto exposer = std::make_unique<prometheus::Exposer>(listen);
    exposer->RegisterCollectable(collectable);
    return exposer;
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", listen, ": ", e.what()));
  }
}

}  // namespace tessera
