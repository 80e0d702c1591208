// Lifeline: keeps one agent registered with the coordinator and its lease renewed.
//
//              register ok                       heartbeat NotFound / Unavailable
//   CONNECTING ───────────► REGISTERED ──────────────────────────────► CONNECTING
//     │  ▲ register fails:     │  heartbeat ok: stay
//     └──┘ backoff + jitter    │
//                              ├── STALE_INCARNATION ──► SUPERSEDED (terminal: a newer process
//                              │                         of this rank took over)
//                              └── no renewal for longer than the lease (the process was frozen,
//                                  e.g. SIGSTOP, or cut off) ──► CONNECTING: the coordinator
//                                  has given this agent up, so it registers again, and the
//                                  lease generation moves on (LeaseGeneration)
//   any state ── Stop() ──► STOPPED (terminal)
//
// Runs on its own thread. Waits use absl::Mutex conditions with timeouts, so Stop() returns
// promptly and nothing polls with sleep.
//
// Thread-safety: all public methods are safe for concurrent use.
#ifndef TESSERA_AGENT_LIFELINE_H_
#define TESSERA_AGENT_LIFELINE_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/backoff.h"
#include "agent/coordinator_client.h"

namespace tessera {

struct LifelineOptions {
  BackoffOptions backoff;  // between failed registrations
  // Heartbeat interval used until the coordinator names one. Default: 1 s.
  absl::Duration default_heartbeat_interval = absl::Seconds(1);
  // Called on the lifeline's thread after every successful registration (the first, and
  // each one after a coordinator restart or a lost lease), with no lock held, before the
  // state becomes REGISTERED (WaitRegistered returns after it). Default: none.
  std::function<void(const v1::RegisterAgentResponse&)> on_registered;
  // Adds what the agent states in every heartbeat beyond its identity (the memory tier's
  // copies). Called on the lifeline's thread before each heartbeat, with no lock held.
  // Default: none.
  std::function<void(v1::HeartbeatRequest&)> fill_heartbeat;
  // Called with every successful heartbeat's reply (the memory buddy), likewise. Default: none.
  std::function<void(const v1::HeartbeatResponse&)> on_heartbeat;
};

class Lifeline {
 public:
  enum class State { kConnecting, kRegistered, kSuperseded, kStopped };

  // `client` must outlive this object.
  Lifeline(CoordinatorClient* client, v1::RegisterAgentRequest registration,
           LifelineOptions options = {});
  ~Lifeline();  // Stop()s.

  Lifeline(const Lifeline&) = delete;
  Lifeline& operator=(const Lifeline&) = delete;

  // Starts the thread. Call once.
  void Start() ABSL_LOCKS_EXCLUDED(mu_);

  // Stops the thread and waits for it. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // Blocks until REGISTERED (true), or a terminal state or `timeout` (false).
  bool WaitRegistered(absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);

  // Blocks until a terminal state (SUPERSEDED or STOPPED) or `timeout`; returns the state.
  State WaitTerminal(absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);

  State state() const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t heartbeats_ok() const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t registrations() const ABSL_LOCKS_EXCLUDED(mu_);

  // Reported in heartbeats.
  void SetPinnedBytes(uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);

  // Sends the next heartbeat now instead of at its interval (what it states changed).
  void BeatNow() ABSL_LOCKS_EXCLUDED(mu_);

  // The lease generation if the lease is current now (registered, and renewed within the
  // lease by the coordinator's clock as far as this process can tell), else nullopt. The
  // generation grows each time the lease was found lapsed, so work begun under one generation
  // must not write under another: the coordinator gave this agent up in between.
  std::optional<uint64_t> LeaseGeneration() const ABSL_LOCKS_EXCLUDED(mu_);

  // Times the lease was found lapsed (the agent re-registered because of it).
  uint64_t leases_lost() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Run();
  // Waits `delay` or until Stop(); returns false if stopping.
  bool WaitFor(absl::Duration delay) ABSL_LOCKS_EXCLUDED(mu_);
  // Waits `delay`, until Stop() or until a heartbeat is due at once; false if stopping.
  bool WaitForBeat(absl::Duration delay) ABSL_LOCKS_EXCLUDED(mu_);
  void SetState(State state) ABSL_LOCKS_EXCLUDED(mu_);

  CoordinatorClient* const client_;
  const v1::RegisterAgentRequest registration_;
  const LifelineOptions options_;

  mutable absl::Mutex mu_;
  State state_ ABSL_GUARDED_BY(mu_) = State::kConnecting;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t heartbeats_ok_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t registrations_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t pinned_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool beat_now_ ABSL_GUARDED_BY(mu_) = false;  // BeatNow() was called
  // Monotonic time of the last renewal (registration or heartbeat, taken when it was sent),
  // and the lease the coordinator granted.
  std::chrono::steady_clock::time_point renewed_ ABSL_GUARDED_BY(mu_);
  absl::Duration lease_ ABSL_GUARDED_BY(mu_) = absl::InfiniteDuration();
  uint64_t leases_lost_ ABSL_GUARDED_BY(mu_) = 0;

  std::thread thread_;  // last: joins before the fields above go away
};

}  // namespace tessera

#endif  // TESSERA_AGENT_LIFELINE_H_
