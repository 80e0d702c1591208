#include "server/agent_registry.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

v1::RegisterAgentRequest Registration(uint32_t rank, uint64_t incarnation,
                                      const std::string& job = "job") {
  v1::RegisterAgentRequest r;
  r.set_job_id(job);
  r.mutable_coord()->set_rank(rank);
  r.set_incarnation(incarnation);
  r.set_node_id("node0");
  r.set_memory_tier(true);
  for (auto [name, degree] : {std::pair{"pp", 2}, {"tp", 2}, {"dp", 2}}) {
    v1::MeshDim* dim = r.mutable_layout()->add_dims();
    dim->set_name(name);
    dim->set_degree(degree);
  }
  return r;
}

class AgentRegistryTest : public ::testing::Test {
 protected:
  // `d` of time the coordinator runs through: its clock read every 250 ms, as its ticker
  // does (a single clock_.Advance is a pause of the coordinator: running_clock.h).
  // `also`: other registries on the same clock, whose coordinators run through it too.
  void Pass(absl::Duration d, std::initializer_list<AgentRegistry*> also = {}) {
    while (d > absl::ZeroDuration()) {
      const absl::Duration step = std::min(d, absl::Milliseconds(250));
      clock_.Advance(step);
      registry_.RunningNow();
      for (AgentRegistry* other : also) other->RunningNow();
      d -= step;
    }
  }
  // Every verdict on ranks 0 .. world - 1 of `job`.
  std::vector<AgentLiveness> Verdicts(const std::string& job = "job", uint32_t world = 8) {
    uint64_t since = 0;
    return registry_.Liveness(job, world, &since);
  }
  // The ranks of `job` whose agent is lost, ascending.
  std::vector<uint32_t> Lost(const std::string& job = "job", uint32_t world = 8) {
    std::vector<uint32_t> lost;
    for (const AgentLiveness& v : Verdicts(job, world)) {
      if (v.state == AgentLiveness::State::kLost) lost.push_back(v.rank);
    }
    return lost;
  }
  bool Gone(const std::string& job, uint32_t rank) {
    return Verdicts(job, rank + 1)[rank].unavailable();
  }

  FakeClock clock_;
  AgentRegistry registry_{&clock_, AgentRegistryOptions{absl::Seconds(10), absl::Seconds(2)}};
};

TEST_F(AgentRegistryTest, Register_NewAgent_IsAliveWithCoords) {
  ASSERT_TRUE(registry_.Register(Registration(5, 11)).ok());
  absl::StatusOr<std::vector<v1::AgentInfo>> agents = registry_.ListAgents("job");
  ASSERT_TRUE(agents.ok());
  ASSERT_EQ(agents->size(), 1u);
  EXPECT_EQ((*agents)[0].coords(), "pp=1,tp=0,dp=1");
  EXPECT_TRUE((*agents)[0].alive());
  EXPECT_THAT((*agents)[0].coord().index(), ElementsAre(1, 0, 1));
}

TEST_F(AgentRegistryTest, NodeBudgets_EveryRankInOrder_UnregisteredNamed) {
  EXPECT_EQ(registry_.NodeBudgets("job", 1)[0].node_id, "(rank 0, not registered)");
  v1::RegisterAgentRequest first = Registration(0, 10);
  first.set_node_host_ram_budget(1000);
  ASSERT_TRUE(registry_.Register(first).ok());
  v1::RegisterAgentRequest third = Registration(2, 12);
  third.set_node_id("node1");
  ASSERT_TRUE(registry_.Register(third).ok());

  const std::vector<NodeBudget> nodes = registry_.NodeBudgets("job", 3);
  ASSERT_EQ(nodes.size(), 3u);
  EXPECT_EQ(nodes[0].node_id, "node0");
  EXPECT_EQ(nodes[0].budget, 1000u);
  EXPECT_EQ(nodes[1].node_id, "(rank 1, not registered)");
  EXPECT_EQ(nodes[1].budget, 0u);
  EXPECT_EQ(nodes[2].node_id, "node1");
  EXPECT_EQ(nodes[2].budget, 0u);
}

TEST_F(AgentRegistryTest, RelayPeers_OnlyLiveAgentsThatSayItWithAPeerAddressRelay) {
  for (uint32_t r : {0u, 1u, 2u, 3u}) {
    v1::RegisterAgentRequest request = Registration(r, 10 + r);
    request.set_relays_commands(r != 1);            // rank 1 does not say it
    if (r != 2) request.set_peer_address(absl::StrCat("10.0.0.", r, ":70"));  // rank 2 has none
    ASSERT_TRUE(registry_.Register(request).ok());
  }
  Pass(absl::Seconds(8));
  for (uint32_t r : {0u, 1u, 2u}) ASSERT_TRUE(registry_.Heartbeat("job", r, 10 + r, 0).ok());
  Pass(absl::Seconds(3));  // rank 3's lease expires

  const std::vector<RelayPeer> peers = registry_.RelayPeers("job", 5);
  ASSERT_EQ(peers.size(), 5u);
  EXPECT_TRUE(peers[0].relays);
  EXPECT_EQ(peers[0].node_id, "node0");
  EXPECT_EQ(peers[0].peer_address, "10.0.0.0:70");
  EXPECT_EQ(peers[0].incarnation, 10u);
  EXPECT_FALSE(peers[1].relays) << "registered without relays_commands";
  EXPECT_FALSE(peers[2].relays) << "no peer address";
  EXPECT_FALSE(peers[3].relays) << "lease expired";
  EXPECT_EQ(peers[3].incarnation, 13u);
  EXPECT_FALSE(peers[4].relays) << "never registered";
  EXPECT_TRUE(registry_.RelayPeers("other-job", 2).size() == 2 &&
              !registry_.RelayPeers("other-job", 2)[0].relays);
}

