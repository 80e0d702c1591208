#include "agent/command_relay.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/clock.h"
#include "common/fake_bulk_holder.h"
#include "common/peer_auth.h"
#include "common/peer_call_proof.h"
#include "common/grpc_status.h"
#include "common/status.h"
#include "google/protobuf/util/message_differencer.h"
#include "grpcpp/grpcpp.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::google::protobuf::util::MessageDifferencer;

constexpr char kJob[] = "job";
constexpr uint32_t kRelayRank = 0;

// A PIN as the coordinator sends a relay: no assignment, relay_to to be filled by the test.
v1::Command Pin(uint64_t seq) {
  v1::Command command;
  command.set_session_id("s-7");
  command.set_step(7);
  command.set_seq(seq);
  v1::PinCommand* pin = command.mutable_pin();
  pin->set_plan_fingerprint(0x1234abcd);
  pin->set_assignment_omitted(true);
  pin->set_copy_when_pinned(true);
  return command;
}

void AddTarget(v1::Command& command, uint32_t rank, uint64_t incarnation,
               const std::string& address) {
  v1::RelayTarget* target = command.add_relay_to();
  target->set_rank(rank);
  target->set_incarnation(incarnation);
  target->set_peer_address(address);
  target->set_seq(100 + rank);  // the target's own seq, as the coordinator gave its PIN
}

// A port on 127.0.0.1 that nothing listens on: bound, then closed.
int ClosedPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  EXPECT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  close(fd);
  return ntohs(addr.sin_port);
}

// Serves `service` on a free port of 127.0.0.1, whose address goes to `address`.
std::unique_ptr<grpc::Server> Serve(grpc::Service* service, std::string* address) {
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  *address = absl::StrCat("127.0.0.1:", port);
  return server;
}

// A relayer's options proving the job's secret (TestPeerCredential), as agents hold it.
CommandRelayerOptions Proving() {
  static PeerKeyring* keyring = TestPeerKeyring(kJob).release();
  CommandRelayerOptions options;
  options.keyring = keyring;
  return options;
}

// One agent's CommandRelayService on its own in-process server, recording what it is handed.
class Agent {
 public:
  Agent(uint32_t rank, uint64_t incarnation)
      : rank_(rank),
        incarnation_(incarnation),
        service_(
            kJob, rank, incarnation,
            [this](const v1::Command& command) {
              absl::MutexLock lock(&mu_);
              commands_.push_back(command);
              if (!received_.HasBeenNotified()) received_.Notify();
            },
            keyring_.get()),
        server_(Serve(&service_, &address_)) {}
  ~Agent() { server_->Shutdown(); }

  uint32_t rank() const { return rank_; }
  uint64_t incarnation() const { return incarnation_; }
  const std::string& address() const { return address_; }
  CommandRelayService& service() { return service_; }
  absl::Notification& received() { return received_; }
  std::vector<v1::Command> commands() {
    absl::MutexLock lock(&mu_);
    return commands_;
  }

  // Relay() over gRPC, as another agent calls it: proving `credential`, or with the proof
  // `proof` (the metadata's value) if it is not empty.
  grpc::Status Call(const v1::RelayRequest& request,
                    const PeerCredential& credential = TestPeerCredential(kJob),
                    const std::string& proof = "") {
    std::unique_ptr<v1::CommandRelay::Stub> stub = v1::CommandRelay::NewStub(
        grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    if (proof.empty()) {
      EXPECT_TRUE(ProvePeerCall(&context, credential, kRelayMethod).ok());
    } else {
      context.AddMetadata(kPeerProofMetadata, proof);
    }
    v1::RelayResponse response;
    return stub->Relay(&context, request, &response);
  }

  // A request addressed to this agent.
  v1::RelayRequest RequestFor(const v1::Command& command) const {
    v1::RelayRequest request;
    request.set_job_id(kJob);
    request.set_rank(rank_);
    request.set_incarnation(incarnation_);
    request.set_from_rank(kRelayRank);
    *request.mutable_command() = command;
    return request;
  }

 private:
  const uint32_t rank_;
  const uint64_t incarnation_;
  absl::Mutex mu_;
  std::vector<v1::Command> commands_ ABSL_GUARDED_BY(mu_);
  absl::Notification received_;
  const std::unique_ptr<PeerKeyring> keyring_ = TestPeerKeyring(kJob);  // before service_
  CommandRelayService service_;
  std::string address_;  // before server_, which Serve() fills it for
  std::unique_ptr<grpc::Server> server_;
};

// What report_failed was called with.
struct Reports {
  struct Report {
    std::string session_id;
    uint64_t seq = 0;
    std::vector<uint32_t> ranks;
  };

