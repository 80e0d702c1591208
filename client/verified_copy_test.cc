#include "client/verified_copy.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "common/checksum.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

std::vector<char> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<char> bytes(n);
  for (char& b : bytes) b = static_cast<char>(rng());
  return bytes;
}

// Blocks of `block` bytes over region[begin, end), each with its XXH3.
std::vector<BlockCheck> BlocksOver(const std::vector<char>& region, uint64_t begin, uint64_t end,
                                   uint64_t block) {
  std::vector<BlockCheck> blocks;
  for (uint64_t at = begin; at < end; at += block) {
    const uint64_t length = std::min(block, end - at);
    blocks.push_back(BlockCheck{at, length, Xxh3(region.data() + at, length)});
  }
  return blocks;
}

std::vector<char> Slice(const std::vector<char>& bytes, uint64_t offset, uint64_t size) {
  return std::vector<char>(bytes.begin() + offset, bytes.begin() + offset + size);
}

TEST(VerifiedCopy, CopiesEverySlot_AllBlocksMatch) {
  // Blocks of several pieces each, a short last block; slots end where blocks do not.
  const uint64_t block = 3 * kVerifiedCopyPiece + 17;
  std::vector<char> region = RandomBytes(5 * block + 100, 1);
  std::vector<char> a(2 * block + 5, 0), b(region.size() - 2 * block - 5, 0);
  const std::vector<SlotCopy> slots = {{a.data(), 0, a.size()},
                                       {b.data(), a.size(), b.size()}};
  absl::StatusOr<VerifiedCopyResult> result =
      VerifiedCopy(region.data(), region.size(), slots,
                   BlocksOver(region, 0, region.size(), block), {}, /*max_threads=*/1, 0);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_THAT(result->mismatched, IsEmpty());
  EXPECT_EQ(result->threads, 1);
  EXPECT_EQ(a, Slice(region, 0, a.size()));
  EXPECT_EQ(b, Slice(region, a.size(), b.size()));
}

TEST(CopyAndCheckBlock, PiecesOfAnySize_EverySlotFilled_TheBlockChecked) {
  // A source that hands the block over in pieces of 1, 2, 3, ... bytes (as a socket returns
  // what has arrived), from the region or, for the pieces slot 1 holds whole, already in
  // slot 1's destination (as a fetch receives them; those are not copied again).
  std::vector<char> region = RandomBytes(5000, 9);
  const BlockCheck block{100, 4000, Xxh3(region.data() + 100, 4000)};
  std::vector<char> a(1500, 0), b(2000, 0);
  const std::vector<SlotCopy> slots = {{a.data(), 50, a.size()}, {b.data(), 1600, b.size()}};
  StreamingHasher hasher;
  uint64_t next_size = 1;
  int calls = 0;
  int in_place = 0;
  auto source = [&](uint64_t begin, uint64_t end) -> absl::StatusOr<absl::Span<const char>> {
    ++calls;
    const uint64_t n = std::min(next_size++, end - begin);
    if (begin >= 1600 && begin + n <= 3600) {
      ++in_place;
      std::copy_n(region.data() + begin, n, b.data() + (begin - 1600));
      return absl::Span<const char>(b.data() + (begin - 1600), n);
    }
    return absl::Span<const char>(region.data() + begin, n);
  };
  absl::StatusOr<bool> matched = CopyAndCheckBlock(source, slots, block, {0, 1}, hasher);
  ASSERT_TRUE(matched.ok()) << matched.status();
  EXPECT_TRUE(*matched);
  EXPECT_EQ(calls, 89);  // 1 + 2 + ... + 88 = 3916 < 4000 <= 4005 = 1 + ... + 89
  EXPECT_GT(in_place, 0);
  EXPECT_EQ(Slice(a, 50, 1450), Slice(region, 100, 1450));
  EXPECT_EQ(b, Slice(region, 1600, 2000));

  region[3000] ^= 1;
  next_size = 1;
  calls = 0;
  matched = CopyAndCheckBlock(source, slots, block, {0, 1}, hasher);
  ASSERT_TRUE(matched.ok()) << matched.status();
  EXPECT_FALSE(*matched);
}