TEST_F(AgentRegistryTest, Heartbeat_KeepsLeaseAlive_ExpiresWithout) {
  ASSERT_TRUE(registry_.Register(Registration(0, 1)).ok());
  ASSERT_TRUE(registry_.Register(Registration(1, 2)).ok());
  Pass(absl::Seconds(8));
  ASSERT_TRUE(registry_.Heartbeat("job", 0, 1, 0).ok());
  Pass(absl::Seconds(8));
  EXPECT_THAT(Lost(), ElementsAre(1));
  Pass(absl::Seconds(3));
  EXPECT_THAT(Lost(), ElementsAre(0, 1));
}

// Issue 52, bug 1: a coordinator paused longer than the lease (SIGSTOP, a VM freeze) heard
// nothing meanwhile; its pause is not the agents' death.
TEST_F(AgentRegistryTest, APauseOfTheCoordinatorLongerThanTheLease_ExpiresNobody) {
  ASSERT_TRUE(registry_.Register(Registration(0, 1)).ok());
  ASSERT_TRUE(registry_.Register(Registration(1, 2)).ok());
  Pass(absl::Seconds(2));
  clock_.Advance(absl::Seconds(13));  // paused: nobody read the clock
  EXPECT_THAT(Lost(), IsEmpty()) << "13 s of the coordinator's pause count as at most 1 s";
  absl::StatusOr<AgentRegistry::Renewal> beat = registry_.Heartbeat("job", 0, 1, 0);
  ASSERT_TRUE(beat.ok());
  EXPECT_TRUE(beat->lease_kept);
  absl::StatusOr<AgentRegistry::Registered> again = registry_.Register(Registration(1, 2));
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->lease_kept) << "re-registered after the pause, never given up";
  // Leases still expire in running time: 10 s the coordinator runs through unheard.
  Pass(absl::Seconds(10) + absl::Milliseconds(250));
  EXPECT_THAT(Lost(), ElementsAre(0, 1));
  absl::StatusOr<AgentRegistry::Renewal> late = registry_.Heartbeat("job", 0, 1, 0);
  ASSERT_TRUE(late.ok());
  EXPECT_FALSE(late->lease_kept) << "given up before this heartbeat";
  absl::StatusOr<AgentRegistry::Registered> late_again = registry_.Register(Registration(1, 2));
  ASSERT_TRUE(late_again.ok());
  EXPECT_FALSE(late_again->lease_kept);
}

// Issue 52, bug 3: a refused registration is the verdict on its rank, with the reason, until
// an agent of that rank is heard from; a live agent of the rank stays live.
TEST_F(AgentRegistryTest, RefusedRegistration_IsTheRanksVerdictUntilItsAgentIsHeard) {
  ASSERT_TRUE(registry_.Register(Registration(0, 1)).ok());
  v1::RegisterAgentRequest other = Registration(3, 7);
  other.mutable_layout()->mutable_dims(2)->set_degree(4);
  ASSERT_EQ(GetErrorCode(registry_.Register(other).status()), v1::ERROR_CODE_LAYOUT_MISMATCH);
  std::vector<AgentLiveness> verdicts = Verdicts();
  EXPECT_EQ(verdicts[0].state, AgentLiveness::State::kLive);
  EXPECT_EQ(verdicts[2].state, AgentLiveness::State::kAbsent);
  ASSERT_EQ(verdicts[3].state, AgentLiveness::State::kLost);
  EXPECT_EQ(verdicts[3].lost.code(), v1::ERROR_CODE_LAYOUT_MISMATCH);
  EXPECT_THAT(verdicts[3].lost.message(),
              ::testing::AllOf(::testing::HasSubstr("its registration was refused"),
                               ::testing::HasSubstr("pp=2,tp=2,dp=2")));

  // A stray process refused for a live agent's rank changes nothing.
  v1::RegisterAgentRequest stray = other;
  stray.mutable_coord()->set_rank(0);
  ASSERT_FALSE(registry_.Register(stray).ok());
  EXPECT_EQ(Verdicts()[0].state, AgentLiveness::State::kLive);

  ASSERT_TRUE(registry_.Register(Registration(3, 8)).ok());
  EXPECT_EQ(Verdicts()[3].state, AgentLiveness::State::kLive);
}

// Issue 52, bug 5: an agent found dead is lost at once, with why; one heard from afterwards
// (it was not dead) is live again, told its lease was not kept.
TEST_F(AgentRegistryTest, MarkDead_LostAtOnceUntilHeardFromAgain) {
  ASSERT_TRUE(registry_.Register(Registration(2, 5)).ok());
  EXPECT_FALSE(registry_.MarkDead("job", 2, 4, "gone")) << "another incarnation";
  ASSERT_TRUE(registry_.MarkDead("job", 2, 5, "its process is gone"));
  std::vector<AgentLiveness> verdicts = Verdicts();
  ASSERT_EQ(verdicts[2].state, AgentLiveness::State::kLost);
  EXPECT_EQ(verdicts[2].lost.code(), v1::ERROR_CODE_AGENT_LOST);
  EXPECT_EQ(verdicts[2].lost.message(), "its process is gone");
  absl::StatusOr<AgentRegistry::Renewal> beat = registry_.Heartbeat("job", 2, 5, 0);
  ASSERT_TRUE(beat.ok());
  EXPECT_FALSE(beat->lease_kept);
  EXPECT_EQ(Verdicts()[2].state, AgentLiveness::State::kLive);
}

