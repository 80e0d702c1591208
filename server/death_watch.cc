#include "server/death_watch.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/tcp_socket.h"

namespace tessera {

DeathWatch::DeathWatch(AgentRegistry* registry,
                       std::function<void(const std::string&)> on_death,
                       DeathWatchOptions options)
    : registry_(registry), on_death_(std::move(on_death)), options_(options) {
  thread_ = std::thread([this] { Run(); });
}

DeathWatch::~DeathWatch() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void DeathWatch::Registered(const std::string& job_id, uint32_t rank, uint64_t incarnation,
                            const std::string& peer_address) {
  absl::MutexLock lock(&mu_);
  Watched& w = agents_[Key{job_id, rank}];
  if (w.incarnation != incarnation || w.peer_address != peer_address) {
    w = Watched{incarnation, peer_address};
  }
  w.suspect = false;
  w.probe_to_verify = !w.verified && !peer_address.empty();
  work_ = work_ || w.probe_to_verify;
}

void DeathWatch::StreamOpened(const std::string& job_id, uint32_t rank, uint64_t incarnation,
                              uint64_t serial) {
  absl::MutexLock lock(&mu_);
  auto it = agents_.find(Key{job_id, rank});
  if (it == agents_.end() || it->second.incarnation != incarnation) return;
  it->second.opened_serial = std::max(it->second.opened_serial, serial);
  it->second.suspect = false;
  if (!it->second.verified && !it->second.peer_address.empty()) {
    it->second.probe_to_verify = true;
    work_ = true;
  }
}

void DeathWatch::StreamBroken(const std::string& job_id, uint32_t rank, uint64_t incarnation,
                              uint64_t serial) {
  absl::MutexLock lock(&mu_);
  auto it = agents_.find(Key{job_id, rank});
  if (it == agents_.end() || it->second.incarnation != incarnation) return;  // the lease decides
  if (serial < it->second.opened_serial) return;  // a newer stream is open
  it->second.suspect = true;
  work_ = true;
}

uint64_t DeathWatch::deaths() const {
  absl::MutexLock lock(&mu_);
  return deaths_;
}

void DeathWatch::Run() {
  struct Probe {
    Key key;
    Watched agent;
  };
  while (true) {
    std::vector<Probe> probes;
    {
      absl::MutexLock lock(&mu_);
      auto due = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || work_; };
      mu_.AwaitWithTimeout(absl::Condition(&due), options_.period);
      if (stop_) return;
      work_ = false;
      for (auto& [key, w] : agents_) {
        if (w.suspect || w.probe_to_verify) probes.push_back({key, w});
        w.probe_to_verify = false;
      }
    }
    std::vector<std::string> addresses;
    addresses.reserve(probes.size());
    for (const Probe& p : probes) addresses.push_back(p.agent.peer_address);
    const std::vector<PortProbe> found =
        ProbePorts(addresses, absl::Now() + options_.probe_timeout);
    std::vector<Probe> dead;
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
      for (size_t i = 0; i < probes.size(); ++i) {
        const Probe& p = probes[i];
        auto it = agents_.find(p.key);
        if (it == agents_.end() || it->second.incarnation != p.agent.incarnation) continue;
        Watched& w = it->second;
        w.verified = w.verified || found[i] == PortProbe::kListening;
        // Dead: still a suspect, its port refusing, and seen accepting before (a refusal of
        // an address that never accepted proves nothing).
        if (!p.agent.suspect || !w.suspect || !w.verified || found[i] != PortProbe::kRefused) {
          continue;
        }
        agents_.erase(it);
        ++deaths_;
        dead.push_back(p);
      }
    }
    for (const Probe& p : dead) {
      const std::string why = absl::StrCat(
          "its process is gone: its command stream broke and its peer port ",
          p.agent.peer_address, " refuses connections");
      if (registry_->MarkDead(p.key.first, p.key.second, p.agent.incarnation, why)) {
        LogWarning("agent of job ", p.key.first, " rank ", p.key.second, " (incarnation ",
                   absl::Hex(p.agent.incarnation), ") is dead: ", why);
        if (on_death_) on_death_(p.key.first);
      }
    }
  }
}

}  // namespace tessera
