// Relayed commands (proto: coordinator.proto Command.relay_to, peer.proto CommandRelay): the
// coordinator writes a PIN once per node, to one agent of it, the relay, whose relay_to lists
// the node's other agents; the relay passes the command on to each of them and handles it
// itself as usual. At 16,384 ranks this turns 16,384 writes on the coordinator's command
// streams into one per node.
//
// Two sides, one class each:
// - CommandRelayService serves CommandRelay.Relay on the agent's Peer port: a command relayed
//   to this agent is handed to the same callback as one from its Commands stream.
// - CommandRelayer is the relay: it passes a command on to its relay_to targets, all at once,
//   on a thread of its own, and reports the targets it could not hand it to (an error, or no
//   answer within its deadline) once per command, so that the coordinator sends those ranks
//   their command directly.
#ifndef TESSERA_AGENT_COMMAND_RELAY_H_
#define TESSERA_AGENT_COMMAND_RELAY_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/backoff.h"
#include "agent/coordinator_client.h"
#include "common/clock.h"
#include "common/peer_auth.h"
#include "common/peer_call_proof.h"
#include "grpcpp/grpcpp.h"
#include "tessera/v1/coordinator.pb.h"
#include "tessera/v1/peer.grpc.pb.h"

namespace tessera {

// Serves CommandRelay.Relay (a callback-API unary handler, STYLE.md 8): checks that the
// request names this agent, then hands the command to `on_command` on the gRPC thread and
// answers. It never waits on the network; `on_command` must be brief and must not block
// (in production SaveExecutor::OnCommand, which takes its mutex briefly).
//
// Lifecycle: register it with a server (GrpcPeerTransportOptions::extra_services) that it
// outlives. Stop() before destroying what `on_command` calls, if that goes first.
//
// Thread-safety: thread-safe; `on_command` may run on several gRPC threads at once.
class CommandRelayService final : public v1::CommandRelay::CallbackService {
 public:
  using OnCommand = std::function<void(const v1::Command&)>;

  // `job_id`, `rank` and `incarnation` are this agent's registration's. `keyring` (which must
  // outlive the service) holds the job's credential, which every call must prove (common/
  // peer_call_proof.h); null: calls not checked, for tests of the relay alone.
  CommandRelayService(std::string job_id, uint32_t rank, uint64_t incarnation,
                      OnCommand on_command, const PeerKeyring* keyring = nullptr);

  // Calls on_command(request->command()) unchanged and answers OK.
  // Errors: UNAUTHENTICATED if the call does not prove it comes from an agent of the job
  // (looked at first); FAILED_PRECONDITION if the request's job_id, rank or incarnation is not this
  // agent's, the message naming each that differs (STALE_INCARNATION in its ErrorDetail when
  // only the incarnation does: the target restarted); INVALID_ARGUMENT if the command has
  // relay_to set (a relayed command is never relayed again) or is not one a relay passes on
  // (common/relayable.h: a PIN without an assignment); UNAVAILABLE after Stop().
  // on_command is not called on an error.
  grpc::ServerUnaryReactor* Relay(grpc::CallbackServerContext* context,
                                  const v1::RelayRequest* request,
                                  v1::RelayResponse* response) override;

  // After Stop() returns, on_command is not running and is never called again. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // What Relay() answers for `request`.
  absl::Status Handle(const v1::RelayRequest& request) ABSL_LOCKS_EXCLUDED(mu_);

  const std::string job_id_;
  const uint32_t rank_;
  const uint64_t incarnation_;
  const OnCommand on_command_;
  const std::unique_ptr<PeerCallGate> gate_;  // null: calls not checked

  // Readers: Relay() calls running on_command; the writer: Stop().
  absl::Mutex mu_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

struct CommandRelayerOptions {
  // How long each target has to answer one Relay call; a target that has not answered by
  // then counts as failed (its call is cancelled). Default: 5 s.
  absl::Duration deadline = absl::Seconds(5);

  // Credentials of the channels to the targets. Default: insecure (nullptr).
  std::shared_ptr<grpc::ChannelCredentials> channel_credentials;