// Liveness hands a consumer only what changed since it last asked.
TEST_F(AgentRegistryTest, Liveness_OnlyWhatChangedSinceTheLastTake) {
  ASSERT_TRUE(registry_.Register(Registration(0, 1)).ok());
  ASSERT_TRUE(registry_.Register(Registration(1, 2)).ok());
  uint64_t since = 0;
  EXPECT_EQ(registry_.Liveness("job", 2, &since).size(), 2u) << "a new consumer gets all";
  EXPECT_THAT(registry_.Liveness("job", 2, &since), IsEmpty());
  Pass(absl::Seconds(8));
  ASSERT_TRUE(registry_.Heartbeat("job", 0, 1, 0).ok());
  EXPECT_THAT(registry_.Liveness("job", 2, &since), IsEmpty()) << "renewals change nothing";
  Pass(absl::Seconds(3));  // rank 1 expires
  std::vector<AgentLiveness> changed = registry_.Liveness("job", 2, &since, false);
  EXPECT_THAT(changed, IsEmpty()) << "leases are judged only when asked to";
  changed = registry_.Liveness("job", 2, &since);
  ASSERT_EQ(changed.size(), 1u);
  EXPECT_EQ(changed[0].rank, 1u);
  EXPECT_EQ(changed[0].state, AgentLiveness::State::kLost);
  EXPECT_EQ(changed[0].lost.message(), "no heartbeat within the lease");
  ASSERT_TRUE(registry_.Register(Registration(1, 3)).ok());
  changed = registry_.Liveness("job", 2, &since, false);
  ASSERT_EQ(changed.size(), 1u);
  EXPECT_EQ(changed[0].incarnation, 3u);
  EXPECT_EQ(changed[0].state, AgentLiveness::State::kLive);
}

// Gone (AgentLiveness::unavailable): a registered agent once its lease expired; a rank not registered only once the
// registry has served for a lease (a live agent registers again within one after a restart).
TEST_F(AgentRegistryTest, Unavailable_ExpiredOrNotRegisteredALeaseAfterServingStarted) {
  Pass(absl::Seconds(30));  // recovering the sessions took a while
  registry_.StartServing();
  ASSERT_TRUE(registry_.Register(Registration(0, 1)).ok());
  Pass(absl::Seconds(10));
  EXPECT_FALSE(Gone("job", 0));
  EXPECT_FALSE(Gone("job", 1)) << "within the first lease it may be on its way";
  EXPECT_FALSE(Gone("other-job", 0));
  Pass(absl::Seconds(1));
  EXPECT_TRUE(Gone("job", 0)) << "its lease expired";
  EXPECT_TRUE(Gone("job", 1)) << "never registered within a lease of serving";
  EXPECT_TRUE(Gone("other-job", 0));
  ASSERT_TRUE(registry_.Register(Registration(1, 2)).ok());
  EXPECT_FALSE(Gone("job", 1));
}

TEST_F(AgentRegistryTest, Reregister_NewIncarnation_OldOneIsStale) {
  ASSERT_TRUE(registry_.Register(Registration(3, 100)).ok());
  absl::StatusOr<AgentRegistry::Registered> again = registry_.Register(Registration(3, 200));
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE(again->replaced_incarnation.has_value());
  EXPECT_EQ(*again->replaced_incarnation, 100u);

  absl::Status stale = registry_.Heartbeat("job", 3, 100, 0).status();
  EXPECT_EQ(stale.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(GetErrorCode(stale), v1::ERROR_CODE_STALE_INCARNATION);
  EXPECT_TRUE(registry_.Heartbeat("job", 3, 200, 0).ok());
}

TEST_F(AgentRegistryTest, Reregister_SameIncarnation_ReplacesNothing) {
  ASSERT_TRUE(registry_.Register(Registration(3, 100)).ok());
  absl::StatusOr<AgentRegistry::Registered> again = registry_.Register(Registration(3, 100));
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->replaced_incarnation.has_value());
}

TEST_F(AgentRegistryTest, Register_LayoutDiffersFromJob_LayoutMismatch) {
  ASSERT_TRUE(registry_.Register(Registration(0, 1)).ok());
  v1::RegisterAgentRequest other = Registration(1, 2);
  other.mutable_layout()->mutable_dims(2)->set_degree(4);
  absl::StatusOr<AgentRegistry::Registered> result = registry_.Register(other);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GetErrorCode(result.status()), v1::ERROR_CODE_LAYOUT_MISMATCH);
  EXPECT_THAT(std::string(result.status().message()), ::testing::HasSubstr("pp=2,tp=2,dp=2"));
}

TEST_F(AgentRegistryTest, Register_NewLayoutAfterOldAgentsExpired_Accepted) {
  ASSERT_TRUE(registry_.Register(Registration(0, 1)).ok());
  v1::RegisterAgentRequest resumed = Registration(1, 2);
  resumed.mutable_layout()->mutable_dims(2)->set_degree(4);
  Pass(absl::Seconds(11));  // the old layout's only agent is gone
  ASSERT_TRUE(registry_.Register(resumed).ok());
  EXPECT_EQ(registry_.JobLayout("job")->world_size(), 16u);
  EXPECT_EQ(registry_.ListAgents("job")->size(), 1u);
}

TEST_F(AgentRegistryTest, Register_RankOutsideMesh_LayoutMismatch) {
  EXPECT_EQ(GetErrorCode(registry_.Register(Registration(8, 1)).status()),
            v1::ERROR_CODE_LAYOUT_MISMATCH);
}

TEST_F(AgentRegistryTest, Register_CoordsDisagreeWithRank_LayoutMismatch) {
  v1::RegisterAgentRequest r = Registration(1, 1);
  for (uint32_t c : {1, 1, 1}) r.mutable_coord()->add_index(c);  // that is rank 7
  absl::Status status = registry_.Register(r).status();
  EXPECT_EQ(GetErrorCode(status), v1::ERROR_CODE_LAYOUT_MISMATCH);
  EXPECT_THAT(std::string(status.message()), ::testing::HasSubstr("rank 7"));
}

