#include "agent/lifeline.h"

#include "common/log.h"
#include "common/status.h"

namespace tessera {

Lifeline::Lifeline(CoordinatorClient* client, v1::RegisterAgentRequest registration,
                   LifelineOptions options)
    : client_(client), registration_(std::move(registration)), options_(options) {}

Lifeline::~Lifeline() { Stop(); }

void Lifeline::Start() {
  thread_ = std::thread([this] { Run(); });
}

void Lifeline::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
  absl::MutexLock lock(&mu_);
  if (state_ != State::kSuperseded) state_ = State::kStopped;
}

bool Lifeline::WaitFor(absl::Duration delay) {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&stop_), delay);
  return !stop_;
}

bool Lifeline::WaitForBeat(absl::Duration delay) {
  absl::MutexLock lock(&mu_);
  auto due = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || beat_now_; };
  mu_.AwaitWithTimeout(absl::Condition(&due), delay);
  beat_now_ = false;
  return !stop_;
}

void Lifeline::SetState(State state) {
  absl::MutexLock lock(&mu_);
  state_ = state;
}

bool Lifeline::WaitRegistered(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return state_ != State::kConnecting;
  };
  mu_.AwaitWithTimeout(absl::Condition(&done), timeout);
  return state_ == State::kRegistered;
}

Lifeline::State Lifeline::WaitTerminal(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return state_ == State::kSuperseded || state_ == State::kStopped;
  };
  mu_.AwaitWithTimeout(absl::Condition(&done), timeout);
  return state_;
}

Lifeline::State Lifeline::state() const {
  absl::MutexLock lock(&mu_);
  return state_;
}

uint64_t Lifeline::heartbeats_ok() const {
  absl::MutexLock lock(&mu_);
  return heartbeats_ok_;
}

uint64_t Lifeline::registrations() const {
  absl::MutexLock lock(&mu_);
  return registrations_;
}

void Lifeline::SetPinnedBytes(uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  pinned_bytes_ = bytes;
}

void Lifeline::BeatNow() {
  absl::MutexLock lock(&mu_);
  beat_now_ = true;
}

std::optional<uint64_t> Lifeline::LeaseGeneration() const {
  absl::MutexLock lock(&mu_);
  if (state_ != State::kRegistered) return std::nullopt;
  if (absl::FromChrono(std::chrono::steady_clock::now() - renewed_) > lease_) return std::nullopt;
  return leases_lost_;
}

uint64_t Lifeline::leases_lost() const {
  absl::MutexLock lock(&mu_);
  return leases_lost_;
}

void Lifeline::Run() {
  Backoff backoff(options_.backoff);
  const uint32_t rank = registration_.coord().rank();
  while (true) {
    // CONNECTING: register until it works.
    auto sent = std::chrono::steady_clock::now();
    absl::StatusOr<v1::RegisterAgentResponse> registered = client_->Register(registration_);
    if (!registered.ok()) {
      if (registered.status().code() == absl::StatusCode::kInvalidArgument) {
        LogError("registration rejected: ", registered.status().message());
      }
      if (!WaitFor(backoff.Next())) return;
      continue;
    }
    backoff.Reset();
    LogInfo("registered with coordinator (lease ", registered->lease_ms(), " ms, heartbeat ",
            registered->heartbeat_interval_ms(), " ms)");
    // Before REGISTERED: what waits for it (the command stream) finds the agent knowing what
    // the registration told it.
    if (options_.on_registered) options_.on_registered(*registered);
    {
      absl::MutexLock lock(&mu_);
      ++registrations_;
      state_ = State::kRegistered;
      renewed_ = sent;
      lease_ = registered->lease_ms() > 0 ? absl::Milliseconds(registered->lease_ms())
                                          : absl::InfiniteDuration();
    }
    const absl::Duration interval =
        registered->heartbeat_interval_ms() > 0
            ? absl::Milliseconds(registered->heartbeat_interval_ms())
            : options_.default_heartbeat_interval;

    // REGISTERED: heartbeat until it fails.
    bool first_beat = true;
    bool lapsed = false;
    while (WaitForBeat(interval)) {
      {
        absl::MutexLock lock(&mu_);
        const absl::Duration gap = absl::FromChrono(std::chrono::steady_clock::now() - renewed_);
        if (gap > lease_) {
          // This thread did not run for longer than the lease (the process was frozen, e.g.
          // SIGSTOP, or starved): the coordinator has expired this agent and aborted any
          // save it was part of. Register again rather than carry on as if nothing happened.
          ++leases_lost_;
          state_ = State::kConnecting;
          lapsed = true;
          LogError("lease lapsed: no renewal for ", absl::FormatDuration(gap), " (lease ",
                   absl::FormatDuration(lease_),
                   "); this agent was frozen or cut off and is stale: registering again");
        }
      }
      if (lapsed) break;
      v1::HeartbeatRequest request;
      request.set_job_id(registration_.job_id());
      request.set_rank(rank);
      request.set_incarnation(registration_.incarnation());
      {
        absl::MutexLock lock(&mu_);
        request.set_pinned_bytes(pinned_bytes_);
      }
      if (options_.fill_heartbeat) options_.fill_heartbeat(request);
      sent = std::chrono::steady_clock::now();
      absl::StatusOr<v1::HeartbeatResponse> beat = client_->Heartbeat(request);
      if (beat.ok()) {
        if (first_beat) LogInfo("lease renewed by the first heartbeat");
        first_beat = false;
        {
          absl::MutexLock lock(&mu_);
          ++heartbeats_ok_;
          renewed_ = sent;
        }
        if (options_.on_heartbeat) options_.on_heartbeat(*beat);
        continue;
      }
      if (GetErrorCode(beat.status()) == v1::ERROR_CODE_STALE_INCARNATION) {
        LogError("superseded by a newer agent process for rank ", rank, "; stopping");
        SetState(State::kSuperseded);
        return;
      }
      LogWarning("heartbeat failed (", beat.status().ToString(), "); re-registering");
      SetState(State::kConnecting);
      break;
    }
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
    }
  }
}

}  // namespace tessera
