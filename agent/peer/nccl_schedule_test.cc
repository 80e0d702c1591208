#include "agent/peer/nccl_schedule.h"

#include <cstring>
#include <map>
#include <vector>

#include "agent/peer/gather_fixture_test_util.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using testing::AllRecvs;
using testing::AllSends;
using testing::DpBox;

// Executes every rank's schedule on the CPU as the GPU path would: staging -> send bounce,
// send bounce -> the peer's recv bounce for the op NCCL pairs it with (same pair, same
// round), recv bounce -> staging. Fails the test if a round's operations do not pair up; an
// overlap of bounce offsets within a round would corrupt the assembled boxes.
void Simulate(const std::vector<NcclSchedule>& schedules) {
  size_t rounds = 0;
  for (const NcclSchedule& s : schedules) rounds = std::max(rounds, s.rounds.size());
  for (size_t r = 0; r < rounds; ++r) {
    std::map<int, std::vector<char>> send_bounce, recv_bounce;  // by communicator rank
    // (sender, receiver) -> op, for this round.
    std::map<std::pair<int, int>, const NcclOp*> sends, recvs;
    for (const NcclSchedule& s : schedules) {
      if (r >= s.rounds.size()) continue;
      send_bounce[s.self].assign(s.send_bounce_bytes, '\0');
      recv_bounce[s.self].assign(s.recv_bounce_bytes, '\0');
      for (const NcclOp& op : s.rounds[r].ops) {
        auto& table = op.send ? sends : recvs;
        const auto key =
            op.send ? std::make_pair(s.self, op.peer) : std::make_pair(op.peer, s.self);
        ASSERT_TRUE(table.emplace(key, &op).second) << "two ops of one pair in round " << r;
        const uint64_t limit = op.send ? s.send_bounce_bytes : s.recv_bounce_bytes;
        ASSERT_LE(op.bounce_offset + op.nbytes, limit);
        EXPECT_EQ(op.bounce_offset % kNcclBounceAlignment, 0u);
        if (op.send) {
          std::memcpy(send_bounce[s.self].data() + op.bounce_offset, op.host, op.nbytes);
        }
      }
    }
    ASSERT_EQ(sends.size(), recvs.size()) << "round " << r;
    for (const auto& [pair, send] : sends) {
      auto it = recvs.find(pair);
      ASSERT_NE(it, recvs.end()) << "round " << r << ": send " << pair.first << "->"
                                 << pair.second << " has no receive";
      ASSERT_EQ(send->nbytes, it->second->nbytes) << "round " << r;
      std::memcpy(recv_bounce[pair.second].data() + it->second->bounce_offset,
                  send_bounce[pair.first].data() + send->bounce_offset, send->nbytes);
    }
    for (const auto& [pair, recv] : recvs) {
      std::memcpy(recv->host, recv_bounce[pair.second].data() + recv->bounce_offset,
                  recv->nbytes);
    }
  }
}

TEST(NcclSchedule, FourRanksTwoLeaders_RoundsPairUpAndAssembleBoxes) {
  const std::vector<uint32_t> members = {2, 0, 3, 1};  // communicator order != rank order
  DpBox a(1, "a", Box{{0, 0}, {64, 100}}, 4, {0, 1, 2, 3}, /*leader=*/1, /*empty=*/0);
  DpBox b(2, "b", Box{{0}, {9999}}, 2, {0, 1, 2, 3}, /*leader=*/2);
  DpBox c(3, "c", Box{{0}, {5000}}, 8, {0, 1, 2, 3}, /*leader=*/1);
  std::vector<DpBox*> boxes = {&a, &b, &c};
  std::vector<NcclSchedule> schedules;
  for (uint32_t rank = 0; rank < 4; ++rank) {
    auto schedule = BuildNcclSchedule(rank, members, AllSends(boxes, rank),
                                      AllRecvs(boxes, rank), /*chunk_bytes=*/1000);
    ASSERT_TRUE(schedule.ok()) << schedule.status();
    schedules.push_back(*std::move(schedule));
  }
  // Every pair agrees on what moves between them.
  for (const NcclSchedule& s : schedules) {
    for (const NcclSchedule& peer : schedules) {
      EXPECT_EQ(s.send_headers[peer.self], peer.recv_headers[s.self]);
    }
  }
  EXPECT_GT(schedules[0].rounds.size(), 10u);  // slices span many pieces
  Simulate(schedules);
  EXPECT_TRUE(a.leader_slot() == a.expected());
  EXPECT_TRUE(b.leader_slot() == b.expected());
  EXPECT_TRUE(c.leader_slot() == c.expected());
}

TEST(NcclSchedule, SenderSizeDiffers_HeadersDisagree) {
  const std::vector<uint32_t> members = {0, 1};
  DpBox box(4, "k", Box{{0}, {1000}}, 4, {0, 1}, /*leader=*/1);
  std::vector<SliceSend> sends = box.Sends(0);
  ASSERT_EQ(sends.size(), 1u);
  sends[0].nbytes -= 4;
  auto sender = BuildNcclSchedule(0, members, sends, {}, 256);
  auto leader = BuildNcclSchedule(1, members, {}, box.Recvs(1), 256);
  ASSERT_TRUE(sender.ok() && leader.ok());
  EXPECT_NE(sender->send_headers[1], leader->recv_headers[0]);
}

TEST(NcclSchedule, SenderRangeDiffers_FingerprintsDisagree) {
  const std::vector<uint32_t> members = {0, 1};
  DpBox box(5, "k", Box{{0}, {1000}}, 4, {0, 1}, /*leader=*/1);
  std::vector<SliceSend> sends = box.Sends(0);
  sends[0].end += 1;  // same bytes, different claim
  auto sender = BuildNcclSchedule(0, members, sends, {}, 256);
  auto leader = BuildNcclSchedule(1, members, {}, box.Recvs(1), 256);
  ASSERT_TRUE(sender.ok() && leader.ok());
  EXPECT_EQ(sender->send_headers[1].bytes, leader->recv_headers[0].bytes);
  EXPECT_NE(sender->send_headers[1].fingerprint, leader->recv_headers[0].fingerprint);
}

TEST(NcclSchedule, EmptySlices_NotScheduled) {
  const std::vector<uint32_t> members = {0, 1};
  DpBox box(6, "k", Box{{0}, {1000}}, 4, {0, 1}, /*leader=*/1, /*empty_rank_index=*/0);
  auto sender = BuildNcclSchedule(0, members, box.Sends(0), {}, 256);
  ASSERT_TRUE(sender.ok());
  EXPECT_TRUE(sender->rounds.empty());
  EXPECT_EQ(sender->send_headers[1].count, 0u);
}

TEST(NcclSchedule, Membership_Errors) {
  DpBox box(7, "k", Box{{0}, {100}}, 4, {0, 1}, /*leader=*/1);
  const std::vector<uint32_t> without_self = {1, 2};
  EXPECT_EQ(BuildNcclSchedule(0, without_self, box.Sends(0), {}, 64).status().code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<uint32_t> without_leader = {0, 2};
  EXPECT_EQ(BuildNcclSchedule(0, without_leader, box.Sends(0), {}, 64).status().code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<uint32_t> duplicate = {0, 1, 1};
  EXPECT_EQ(BuildNcclSchedule(0, duplicate, box.Sends(0), {}, 64).status().code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<uint32_t> members = {0, 1};
  EXPECT_EQ(BuildNcclSchedule(0, members, box.Sends(0), {}, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tessera