TEST_F(AgentRegistryTest, Register_BadJobIdOrZeroIncarnation_Rejected) {
  EXPECT_EQ(registry_.Register(Registration(0, 1, "../etc")).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry_.Register(Registration(0, 0)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(registry_.Jobs(), IsEmpty());
}

TEST_F(AgentRegistryTest, Heartbeat_Unknown_NotFound) {
  EXPECT_EQ(registry_.Heartbeat("nope", 0, 1, 0).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(registry_.Register(Registration(0, 1)).ok());
  EXPECT_EQ(registry_.Heartbeat("job", 1, 1, 0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(registry_.ListAgents("nope").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(AgentRegistryTest, Heartbeat_RecordsPinnedBytes) {
  ASSERT_TRUE(registry_.Register(Registration(0, 1)).ok());
  ASSERT_TRUE(registry_.Heartbeat("job", 0, 1, 4096).ok());
  EXPECT_EQ(registry_.ListAgents("job")->at(0).pinned_bytes(), 4096u);
}

v1::MemoryCopy Copy(int64_t step, const std::string& session, const std::string& region) {
  v1::MemoryCopy c;
  c.set_step(step);
  c.set_session_id(session);
  c.set_file("data.safetensors");
  c.set_region(region);
  c.set_rank(99);           // the coordinator's to set
  c.set_node_id("forged");  // likewise
  return c;
}

TEST_F(AgentRegistryTest, MemoryCopies_OfThatCheckpoint_FromLiveAgentsWithRankAndNode) {
  for (uint32_t r : {0u, 1u, 2u}) ASSERT_TRUE(registry_.Register(Registration(r, r + 1)).ok());
  ASSERT_TRUE(registry_.Heartbeat("job", 0, 1, 0, Copy(7, "s7", "/a")).ok());
  ASSERT_TRUE(registry_.Heartbeat("job", 1, 2, 0, Copy(7, "s7", "/b")).ok());
  ASSERT_TRUE(registry_.Heartbeat("job", 2, 3, 0, Copy(6, "s6", "/c")).ok());

  std::vector<v1::MemoryCopy> copies = registry_.MemoryCopies("job", 7, "s7");
  ASSERT_EQ(copies.size(), 2u);
  EXPECT_EQ(copies[0].region(), "/a");
  EXPECT_EQ(copies[0].rank(), 0u);
  EXPECT_EQ(copies[0].node_id(), "node0");
  EXPECT_EQ(copies[1].region(), "/b");
  EXPECT_EQ(copies[1].rank(), 1u);
  EXPECT_TRUE(registry_.MemoryCopies("job", 7, "s7-again").empty());
  EXPECT_TRUE(registry_.MemoryCopies("other", 7, "s7").empty());
  EXPECT_EQ(registry_.ListAgents("job")->at(2).resident().region(), "/c");
}

TEST_F(AgentRegistryTest, MemoryCopies_ForgottenOnLossRestartOrAHeartbeatWithout) {
  for (uint32_t r : {0u, 1u, 2u}) ASSERT_TRUE(registry_.Register(Registration(r, r + 1)).ok());
  for (uint32_t r : {0u, 1u, 2u}) {
    ASSERT_TRUE(registry_.Heartbeat("job", r, r + 1, 0, Copy(7, "s7", "/x")).ok());
  }
  ASSERT_EQ(registry_.MemoryCopies("job", 7, "s7").size(), 3u);

  ASSERT_TRUE(registry_.Heartbeat("job", 0, 1, 0).ok());  // rank 0 dropped its copy
  ASSERT_TRUE(registry_.Register(Registration(1, 20)).ok());  // rank 1's agent restarted
  Pass(absl::Seconds(8));
  ASSERT_TRUE(registry_.Heartbeat("job", 0, 1, 0).ok());
  ASSERT_TRUE(registry_.Heartbeat("job", 1, 20, 0).ok());
  EXPECT_EQ(registry_.MemoryCopies("job", 7, "s7").size(), 1u);  // rank 2's, still alive
  Pass(absl::Seconds(3));  // rank 2's lease expires
  EXPECT_TRUE(registry_.MemoryCopies("job", 7, "s7").empty());
  EXPECT_FALSE(registry_.ListAgents("job")->at(1).has_resident());
}

TEST_F(AgentRegistryTest, MayMissCopies_UntilEveryRankHeartbeatedOrALeasePassed) {
  // A registry just made (a coordinator that restarted) knows no copy until heartbeats state
  // them: the job's 8 ranks are heard one by one.
  EXPECT_TRUE(registry_.MayMissCopies("job"));  // not even registered yet
  for (uint32_t r = 0; r < 8; ++r) ASSERT_TRUE(registry_.Register(Registration(r, r + 1)).ok());
  EXPECT_TRUE(registry_.MayMissCopies("job")) << "registered, but no copy stated";
  for (uint32_t r = 0; r < 7; ++r) ASSERT_TRUE(registry_.Heartbeat("job", r, r + 1, 0).ok());
  EXPECT_TRUE(registry_.MayMissCopies("job")) << "rank 7 not heard";
  ASSERT_TRUE(registry_.Heartbeat("job", 7, 8, 0).ok());
  EXPECT_FALSE(registry_.MayMissCopies("job"));

  // Another job, of which rank 1 is never heard: known complete once a lease has passed
  // since the registry was made (rank 1 would be expired by then, its copies left out).
  ASSERT_TRUE(registry_.Register(Registration(0, 1, "other")).ok());
  ASSERT_TRUE(registry_.Heartbeat("other", 0, 1, 0).ok());
  EXPECT_TRUE(registry_.MayMissCopies("other"));
  Pass(absl::Seconds(10));
  EXPECT_FALSE(registry_.MayMissCopies("other"));
  EXPECT_FALSE(registry_.MayMissCopies("never-registered"));
}

// Past the restart window: an agent that registered again (a heartbeat failed; or it
// restarted) still holds what it held, or may, until its next heartbeat says — not none.
TEST_F(AgentRegistryTest, MayMissCopies_WhileALiveAgentRegisteredAgainIsNotYetHeard) {
  Pass(absl::Seconds(10));  // the registry's restart window is over
  for (uint32_t r = 0; r < 8; ++r) ASSERT_TRUE(registry_.Register(Registration(r, r + 1)).ok());
  for (uint32_t r = 0; r < 8; ++r) {
    ASSERT_TRUE(registry_.Heartbeat("job", r, r + 1, 0, Copy(7, "s7", "/x")).ok());
  }
  EXPECT_FALSE(registry_.MayMissCopies("job"));
  ASSERT_TRUE(registry_.Register(Registration(3, 4)).ok());  // same incarnation, copy intact
  bool may_miss = false;  // the copies known, and that they may not be all, in one answer
  EXPECT_EQ(registry_.MemoryCopies("job", 7, "s7", {}, &may_miss).size(), 7u);
  EXPECT_TRUE(may_miss);
  EXPECT_TRUE(registry_.MayMissCopies("job")) << "rank 3 has not said what it holds";
  ASSERT_TRUE(registry_.Heartbeat("job", 3, 4, 0, Copy(7, "s7", "/x")).ok());
  EXPECT_FALSE(registry_.MayMissCopies("job"));
  EXPECT_EQ(registry_.MemoryCopies("job", 7, "s7", {}, &may_miss).size(), 8u);
  EXPECT_FALSE(may_miss);

  // A restarted agent (new incarnation) likewise, until it says it holds nothing.
  ASSERT_TRUE(registry_.Register(Registration(5, 60)).ok());
  EXPECT_TRUE(registry_.MayMissCopies("job"));
  ASSERT_TRUE(registry_.Heartbeat("job", 5, 60, 0).ok());
  EXPECT_FALSE(registry_.MayMissCopies("job"));
  EXPECT_EQ(registry_.MemoryCopies("job", 7, "s7").size(), 7u);

  // One that registered and then went silent for a lease is expired: its copies are none.
  ASSERT_TRUE(registry_.Register(Registration(6, 7)).ok());
  EXPECT_TRUE(registry_.MayMissCopies("job"));
  Pass(absl::Seconds(11));
  EXPECT_FALSE(registry_.MayMissCopies("job"));
}

// Between a memory-only commit and an agent's keeping it: until its heartbeat names the
// commit as the last it handled, its copy is "not yet" (may miss), not "never" — however long
// ago its last heartbeat was (a save shorter than a heartbeat interval); once it has, what it
// states is all it has. A restarted agent (new incarnation) holds nothing of it, and an agent
// that expires holds nothing up.
TEST_F(AgentRegistryTest, MemoryCopies_UntilEachAgentSaidItHandledTheMemoryCommit_MayMiss) {
  Pass(absl::Seconds(10));  // the registry's restart window is over
  for (uint32_t r = 0; r < 4; ++r) ASSERT_TRUE(registry_.Register(Registration(r, r + 1)).ok());
  for (uint32_t r = 0; r < 4; ++r) {
    ASSERT_TRUE(registry_.Heartbeat("job", r, r + 1, 0, Copy(7, "s7", "/x"), {}, "s7").ok());
  }
  registry_.NoteMemoryCommit("job", "s8");
  bool may_miss = false;
  EXPECT_EQ(registry_.MemoryCopies("job", 8, "s8", {}, &may_miss).size(), 0u);
  EXPECT_TRUE(may_miss) << "no agent has handled the commit of s8 yet";
  for (uint32_t r : {0u, 1u, 3u}) {
    ASSERT_TRUE(registry_.Heartbeat("job", r, r + 1, 0, Copy(8, "s8", "/x"), {}, "s8").ok());
  }
  ASSERT_TRUE(registry_.Heartbeat("job", 2, 3, 0, Copy(7, "s7", "/x"), {}, "s7").ok());
  EXPECT_EQ(registry_.MemoryCopies("job", 8, "s8", {}, &may_miss).size(), 3u);
  EXPECT_TRUE(may_miss) << "rank 2 has not handled the commit of s8";
  EXPECT_EQ(registry_.MemoryCopies("job", 7, "s7", {}, &may_miss).size(), 1u);
  EXPECT_FALSE(may_miss) << "s7 is not the commit noted";
  EXPECT_FALSE(registry_.MayMissCopies("job"));

  // Registered again with its incarnation (a heartbeat failed): still not handled.
  ASSERT_TRUE(registry_.Register(Registration(2, 3)).ok());
  ASSERT_TRUE(registry_.Heartbeat("job", 2, 3, 0, Copy(7, "s7", "/x"), {}, "s7").ok());
  EXPECT_EQ(registry_.MemoryCopies("job", 8, "s8", {}, &may_miss).size(), 3u);
  EXPECT_TRUE(may_miss);
  // It handled it without keeping the step: rank 2's file is in no agent.
  ASSERT_TRUE(registry_.Heartbeat("job", 2, 3, 0, std::nullopt, {}, "s8").ok());
  EXPECT_EQ(registry_.MemoryCopies("job", 8, "s8", {}, &may_miss).size(), 3u);
  EXPECT_FALSE(may_miss);

  // The next memory-only commit: a restarted agent holds nothing of it.
  registry_.NoteMemoryCommit("job", "s9");
  for (uint32_t r : {0u, 1u, 2u}) {
    ASSERT_TRUE(registry_.Heartbeat("job", r, r + 1, 0, Copy(9, "s9", "/x"), {}, "s9").ok());
  }
  EXPECT_EQ(registry_.MemoryCopies("job", 9, "s9", {}, &may_miss).size(), 3u);
  EXPECT_TRUE(may_miss) << "rank 3 has not handled the commit of s9";
  ASSERT_TRUE(registry_.Register(Registration(3, 40)).ok());
  ASSERT_TRUE(registry_.Heartbeat("job", 3, 40, 0).ok());
  EXPECT_EQ(registry_.MemoryCopies("job", 9, "s9", {}, &may_miss).size(), 3u);
  EXPECT_FALSE(may_miss);

  // One that expires before it says so holds nothing up.
  Pass(absl::Seconds(6));  // rank 2 was last heard 6 s ago
  registry_.NoteMemoryCommit("job", "s10");
  for (uint32_t r : {0u, 1u, 3u}) {
    ASSERT_TRUE(registry_.Heartbeat("job", r, r == 3 ? 40 : r + 1, 0, Copy(10, "s10", "/x"), {},
                                    "s10")
                    .ok());
  }
  EXPECT_EQ(registry_.MemoryCopies("job", 10, "s10", {}, &may_miss).size(), 3u);
  EXPECT_TRUE(may_miss);
  Pass(absl::Seconds(5));  // rank 2's lease (10 s) is over; the note's is not
  EXPECT_EQ(registry_.MemoryCopies("job", 10, "s10", {}, &may_miss).size(), 3u);
  EXPECT_FALSE(may_miss);
}

// The note holds for a lease: an agent live all along that has not handled the commit by
// then (its command stream down; or a new process the coordinator could not tell from the
// old) is judged by what it states. A rank that registers for the first time meanwhile is
// in the note; one noted before any agent registered (a recovered commit) holds for a lease
// from StartServing.
TEST_F(AgentRegistryTest, NoteMemoryCommit_HoldsForALease) {
  Pass(absl::Seconds(10));  // the registry's restart window is over
  for (uint32_t r = 0; r < 3; ++r) ASSERT_TRUE(registry_.Register(Registration(r, r + 1)).ok());
  for (uint32_t r = 0; r < 3; ++r) ASSERT_TRUE(registry_.Heartbeat("job", r, r + 1, 0).ok());
  registry_.NoteMemoryCommit("job", "s8");
  ASSERT_TRUE(registry_.Register(Registration(3, 4)).ok());  // rank 3, first heard of now
  for (uint32_t r : {0u, 1u, 2u}) {
    ASSERT_TRUE(registry_.Heartbeat("job", r, r + 1, 0, Copy(8, "s8", "/x"), {}, "s8").ok());
  }
  ASSERT_TRUE(registry_.Heartbeat("job", 3, 4, 0).ok());
  bool may_miss = false;
  EXPECT_EQ(registry_.MemoryCopies("job", 8, "s8", {}, &may_miss).size(), 3u);
  EXPECT_TRUE(may_miss) << "rank 3 registered after the note and has not handled the commit";
  Pass(absl::Seconds(9));
  for (uint32_t r = 0; r < 4; ++r) {
    ASSERT_TRUE(registry_.Heartbeat("job", r, r + 1, 0, r < 3 ? std::optional(Copy(8, "s8", "/x"))
                                                              : std::nullopt)
                    .ok());
  }
  EXPECT_EQ(registry_.MemoryCopies("job", 8, "s8", {}, &may_miss).size(), 3u);
  EXPECT_TRUE(may_miss);
  Pass(absl::Seconds(2));  // the note's lease is over; every agent is live
  EXPECT_EQ(registry_.MemoryCopies("job", 8, "s8", {}, &may_miss).size(), 3u);
  EXPECT_FALSE(may_miss);
  // Noted again by this registry (a job reloaded after a refused store write): it stays lapsed.
  registry_.NoteMemoryCommit("job", "s8");
  EXPECT_EQ(registry_.MemoryCopies("job", 8, "s8", {}, &may_miss).size(), 3u);
  EXPECT_FALSE(may_miss);
  // And within its lease, agents that named it stay out.
  registry_.NoteMemoryCommit("job", "s9");
  for (uint32_t r = 0; r < 4; ++r) {
    ASSERT_TRUE(registry_.Heartbeat("job", r, r + 1, 0, std::nullopt, {}, r < 3 ? "s9" : "").ok());
  }
  registry_.NoteMemoryCommit("job", "s9");
  ASSERT_TRUE(registry_.Register(Registration(3, 50)).ok());  // rank 3 restarted: out
  ASSERT_TRUE(registry_.Heartbeat("job", 3, 50, 0).ok());
  EXPECT_EQ(registry_.MemoryCopies("job", 9, "s9", {}, &may_miss).size(), 0u);
  EXPECT_FALSE(may_miss);

  // A recovered commit, noted before any agent of its job registered: from StartServing on.
  AgentRegistry fresh(&clock_, AgentRegistryOptions{absl::Seconds(10), absl::Seconds(2)});
  fresh.NoteMemoryCommit("job", "s8");
  Pass(absl::Seconds(30), {&fresh});  // recovering took long
  fresh.StartServing();
  Pass(absl::Seconds(11), {&fresh});  // past the start window
  for (uint32_t r = 0; r < 8; ++r) ASSERT_TRUE(fresh.Register(Registration(r, r + 1)).ok());
  for (uint32_t r = 0; r < 8; ++r) {
    ASSERT_TRUE(fresh.Heartbeat("job", r, r + 1, 0, std::nullopt, {}, r != 3 ? "s8" : "").ok());
  }
  EXPECT_FALSE(fresh.MayMissCopies("job"));
  EXPECT_EQ(fresh.MemoryCopies("job", 8, "s8", {}, &may_miss).size(), 0u);
  EXPECT_FALSE(may_miss) << "the note's lease from StartServing is over";
  AgentRegistry again(&clock_, AgentRegistryOptions{absl::Seconds(10), absl::Seconds(2)});
  again.NoteMemoryCommit("job", "s8");
  Pass(absl::Seconds(30), {&again});
  again.StartServing();
  Pass(absl::Seconds(5), {&again});
  for (uint32_t r = 0; r < 8; ++r) ASSERT_TRUE(again.Register(Registration(r, r + 1)).ok());
  for (uint32_t r = 0; r < 8; ++r) {
    ASSERT_TRUE(again.Heartbeat("job", r, r + 1, 0, std::nullopt, {}, r != 3 ? "s8" : "").ok());
  }
  EXPECT_FALSE(again.MayMissCopies("job")) << "every rank heard: the start window is closed";
  EXPECT_EQ(again.MemoryCopies("job", 8, "s8", {}, &may_miss).size(), 0u);
  EXPECT_TRUE(may_miss) << "rank 3 has not handled the recovered commit";
}

TEST_F(AgentRegistryTest, MayMissCopies_TheWindowStartsWhenServingStarts) {
  // Recovering the sessions took a lease: agents could not reach the coordinator yet.
  Pass(absl::Seconds(10));
  registry_.StartServing();
  // Only rank 0 has registered (a rank registered and silent counts as unknown on its own).
  ASSERT_TRUE(registry_.Register(Registration(0, 1)).ok());
  ASSERT_TRUE(registry_.Heartbeat("job", 0, 1, 0).ok());
  EXPECT_TRUE(registry_.MayMissCopies("job"));
  Pass(absl::Seconds(10));
  EXPECT_FALSE(registry_.MayMissCopies("job"));
}

TEST_F(AgentRegistryTest, MemoryCopies_BuddyCopiesListedWithTheirHolder) {
  v1::RegisterAgentRequest holder = Registration(0, 1);
  holder.set_peer_address("10.0.0.1:7000");
  holder.set_memory_bulk_address("10.0.0.1:7001");
  ASSERT_TRUE(registry_.Register(holder).ok());
  v1::MemoryCopy held = Copy(7, "s7", "");
  held.set_file("data-00001.safetensors");
  held.set_writer_rank(1);
  ASSERT_TRUE(registry_.Heartbeat("job", 0, 1, 0, Copy(7, "s7", "/own"), {held}).ok());
  std::vector<v1::MemoryCopy> copies = registry_.MemoryCopies("job", 7, "s7");
  ASSERT_EQ(copies.size(), 2u);
  EXPECT_EQ(copies[0].writer_rank(), 0u);
  EXPECT_EQ(copies[1].file(), "data-00001.safetensors");
  EXPECT_EQ(copies[1].writer_rank(), 1u);
  EXPECT_EQ(copies[1].rank(), 0u);
  EXPECT_EQ(copies[1].node_id(), "node0");
  // Where to read it: the holder's Peer service and its bulk port.
  for (const v1::MemoryCopy& c : copies) {
    EXPECT_EQ(c.peer_address(), "10.0.0.1:7000");
    EXPECT_EQ(c.bulk_address(), "10.0.0.1:7001");
  }
}

// A load asks for the files it reads: only their copies, own and buddy ones, by holder rank
// as without files; the index follows heartbeats that change or drop a copy, re-registrations
// and lease expiry.
TEST_F(AgentRegistryTest, MemoryCopies_OfFiles_OnlyThoseFilesByHolderRank) {
  auto copy_of = [](const std::string& file, uint32_t writer) {
    v1::MemoryCopy c = Copy(7, "s7", "");
    c.set_file(file);
    c.set_writer_rank(writer);
    return c;
  };
  for (uint32_t r : {0u, 1u, 2u, 3u}) ASSERT_TRUE(registry_.Register(Registration(r, r + 1)).ok());
  // Rank r holds its own file data-r; rank 3 also holds rank 0's and rank 1's as a buddy.
  for (uint32_t r : {0u, 1u, 2u}) {
    ASSERT_TRUE(
        registry_.Heartbeat("job", r, r + 1, 0, copy_of(absl::StrCat("data-", r), r)).ok());
  }
  ASSERT_TRUE(registry_.Heartbeat("job", 3, 4, 0, copy_of("data-3", 3),
                                  {copy_of("data-1", 1), copy_of("data-0", 0)})
                  .ok());
  auto holders = [&](std::vector<std::string> files) {
    std::vector<std::string> out;
    for (const v1::MemoryCopy& c : registry_.MemoryCopies("job", 7, "s7", files)) {
      out.push_back(absl::StrCat(c.file(), "@", c.rank()));
    }
    return out;
  };
  EXPECT_THAT(holders({"data-1"}), ElementsAre("data-1@1", "data-1@3"));
  EXPECT_THAT(holders({"data-1", "data-0"}),
              ElementsAre("data-0@0", "data-1@1", "data-1@3", "data-0@3"));
  EXPECT_THAT(holders({"data-9"}), IsEmpty());
  EXPECT_EQ(registry_.MemoryCopies("job", 7, "s7").size(), 6u);  // no files: every copy
  EXPECT_THAT(registry_.MemoryCopies("job", 7, "s8", {"data-1"}), IsEmpty());

  // Rank 3 now holds only rank 0's buddy copy; rank 1 drops its own; rank 0 re-registers.
  ASSERT_TRUE(registry_.Heartbeat("job", 3, 4, 0, std::nullopt, {copy_of("data-0", 0)}).ok());
  ASSERT_TRUE(registry_.Heartbeat("job", 1, 2, 0).ok());
  EXPECT_THAT(holders({"data-1"}), IsEmpty());
  EXPECT_THAT(holders({"data-0", "data-3"}), ElementsAre("data-0@0", "data-0@3"));
  ASSERT_TRUE(registry_.Register(Registration(0, 10)).ok());
  EXPECT_THAT(holders({"data-0"}), ElementsAre("data-0@3"));
  // Rank 3's lease expires: its copies are left out.
  Pass(absl::Seconds(8));
  ASSERT_TRUE(registry_.Heartbeat("job", 2, 3, 0, copy_of("data-2", 2)).ok());
  Pass(absl::Seconds(3));
  EXPECT_THAT(holders({"data-0", "data-2"}), ElementsAre("data-2@2"));
}

TEST_F(AgentRegistryTest, BuddyOf_RingOverNodes_SamePositionOnTheNextNode) {
  // node-a: ranks 0, 2, 4; node-b: 1, 3; node-c: 5.
  const std::vector<std::pair<uint32_t, std::string>> placement = {
      {0, "node-a"}, {1, "node-b"}, {2, "node-a"}, {3, "node-b"}, {4, "node-a"}, {5, "node-c"}};
  for (const auto& [rank, node] : placement) {
    v1::RegisterAgentRequest r = Registration(rank, rank + 1);
    r.set_node_id(node);
    r.set_peer_address(absl::StrCat("10.0.0.", rank, ":7000"));
    r.set_memory_bulk_address(absl::StrCat("10.0.0.", rank, ":7001"));
    ASSERT_TRUE(registry_.Register(r).ok());
  }
  EXPECT_EQ(registry_.BuddyOf("job", 0)->bulk_address(), "10.0.0.1:7001");  // where to send
  auto buddy = [&](uint32_t rank) { return registry_.BuddyOf("job", rank)->rank(); };
  EXPECT_EQ(buddy(0), 1u);  // a[0] -> b[0]
  EXPECT_EQ(buddy(2), 3u);  // a[1] -> b[1]
  EXPECT_EQ(buddy(4), 3u);  // a[2] -> b's last
  EXPECT_EQ(buddy(1), 5u);  // b -> c
  EXPECT_EQ(buddy(3), 5u);
  EXPECT_EQ(buddy(5), 0u);  // c -> a, round the ring
  EXPECT_EQ(registry_.BuddyOf("job", 0)->peer_address(), "10.0.0.1:7000");
  EXPECT_EQ(registry_.BuddyOf("job", 0)->node_id(), "node-b");
  EXPECT_EQ(registry_.BuddyOf("job", 0)->incarnation(), 2u);
  EXPECT_FALSE(registry_.BuddyOf("job", 9).has_value());

  // Rank 5 moves to node-b (a replacement): two nodes now.
  v1::RegisterAgentRequest moved = Registration(5, 50);
  moved.set_node_id("node-b");
  ASSERT_TRUE(registry_.Register(moved).ok());
  EXPECT_EQ(buddy(1), 0u);
  EXPECT_EQ(buddy(5), 4u);  // b[2] -> a[2]
}

// A node whose agents' leases expired leaves the ring: its predecessor's agents pair with the
// next live node instead of sending copies to a dead buddy until a replacement registers.
TEST_F(AgentRegistryTest, BuddyOf_ExpiredAgentsLeaveTheRing_BackWhenTheyHeartbeat) {
  for (const auto& [rank, node] :
       std::vector<std::pair<uint32_t, std::string>>{{0, "node-a"}, {1, "node-b"}, {2, "node-c"}}) {
    v1::RegisterAgentRequest r = Registration(rank, rank + 1);
    r.set_node_id(node);
    ASSERT_TRUE(registry_.Register(r).ok());
  }
  auto buddy = [&](uint32_t rank) { return registry_.BuddyOf("job", rank)->rank(); };
  EXPECT_EQ(buddy(0), 1u);
  EXPECT_EQ(buddy(2), 0u);

  // node-b's agent stops heartbeating; the others go on, and its lease (10 s) runs out.
  Pass(absl::Seconds(8));
  ASSERT_TRUE(registry_.Heartbeat("job", 0, 1, 0).ok());
  ASSERT_TRUE(registry_.Heartbeat("job", 2, 3, 0).ok());
  EXPECT_EQ(buddy(0), 1u);  // not expired yet
  Pass(absl::Seconds(3));
  EXPECT_EQ(buddy(0), 2u);  // a -> c: b is gone
  EXPECT_EQ(buddy(2), 0u);
  EXPECT_FALSE(registry_.BuddyOf("job", 1).has_value());  // an expired agent has none

  // It heartbeats again (it was frozen, not dead): back in the ring.
  ASSERT_TRUE(registry_.Heartbeat("job", 1, 2, 0).ok());
  EXPECT_EQ(buddy(0), 1u);
  EXPECT_EQ(buddy(1), 2u);
}

// An agent with the memory tier off would refuse every copy (it serves no PeerMemory): its
// node's tier-on agents still pair, and the ring passes its node by.
TEST_F(AgentRegistryTest, BuddyOf_AgentsWithTheTierOffLeftOut) {
  for (const auto& [rank, node] : std::vector<std::pair<uint32_t, std::string>>{
           {0, "node-a"}, {1, "node-b"}, {2, "node-c"}, {3, "node-c"}}) {
    v1::RegisterAgentRequest r = Registration(rank, rank + 1);
    r.set_node_id(node);
    r.set_memory_tier(rank != 1 && rank != 2);  // node-b's agent and one of node-c's: off
    ASSERT_TRUE(registry_.Register(r).ok());
  }
  auto buddy = [&](uint32_t rank) { return registry_.BuddyOf("job", rank)->rank(); };
  EXPECT_EQ(buddy(0), 3u);  // a -> c's tier-on agent, b passed by
  EXPECT_EQ(buddy(3), 0u);  // c -> a
  EXPECT_FALSE(registry_.BuddyOf("job", 1).has_value());
  EXPECT_FALSE(registry_.BuddyOf("job", 2).has_value());
}

TEST_F(AgentRegistryTest, BuddyOf_OneNode_None) {
  ASSERT_TRUE(registry_.Register(Registration(0, 1)).ok());
  ASSERT_TRUE(registry_.Register(Registration(1, 2)).ok());
  EXPECT_FALSE(registry_.BuddyOf("job", 0).has_value());
}

TEST_F(AgentRegistryTest, Jobs_AreSeparate) {
  ASSERT_TRUE(registry_.Register(Registration(0, 1, "a")).ok());
  ASSERT_TRUE(registry_.Register(Registration(0, 2, "b")).ok());
  EXPECT_THAT(registry_.Jobs(), ElementsAre("a", "b"));
  EXPECT_TRUE(registry_.CheckIncarnation("a", 0, 1).ok());
  EXPECT_EQ(GetErrorCode(registry_.CheckIncarnation("a", 0, 2)),
            v1::ERROR_CODE_STALE_INCARNATION);
}

}  // namespace
}  // namespace tessera
