#include "agent/memory_tier.h"

#include <memory>
#include <string>

#include "gtest/gtest.h"

namespace tessera {
namespace {

// A checkpoint of step 7 by session "s7" whose data file bytes 4096.. are in `bytes`.
ResidentCheckpoint Checkpoint(const std::shared_ptr<std::string>& bytes) {
  ResidentCheckpoint c;
  c.step = 7;
  c.session_id = "s7";
  c.file = "data-r0.safetensors";
  c.file_offset = 4096;
  c.nbytes = bytes->size();
  c.region = ResidentRegion{"/region", bytes->data(), bytes->size(), bytes};
  return c;
}

TEST(MemoryTier, Find_ThatCheckpoint_FileBytesAndAHold) {
  auto bytes = std::make_shared<std::string>(8192, 'x');
  MemoryTier tier;
  tier.Publish(Checkpoint(bytes));

  ResidentView view = tier.Find(7, "s7");
  ASSERT_EQ(view.files.size(), 1u);
  const ResidentBytes& file = view.files.at("data-r0.safetensors");
  EXPECT_EQ(file.file_offset, 4096u);
  EXPECT_EQ(file.data, bytes->data());
  EXPECT_EQ(file.size, 8192u);
  EXPECT_EQ(view.bytes, 8192u);
  ASSERT_EQ(view.holds.size(), 1u);

  // The hold keeps the region while the owner lets go of it.
  std::weak_ptr<std::string> watch = bytes;
  bytes.reset();
  EXPECT_FALSE(watch.expired());
  view = ResidentView();
  EXPECT_TRUE(watch.expired());
}

TEST(MemoryTier, Find_OtherStepOrSession_Nothing) {
  auto bytes = std::make_shared<std::string>(4096, 'x');
  MemoryTier tier;
  EXPECT_TRUE(tier.Find(7, "s7").files.empty());
  tier.Publish(Checkpoint(bytes));
  EXPECT_TRUE(tier.Find(8, "s7").files.empty());
  // The same step saved again by another session (a retried save): not these bytes.
  EXPECT_TRUE(tier.Find(7, "s7-retry").files.empty());
  tier.Clear();
  EXPECT_TRUE(tier.Find(7, "s7").files.empty());
  EXPECT_FALSE(tier.Current().has_value());
}

TEST(MemoryTier, RegionDroppedByThePool_NothingAndNoCurrent) {
  auto bytes = std::make_shared<std::string>(4096, 'x');
  MemoryTier tier;
  tier.Publish(Checkpoint(bytes));
  ASSERT_TRUE(tier.Current().has_value());
  EXPECT_EQ(tier.Current()->step, 7);
  bytes.reset();  // the pool made room for a save
  EXPECT_TRUE(tier.Find(7, "s7").files.empty());
  EXPECT_FALSE(tier.Current().has_value());
}

}  // namespace
}  // namespace tessera