  CommandRelayer::ReportFailed Callback() {
    return [this](const std::string& session_id, uint64_t seq, std::vector<uint32_t> ranks) {
      absl::MutexLock lock(&mu);
      reports.push_back({session_id, seq, std::move(ranks)});
    };
  }
  std::vector<Report> Get() {
    absl::MutexLock lock(&mu);
    return reports;
  }

  absl::Mutex mu;
  std::vector<Report> reports ABSL_GUARDED_BY(mu);
};

// A CommandRelay server that never answers until it is destroyed: a target that hangs.
class SilentService final : public v1::CommandRelay::CallbackService {
 public:
  grpc::ServerUnaryReactor* Relay(grpc::CallbackServerContext* context,
                                  const v1::RelayRequest*, v1::RelayResponse*) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    absl::MutexLock lock(&mu_);
    parked_.push_back(reactor);
    if (!called_.HasBeenNotified()) called_.Notify();
    return reactor;
  }
  // Answers every parked call (a server's Shutdown waits for them).
  void Release() {
    absl::MutexLock lock(&mu_);
    for (grpc::ServerUnaryReactor* reactor : parked_) reactor->Finish(grpc::Status::OK);
    parked_.clear();
  }
  absl::Notification& called() { return called_; }

 private:
  absl::Mutex mu_;
  std::vector<grpc::ServerUnaryReactor*> parked_ ABSL_GUARDED_BY(mu_);
  absl::Notification called_;
};

class SilentAgent {
 public:
  SilentAgent() : server_(Serve(&service_, &address_)) {}
  ~SilentAgent() {
    service_.Release();
    server_->Shutdown();
  }
  const std::string& address() const { return address_; }
  SilentService& service() { return service_; }

 private:
  SilentService service_;
  std::string address_;  // before server_, which Serve() fills it for
  std::unique_ptr<grpc::Server> server_;
};

TEST(CommandRelayServiceTest, Relay_MatchingCommand_HandedOnUnchanged) {
  Agent agent(3, 0x33);
  const v1::Command command = Pin(42);
  grpc::Status status = agent.Call(agent.RequestFor(command));
  ASSERT_TRUE(status.ok()) << status.error_message();
  std::vector<v1::Command> got = agent.commands();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE(MessageDifferencer::Equals(got[0], command)) << got[0].DebugString();
}

TEST(CommandRelayServiceTest, Relay_AnotherIncarnation_FailedPreconditionStaleIncarnation) {
  Agent agent(3, 0x33);
  v1::RelayRequest request = agent.RequestFor(Pin(42));
  request.set_incarnation(0x32);
  grpc::Status status = agent.Call(request);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(status.error_message().find("incarnation"), std::string::npos)
      << status.error_message();
  EXPECT_EQ(GetErrorCode(FromGrpcStatus(status)), v1::ERROR_CODE_STALE_INCARNATION);
  EXPECT_TRUE(agent.commands().empty());
}

TEST(CommandRelayServiceTest, Relay_AnotherRank_FailedPrecondition) {
  Agent agent(3, 0x33);
  v1::RelayRequest request = agent.RequestFor(Pin(42));
  request.set_rank(4);
  grpc::Status status = agent.Call(request);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(status.error_message().find("rank 4"), std::string::npos) << status.error_message();
  EXPECT_TRUE(agent.commands().empty());
}

