#include "agent/peer/loopback_peer_transport.h"

#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "agent/peer/gather_fixture_test_util.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using testing::AllRecvs;
using testing::AllSends;
using testing::DpBox;
using testing::OnceNotification;

absl::Time Later() { return absl::Now() + absl::Seconds(60); }

TEST(LoopbackPeerTransport, Gather_FourRanks_LeadersAssembleBoxes) {
  LoopbackHub hub;
  std::vector<std::unique_ptr<LoopbackPeerTransport>> transports;
  for (uint32_t rank = 0; rank < 4; ++rank) {
    transports.push_back(std::make_unique<LoopbackPeerTransport>(&hub, rank));
  }
  DpBox a(1, "a", Box{{0}, {100000}}, 4, {0, 1, 2, 3}, /*leader=*/0, /*empty_rank_index=*/3);
  DpBox b(2, "b", Box{{0}, {70001}}, 2, {0, 1, 2, 3}, /*leader=*/2);
  std::vector<absl::Status> statuses(4);
  std::vector<std::thread> threads;
  for (uint32_t rank = 0; rank < 4; ++rank) {
    threads.emplace_back([&, rank] {
      statuses[rank] =
          transports[rank]->Exchange("s", AllSends({&a, &b}, rank), AllRecvs({&a, &b}, rank),
                                     Later());
    });
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : statuses) EXPECT_TRUE(s.ok()) << s;
  EXPECT_TRUE(a.leader_slot() == a.expected());
  EXPECT_TRUE(b.leader_slot() == b.expected());
}

TEST(LoopbackPeerTransport, Send_NoTransportForLeader_Unavailable) {
  LoopbackHub hub;
  LoopbackPeerTransport t0(&hub, 0);
  DpBox box(3, "k", Box{{0}, {64}}, 4, {0, 1}, /*leader=*/1);
  EXPECT_EQ(t0.Exchange("s", box.Sends(0), {}, Later()).code(), absl::StatusCode::kUnavailable);
}

TEST(LoopbackPeerTransport, Cancel_LeaderCancelsWhileSenderParked_SenderAborted) {
  LoopbackHub hub;
  OnceNotification parked;
  SliceInboxOptions options;
  options.on_parked = [&](const std::string&) { parked.Notify(); };
  LoopbackPeerTransport sender(&hub, 0);
  LoopbackPeerTransport leader(&hub, 1, options);
  DpBox box(4, "k", Box{{0}, {64}}, 4, {0, 1}, /*leader=*/1);
  absl::Status status;
  std::thread t([&] { status = sender.Exchange("s", box.Sends(0), {}, Later()); });
  parked.WaitForNotification();
  leader.CancelSession("s");
  t.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted) << status;
  EXPECT_EQ(leader.Exchange("s", {}, box.Recvs(1), Later()).code(), absl::StatusCode::kAborted);
}

TEST(LoopbackPeerTransport, Cancel_SenderCancelsWhileParked_Aborted) {
  LoopbackHub hub;
  OnceNotification parked;
  SliceInboxOptions options;
  options.on_parked = [&](const std::string&) { parked.Notify(); };
  LoopbackPeerTransport sender(&hub, 0);
  LoopbackPeerTransport leader(&hub, 1, options);
  DpBox box(5, "k", Box{{0}, {64}}, 4, {0, 1}, /*leader=*/1);
  absl::Status status;
  std::thread t([&] { status = sender.Exchange("s", box.Sends(0), {}, Later()); });
  parked.WaitForNotification();
  sender.CancelSession("s");
  t.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted) << status;
}

TEST(LoopbackPeerTransport, Send_LeaderNeverStarts_DeadlineExceeded) {
  LoopbackHub hub;
  LoopbackPeerTransport sender(&hub, 0);
  LoopbackPeerTransport leader(&hub, 1);
  DpBox box(6, "k", Box{{0}, {64}}, 4, {0, 1}, /*leader=*/1);
  EXPECT_EQ(sender.Exchange("s", box.Sends(0), {}, absl::Now()).code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST(LoopbackPeerTransport, Reject_WrongSize_BothSidesInvalidArgument) {
  LoopbackHub hub;
  LoopbackPeerTransport sender(&hub, 0);
  LoopbackPeerTransport leader(&hub, 1);
  DpBox box(7, "k", Box{{0}, {64}}, 4, {0, 1}, /*leader=*/1);
  std::vector<SliceSend> sends = box.Sends(0);
  ASSERT_EQ(sends.size(), 1u);
  sends[0].nbytes -= 4;
  absl::Status leader_status;
  std::thread t([&] { leader_status = leader.Exchange("s", {}, box.Recvs(1), Later()); });
  EXPECT_EQ(sender.Exchange("s", sends, {}, Later()).code(), absl::StatusCode::kInvalidArgument);
  t.join();
  EXPECT_EQ(leader_status.code(), absl::StatusCode::kInvalidArgument);
}

TEST(LoopbackHub, SameRankTwice_SecondNotRegistered) {
  LoopbackHub hub;
  LoopbackPeerTransport first(&hub, 3);
  LoopbackPeerTransport second(&hub, 3);
  EXPECT_TRUE(first.registered());
  EXPECT_FALSE(second.registered());
  EXPECT_EQ(hub.Find(3), &first);
}

}  // namespace
}  // namespace tessera
