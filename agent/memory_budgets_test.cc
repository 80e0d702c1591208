#include "agent/memory_budgets.h"

#include "gtest/gtest.h"

namespace tessera {
namespace {

constexpr uint64_t kGiB = 1ull << 30;

TEST(AgentsPerNode, TheFlagFirst_ThenTorchrun_ThenSlurm_ElseOne) {
  EXPECT_EQ(*AgentsPerNode(8, "4", "2"), 8u);
  EXPECT_EQ(*AgentsPerNode(0, "4", "2"), 4u);
  EXPECT_EQ(*AgentsPerNode(0, nullptr, "2"), 2u);
  EXPECT_EQ(*AgentsPerNode(0, "", "2"), 2u);
  EXPECT_EQ(*AgentsPerNode(0, nullptr, nullptr), 1u);
  // An uneven Slurm layout is not one count: the default.
  EXPECT_EQ(*AgentsPerNode(0, nullptr, "2(x3),1"), 1u);
}

TEST(AgentsPerNode, BadCounts_RefusedNamingTheirSource) {
  absl::StatusOr<uint32_t> flag = AgentsPerNode(-1, nullptr, nullptr);
  ASSERT_EQ(flag.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(flag.status().message().find("--agents_per_node is -1"), absl::string_view::npos)
      << flag.status();
  absl::StatusOr<uint32_t> torchrun = AgentsPerNode(0, "four", "2");
  ASSERT_EQ(torchrun.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(torchrun.status().message().find("LOCAL_WORLD_SIZE='four'"), absl::string_view::npos)
      << torchrun.status();
  EXPECT_EQ(AgentsPerNode(0, "0", nullptr).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AgentsPerNode(0, nullptr, "0").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AgentsPerNode(5000, nullptr, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ResolveMemoryBudgets, Defaults_HalfTheNodeForStagingSharedByItsAgents_BuddyHalfOfThat) {
  absl::StatusOr<MemoryBudgets> alone = ResolveMemoryBudgets(64 * kGiB, 1, 0, 0);
  ASSERT_TRUE(alone.ok()) << alone.status();
  EXPECT_EQ(alone->staging_bytes, 32 * kGiB);
  EXPECT_EQ(alone->buddy_bytes, 16 * kGiB);
  absl::StatusOr<MemoryBudgets> eight = ResolveMemoryBudgets(64 * kGiB, 8, 0, 0);
  ASSERT_TRUE(eight.ok()) << eight.status();
  EXPECT_EQ(eight->staging_bytes, 4 * kGiB);
  EXPECT_EQ(eight->buddy_bytes, 2 * kGiB);
  // Eight agents' defaults together: three quarters of the node, a quarter left to trainers.
  EXPECT_EQ(8 * (eight->staging_bytes + eight->buddy_bytes), 48 * kGiB);
}

TEST(ResolveMemoryBudgets, FlagsGiven_TakenAsIs_BuddyFollowsStaging) {
  absl::StatusOr<MemoryBudgets> staging = ResolveMemoryBudgets(64 * kGiB, 8, 1024, 0);
  ASSERT_TRUE(staging.ok()) << staging.status();
  EXPECT_EQ(staging->staging_bytes, 1 * kGiB);
  EXPECT_EQ(staging->buddy_bytes, kGiB / 2);
  absl::StatusOr<MemoryBudgets> both = ResolveMemoryBudgets(64 * kGiB, 8, 1024, 3072);
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ(both->buddy_bytes, 3 * kGiB);
}

TEST(ResolveMemoryBudgets, NegativeOrBelowAPage_RefusedNamingTheFlag) {
  absl::StatusOr<MemoryBudgets> negative = ResolveMemoryBudgets(64 * kGiB, 1, -5, 0);
  ASSERT_EQ(negative.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(negative.status().message().find("--staging_budget_mb is -5"), absl::string_view::npos)
      << negative.status();
  absl::StatusOr<MemoryBudgets> buddy = ResolveMemoryBudgets(64 * kGiB, 1, 0, -1);
  ASSERT_EQ(buddy.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(buddy.status().message().find("--buddy_budget_mb"), absl::string_view::npos);
  // Physical memory unknown: the flags must say.
  absl::StatusOr<MemoryBudgets> unknown = ResolveMemoryBudgets(0, 1, 0, 0);
  ASSERT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("physical memory is unknown"), absl::string_view::npos);
  EXPECT_TRUE(ResolveMemoryBudgets(0, 1, 1024, 512).ok());
  // A node too small for its agents' default share.
  absl::StatusOr<MemoryBudgets> tiny = ResolveMemoryBudgets(16 * 4096, 8, 0, 0);
  ASSERT_EQ(tiny.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(tiny.status().message().find("less than one page"), absl::string_view::npos)
      << tiny.status();
}

}  // namespace
}  // namespace tessera