TEST(CommandRelayServiceTest, Relay_AnotherJob_FailedPrecondition) {
  Agent agent(3, 0x33);
  v1::RelayRequest request = agent.RequestFor(Pin(42));
  request.set_job_id("other-job");
  grpc::Status status = agent.Call(request);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(status.error_message().find("job other-job"), std::string::npos)
      << status.error_message();
  EXPECT_TRUE(agent.commands().empty());
}

// Issue 51: a relayed command is handed on only if the call proves the job's secret.
TEST(CommandRelayServiceTest, Relay_WithoutProofForgedReplayedOrAnotherJobs_Unauthenticated) {
  Agent agent(3, 0x33);
  const v1::RelayRequest request = agent.RequestFor(Pin(42));
  EXPECT_EQ(agent.Call(request, PeerCredential{kJob, ""}).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(agent.Call(request, TestPeerCredential("other-job")).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  PeerCallProof forged = MakePeerCallProof(TestPeerCredential(kJob), kRelayMethod, absl::Now(),
                                           std::string(kPeerNonceBytes, 'f'));
  forged.mac[0] ^= 1;
  EXPECT_EQ(agent.Call(request, {}, EncodePeerCallProof(forged)).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(agent.commands().empty());
  // A proof seen on the wire, replayed: the first call is handed on, the replay is not.
  const std::string seen = EncodePeerCallProof(MakePeerCallProof(
      TestPeerCredential(kJob), kRelayMethod, absl::Now(), std::string(kPeerNonceBytes, 'r')));
  ASSERT_TRUE(agent.Call(request, {}, seen).ok());
  EXPECT_EQ(agent.Call(request, {}, seen).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(agent.commands().size(), 1u);
}

TEST(CommandRelayServiceTest, Relay_CommandWithRelayTo_InvalidArgument) {
  Agent agent(3, 0x33);
  v1::Command command = Pin(42);
  AddTarget(command, 5, 0x55, "127.0.0.1:1");
  grpc::Status status = agent.Call(agent.RequestFor(command));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(agent.commands().empty());
}

// Only what the coordinator relays is taken from a relay: a PIN without an assignment. A
// peer that relays anything else (an ABORT, a COMMIT, a PIN with an assignment) is refused.
TEST(CommandRelayServiceTest, Relay_CommandNotRelayable_InvalidArgumentAndNotHandedOn) {
  Agent agent(3, 0x33);
  v1::Command abort;
  abort.set_session_id("s-7");
  abort.set_seq(43);
  abort.mutable_abort();
  v1::Command commit = abort;
  commit.mutable_commit()->set_final_dir("/ckpt/job/step-1");
  v1::Command with_assignment = Pin(42);
  with_assignment.mutable_pin()->set_assignment_omitted(false);
  for (const v1::Command& command : {abort, commit, with_assignment}) {
    grpc::Status status = agent.Call(agent.RequestFor(command));
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << command.ShortDebugString();
    EXPECT_THAT(status.error_message(), ::testing::HasSubstr("not one a relay passes on"));
  }
  EXPECT_TRUE(agent.commands().empty());
}

TEST(CommandRelayServiceTest, Relay_AfterStop_UnavailableAndNotHandedOn) {
  Agent agent(3, 0x33);
  agent.service().Stop();
  grpc::Status status = agent.Call(agent.RequestFor(Pin(42)));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_TRUE(agent.commands().empty());
}

TEST(CommandRelayerTest, Forward_TwoLiveTargets_EachGetsCommandWithoutRelayToWithItsSeq) {
  Agent a(1, 0x11);
  Agent b(2, 0x22);
  Reports reports;
  CommandRelayer relayer(kJob, kRelayRank, reports.Callback(), Proving());
  v1::Command command = Pin(42);
  AddTarget(command, a.rank(), a.incarnation(), a.address());
  AddTarget(command, b.rank(), b.incarnation(), b.address());
  relayer.Forward(command);
  a.received().WaitForNotification();
  b.received().WaitForNotification();
  relayer.WaitIdleForTesting();

  for (Agent* agent : {&a, &b}) {
    v1::Command expected = command;
    expected.clear_relay_to();
    expected.set_seq(100 + agent->rank());
    std::vector<v1::Command> got = agent->commands();
    ASSERT_EQ(got.size(), 1u) << "rank " << agent->rank();
    EXPECT_EQ(got[0].relay_to_size(), 0);
    EXPECT_TRUE(MessageDifferencer::Equals(got[0], expected)) << got[0].DebugString();
  }
  EXPECT_TRUE(reports.Get().empty());
}

TEST(CommandRelayerTest, Forward_UnreachableAndRefusingTargets_ReportedOnceWithThoseRanks) {
  Agent live(1, 0x11);
  Agent restarted(3, 0x33);  // the relay was told of incarnation 0x30
  Reports reports;
  CommandRelayer relayer(kJob, kRelayRank, reports.Callback(), Proving());
  v1::Command command = Pin(42);
  AddTarget(command, live.rank(), live.incarnation(), live.address());
  AddTarget(command, 2, 0x22, absl::StrCat("127.0.0.1:", ClosedPort()));
  AddTarget(command, restarted.rank(), 0x30, restarted.address());
  relayer.Forward(command);
  relayer.WaitIdleForTesting();

  std::vector<Reports::Report> got = reports.Get();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].session_id, "s-7");
  EXPECT_EQ(got[0].seq, 42u);
  EXPECT_EQ(got[0].ranks, (std::vector<uint32_t>{2, 3}));
  EXPECT_EQ(live.commands().size(), 1u);
  EXPECT_TRUE(restarted.commands().empty());
}

TEST(CommandRelayerTest, Forward_TargetDoesNotAnswer_ReportedAfterDeadline) {
  Agent live(1, 0x11);
  SilentAgent silent;
  Reports reports;
  CommandRelayerOptions options = Proving();
  // Long enough for the live target's call (a fresh channel: connect, handshake, answer) on a
  // loaded machine; only the silent one is to run out of it.
  options.deadline = absl::Seconds(3);
  CommandRelayer relayer(kJob, kRelayRank, reports.Callback(), options);
  v1::Command command = Pin(42);
  AddTarget(command, live.rank(), live.incarnation(), live.address());
  AddTarget(command, 2, 0x22, silent.address());
  relayer.Forward(command);
  relayer.WaitIdleForTesting();

  std::vector<Reports::Report> got = reports.Get();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].ranks, (std::vector<uint32_t>{2}));
  EXPECT_TRUE(silent.service().called().HasBeenNotified());
  EXPECT_EQ(live.commands().size(), 1u);
}

