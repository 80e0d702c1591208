#include "agent/memory_tier.h"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
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
  // A newer checkpoint replaces it.
  tier.Publish(ResidentCheckpoint{8, "s8", "data-r0.safetensors", 4096, bytes->size(),
                                  ResidentRegion{"/region", bytes->data(), bytes->size(), bytes}});
  EXPECT_TRUE(tier.Find(7, "s7").files.empty());
  EXPECT_EQ(tier.Find(8, "s8").files.size(), 1u);
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

v1::MemoryCopy Held(const std::string& file, uint32_t holder, uint64_t offset, uint64_t nbytes,
                    const std::string& address) {
  v1::MemoryCopy c;
  c.set_step(7);
  c.set_session_id("s7");
  c.set_file(file);
  c.set_file_offset(offset);
  c.set_nbytes(nbytes);
  c.set_rank(holder);
  c.set_peer_address(address);
  return c;
}

TEST(MemoryTier, AddRemoteCopies_OnlyNeededBoundedFilesFromOtherHolders) {
  const std::vector<v1::MemoryCopy> copies = {
      Held("data-00000", /*holder=*/0, 4096, 8192, "self:1"),  // this agent's own: skipped
      Held("data-00009", 3, 4096, 8192, "c:1"),                // not needed: skipped
      Held("data-00001", 1, 4096, 1 << 30, "liar:1"),          // past the file: skipped
      Held("data-00001", 2, 4096, 8192, "down:1"),             // fails: next holder
      Held("data-00001", 4, 4096, 8192, "d:1"),                // read
      Held("data-00002", 5, 4096, 8192, "e:1"),                // over max_bytes: skipped
  };
  const absl::flat_hash_map<std::string, uint64_t> needed = {
      {"data-00000", 12288}, {"data-00001", 12288}, {"data-00002", 12288}};
  std::vector<std::string> asked;
  FetchMemoryCopy fetch = [&](const v1::MemoryCopy& copy, char* dest) {
    asked.push_back(copy.peer_address());
    if (copy.peer_address() == "down:1") return absl::UnavailableError("down");
    memset(dest, 'r', copy.nbytes());
    return absl::OkStatus();
  };
  ResidentView view;
  EXPECT_EQ(AddRemoteCopies(copies, /*self_rank=*/0, needed, /*max_bytes=*/10000, fetch, view),
            8192u);
  EXPECT_THAT(asked, ::testing::ElementsAre("down:1", "d:1"));
  ASSERT_EQ(view.files.size(), 1u);
  EXPECT_EQ(view.files.at("data-00001").file_offset, 4096u);
  EXPECT_EQ(view.files.at("data-00001").size, 8192u);
  EXPECT_EQ(view.files.at("data-00001").data[8191], 'r');
  EXPECT_EQ(view.holds.size(), 1u);
}

TEST(MemoryTier, AddHeldCopies_ThisAgentsBuddyCopiesFromItsStore) {
  BuddyStore store(1 << 20);
  v1::MemoryCopy copy = Held("data-00001", /*holder=*/0, 4096, 100, "");
  copy.set_writer_rank(1);
  absl::StatusOr<std::shared_ptr<MemoryBuffer>> buffer = store.Reserve(copy);
  ASSERT_TRUE(buffer.ok());
  memset((*buffer)->data(), 'b', 100);
  store.Keep(copy, *buffer);

  ResidentView view;
  const std::vector<v1::MemoryCopy> copies = {copy, Held("data-00003", 2, 4096, 100, "x:1")};
  EXPECT_EQ(AddHeldCopies(copies, /*self_rank=*/0, store, view), 1);
  ASSERT_EQ(view.files.count("data-00001"), 1u);
  EXPECT_EQ(view.files.at("data-00001").data, (*buffer)->data());
  EXPECT_EQ(view.files.at("data-00001").size, 100u);
  EXPECT_EQ(AddHeldCopies(copies, /*self_rank=*/2, store, view), 0);  // rank 2's: not here
}

}  // namespace
}  // namespace tessera