TEST(CopyAndCheckBlock, ASourceThatReturnsNothingOrTooMuch_Internal) {
  std::vector<char> region = RandomBytes(100, 10);
  const BlockCheck block{0, 64, Xxh3(region.data(), 64)};
  StreamingHasher hasher;
  auto nothing = [&](uint64_t begin, uint64_t) -> absl::StatusOr<absl::Span<const char>> {
    return absl::Span<const char>(region.data() + begin, 0);
  };
  absl::StatusOr<bool> matched = CopyAndCheckBlock(nothing, {}, block, {}, hasher);
  EXPECT_EQ(matched.status().code(), absl::StatusCode::kInternal) << matched.status();
  auto too_much = [&](uint64_t begin, uint64_t end) -> absl::StatusOr<absl::Span<const char>> {
    return absl::Span<const char>(region.data() + begin, end - begin + 1);
  };
  matched = CopyAndCheckBlock(too_much, {}, block, {}, hasher);
  EXPECT_EQ(matched.status().code(), absl::StatusCode::kInternal) << matched.status();
  EXPECT_THAT(std::string(matched.status().message()), HasSubstr("65 bytes at 0 for up to 64"));
}

TEST(VerifiedCopy, FlippedByte_ThatBlockOnly) {
  const uint64_t block = kVerifiedCopyPiece + 1;
  std::vector<char> region = RandomBytes(4 * block, 2);
  const std::vector<BlockCheck> blocks = BlocksOver(region, 0, region.size(), block);
  region[2 * block + 7] ^= 1;  // in block 2, after the checksums were taken
  std::vector<char> into(region.size(), 0);
  absl::StatusOr<VerifiedCopyResult> result =
      VerifiedCopy(region.data(), region.size(), {{into.data(), 0, into.size()}}, blocks, {}, 1, 0);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_THAT(result->mismatched, ElementsAre(2u));
}

TEST(VerifiedCopy, BlockWiderThanSlot_WholeBlockChecked) {
  // A slot inside one block (a slice of a chunk): the block's bytes outside the slot are
  // hashed too, so a flip there is caught although nothing there is copied.
  std::vector<char> region = RandomBytes(4096, 3);
  const std::vector<BlockCheck> blocks = BlocksOver(region, 1000, 3000, 2000);
  std::vector<char> into(500, 0);
  const std::vector<SlotCopy> slots = {{into.data(), 1200, into.size()}};
  absl::StatusOr<VerifiedCopyResult> result =
      VerifiedCopy(region.data(), region.size(), slots, blocks, {}, 1, 0);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_THAT(result->mismatched, IsEmpty());
  EXPECT_EQ(into, Slice(region, 1200, into.size()));

  region[2900] ^= 1;
  result = VerifiedCopy(region.data(), region.size(), slots, blocks, {}, 1, 0);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_THAT(result->mismatched, ElementsAre(0u));
}

TEST(VerifiedCopy, TwoSlotsShareABlock_BothCopied) {
  std::vector<char> region = RandomBytes(8192, 4);
  std::vector<char> a(100, 0), b(300, 0);
  const std::vector<SlotCopy> slots = {{b.data(), 4200, b.size()}, {a.data(), 4096, a.size()}};
  absl::StatusOr<VerifiedCopyResult> result = VerifiedCopy(
      region.data(), region.size(), slots, BlocksOver(region, 4096, 8192, 4096), {}, 1, 0);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_THAT(result->mismatched, IsEmpty());
  EXPECT_EQ(a, Slice(region, 4096, a.size()));
  EXPECT_EQ(b, Slice(region, 4200, b.size()));
}

TEST(VerifiedCopy, Threads_TakeWholeBlocks_ByteExact) {
  const uint64_t block = 64 << 10;
  std::vector<char> region = RandomBytes(37 * block + 11, 5);
  std::vector<BlockCheck> blocks = BlocksOver(region, 0, region.size(), block);
  region[30 * block] ^= 1;  // in the second thread's half
  std::vector<char> into(region.size(), 0);
  absl::StatusOr<VerifiedCopyResult> result =
      VerifiedCopy(region.data(), region.size(), {{into.data(), 0, into.size()}}, blocks, {},
                   /*max_threads=*/2, /*parallel_min_bytes=*/0);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->threads, 2);
  EXPECT_THAT(result->mismatched, ElementsAre(30u));
  EXPECT_EQ(into, region);
}

TEST(VerifiedCopy, DestinationsNotAlignedLikeTheRegion_ByteExact) {
  // Copied in short runs (verified_copy.cc CopyPiece): odd offsets, pieces with a partial run.
  const uint64_t block = kVerifiedCopyPiece + 4099;
  std::vector<char> region = RandomBytes(3 * block, 9);
  std::vector<char> buffer(region.size() + 64, 0);
  for (uint64_t skew : {1, 16, 63}) {
    std::fill(buffer.begin(), buffer.end(), 0);
    absl::StatusOr<VerifiedCopyResult> result = VerifiedCopy(
        region.data(), region.size(), {{buffer.data() + skew, 0, region.size()}},
        BlocksOver(region, 0, region.size(), block), {}, 1, 0);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_THAT(result->mismatched, IsEmpty());
    EXPECT_EQ(std::vector<char>(buffer.begin() + skew, buffer.begin() + skew + region.size()),
              region)
        << skew;
    EXPECT_EQ(buffer[skew - 1], 0) << skew;
    EXPECT_EQ(buffer[skew + region.size()], 0) << skew;
  }
}

