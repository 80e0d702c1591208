#include "common/checksum.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/xxh3_avx2.h"
#include "gtest/gtest.h"
// The library's own (non-inlined, baseline) implementation, as the reference.
#include "xxhash.h"

namespace tessera {
namespace {

std::vector<unsigned char> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<unsigned char> bytes(n);
  for (auto& b : bytes) b = static_cast<unsigned char>(rng());
  return bytes;
}

TEST(Xxh3, EmptyInput_KnownValue) {
  EXPECT_EQ(Xxh3(nullptr, 0), 0x2D06800538D394C2ull);
  EXPECT_EQ(Xxh3("", 0), 0x2D06800538D394C2ull);
}

TEST(Xxh3, MatchesLibxxhashAcrossSizeClasses) {
  // XXH3 has separate code paths for 0, 1-3, 4-8, 9-16, 17-128, 129-240 and >240 bytes,
  // and for inputs spanning several stripes and blocks.
  std::vector<unsigned char> data = RandomBytes(70000, 1);
  for (size_t n : {0, 1, 3, 4, 8, 9, 16, 17, 128, 129, 240, 241, 1024, 1025, 65536, 70000}) {
    EXPECT_EQ(Xxh3(data.data(), n), XXH3_64bits(data.data(), n)) << n;
  }
}

TEST(Xxh3, LongInputs_MatchLibxxhash) {
  // Past one XXH3 block (1 KiB of stripes), a last partial stripe, several 4 MiB blocks.
  std::vector<unsigned char> data = RandomBytes((9u << 20) + 77, 13);
  for (size_t n : {size_t{1} << 20, (size_t{1} << 20) + 13, data.size()}) {
    EXPECT_EQ(Xxh3(data.data(), n), XXH3_64bits(data.data(), n)) << n;
  }
}

// The kernel Xxh3 and StreamingHasher choose on this CPU (common/xxh3_avx2.h), on its own.
TEST(Xxh3Avx2, MatchesLibxxhash) {
#if defined(__x86_64__)
  const bool cpu_has_avx2 = __builtin_cpu_supports("avx2") != 0;
#else
  const bool cpu_has_avx2 = false;
#endif
  if (!checksum_internal::kAvx2Built || !cpu_has_avx2) {
    GTEST_SKIP() << "this CPU (or this build's architecture) has no AVX2: the baseline kernel, "
                    "tested above, is the one in use";
  }
  std::vector<unsigned char> data = RandomBytes((1u << 20) + 333, 14);
  for (size_t n : {0, 1, 17, 129, 241, 1024, 1025, 65536, 1 << 20, (1 << 20) + 333}) {
    EXPECT_EQ(checksum_internal::Avx2Xxh3(data.data(), n), XXH3_64bits(data.data(), n)) << n;
  }
  XXH3_state_t* state = XXH3_createState();
  ASSERT_NE(state, nullptr);
  XXH3_64bits_reset(state);
  size_t off = 0;
  for (size_t n : {100, 900, 64 << 10, 3, 1 << 19}) {
    checksum_internal::Avx2Update(state, data.data() + off, n);
    off += n;
  }
  checksum_internal::Avx2Update(state, data.data() + off, data.size() - off);
  EXPECT_EQ(XXH3_64bits_digest(state), XXH3_64bits(data.data(), data.size()));
  XXH3_freeState(state);
}

TEST(Xxh3, DependsOnEveryByte) {
  std::vector<unsigned char> data = RandomBytes(300, 2);
  uint64_t base = Xxh3(data.data(), data.size());
  for (size_t i = 0; i < data.size(); i += 37) {
    data[i] ^= 1;
    EXPECT_NE(Xxh3(data.data(), data.size()), base) << i;
    data[i] ^= 1;
  }
  EXPECT_EQ(Xxh3(data.data(), data.size()), base);
}

TEST(BlockChecksums, ZeroBytes_NoBlocks) {
  EXPECT_TRUE(BlockChecksums(nullptr, 0, 16).empty());
}

TEST(BlockChecksums, ExactMultiple_FullBlocksOnly) {
  std::vector<unsigned char> data = RandomBytes(64, 3);
  std::vector<uint64_t> sums = BlockChecksums(data.data(), data.size(), 16);
  ASSERT_EQ(sums.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(sums[i], XXH3_64bits(data.data() + 16 * i, 16)) << i;
}

TEST(BlockChecksums, LastBlockShort) {
  std::vector<unsigned char> data = RandomBytes(70, 4);
  std::vector<uint64_t> sums = BlockChecksums(data.data(), data.size(), 16);
  ASSERT_EQ(sums.size(), 5u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(sums[i], XXH3_64bits(data.data() + 16 * i, 16)) << i;
  EXPECT_EQ(sums[4], XXH3_64bits(data.data() + 64, 6));
}

TEST(BlockChecksums, SmallerThanOneBlock_OneBlock) {
  std::vector<unsigned char> data = RandomBytes(10, 5);
  std::vector<uint64_t> sums = BlockChecksums(data.data(), data.size(), kDefaultBlockSize);
  ASSERT_EQ(sums.size(), 1u);
  EXPECT_EQ(sums[0], Xxh3(data.data(), data.size()));
}

TEST(BlockChecksums, BlockSizeOne_OneSumPerByte) {
  std::vector<unsigned char> data = RandomBytes(5, 6);
  std::vector<uint64_t> sums = BlockChecksums(data.data(), data.size(), 1);
  ASSERT_EQ(sums.size(), 5u);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(sums[i], Xxh3(&data[i], 1));
}

TEST(BlockChecksums, DefaultBlockSize_Is4MiB) {
  EXPECT_EQ(kDefaultBlockSize, 4u * 1024 * 1024);
  std::vector<unsigned char> data = RandomBytes(kDefaultBlockSize + 1, 7);
  std::vector<uint64_t> sums = BlockChecksums(data.data(), data.size(), kDefaultBlockSize);
  ASSERT_EQ(sums.size(), 2u);
  EXPECT_EQ(sums[0], Xxh3(data.data(), kDefaultBlockSize));
  EXPECT_EQ(sums[1], Xxh3(data.data() + kDefaultBlockSize, 1));
}

TEST(StreamingHasher, NoUpdates_EqualsEmptyHash) {
  StreamingHasher h;
  EXPECT_EQ(h.Digest(), Xxh3(nullptr, 0));
}

TEST(StreamingHasher, ArbitrarySplits_EqualOneShot) {
  std::vector<unsigned char> data = RandomBytes(5000, 8);
  std::mt19937 rng(9);
  for (size_t total : {0, 1, 15, 240, 241, 1000, 5000}) {
    const uint64_t want = Xxh3(data.data(), total);
    for (int trial = 0; trial < 20; ++trial) {
      StreamingHasher h;
      size_t off = 0;
      while (off < total) {
        size_t n = std::min<size_t>(total - off, rng() % 300);  // includes empty updates
        h.Update(data.data() + off, n);
        off += n;
      }
      EXPECT_EQ(h.Digest(), want) << "total " << total << " trial " << trial;
    }
  }
}

TEST(StreamingHasher, LargeSplits_MatchLibxxhash) {
  // Pieces as the verified copy hashes them (client/verified_copy.h), against the library.
  std::vector<unsigned char> data = RandomBytes((4u << 20) + 5, 15);
  for (size_t piece : {size_t{4096}, size_t{64} << 10, (size_t{64} << 10) + 1}) {
    StreamingHasher h;
    for (size_t off = 0; off < data.size(); off += piece) {
      h.Update(data.data() + off, std::min(piece, data.size() - off));
    }
    EXPECT_EQ(h.Digest(), XXH3_64bits(data.data(), data.size())) << piece;
  }
}

TEST(StreamingHasher, ByteAtATime_EqualsOneShot) {
  std::vector<unsigned char> data = RandomBytes(1000, 10);
  StreamingHasher h;
  for (unsigned char b : data) h.Update(&b, 1);
  EXPECT_EQ(h.Digest(), Xxh3(data.data(), data.size()));
}

TEST(StreamingHasher, DigestIsRepeatableAndUpdatesContinue) {
  std::vector<unsigned char> data = RandomBytes(600, 11);
  StreamingHasher h;
  h.Update(data.data(), 300);
  EXPECT_EQ(h.Digest(), Xxh3(data.data(), 300));
  EXPECT_EQ(h.Digest(), Xxh3(data.data(), 300));
  h.Update(data.data() + 300, 300);
  EXPECT_EQ(h.Digest(), Xxh3(data.data(), 600));
}

TEST(StreamingHasher, Reset_StartsOver) {
  std::vector<unsigned char> data = RandomBytes(500, 12);
  StreamingHasher h;
  h.Update(data.data(), 500);
  h.Reset();
  EXPECT_EQ(h.Digest(), Xxh3(nullptr, 0));
  h.Update(data.data() + 100, 400);
  EXPECT_EQ(h.Digest(), Xxh3(data.data() + 100, 400));
}

}  // namespace
}  // namespace tessera
