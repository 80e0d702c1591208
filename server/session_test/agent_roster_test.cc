#include "server/session/agent_roster.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

AgentLiveness Live(uint32_t rank, uint64_t incarnation) {
  AgentLiveness v;
  v.rank = rank;
  v.state = AgentLiveness::State::kLive;
  v.incarnation = incarnation;
  return v;
}

TEST(AgentRosterTest, Apply_ANewIncarnationOfAKnownAgentIsARestart) {
  AgentRoster roster;
  EXPECT_THAT(roster.Apply({Live(0, 10), Live(1, 11)}), IsEmpty()) << "first registrations";
  EXPECT_THAT(roster.Apply({Live(1, 11)}), IsEmpty()) << "the same incarnation again";
  AgentLiveness lost = Live(1, 11);
  lost.state = AgentLiveness::State::kLost;
  EXPECT_THAT(roster.Apply({lost}), IsEmpty());
  EXPECT_THAT(roster.Lost(4), ElementsAre(1));
  EXPECT_THAT(roster.Apply({Live(1, 21), Live(3, 13)}), ElementsAre(1));
  EXPECT_THAT(roster.Lost(4), IsEmpty());
  EXPECT_EQ(roster[3].incarnation, 13u);
  EXPECT_EQ(roster[7].state, AgentLiveness::State::kAbsent) << "never heard of";
}

TEST(AgentRosterTest, EveryRegistered_AllRanksRegisteredAndSayingSo) {
  AgentRoster roster;
  constexpr auto kCopies = &AgentLiveness::copies_when_pinned;
  constexpr auto kWrites = &AgentLiveness::writes_when_staged;
  EXPECT_FALSE(roster.EveryRegistered(2, kCopies)) << "nobody registered";
  AgentLiveness zero = Live(0, 10), one = Live(1, 11);
  zero.copies_when_pinned = one.copies_when_pinned = true;
  zero.writes_when_staged = true;
  roster.Apply({zero, one});
  EXPECT_TRUE(roster.EveryRegistered(2, kCopies));
  EXPECT_FALSE(roster.EveryRegistered(2, kWrites)) << "rank 1 does not say it";
  EXPECT_TRUE(roster.EveryRegistered(1, kWrites));
  EXPECT_FALSE(roster.EveryRegistered(3, kCopies)) << "rank 2 never registered";
  roster.Apply({Live(1, 21)});  // back as an agent that does not follow the field
  EXPECT_FALSE(roster.EveryRegistered(2, kCopies));
}

}  // namespace
}  // namespace tessera