TEST(VerifiedCopy, BlocksCheckedAhead_OnlyCopied_AnyOtherIdentityStillHashed) {
  const uint64_t block = kVerifiedCopyPiece + 100;
  std::vector<char> region = RandomBytes(4 * block, 10);
  const std::vector<BlockCheck> blocks = BlocksOver(region, 0, region.size(), block);
  // Checked ahead: block 1 as the load lists it; block 2 with another XXH3 (another step's
  // bytes there); block 3 at its offset but shorter.
  std::vector<BlockCheck> ahead = {blocks[1], blocks[2], blocks[3]};
  ahead[1].xxh3 ^= 1;
  ahead[2].length -= 1;
  // Flipped after the checks: the copy of block 1 is not hashed again, so it is not caught;
  // blocks 2 and 3 are.
  for (int b = 1; b < 4; ++b) region[b * block + 5] ^= 1;
  std::vector<char> into(region.size(), 0);
  absl::StatusOr<VerifiedCopyResult> result =
      VerifiedCopy(region.data(), region.size(), {{into.data(), 0, into.size()}}, blocks, ahead,
                   /*max_threads=*/2, /*parallel_min_bytes=*/0);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_THAT(result->mismatched, ElementsAre(2u, 3u));
  EXPECT_EQ(result->checked_ahead_bytes, block);
  EXPECT_EQ(into, region);
}

TEST(VerifiedCopy, SmallTotal_OneThread) {
  std::vector<char> region = RandomBytes(4096, 6);
  std::vector<char> into(region.size(), 0);
  absl::StatusOr<VerifiedCopyResult> result = VerifiedCopy(
      region.data(), region.size(), {{into.data(), 0, into.size()}},
      BlocksOver(region, 0, region.size(), 1024), {}, /*max_threads=*/4, /*parallel_min_bytes=*/4096);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->threads, 1);
  EXPECT_EQ(into, region);
}

TEST(VerifiedCopy, SlotBytesInNoBlock_InvalidArgument_NothingCopied) {
  std::vector<char> region = RandomBytes(4096, 7);
  std::vector<char> into(1000, 0);
  // Blocks cover [0, 1024) and [2048, 3072): the slot's bytes from 1024 are in none.
  std::vector<BlockCheck> blocks = BlocksOver(region, 0, 1024, 1024);
  const std::vector<BlockCheck> later = BlocksOver(region, 2048, 3072, 1024);
  blocks.insert(blocks.end(), later.begin(), later.end());
  absl::StatusOr<VerifiedCopyResult> result = VerifiedCopy(
      region.data(), region.size(), {{into.data(), 500, into.size()}}, blocks, {}, 1, 0);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(result.status().message(), HasSubstr("slot 0"));
  EXPECT_THAT(result.status().message(), HasSubstr("from 1024"));
  EXPECT_EQ(into, std::vector<char>(1000, 0));
}

TEST(VerifiedCopy, BadBlocks_InvalidArgument) {
  std::vector<char> region = RandomBytes(4096, 8);
  std::vector<char> into(16, 0);
  const std::vector<SlotCopy> slots = {{into.data(), 0, into.size()}};
  absl::StatusOr<VerifiedCopyResult> outside =
      VerifiedCopy(region.data(), region.size(), slots, {{0, 4096, 0}, {4096, 1, 0}}, {}, 1, 0);
  EXPECT_EQ(outside.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(outside.status().message(), HasSubstr("block 1"));
  EXPECT_THAT(outside.status().message(), HasSubstr("outside the 4096-byte region"));
  absl::StatusOr<VerifiedCopyResult> overlapping =
      VerifiedCopy(region.data(), region.size(), slots, {{0, 100, 0}, {50, 100, 0}}, {}, 1, 0);
  EXPECT_EQ(overlapping.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(overlapping.status().message(), HasSubstr("overlaps or precedes block 0"));
}

TEST(VerifiedCopy, NoBlocksNoSlots_NothingToDo) {
  absl::StatusOr<VerifiedCopyResult> result = VerifiedCopy(nullptr, 0, {}, {}, {}, 2, 0);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->threads, 0);
  EXPECT_THAT(result->mismatched, IsEmpty());
}

}  // namespace
}  // namespace tessera