TEST(CommandRelayerTest, Destroy_CallInFlight_CancelledAndNotReported) {
  SilentAgent silent;
  Reports reports;
  {
    CommandRelayerOptions options = Proving();
    options.deadline = absl::Hours(1);
    CommandRelayer relayer(kJob, kRelayRank, reports.Callback(), options);
    v1::Command command = Pin(42);
    AddTarget(command, 2, 0x22, silent.address());
    relayer.Forward(command);
    silent.service().called().WaitForNotification();
  }  // must return long before the hour: the call is cancelled
  EXPECT_TRUE(reports.Get().empty());
}

TEST(CommandRelayerTest, Forward_NoRelayTo_NothingQueuedNorReported) {
  Reports reports;
  CommandRelayer relayer(kJob, kRelayRank, reports.Callback(), Proving());
  relayer.Forward(Pin(41));  // no relay_to
  relayer.WaitIdleForTesting();
  EXPECT_TRUE(reports.Get().empty());
}

// A coordinator whose RelayFailed answers come from a script, then OK.
class ScriptedCoordinator : public CoordinatorClient {
 public:
  explicit ScriptedCoordinator(std::vector<absl::Status> answers) : answers_(std::move(answers)) {}
  absl::StatusOr<v1::RegisterAgentResponse> Register(const v1::RegisterAgentRequest&) override {
    return absl::UnimplementedError("not here");
  }
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest&) override {
    return absl::UnimplementedError("not here");
  }
  absl::StatusOr<v1::SubmitLocalPlanResponse> SubmitLocalPlan(
      const v1::SubmitLocalPlanRequest&) override {
    return absl::UnimplementedError("not here");
  }
  absl::StatusOr<v1::ReportChunksResponse> ReportChunks(const v1::ReportChunksRequest&) override {
    return absl::UnimplementedError("not here");
  }
  absl::StatusOr<v1::ReportPhaseResponse> ReportPhase(const v1::ReportPhaseRequest&) override {
    return absl::UnimplementedError("not here");
  }
  absl::StatusOr<v1::RelayFailedResponse> RelayFailed(
      const v1::RelayFailedRequest& request) override {
    requests.push_back(request);
    if (calls_ < answers_.size()) return answers_[calls_++];
    ++calls_;
    return v1::RelayFailedResponse();
  }
  std::vector<v1::RelayFailedRequest> requests;

 private:
  std::vector<absl::Status> answers_;
  size_t calls_ = 0;
};

