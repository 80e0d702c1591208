#include "server/relay.h"

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tessera {
namespace {

// A cached save's PIN to `rank`, with a seq of its own as the session emits them.
Outgoing CachedPin(uint32_t rank, bool write_when_staged = false) {
  Outgoing o;
  o.rank = rank;
  o.command.set_session_id("s1");
  o.command.set_step(7);
  o.command.set_seq(100 + rank);
  v1::PinCommand* pin = o.command.mutable_pin();
  pin->set_plan_cached(true);
  pin->set_plan_fingerprint(0xabc);
  pin->set_assignment_omitted(true);
  pin->set_write_when_staged(write_when_staged);
  return o;
}

// `ranks` agents, `per_node` to a node, every one relaying.
std::vector<RelayPeer> Peers(uint32_t ranks, uint32_t per_node) {
  std::vector<RelayPeer> peers(ranks);
  for (uint32_t r = 0; r < ranks; ++r) {
    peers[r] = {true, "node-" + std::to_string(r / per_node), "10.0.0.1:" + std::to_string(7000 + r),
                1000 + r};
  }
  return peers;
}

std::vector<uint32_t> Ranks(const std::vector<Outgoing>& commands) {
  std::vector<uint32_t> ranks;
  for (const Outgoing& o : commands) ranks.push_back(o.rank);
  return ranks;
}

TEST(FoldRelays, CachedPins_OnePerNode_RelayNamesTheOthersWithTheirSeqs) {
  std::vector<Outgoing> commands;
  for (uint32_t r = 0; r < 8; ++r) commands.push_back(CachedPin(r));
  EXPECT_EQ(FoldRelays(commands, Peers(8, 4)), 6u);
  ASSERT_EQ(Ranks(commands), (std::vector<uint32_t>{0, 4}));
  const v1::Command& relay = commands[1].command;
  EXPECT_EQ(relay.seq(), 104u);  // its own
  ASSERT_EQ(relay.relay_to_size(), 3);
  for (int i = 0; i < 3; ++i) {
    const uint32_t rank = 5 + i;
    EXPECT_EQ(relay.relay_to(i).rank(), rank);
    EXPECT_EQ(relay.relay_to(i).seq(), 100 + rank);
    EXPECT_EQ(relay.relay_to(i).incarnation(), 1000 + rank);
    EXPECT_EQ(relay.relay_to(i).peer_address(), "10.0.0.1:" + std::to_string(7000 + rank));
  }
  // Apart from relay_to and seq the relay's command is every rank's.
  v1::Command bare = relay;
  bare.clear_relay_to();
  bare.set_seq(105);
  EXPECT_EQ(bare.SerializeAsString(), CachedPin(5).command.SerializeAsString());
}

TEST(FoldRelays, PinWithAnAssignment_IsWrittenToEveryRank) {
  std::vector<Outgoing> commands;
  auto plan = std::make_shared<GlobalPlan>();
  for (uint32_t r = 0; r < 4; ++r) {
    Outgoing o = CachedPin(r);
    o.command.mutable_pin()->set_assignment_omitted(false);
    o.pin_plan = plan;
    commands.push_back(std::move(o));
  }
  EXPECT_EQ(FoldRelays(commands, Peers(4, 4)), 0u);
  EXPECT_EQ(Ranks(commands), (std::vector<uint32_t>{0, 1, 2, 3}));
  for (const Outgoing& o : commands) EXPECT_EQ(o.command.relay_to_size(), 0);
}

TEST(FoldRelays, CommandsThatAreNotPins_AreWrittenToEveryRank) {
  std::vector<Outgoing> commands;
  for (uint32_t r = 0; r < 4; ++r) {
    Outgoing o;
    o.rank = r;
    o.command.set_session_id("s1");
    o.command.set_seq(r);
    if (r % 2 == 0) {
      o.command.mutable_abort();
    } else {
      o.command.mutable_committed();
    }
    commands.push_back(std::move(o));
  }
  EXPECT_EQ(FoldRelays(commands, Peers(4, 4)), 0u);
  EXPECT_EQ(Ranks(commands), (std::vector<uint32_t>{0, 1, 2, 3}));
}

TEST(FoldRelays, PinsThatDiffer_AreRelayedInTheirOwnGroups) {
  // Ranks 0, 2 write when staged, 1, 3 do not: two groups on the node.
  std::vector<Outgoing> commands;
  for (uint32_t r = 0; r < 4; ++r) commands.push_back(CachedPin(r, r % 2 == 0));
  EXPECT_EQ(FoldRelays(commands, Peers(4, 4)), 2u);
  ASSERT_EQ(Ranks(commands), (std::vector<uint32_t>{0, 1}));
  ASSERT_EQ(commands[0].command.relay_to_size(), 1);
  EXPECT_EQ(commands[0].command.relay_to(0).rank(), 2u);
  ASSERT_EQ(commands[1].command.relay_to_size(), 1);
  EXPECT_EQ(commands[1].command.relay_to(0).rank(), 3u);
}

TEST(FoldRelays, AgentsThatDoNotRelay_GetTheirOwn_AndAreNeverRelays) {
  std::vector<Outgoing> commands;
  for (uint32_t r = 0; r < 4; ++r) commands.push_back(CachedPin(r));
  std::vector<RelayPeer> peers = Peers(3, 4);  // rank 3 is not in `peers`
  peers[0].relays = false;                     // rank 0 registered without relays_commands
  EXPECT_EQ(FoldRelays(commands, peers), 1u);
  ASSERT_EQ(Ranks(commands), (std::vector<uint32_t>{0, 1, 3}));
  EXPECT_EQ(commands[0].command.relay_to_size(), 0);
  ASSERT_EQ(commands[1].command.relay_to_size(), 1);
  EXPECT_EQ(commands[1].command.relay_to(0).rank(), 2u);
  EXPECT_EQ(commands[2].command.relay_to_size(), 0);
}

TEST(FoldRelays, OneRankPerNode_NothingFolds) {
  std::vector<Outgoing> commands;
  for (uint32_t r = 0; r < 4; ++r) commands.push_back(CachedPin(r));
  EXPECT_EQ(FoldRelays(commands, Peers(4, 1)), 0u);
  EXPECT_EQ(Ranks(commands), (std::vector<uint32_t>{0, 1, 2, 3}));
  for (const Outgoing& o : commands) EXPECT_EQ(o.command.relay_to_size(), 0);
}

TEST(FoldRelays, ANodeOfMoreThanTheMostTargets_HasSeveralRelays) {
  const uint32_t ranks = kMaxRelayTargets + 3;  // one node id for all of them
  std::vector<Outgoing> commands;
  for (uint32_t r = 0; r < ranks; ++r) commands.push_back(CachedPin(r));
  EXPECT_EQ(FoldRelays(commands, Peers(ranks, ranks)), ranks - 2);
  ASSERT_EQ(Ranks(commands), (std::vector<uint32_t>{0, kMaxRelayTargets + 1}));
  EXPECT_EQ(static_cast<size_t>(commands[0].command.relay_to_size()), kMaxRelayTargets);
  ASSERT_EQ(commands[1].command.relay_to_size(), 1);
  EXPECT_EQ(commands[1].command.relay_to(0).rank(), kMaxRelayTargets + 2);
}

// A relay's stream that reconnects is replayed its command with the targets it names; the
// targets, and a command of another session or seq, are replayed as they are.
TEST(RelayedCommands, Replay_TheRelaysCommandNamesItsTargetsAgain) {
  std::vector<Outgoing> commands;
  for (uint32_t r = 0; r < 4; ++r) commands.push_back(CachedPin(r));
  ASSERT_EQ(FoldRelays(commands, Peers(4, 4)), 3u);
  RelayedCommands relayed;
  relayed.Record(commands);

  const v1::Command replayed = relayed.Replay(0, CachedPin(0).command);
  EXPECT_EQ(replayed.SerializeAsString(), commands[0].command.SerializeAsString());
  EXPECT_EQ(replayed.relay_to_size(), 3);
  EXPECT_EQ(relayed.Replay(1, CachedPin(1).command).relay_to_size(), 0);
  v1::Command newer = CachedPin(0).command;
  newer.set_seq(500);
  EXPECT_EQ(relayed.Replay(0, newer).relay_to_size(), 0);
  v1::Command other_session = CachedPin(0).command;
  other_session.set_session_id("s2");
  EXPECT_EQ(relayed.Replay(0, other_session).relay_to_size(), 0);

  // The next folded fan-out replaces what was recorded.
  std::vector<Outgoing> next;
  for (uint32_t r = 4; r < 6; ++r) next.push_back(CachedPin(r));
  ASSERT_EQ(FoldRelays(next, Peers(6, 2)), 1u);
  relayed.Record(next);
  EXPECT_EQ(relayed.Replay(0, CachedPin(0).command).relay_to_size(), 0);
  EXPECT_EQ(relayed.Replay(4, CachedPin(4).command).relay_to_size(), 1);
}

}  // namespace
}  // namespace tessera
