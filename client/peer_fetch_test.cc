#include "client/peer_fetch.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "agent/buddy_store.h"
#include "agent/memory_bulk.h"
#include "agent/memory_tier.h"
#include "common/checksum.h"
#include "common/fake_bulk_holder.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

constexpr char kJob[] = "job";
constexpr uint64_t kMiB = 1 << 20;

absl::Time Soon() { return absl::Now() + absl::Seconds(30); }

std::string Pattern(uint64_t size) {
  std::string s(size, '\0');
  for (uint64_t i = 0; i < size; ++i) s[i] = static_cast<char>(i * 7 + (i >> 12));
  return s;
}

// A holder's bulk port serving one buddy copy, "data-00003" of step 7 (9 MiB + 123 bytes),
// and the blocks a manifest would give it: 1 MiB each, the last one short.
class PeerFetchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    held_ = Pattern(9 * kMiB + 123);
    copy_.set_step(7);
    copy_.set_session_id("s7");
    copy_.set_file("data-00003");
    copy_.set_nbytes(held_.size());
    copy_.set_writer_rank(3);
    absl::StatusOr<std::shared_ptr<MemoryBuffer>> room = store_.Reserve(copy_);
    ASSERT_TRUE(room.ok()) << room.status();
    std::copy(held_.begin(), held_.end(), (*room)->data());
    store_.Keep(copy_, *room);
    MemoryBulkServerOptions options;
    options.listen_address = "127.0.0.1:0";
    absl::StatusOr<std::unique_ptr<MemoryBulkServer>> server =
        MemoryBulkServer::Start(keyring_.get(), &tier_, &store_, options);
    ASSERT_TRUE(server.ok()) << server.status();
    bulk_ = *std::move(server);
    copy_.set_bulk_address("127.0.0.1:" + std::to_string(bulk_->port()));
    for (uint64_t at = 0; at < held_.size(); at += kMiB) {
      const uint64_t n = std::min<uint64_t>(kMiB, held_.size() - at);
      blocks_.push_back(BlockCheck{at, n, Xxh3(held_.data() + at, n)});
    }
  }

  std::string held_;
  v1::MemoryCopy copy_;
  std::vector<BlockCheck> blocks_;
  MemoryTier tier_;
  BuddyStore store_{64 * kMiB};
  const std::unique_ptr<PeerKeyring> keyring_ = TestPeerKeyring(kJob);
  std::unique_ptr<MemoryBulkServer> bulk_;
};

// Destinations for slots [offset, +size) of the copy, filled with a byte the copy does not
// have there, so a slot left unwritten shows.
struct Destinations {
  explicit Destinations(std::vector<std::pair<uint64_t, uint64_t>> slot_ranges)
      : ranges(std::move(slot_ranges)) {
    for (const auto& [offset, size] : ranges) buffers.emplace_back(size, '\xee');
    for (size_t i = 0; i < ranges.size(); ++i) {
      slots.push_back(SlotCopy{buffers[i].data(), ranges[i].first, ranges[i].second});
    }
  }
  // Each destination holds the copy's bytes of its slot.
  void ExpectFilledFrom(const std::string& held) const {
    for (size_t i = 0; i < ranges.size(); ++i) {
      EXPECT_EQ(buffers[i], held.substr(ranges[i].first, ranges[i].second)) << "slot " << i;
    }
  }

  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  std::vector<std::string> buffers;
  std::vector<SlotCopy> slots;
};

TEST_F(PeerFetchTest, EverySlotFilledFromTheHolder_EveryBlockChecked) {
  // Slots across block boundaries, with gaps between them, the last one to the copy's end.
  Destinations d({{0, 3}, {100, kMiB}, {2 * kMiB + 17, 3 * kMiB}, {9 * kMiB - 5, 128}});
  absl::StatusOr<VerifiedCopyResult> fetched =
      FetchVerified(TestPeerCredential(kJob), copy_, d.slots, blocks_, /*max_streams=*/3, Soon());
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_TRUE(fetched->mismatched.empty());
  EXPECT_EQ(fetched->threads, 3);
  d.ExpectFilledFrom(held_);
}

