#include "agent/command_relay.h"

#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "agent/save/report_queue.h"
#include "common/grpc_reactors.h"
#include "common/log.h"
#include "common/relayable.h"
#include "common/status.h"

namespace tessera {
namespace {

// Channels kept before the cache is trimmed to the current command's targets: far more than
// the agents of one node, so only targets restarted on new ports ever trigger it.
constexpr size_t kMaxCachedChannels = 256;

std::string Describe(const grpc::Status& status) {
  return absl::StrCat(absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code())),
                      ": ", status.error_message());
}

}  // namespace

CommandRelayService::CommandRelayService(std::string job_id, uint32_t rank, uint64_t incarnation,
                                         OnCommand on_command, const PeerKeyring* keyring)
    : job_id_(std::move(job_id)),
      rank_(rank),
      incarnation_(incarnation),
      on_command_(std::move(on_command)),
      gate_(keyring != nullptr ? std::make_unique<PeerCallGate>(keyring) : nullptr) {}

grpc::ServerUnaryReactor* CommandRelayService::Relay(grpc::CallbackServerContext* context,
                                                     const v1::RelayRequest* request,
                                                     v1::RelayResponse* /*response*/) {
  if (gate_ != nullptr) {
    if (absl::Status admitted = gate_->Admit(*context, kRelayMethod); !admitted.ok()) {
      LogWarning("CommandRelay: ", context->peer(), ": ", admitted.message());
      return FinishUnary(context, admitted);
    }
  }
  return FinishUnary(context, Handle(*request));
}

absl::Status CommandRelayService::Handle(const v1::RelayRequest& request) {
  std::vector<std::string> differs;
  if (request.job_id() != job_id_) {
    differs.push_back(absl::StrCat("job ", request.job_id(), " (this agent's: ", job_id_, ")"));
  }
  if (request.rank() != rank_) {
    differs.push_back(absl::StrCat("rank ", request.rank(), " (this agent's: ", rank_, ")"));
  }
  if (request.incarnation() != incarnation_) {
    differs.push_back(absl::StrCat("incarnation ", absl::Hex(request.incarnation()),
                                   " (this agent's: ", absl::Hex(incarnation_), ")"));
  }
  if (!differs.empty()) {
    const std::string message =
        absl::StrCat("command relayed by rank ", request.from_rank(), " is for another agent: ",
                     absl::StrJoin(differs, ", "));
    // Only the incarnation differs: the agent the relay was told of restarted as this one.
    if (differs.size() == 1 && request.incarnation() != incarnation_) {
      return MakeError(absl::StatusCode::kFailedPrecondition, v1::ERROR_CODE_STALE_INCARNATION,
                       message);
    }
    return absl::FailedPreconditionError(message);
  }
  if (!RelayableCommand(request.command())) {
    return absl::InvalidArgumentError(
        absl::StrCat("command relayed by rank ", request.from_rank(), " (",
                     request.command().ShortDebugString(), ") is not one a relay passes on: ",
                     "only a PIN without an assignment is (common/relayable.h)"));
  }
  if (request.command().relay_to_size() > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("command relayed by rank ", request.from_rank(), " has relay_to set (",
                     request.command().relay_to_size(), " targets): a relayed command is never ",
                     "relayed again"));
  }
  absl::ReaderMutexLock lock(&mu_);
  if (stopped_) return absl::UnavailableError("this agent is stopping");
  on_command_(request.command());
  return absl::OkStatus();
}

void CommandRelayService::Stop() {
  absl::MutexLock lock(&mu_);  // waits for Handle() calls inside on_command
  stopped_ = true;
}

// One Relay call to one target. gRPC uses `context`, `request` and `response` until it runs
// the call's callback, which is the last it touches of it.
struct CommandRelayer::Call {
  uint32_t rank = 0;
  std::string address;
  grpc::ClientContext context;
  v1::RelayRequest request;
  v1::RelayResponse response;
  grpc::Status status;  // written by the callback, read once calls_pending_ is 0
};

CommandRelayer::CommandRelayer(std::string job_id, uint32_t rank, ReportFailed report_failed,
                               CommandRelayerOptions options)
    : job_id_(std::move(job_id)),
      rank_(rank),
      report_failed_(std::move(report_failed)),
      options_(std::move(options)),
      worker_([this] { Run(); }) {}

CommandRelayer::~CommandRelayer() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  worker_.join();
}

void CommandRelayer::Forward(const v1::Command& command) {
  if (command.relay_to().empty()) return;
  absl::MutexLock lock(&mu_);
  if (stop_) return;
  queue_.push_back(command);
}

void CommandRelayer::WaitIdleForTesting() {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return queue_.empty() && !busy_; };
  mu_.Await(absl::Condition(&idle));
}

void CommandRelayer::Run() {
  while (true) {
    v1::Command command;
    {
      absl::MutexLock lock(&mu_);
      busy_ = false;
      auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !queue_.empty(); };
      mu_.Await(absl::Condition(&woken));
      if (stop_) return;  // what is still queued is dropped (see the header)
      command = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    RelayOne(command);
  }
}

