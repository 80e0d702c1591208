#include "server/store/keys.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::testing::ElementsAre;

std::string Bytes(const char* data, size_t size) { return std::string(data, size); }

TEST(EncodeOrderedInt64, RandomValuesWithNegatives_ByteOrderIsNumericOrder) {
  std::mt19937_64 rng(20240611);
  std::vector<int64_t> values = {std::numeric_limits<int64_t>::min(),
                                 std::numeric_limits<int64_t>::min() + 1,
                                 -256, -255, -1, 0, 1, 255, 256,
                                 std::numeric_limits<int64_t>::max() - 1,
                                 std::numeric_limits<int64_t>::max()};
  std::uniform_int_distribution<int64_t> any;
  std::uniform_int_distribution<int64_t> small(-1000, 1000);
  for (int i = 0; i < 2000; ++i) values.push_back(i % 2 ? any(rng) : small(rng));

  std::vector<int64_t> by_value = values;
  std::sort(by_value.begin(), by_value.end());
  std::vector<int64_t> by_bytes = values;
  std::sort(by_bytes.begin(), by_bytes.end(), [](int64_t a, int64_t b) {
    return EncodeOrderedInt64(a) < EncodeOrderedInt64(b);
  });
  EXPECT_EQ(by_bytes, by_value);

  for (int64_t v : values) {
    ASSERT_EQ(EncodeOrderedInt64(v).size(), 8u);
    absl::StatusOr<int64_t> decoded = DecodeOrderedInt64(EncodeOrderedInt64(v));
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(*decoded, v);
  }
}

TEST(EncodeOrderedInt64, KnownValues_SignBitFlippedBigEndian) {
  EXPECT_EQ(EncodeOrderedInt64(0), Bytes("\x80\0\0\0\0\0\0\0", 8));
  EXPECT_EQ(EncodeOrderedInt64(-1), Bytes("\x7f\xff\xff\xff\xff\xff\xff\xff", 8));
  EXPECT_EQ(EncodeOrderedInt64(258), Bytes("\x80\0\0\0\0\0\x01\x02", 8));
}

TEST(EncodeOrderedUint64, RandomValues_ByteOrderIsNumericOrderAndRoundTrips) {
  std::mt19937_64 rng(7);
  std::vector<uint64_t> values = {0, 1, 255, 256, std::numeric_limits<uint64_t>::max()};
  for (int i = 0; i < 2000; ++i) values.push_back(rng() >> (rng() % 64));
  std::vector<uint64_t> by_value = values;
  std::sort(by_value.begin(), by_value.end());
  std::vector<uint64_t> by_bytes = values;
  std::sort(by_bytes.begin(), by_bytes.end(), [](uint64_t a, uint64_t b) {
    return EncodeOrderedUint64(a) < EncodeOrderedUint64(b);
  });
  EXPECT_EQ(by_bytes, by_value);
  for (uint64_t v : values) {
    absl::StatusOr<uint64_t> decoded = DecodeOrderedUint64(EncodeOrderedUint64(v));
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(*decoded, v);
  }
}