TEST_F(PeerFetchTest, BlocksOfManyPieces_SlotsAcrossPieceBoundaries_EveryByteChecked) {
  // A manifest's 4 MiB blocks, each received in several pieces: slots that start and end
  // inside pieces, one across a block boundary, padding between them, and a flipped byte in
  // the middle block found.
  std::vector<BlockCheck> blocks;
  for (uint64_t at = 0; at < held_.size(); at += 4 * kMiB) {
    const uint64_t n = std::min<uint64_t>(4 * kMiB, held_.size() - at);
    blocks.push_back(BlockCheck{at, n, Xxh3(held_.data() + at, n)});
  }
  Destinations d({{kMiB - 5, 2 * kMiB + 10}, {3 * kMiB + 7, 3 * kMiB}, {8 * kMiB, kMiB + 123}});
  absl::StatusOr<VerifiedCopyResult> fetched =
      FetchVerified(TestPeerCredential(kJob), copy_, d.slots, blocks, /*max_streams=*/2, Soon());
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_TRUE(fetched->mismatched.empty());
  d.ExpectFilledFrom(held_);

  std::string flipped = held_;
  flipped[4 * kMiB + kMiB + kMiB / 2] ^= 1;
  FakeBulkHolder holder(flipped);
  copy_.set_bulk_address(holder.address());
  Destinations again({{0, held_.size()}});
  fetched = FetchVerified(TestPeerCredential(kJob), copy_, again.slots, blocks, 1, Soon());
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_EQ(fetched->mismatched, std::vector<size_t>({1}));
}

TEST_F(PeerFetchTest, ABlockThatDoesNotMatch_ListedAndTheOthersStillCopied) {
  blocks_[4].xxh3 ^= 1;
  Destinations d({{0, held_.size()}});
  absl::StatusOr<VerifiedCopyResult> fetched =
      FetchVerified(TestPeerCredential(kJob), copy_, d.slots, blocks_, 4, Soon());
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_EQ(fetched->mismatched, std::vector<size_t>({4}));
  EXPECT_EQ(d.buffers[0], held_);
}

TEST_F(PeerFetchTest, BlocksWithGaps_EachRunReadOnItsOwn) {
  // Blocks 0-1 and 5-6 only, on one stream: two runs, two connections.
  const std::vector<BlockCheck> blocks = {blocks_[0], blocks_[1], blocks_[5], blocks_[6]};
  Destinations d({{10, 2 * kMiB - 10}, {5 * kMiB, 2 * kMiB}});
  absl::StatusOr<VerifiedCopyResult> fetched =
      FetchVerified(TestPeerCredential(kJob), copy_, d.slots, blocks, 1, Soon());
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_TRUE(fetched->mismatched.empty());
  EXPECT_EQ(fetched->threads, 1);
  d.ExpectFilledFrom(held_);
}

TEST_F(PeerFetchTest, MoreStreamsThanBlocks_OneStreamPerBlock) {
  const std::vector<BlockCheck> blocks = {blocks_[0], blocks_[1]};
  Destinations d({{0, 2 * kMiB}});
  absl::StatusOr<VerifiedCopyResult> fetched =
      FetchVerified(TestPeerCredential(kJob), copy_, d.slots, blocks, 8, Soon());
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_EQ(fetched->threads, 2);
  EXPECT_EQ(d.buffers[0], held_.substr(0, 2 * kMiB));
}

TEST_F(PeerFetchTest, BlocksAPaddingApart_OneConnection_TheGapDropped) {
  // Block 1 shortened by 4000 bytes, as a chunk's last block before the next chunk's
  // 4 KiB-aligned start: blocks 0-2 are read over one connection, the gap received and dropped.
  FakeBulkHolder holder(held_);
  copy_.set_bulk_address(holder.address());
  std::vector<BlockCheck> blocks = {blocks_[0], blocks_[1], blocks_[2]};
  blocks[1].length -= 4000;
  blocks[1].xxh3 = Xxh3(held_.data() + blocks[1].offset, blocks[1].length);
  Destinations d({{5, kMiB}, {kMiB + 100, kMiB - 4100}, {2 * kMiB, kMiB}});
  absl::StatusOr<VerifiedCopyResult> fetched =
      FetchVerified(TestPeerCredential(kJob), copy_, d.slots, blocks, 1, Soon());
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_TRUE(fetched->mismatched.empty());
  EXPECT_EQ(holder.connections(), 1);
  d.ExpectFilledFrom(held_);
}

TEST_F(PeerFetchTest, BlocksFarApart_AConnectionEach) {
  FakeBulkHolder holder(held_);
  copy_.set_bulk_address(holder.address());
  const std::vector<BlockCheck> blocks = {blocks_[0], blocks_[4]};
  Destinations d({{0, kMiB}, {4 * kMiB, kMiB}});
  absl::StatusOr<VerifiedCopyResult> fetched =
      FetchVerified(TestPeerCredential(kJob), copy_, d.slots, blocks, 1, Soon());
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_EQ(holder.connections(), 2);
  d.ExpectFilledFrom(held_);
}

TEST_F(PeerFetchTest, TwoSlotsOverTheSameBytes_BothFilled) {
  Destinations d({{kMiB, 2 * kMiB}, {kMiB, 2 * kMiB}});
  absl::StatusOr<VerifiedCopyResult> fetched =
      FetchVerified(TestPeerCredential(kJob), copy_, d.slots, blocks_, 2, Soon());
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_TRUE(fetched->mismatched.empty());
  d.ExpectFilledFrom(held_);
}

