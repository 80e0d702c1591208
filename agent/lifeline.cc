#include "agent/lifeline.h"

#include <chrono>

#include "absl/strings/str_cat.h"
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

uint64_t Lifeline::renewals() const {
  absl::MutexLock lock(&mu_);
  return registrations_ + heartbeats_ok_;
}

bool Lifeline::AwaitRenewal(uint64_t seen, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto renewed = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_ || registrations_ + heartbeats_ok_ > seen;
  };
  mu_.AwaitWithTimeout(absl::Condition(&renewed), timeout);
  return registrations_ + heartbeats_ok_ > seen;
}

absl::Status Lifeline::Admission() const {
  absl::MutexLock lock(&mu_);
  if (!refusal_.ok()) {
    std::optional<v1::ErrorDetail> detail = GetErrorDetail(refusal_);
    v1::ErrorDetail reason = detail.value_or(v1::ErrorDetail());
    if (reason.code() == v1::ERROR_CODE_UNSPECIFIED) {
      reason.set_code(v1::ERROR_CODE_LAYOUT_MISMATCH);
    }
    reason.set_message(absl::StrCat("the coordinator refused this agent's registration: ",
                                    refusal_.message()));
    return MakeError(absl::StatusCode::kUnavailable, reason);
  }
  if (registrations_ == 0) {
    return absl::UnavailableError(
        "this agent has not registered with the coordinator yet (it is trying): ask again");
  }
  return absl::OkStatus();
}

absl::Time Lifeline::Monotonic() {
  return absl::UnixEpoch() + absl::FromChrono(std::chrono::steady_clock::now().time_since_epoch());
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
  return lease_.Generation(Monotonic());
}

uint64_t Lifeline::leases_lost() const {
  absl::MutexLock lock(&mu_);
  return lease_.leases_lost();
}

void Lifeline::Run() {
  Backoff backoff(options_.backoff);
  // A refusal is asked again more slowly: it stands until the job's agents of another layout
  // are gone (a lease), and every refusal costs the coordinator a warning and a verdict.
  Backoff refused_backoff(BackoffOptions{absl::Milliseconds(500), absl::Seconds(5), 2.0, 0.5});
  const uint32_t rank = registration_.coord().rank();
  int unanswered = 0;  // registrations in a row that failed without a refusal
  while (true) {
    // CONNECTING: register until it works.
    absl::Time sent = Monotonic();
    absl::StatusOr<v1::RegisterAgentResponse> registered = client_->Register(registration_);
    if (!registered.ok()) {
      const bool refused = registered.status().code() == absl::StatusCode::kInvalidArgument;
      if (refused) {
        LogError("registration rejected: ", registered.status().message());
        absl::MutexLock lock(&mu_);
        refusal_ = registered.status();
      } else if (unanswered++ % 20 == 0) {
        // The first failure of a streak, then every 20th: an unreachable coordinator is
        // said at once, without a line per retry.
        LogWarning("cannot register with the coordinator (", registered.status().ToString(),
                   "); retrying");
      }
      if (!WaitFor(refused ? refused_backoff.Next() : backoff.Next())) return;
      continue;
    }
    backoff.Reset();
    refused_backoff.Reset();
    unanswered = 0;
    const absl::Duration lease = registered->lease_ms() > 0
                                     ? absl::Milliseconds(registered->lease_ms())
                                     : absl::InfiniteDuration();
    LogInfo("registered with coordinator (lease ", registered->lease_ms(), " ms, heartbeat ",
            registered->heartbeat_interval_ms(), " ms)");
    // Before REGISTERED: what waits for it (the command stream) finds the agent knowing what
    // the registration told it.
    if (options_.on_registered) options_.on_registered(*registered);
    {
      absl::MutexLock lock(&mu_);
      const uint64_t lost_before = lease_.leases_lost();
      lease_.Renewed(sent, lease, registered->lease_kept(),
                     registered->coordinator_incarnation());
      if (lease_.leases_lost() != lost_before) {
        LogWarning("the coordinator gave this agent's lease up meanwhile (and aborted any save "
                   "it was part of): lease generation ", lease_.leases_lost());
      }
      refusal_ = absl::OkStatus();
      ++registrations_;
      state_ = State::kRegistered;
    }
    if (options_.on_lease_changed) options_.on_lease_changed();
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
        const absl::Time now = Monotonic();
        if (lease_.Lapsed(now)) {
          // This thread did not run, or was not answered, for longer than the lease (the
          // process was frozen, e.g. SIGSTOP, starved, or cut off). Whether the coordinator
          // gave this agent up meanwhile only it can say: register again and be told.
          lease_.Unregistered(now);
          state_ = State::kConnecting;
          lapsed = true;
          LogError("lease lapsed: no renewal for ", absl::FormatDuration(lease_.SinceRenewal(now)),
                   " (lease ", absl::FormatDuration(lease_.lease()),
                   "); this agent was frozen or cut off and may be stale: registering again");
        }
      }
      if (lapsed) {
        if (options_.on_lease_changed) options_.on_lease_changed();
        break;
      }
      v1::HeartbeatRequest request;
      request.set_job_id(registration_.job_id());
      request.set_rank(rank);
      request.set_incarnation(registration_.incarnation());
      {
        absl::MutexLock lock(&mu_);
        request.set_pinned_bytes(pinned_bytes_);
      }
      if (options_.fill_heartbeat) options_.fill_heartbeat(request);
      sent = Monotonic();
      absl::StatusOr<v1::HeartbeatResponse> beat = client_->Heartbeat(request);
      if (beat.ok()) {
        if (first_beat) LogInfo("lease renewed by the first heartbeat");
        first_beat = false;
        {
          absl::MutexLock lock(&mu_);
          const uint64_t lost_before = lease_.leases_lost();
          lease_.Renewed(sent, lease, beat->lease_kept(), beat->coordinator_incarnation());
          if (lease_.leases_lost() != lost_before) {
            LogWarning("the coordinator had given this agent's lease up before this heartbeat: "
                       "lease generation ", lease_.leases_lost());
          }
          ++heartbeats_ok_;
          // Answered so late that it renewed nothing current (a paused coordinator answers
          // its queued heartbeats when it resumes): ask again at once.
          if (!lease_.Generation(Monotonic()).has_value()) beat_now_ = true;
        }
        if (options_.on_heartbeat) options_.on_heartbeat(*beat);
        if (options_.on_lease_changed) options_.on_lease_changed();
        continue;
      }
      if (GetErrorCode(beat.status()) == v1::ERROR_CODE_STALE_INCARNATION) {
        LogError("superseded by a newer agent process for rank ", rank, "; stopping");
        SetState(State::kSuperseded);
        return;
      }
      LogWarning("heartbeat failed (", beat.status().ToString(), "); re-registering");
      {
        absl::MutexLock lock(&mu_);
        lease_.Unregistered(Monotonic());
        state_ = State::kConnecting;
      }
      if (options_.on_lease_changed) options_.on_lease_changed();
      break;
    }
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
    }
  }
}

}  // namespace tessera