v1::CommandRelay::Stub* CommandRelayer::StubFor(const std::string& address) {
  auto it = stubs_.find(address);
  if (it == stubs_.end()) {
    std::shared_ptr<grpc::Channel> channel = grpc::CreateChannel(
        address, options_.channel_credentials != nullptr ? options_.channel_credentials
                                                         : grpc::InsecureChannelCredentials());
    it = stubs_.emplace(address, v1::CommandRelay::NewStub(std::move(channel))).first;
  }
  return it->second.get();
}

void CommandRelayer::RelayOne(const v1::Command& command) {
  const absl::Time start = absl::Now();
  v1::Command relayed = command;
  relayed.clear_relay_to();

  if (stubs_.size() >= kMaxCachedChannels) {
    std::set<std::string> current;
    for (const v1::RelayTarget& target : command.relay_to()) current.insert(target.peer_address());
    for (auto it = stubs_.begin(); it != stubs_.end();) {
      it = current.count(it->first) > 0 ? std::next(it) : stubs_.erase(it);
    }
  }

  std::vector<std::unique_ptr<Call>> calls;
  calls.reserve(command.relay_to_size());
  int started = 0;
  for (const v1::RelayTarget& target : command.relay_to()) {
    auto call = std::make_unique<Call>();
    call->rank = target.rank();
    call->address = target.peer_address();
    if (call->address.empty()) {
      call->status = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no peer_address");
    } else {
      call->request.set_job_id(job_id_);
      call->request.set_rank(target.rank());
      call->request.set_incarnation(target.incarnation());
      call->request.set_from_rank(rank_);
      *call->request.mutable_command() = relayed;
      call->request.mutable_command()->set_seq(target.seq());  // the target's own
      call->context.set_deadline(absl::ToChronoTime(start + options_.deadline));
      if (options_.keyring != nullptr) {
        // Without a nonce (no randomness) the call carries no proof: the target refuses it and
        // counts as failed, as any target that does not answer.
        ProvePeerCall(&call->context, options_.keyring->Get(), kRelayMethod).IgnoreError();
      }
      ++started;
    }
    calls.push_back(std::move(call));
  }
  {
    absl::MutexLock lock(&mu_);
    calls_pending_ = started;
  }
  // All calls go out before any answer is awaited; callbacks may run before the loop ends.
  for (const std::unique_ptr<Call>& call : calls) {
    if (call->address.empty()) continue;
    Call* c = call.get();
    StubFor(c->address)->async()->Relay(&c->context, &c->request, &c->response,
                                        [this, c](grpc::Status status) {
                                          c->status = std::move(status);
                                          absl::MutexLock lock(&mu_);
                                          --calls_pending_;
                                        });
  }

  bool stopping = false;
  {
    absl::MutexLock lock(&mu_);
    auto answered = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return calls_pending_ == 0 || stop_;
    };
    mu_.Await(absl::Condition(&answered));
    stopping = stop_;
  }
  if (stopping) {
    for (const std::unique_ptr<Call>& call : calls) call->context.TryCancel();
    {
      absl::MutexLock lock(&mu_);
      auto answered = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return calls_pending_ == 0; };
      mu_.Await(absl::Condition(&answered));
    }
    LogWarning("stopping: the relay of session ", command.session_id(), " seq ", command.seq(),
               " to ", calls.size(), " agent(s) is cancelled and not reported");
    return;
  }

  std::vector<uint32_t> failed;
  std::string first_error;
  for (const std::unique_ptr<Call>& call : calls) {
    if (call->status.ok()) continue;
    if (failed.empty()) {
      first_error = absl::StrCat("rank ", call->rank, " at ", call->address, ": ",
                                 Describe(call->status));
    }
    failed.push_back(call->rank);
  }
  const std::string took = absl::FormatDuration(absl::Now() - start);
  if (failed.empty()) {
    LogInfo("relayed session ", command.session_id(), " seq ", command.seq(), " to ",
            calls.size(), " agent(s) in ", took);
    return;
  }
  LogWarning("relayed session ", command.session_id(), " seq ", command.seq(), " to ",
             calls.size(), " agent(s) in ", took, ": ", failed.size(), " failed (first: ",
             first_error, "); reporting them to the coordinator");
  report_failed_(command.session_id(), command.seq(), std::move(failed));
}

absl::Status ReportRelayFailed(CoordinatorClient& coordinator,
                               const v1::RelayFailedRequest& request, absl::Time give_up,
                               Backoff& backoff, const Clock& clock,
                               absl::FunctionRef<void(absl::Duration)> sleep) {
  for (;;) {
    const absl::Status status = coordinator.RelayFailed(request).status();
    if (!WorthResending(status.code()) || clock.Now() >= give_up) return status;
    sleep(backoff.Next());
  }
}

}  // namespace tessera