TEST_F(PeerFetchTest, TheHolderClosesPartway_DataLoss) {
  FakeBulkHolder holder(held_, /*cut_after=*/kMiB + 10);
  copy_.set_bulk_address(holder.address());
  Destinations d({{0, held_.size()}});
  absl::StatusOr<VerifiedCopyResult> fetched =
      FetchVerified(TestPeerCredential(kJob), copy_, d.slots, blocks_, 3, Soon());
  EXPECT_EQ(fetched.status().code(), absl::StatusCode::kDataLoss) << fetched.status();
}

// The fetch's stall limit bounds each wait for the holder's bytes, not the fetch: a holder on
// a slow but steady link (a 256 KiB piece every 400 ms, 3.2 s for 2 MiB) is read whole under
// a 2 s limit. Failed before: the load gave its fetch a fixed 2 minutes in all, so a copy
// longer than that on its link was never fetched.
TEST_F(PeerFetchTest, ASlowSteadyHolder_ReadWholeUnderAShorterStallLimit) {
  FakeBulkHolder holder(held_);
  holder.set_pace(absl::Milliseconds(400));
  copy_.set_bulk_address(holder.address());
  const std::vector<BlockCheck> blocks = {blocks_[0], blocks_[1]};  // 2 MiB
  Destinations d({{0, 2 * kMiB}});
  absl::StatusOr<VerifiedCopyResult> fetched =
      FetchVerified(TestPeerCredential(kJob), copy_, d.slots, blocks, 1, TimeLimit(Soon(), absl::Seconds(2)));
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_TRUE(fetched->mismatched.empty());
  d.ExpectFilledFrom(held_);
}

TEST_F(PeerFetchTest, OneStreamFails_TheOthersEndAtOnce) {
  // The first share's read closes after 4 MiB, long after the second's has been waiting for
  // bytes its holder never sends — or, `stall_unanswered`, for the holder's answer to its
  // request; the fetch has no deadline: it returns only because the failed stream shuts the
  // other one down.
  for (bool stall_unanswered : {false, true}) {
    SCOPED_TRACE(stall_unanswered ? "request unanswered" : "bytes never sent");
    FakeBulkHolder holder(held_, /*cut_after=*/4 * kMiB, /*stall_from=*/1, stall_unanswered);
    copy_.set_bulk_address(holder.address());
    Destinations d({{0, held_.size()}});
    absl::StatusOr<VerifiedCopyResult> fetched =
        FetchVerified(TestPeerCredential(kJob), copy_, d.slots, blocks_, 2, absl::InfiniteFuture());
    EXPECT_EQ(fetched.status().code(), absl::StatusCode::kDataLoss) << fetched.status();
    EXPECT_EQ(holder.connections(), 2);
  }
}

TEST_F(PeerFetchTest, ASlotNoBlockCovers_InvalidArgumentBeforeAnyConnection) {
  copy_.set_bulk_address("127.0.0.1:1");  // nothing listens: a connection would be Unavailable
  const std::vector<BlockCheck> blocks = {blocks_[0]};
  Destinations d({{kMiB - 4, 8}});
  absl::StatusOr<VerifiedCopyResult> fetched =
      FetchVerified(TestPeerCredential(kJob), copy_, d.slots, blocks, 2, Soon());
  ASSERT_EQ(fetched.status().code(), absl::StatusCode::kInvalidArgument) << fetched.status();
  EXPECT_NE(fetched.status().message().find("slot 0"), std::string::npos) << fetched.status();
}

TEST_F(PeerFetchTest, TheHolderHasNoSuchCopy_ItsErrorNamingThePort) {
  copy_.set_session_id("another session");
  Destinations d({{0, 16}});
  absl::StatusOr<VerifiedCopyResult> fetched =
      FetchVerified(TestPeerCredential(kJob), copy_, d.slots, {blocks_[0]}, 2, Soon());
  ASSERT_EQ(fetched.status().code(), absl::StatusCode::kNotFound) << fetched.status();
  EXPECT_NE(fetched.status().message().find(copy_.bulk_address()), std::string::npos)
      << fetched.status();
}

TEST_F(PeerFetchTest, TheHolderIsGone_Unavailable) {
  bulk_.reset();
  Destinations d({{0, 16}});
  absl::StatusOr<VerifiedCopyResult> fetched =
      FetchVerified(TestPeerCredential(kJob), copy_, d.slots, {blocks_[0]}, 2, Soon());
  EXPECT_EQ(fetched.status().code(), absl::StatusCode::kUnavailable) << fetched.status();
}

}  // namespace
}  // namespace tessera