  // The job's credential, proved on every call (common/peer_call_proof.h); must outlive the
  // relayer. Default: null — no proof, which an agent's CommandRelayService refuses.
  const PeerKeyring* keyring = nullptr;
};

// Passes commands with relay_to on to their targets. Forward() queues a command and returns at
// once; a worker thread takes the commands in order and, for each, calls CommandRelay.Relay on
// every target at once (the callback client API: no thread per target), with relay_to cleared
// and the target's rank and incarnation, each call bounded by the deadline. Once all answered
// or gave up, it logs one line (targets, failures with the first error, time taken) and, if
// any failed, calls `report_failed` once with the failed ranks, in relay_to order, on the
// worker thread (so it may block: in production Coordinator.RelayFailed). The next command
// waits for that. Channels to targets are kept by address for the relayer's life (a target
// restarted on another port adds one; the cache is trimmed to the current targets once it
// holds 256).
//
// Lifecycle: the destructor stops the worker: commands still queued are dropped unrelayed and
// unreported (the agent is stopping; its lost lease ends the session), calls in flight are
// cancelled and waited for, and report_failed is not called for their command (a
// report_failed already running is waited for). Destroy the relayer before what
// report_failed uses.
//
// Thread-safety: thread-safe.
class CommandRelayer {
 public:
  // The command (session_id, seq) could not be handed to `ranks`.
  using ReportFailed = std::function<void(const std::string& session_id, uint64_t seq,
                                          std::vector<uint32_t> ranks)>;

  // `job_id` and `rank` are this agent's: the job of every target, and RelayRequest.from_rank.
  CommandRelayer(std::string job_id, uint32_t rank, ReportFailed report_failed,
                 CommandRelayerOptions options = {});
  ~CommandRelayer();

  CommandRelayer(const CommandRelayer&) = delete;
  CommandRelayer& operator=(const CommandRelayer&) = delete;

  // Queues `command` for its relay_to targets and returns without blocking; returns at once,
  // queuing nothing, if relay_to is empty. Called before the agent handles the command itself.
  void Forward(const v1::Command& command) ABSL_LOCKS_EXCLUDED(mu_);

  // Blocks until no command is queued or being relayed (report_failed included). For tests.
  void WaitIdleForTesting() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Call;

  void Run() ABSL_LOCKS_EXCLUDED(mu_);
  // Relays one command to all its targets, waits for them, logs and reports.
  void RelayOne(const v1::Command& command) ABSL_LOCKS_EXCLUDED(mu_);
  v1::CommandRelay::Stub* StubFor(const std::string& address);

  const std::string job_id_;
  const uint32_t rank_;
  const ReportFailed report_failed_;
  const CommandRelayerOptions options_;

  // Stubs by peer address; used by the worker thread only.
  std::map<std::string, std::unique_ptr<v1::CommandRelay::Stub>> stubs_;

  absl::Mutex mu_;
  std::deque<v1::Command> queue_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;  // the worker is relaying a command
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int calls_pending_ ABSL_GUARDED_BY(mu_) = 0;  // of the command being relayed
  std::thread worker_;  // last: starts once the fields above exist
};

// A relay's report that `request.ranks()` did not get its command (Coordinator.RelayFailed):
// until the coordinator hears it those ranks have no PIN, and only the session's PINNING
// deadline would end the wait. Sends it, and again after each failure worth resending
// (agent/save/report_queue.h WorthResending), sleeping `backoff.Next()` between, until it gets
// through or `clock` passes `give_up`. Returns the last answer: OK, the error that is not
// worth resending (e.g. FailedPrecondition: the session ended or this incarnation is stale),
// or the last failure. Blocks; run it where a wait does not hold up other work.
absl::Status ReportRelayFailed(CoordinatorClient& coordinator,
                               const v1::RelayFailedRequest& request, absl::Time give_up,
                               Backoff& backoff, const Clock& clock,
                               absl::FunctionRef<void(absl::Duration)> sleep);

}  // namespace tessera

#endif  // TESSERA_AGENT_COMMAND_RELAY_H_
