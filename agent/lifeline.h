// Lifeline: keeps one agent registered with the coordinator and its lease renewed.
//
//              register ok                       heartbeat NotFound / Unavailable
//   CONNECTING ───────────► REGISTERED ──────────────────────────────► CONNECTING
//     │  ▲ register fails:     │  heartbeat ok: stay
//     └──┘ backoff + jitter    │
//          (a refusal is kept  ├── STALE_INCARNATION ──► SUPERSEDED (terminal: a newer process
//           for Admission)     │                         of this rank took over)
//                              └── no renewal for longer than the lease by this process's
//                                  clock (it was frozen, e.g. SIGSTOP, starved or cut off)
//                                  ──► CONNECTING: it registers again, and the answer says
//                                  whether the coordinator kept its lease meanwhile
//   any state ── Stop() ──► STOPPED (terminal)
//
// The lease and its generation follow LeaseKeeper (agent/lease_keeper.h): the generation
// moves on only when the coordinator says it did not keep the lease (a coordinator that was
// itself paused keeps it).
//
// Runs on its own thread. Waits use absl::Mutex conditions with timeouts, so Stop() returns
// promptly and nothing polls with sleep.
//
// Thread-safety: all public methods are safe for concurrent use.
#ifndef TESSERA_AGENT_LIFELINE_H_
#define TESSERA_AGENT_LIFELINE_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/backoff.h"
#include "agent/coordinator_client.h"
#include "agent/lease_keeper.h"

namespace tessera {

struct LifelineOptions {
  // Between failed registrations. Default: from 100 ms, at most 500 ms: after a cut of the
  // link (or a coordinator's restart) an agent must be registered again well within its lease
  // — the lease counts from its last heartbeat before the cut — and its command stream
  // reopens only then (CommandStream): a 5 s cap lost saves to 6 s cuts of a 10 s lease. An
  // attempt while the coordinator is unreachable fails in the channel, at no cost to it.
  BackoffOptions backoff{absl::Milliseconds(100), absl::Milliseconds(500), 2.0, 0.5};
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
  // Called on the lifeline's thread, with no lock held, whenever LeaseGeneration() may have
  // changed: after each renewal and each time the lease was found lapsed or the agent
  // unregistered (the executor re-reads it: work waiting for the lease goes on). Default: none.
  std::function<void()> on_lease_changed;
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

  // Whether this agent may serve its trainer: OK once it has registered, unless its latest
  // registration attempt was refused. Errors: Unavailable "not registered yet" (no error
  // code: a client may wait and ask again); Unavailable with the refusal's ErrorDetail
  // (LAYOUT_MISMATCH ...) naming the coordinator's reason, while the coordinator refuses it.
  absl::Status Admission() const ABSL_LOCKS_EXCLUDED(mu_);

  // Renewals so far (registrations and heartbeats answered OK). With AwaitRenewal, a waiter
  // learns the coordinator is reachable again the moment it is (CommandStream reopens then).
  uint64_t renewals() const ABSL_LOCKS_EXCLUDED(mu_);
  // Blocks until renewals() > `seen`, Stop() or `timeout`; true if renewed.
  bool AwaitRenewal(uint64_t seen, absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);

  State state() const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t heartbeats_ok() const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t registrations() const ABSL_LOCKS_EXCLUDED(mu_);

  // Reported in heartbeats.
  void SetPinnedBytes(uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);

  // Sends the next heartbeat now instead of at its interval (what it states changed).
  void BeatNow() ABSL_LOCKS_EXCLUDED(mu_);

  // The lease generation if the lease is current now (LeaseKeeper::Generation), else nullopt.
  // Work begun under one generation must not write under another: the coordinator gave this
  // agent up in between.
  std::optional<uint64_t> LeaseGeneration() const ABSL_LOCKS_EXCLUDED(mu_);

  // Times the coordinator said it had not kept this agent's lease.
  uint64_t leases_lost() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Run();
  // Waits `delay` or until Stop(); returns false if stopping.
  bool WaitFor(absl::Duration delay) ABSL_LOCKS_EXCLUDED(mu_);
  // Waits `delay`, until Stop() or until a heartbeat is due at once; false if stopping.
  bool WaitForBeat(absl::Duration delay) ABSL_LOCKS_EXCLUDED(mu_);
  void SetState(State state) ABSL_LOCKS_EXCLUDED(mu_);
  // The agent's monotonic time, on LeaseKeeper's timeline.
  static absl::Time Monotonic();

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
  LeaseKeeper lease_ ABSL_GUARDED_BY(mu_);
  // The latest registration attempt's refusal (InvalidArgument from the coordinator); OK if
  // it was not refused.
  absl::Status refusal_ ABSL_GUARDED_BY(mu_);

  std::thread thread_;  // last: joins before the fields above go away
};

}  // namespace tessera

#endif  // TESSERA_AGENT_LIFELINE_H_
