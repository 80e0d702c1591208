#include "server/death_watch.h"

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

// Real listeners stand in for the agents' peer ports: a closed one is a process gone.
class DeathWatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<TcpSocket> listener = TcpSocket::Listen("127.0.0.1:0", 4);
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
  ASSERT_TRUE(port_.Accept().ok()) << "the watch's probe of the new registration";
  port_ = TcpSocket();  // the process is gone: its port closes with it
  watch_.StreamBroken("job", 1, 7);
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
  watch_.StreamBroken("job", 1, 7);
  // The verification, then every probe of the suspect, connects to the live port.
  for (int accepted = 0; accepted < 4; ++accepted) {
    absl::StatusOr<TcpSocket> probe = port_.Accept();
    ASSERT_TRUE(probe.ok()) << probe.status();
  }
  watch_.StreamOpened("job", 1, 7);
  EXPECT_EQ(Verdict(1).state, AgentLiveness::State::kLive);
  EXPECT_EQ(watch_.deaths(), 0u);
}

// A refusal proves a death only for an address seen accepting: one that never did (advertised
// wrong) must not kill a live agent.
TEST_F(DeathWatchTest, AnAddressNeverSeenAccepting_ItsRefusalProvesNothing) {
  const std::string wrong = address_;
  port_ = TcpSocket();  // closed before the watch ever reached it
  ASSERT_TRUE(registry_.Register(Registration(0, 9, wrong)).ok());
  watch_.Registered("job", 0, 9, wrong);
  watch_.StreamBroken("job", 0, 9);
  // The registered rank 1 (never registered with the watch) and rank 0 stay as the lease says.
  absl::StatusOr<TcpSocket> other = TcpSocket::Listen("127.0.0.1:0", 4);
  ASSERT_TRUE(other.ok());
  // Let the watch run its verification probe of `wrong` and a few periods beyond: it is an
  // event (the second, live listener's probes) that tells the test the watch has run.
  const std::string other_address = "127.0.0.1:" + std::to_string(other->port());
  ASSERT_TRUE(registry_.Register(Registration(1, 8, other_address)).ok());
  watch_.Registered("job", 1, 8, other_address);
  ASSERT_TRUE(other->Accept().ok());  // the verification of rank 1, after rank 0's
  EXPECT_EQ(Verdict(0).state, AgentLiveness::State::kLive);
  EXPECT_EQ(watch_.deaths(), 0u);
}

}  // namespace
}  // namespace tessera