TEST(DecodeOrderedInt64, WrongLength_InvalidArgument) {
  EXPECT_EQ(DecodeOrderedInt64("1234567").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeOrderedInt64("123456789").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeOrderedUint64("").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(KeyJoin, PrintableComponents_JoinedBySeparatorAndReadable) {
  EXPECT_EQ(KeyJoin({"job", "s123"}), Bytes("job\0s123", 8));
  EXPECT_EQ(KeyPrefix({"job"}), Bytes("job\0", 4));
  EXPECT_EQ(KeyJoin(std::vector<std::string>{"job", "s123"}), KeyJoin({"job", "s123"}));
}

// Random component bytes are drawn from the bytes the escape treats specially and their
// neighbours, so that every escape case meets every other in comparisons.
std::vector<std::string> RandomTuple(std::mt19937_64& rng) {
  static const char kAlphabet[] = {'\x00', '\x01', '\x02', 'a', '\x7f', '\x80', '\xff'};
  std::vector<std::string> tuple(1 + rng() % 3);
  for (std::string& component : tuple) {
    const size_t length = rng() % 4;
    for (size_t i = 0; i < length; ++i) component.push_back(kAlphabet[rng() % sizeof(kAlphabet)]);
  }
  return tuple;
}

TEST(KeyJoin, RandomTuplesWithEscapeBytes_ByteOrderIsTupleOrder) {
  std::mt19937_64 rng(99);
  std::vector<std::vector<std::string>> tuples;
  for (int i = 0; i < 3000; ++i) tuples.push_back(RandomTuple(rng));
  // KeyJoin({}) == KeyJoin({""}) by design; tuples here all have at least one component, and
  // {""} vs {"", ...} still order correctly.
  std::vector<std::vector<std::string>> by_tuple = tuples;
  std::stable_sort(by_tuple.begin(), by_tuple.end());
  std::vector<std::vector<std::string>> by_key = tuples;
  std::stable_sort(by_key.begin(), by_key.end(),
                   [](const std::vector<std::string>& a, const std::vector<std::string>& b) {
                     return KeyJoin(a) < KeyJoin(b);
                   });
  EXPECT_EQ(by_key, by_tuple);

  for (const std::vector<std::string>& tuple : tuples) {
    absl::StatusOr<std::vector<std::string>> split = KeySplit(KeyJoin(tuple));
    ASSERT_TRUE(split.ok()) << split.status();
    EXPECT_EQ(*split, tuple);
  }
}

TEST(KeyJoin, OrderedIntComponents_SortNumericallyInsideCompositeKeys) {
  std::mt19937_64 rng(5);
  std::vector<int64_t> steps = {-3, -1, 0, 1, 255, 256, 65536};
  for (int i = 0; i < 500; ++i) steps.push_back(static_cast<int64_t>(rng()));
  std::vector<int64_t> by_value = steps;
  std::sort(by_value.begin(), by_value.end());
  std::vector<int64_t> by_key = steps;
  std::sort(by_key.begin(), by_key.end(), [](int64_t a, int64_t b) {
    return KeyJoin({"job", EncodeOrderedInt64(a), "x"}) <
           KeyJoin({"job", EncodeOrderedInt64(b), "x"});
  });
  EXPECT_EQ(by_key, by_value);

  absl::StatusOr<std::vector<std::string>> split =
      KeySplit(KeyJoin({"job", EncodeOrderedInt64(256), "x"}));
  ASSERT_TRUE(split.ok()) << split.status();
  ASSERT_EQ(split->size(), 3u);
  EXPECT_EQ(*DecodeOrderedInt64((*split)[1]), 256);
}

TEST(KeyPrefix, LeadingComponents_MatchWholeComponentsOnly) {
  const std::string prefix = KeyPrefix({"job", "s12"});
  auto starts_with = [&](const std::string& key) { return key.rfind(prefix, 0) == 0; };
  EXPECT_TRUE(starts_with(KeyJoin({"job", "s12", "chunk"})));
  EXPECT_TRUE(starts_with(KeyJoin({"job", "s12", ""})));
  EXPECT_FALSE(starts_with(KeyJoin({"job", "s123", "chunk"})));
  EXPECT_FALSE(starts_with(KeyJoin({"job", "s12"})));
  EXPECT_FALSE(starts_with(KeyJoin({"job", Bytes("s12\0", 4), "chunk"})));
}

TEST(KeySplit, EmptyKey_OneEmptyComponent) {
  absl::StatusOr<std::vector<std::string>> split = KeySplit("");
  ASSERT_TRUE(split.ok());
  EXPECT_THAT(*split, ElementsAre(""));
}

TEST(KeySplit, MalformedEscape_InvalidArgument) {
  EXPECT_EQ(KeySplit("a\x01").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KeySplit("a\x01\x03").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KeySplit(Bytes("a\x01\0", 3)).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(PrefixSuccessor, Cases_SmallestKeyAfterThePrefixRange) {
  EXPECT_EQ(PrefixSuccessor("ab"), "ac");
  EXPECT_EQ(PrefixSuccessor("a\xff"), "b");
  EXPECT_EQ(PrefixSuccessor(Bytes("a\0", 2)), "a\x01");
  EXPECT_EQ(PrefixSuccessor("\xff\xff"), "");
  EXPECT_EQ(PrefixSuccessor(""), "");
}

TEST(PrefixSuccessor, RandomKeys_BoundsExactlyTheKeysWithThePrefix) {
  std::mt19937_64 rng(3);
  static const char kAlphabet[] = {'\x00', 'a', 'b', '\xfe', '\xff'};
  auto random_string = [&](size_t max_length) {
    std::string s(rng() % (max_length + 1), '\0');
    for (char& c : s) c = kAlphabet[rng() % sizeof(kAlphabet)];
    return s;
  };
  for (int i = 0; i < 5000; ++i) {
    const std::string prefix = random_string(2);
    const std::string key = random_string(4);
    const std::string end = PrefixSuccessor(prefix);
    const bool in_range = key >= prefix && (end.empty() || key < end);
    EXPECT_EQ(in_range, key.rfind(prefix, 0) == 0)
        << "prefix of size " << prefix.size() << ", key of size " << key.size();
  }
}

}  // namespace
}  // namespace tessera
