#include "server/death_watch.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "absl/synchronization/notification.h"
#include "common/clock.h"
#include "common/tcp_socket.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

v1::RegisterAgentRequest Registration(uint32_t rank, uint64_t incarnation,
                                      const std::string& peer_address) {
  v1::RegisterAgentRequest r;
  r.set_job_id("job");
  r.mutable_coord()->set_rank(rank);
  r.set_incarnation(incarnation);
  r.set_peer_address(peer_address);
  v1::MeshDim* dim = r.mutable_layout()->add_dims();
  dim->set_name("dp");
  dim->set_degree(2);
  return r;
}

// The watch's next connection to `listener`, waited for at most 30 s (a watch that never
// probes fails the test instead of hanging it).
::testing::AssertionResult Probed(const TcpSocket& listener) {
  pollfd ready{listener.fd(), POLLIN, 0};
  if (::poll(&ready, 1, 30000) != 1) {
    return ::testing::AssertionFailure() << "no probe reached the port within 30 s";
  }
  absl::StatusOr<TcpSocket> probe = listener.Accept();
  if (!probe.ok()) return ::testing::AssertionFailure() << probe.status();
  return ::testing::AssertionSuccess();
}

// A port nobody listens on and nobody can take meanwhile: bound, never listened on.
class ClosedPort {
 public:
  ClosedPort() : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    ::bind(fd_, reinterpret_cast<sockaddr*>(&a), len);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    address_ = "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  }
  ~ClosedPort() { ::close(fd_); }
  const std::string& address() const { return address_; }

 private:
  int fd_;
  std::string address_;
};

// Real listeners stand in for the agents' peer ports: a closed one is a process gone.
class DeathWatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<TcpSocket> listener = TcpSocket::Listen("127.0.0.1:0", 16);
    ASSERT_TRUE(listener.ok()) << listener.status();
    port_ = *std::move(listener);
    address_ = "127.0.0.1:" + std::to_string(port_.port());
    ASSERT_TRUE(registry_.Register(Registration(1, 7, address_)).ok());
  }

  AgentLiveness Verdict(uint32_t rank) {
    uint64_t since = 0;
    return registry_.Liveness("job", 2, &since)[rank];
  }

  FakeClock clock_;
  AgentRegistry registry_{&clock_, AgentRegistryOptions{}};
  TcpSocket port_;
  std::string address_;
  absl::Notification died_;
  DeathWatch watch_{&registry_, [this](const std::string& job) {
                      EXPECT_EQ(job, "job");
                      died_.Notify();
                    }};
};

// Issue 52, bug 5: a killed agent's stream breaks and its port refuses: dead at once, with why.
TEST_F(DeathWatchTest, StreamBrokenAndPortRefusing_DeadWithinAFewProbes) {
  watch_.Registered("job", 1, 7, address_);
  ASSERT_TRUE(Probed(port_)) << "the watch's probe of the new registration";
  watch_.StreamOpened("job", 1, 7, /*serial=*/1);
  port_ = TcpSocket();  // the process is gone: its port closes with it
  watch_.StreamBroken("job", 1, 7, /*serial=*/1);
  ASSERT_TRUE(died_.WaitForNotificationWithTimeout(absl::Seconds(30)));
  const AgentLiveness verdict = Verdict(1);
  EXPECT_EQ(verdict.state, AgentLiveness::State::kLost);
  EXPECT_EQ(verdict.lost.code(), v1::ERROR_CODE_AGENT_LOST);
  EXPECT_NE(verdict.lost.message().find("refuses connections"), std::string::npos)
      << verdict.lost.message();
  EXPECT_EQ(watch_.deaths(), 1u);
}

// A stream reset by the network (a proxy, a NAT) while the agent lives: its port accepts, so
// it stays a suspect, never dead; its stream back clears it.
TEST_F(DeathWatchTest, StreamBrokenButPortAccepting_NeverDead) {
  watch_.Registered("job", 1, 7, address_);
  watch_.StreamBroken("job", 1, 7, /*serial=*/1);
  // The verification, then every probe of the suspect, connects to the live port.
  for (int probe = 0; probe < 4; ++probe) ASSERT_TRUE(Probed(port_)) << "probe " << probe;
  watch_.StreamOpened("job", 1, 7, /*serial=*/2);
  EXPECT_EQ(Verdict(1).state, AgentLiveness::State::kLive);
  EXPECT_EQ(watch_.deaths(), 0u);
}

// A break reported after a newer stream opened (gRPC's callbacks of the two streams raced) is
// old news: the agent is no suspect, even with its port closed.
TEST_F(DeathWatchTest, ABreakOfAnOlderStream_Ignored) {
  watch_.Registered("job", 1, 7, address_);
  ASSERT_TRUE(Probed(port_));
  watch_.StreamOpened("job", 1, 7, /*serial=*/5);
  watch_.StreamBroken("job", 1, 7, /*serial=*/4);
  port_ = TcpSocket();
  // Another agent's death, reported after, is the event that says the watch has run rounds.
  ClosedPort rank0;
  absl::StatusOr<TcpSocket> live = TcpSocket::Listen("127.0.0.1:0", 4);
  ASSERT_TRUE(live.ok());
  const std::string live_address = "127.0.0.1:" + std::to_string(live->port());
  ASSERT_TRUE(registry_.Register(Registration(0, 9, live_address)).ok());
  watch_.Registered("job", 0, 9, live_address);
  ASSERT_TRUE(Probed(*live));
  *live = TcpSocket();
  watch_.StreamBroken("job", 0, 9, /*serial=*/6);
  ASSERT_TRUE(died_.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(Verdict(0).state, AgentLiveness::State::kLost);
  EXPECT_EQ(Verdict(1).state, AgentLiveness::State::kLive);
  EXPECT_EQ(watch_.deaths(), 1u);
}

// A refusal proves a death only for an address seen accepting: one that never did (advertised
// wrong) must not kill a live agent.
TEST_F(DeathWatchTest, AnAddressNeverSeenAccepting_ItsRefusalProvesNothing) {
  ClosedPort wrong;
  ASSERT_TRUE(registry_.Register(Registration(0, 9, wrong.address())).ok());
  watch_.Registered("job", 0, 9, wrong.address());
  watch_.StreamBroken("job", 0, 9, /*serial=*/1);
  // Rank 1's death, found in a round after rank 0's refusals were judged (rank 0 is a suspect
  // from before rank 1's stream broke), is the event that says the watch has run.
  watch_.Registered("job", 1, 7, address_);
  ASSERT_TRUE(Probed(port_));
  port_ = TcpSocket();
  watch_.StreamBroken("job", 1, 7, /*serial=*/2);
  ASSERT_TRUE(died_.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(Verdict(1).state, AgentLiveness::State::kLost);
  EXPECT_EQ(Verdict(0).state, AgentLiveness::State::kLive) << "its refusals proved nothing";
  EXPECT_EQ(watch_.deaths(), 1u);
}

}  // namespace
}  // namespace tessera