v1::RelayFailedRequest MissedRanks() {
  v1::RelayFailedRequest request;
  request.set_session_id("s9");
  request.set_seq(12);
  request.add_ranks(5);
  request.add_ranks(6);
  return request;
}

TEST(ReportRelayFailedTest, UnreachableTwice_ResentWithBackoff_ThenOk) {
  ScriptedCoordinator coordinator(
      {absl::UnavailableError("down"), absl::DeadlineExceededError("slow")});
  FakeClock clock;
  Backoff backoff(BackoffOptions{}, /*seed=*/1);
  std::vector<absl::Duration> slept;
  absl::Status status =
      ReportRelayFailed(coordinator, MissedRanks(), clock.Now() + absl::Seconds(30), backoff, clock,
                        [&](absl::Duration d) {
                          slept.push_back(d);
                          clock.Advance(d);
                        });
  EXPECT_TRUE(status.ok()) << status;
  ASSERT_EQ(coordinator.requests.size(), 3u);
  for (const v1::RelayFailedRequest& sent : coordinator.requests) {
    EXPECT_TRUE(MessageDifferencer::Equals(sent, MissedRanks())) << sent.DebugString();
  }
  ASSERT_EQ(slept.size(), 2u);
  EXPECT_GT(slept[0], absl::ZeroDuration());
  EXPECT_LE(slept[0], absl::Milliseconds(100));  // BackoffOptions' initial delay
}

TEST(ReportRelayFailedTest, SessionEnded_NotResent) {
  ScriptedCoordinator coordinator({absl::FailedPreconditionError("session s9 ended")});
  FakeClock clock;
  Backoff backoff(BackoffOptions{}, 1);
  int sleeps = 0;
  absl::Status status =
      ReportRelayFailed(coordinator, MissedRanks(), clock.Now() + absl::Seconds(30), backoff, clock,
                        [&](absl::Duration) { ++sleeps; });
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_EQ(coordinator.requests.size(), 1u);
  EXPECT_EQ(sleeps, 0);
}

TEST(ReportRelayFailedTest, UnreachablePastGiveUp_TheLastFailure) {
  ScriptedCoordinator coordinator(std::vector<absl::Status>(1000, absl::UnavailableError("down")));
  FakeClock clock;
  const absl::Time give_up = clock.Now() + absl::Seconds(30);
  Backoff backoff(BackoffOptions{}, 1);
  absl::Status status = ReportRelayFailed(coordinator, MissedRanks(), give_up, backoff, clock,
                                          [&](absl::Duration d) { clock.Advance(d); });
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_GE(clock.Now(), give_up);
  // Delays of at least half of 0.1, 0.2, 0.4 ... 5 s: it gave up within a handful of tries.
  EXPECT_GT(coordinator.requests.size(), 3u);
  EXPECT_LT(coordinator.requests.size(), 30u);
}

}  // namespace
}  // namespace tessera
