#include "common/tensor_key.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tessera {
namespace {

void ExpectRejected(absl::string_view name, absl::string_view why) {
  absl::Status s = ValidateName(name);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << why;
}

TEST(ValidateName, TypicalNames_Accepted) {
  for (const char* name : {"layers.0.attention.wq.weight", "tok_embeddings.weight", "a",
                           "model.layers.10.mlp.experts.3.w1", "exp_avg_sq", "step",
                           "with space", "tilde~and-dash", "/looks/like/a/path", "..",
                           "x\x7e"}) {
    EXPECT_TRUE(ValidateName(name).ok()) << '"' << name << '"' << ValidateName(name);
  }
}

TEST(ValidateName, Utf8_Accepted) {
  EXPECT_TRUE(ValidateName("层.0.weight").ok());
  EXPECT_TRUE(ValidateName("poids.café").ok());                // 2-byte
  EXPECT_TRUE(ValidateName("\xE2\x82\xAC").ok());               // U+20AC, 3-byte
  EXPECT_TRUE(ValidateName("emb.\xF0\x9F\x98\x80").ok());       // U+1F600, 4-byte
  EXPECT_TRUE(ValidateName("\xF4\x8F\xBF\xBF").ok());           // U+10FFFF, the largest
  EXPECT_TRUE(ValidateName("\xED\x9F\xBF").ok());               // U+D7FF, below surrogates
  EXPECT_TRUE(ValidateName("\xEE\x80\x80").ok());               // U+E000, above surrogates
}

TEST(ValidateName, Empty_Rejected) { ExpectRejected("", "empty"); }

TEST(ValidateName, LengthLimit) {
  EXPECT_TRUE(ValidateName(std::string(kMaxFqnBytes, 'w')).ok());
  ExpectRejected(std::string(kMaxFqnBytes + 1, 'w'), "too long");
  // The limit is in bytes, not characters: 342 three-byte characters = 1026 bytes.
  std::string wide;
  for (int i = 0; i < 342; ++i) wide += "层";
  ExpectRejected(wide, "too long in bytes");
}

TEST(ValidateName, InvalidUtf8_Rejected) {
  ExpectRejected("\xFF", "0xFF is never valid");
  ExpectRejected("a\x80", "lone continuation byte");
  ExpectRejected("\xC3", "truncated 2-byte sequence");
  ExpectRejected("\xE5\xB1", "truncated 3-byte sequence");
  ExpectRejected("\xE5\xB1.", "bad continuation byte");
  ExpectRejected("\xF0\x9F\x98", "truncated 4-byte sequence");
  ExpectRejected("\xF8\x88\x80\x80\x80", "5-byte form");
  ExpectRejected("\xC0\xAF", "overlong '/'");
  ExpectRejected("\xC1\x80", "overlong '@'");
  ExpectRejected("\xC0\x80", "overlong NUL");
  ExpectRejected("\xE0\x80\xAF", "overlong 3-byte '/'");
  ExpectRejected("\xF0\x80\x80\xAF", "overlong 4-byte '/'");
  ExpectRejected("\xED\xA0\x80", "UTF-16 surrogate U+D800");
  ExpectRejected("\xED\xBF\xBF", "UTF-16 surrogate U+DFFF");
  ExpectRejected("\xF4\x90\x80\x80", "U+110000, beyond Unicode");
  ExpectRejected("\xF5\x80\x80\x80", "lead byte 0xF5");
}

TEST(ValidateName, ControlCharacters_Rejected) {
  ExpectRejected(std::string("a\0b", 3), "NUL");
  ExpectRejected("a\nb", "newline");
  ExpectRejected("a\tb", "tab");
  ExpectRejected("\x1F", "unit separator");
  ExpectRejected("a\x7F", "DEL");
  ExpectRejected("a\xC2\x80", "C1 control U+0080");
  ExpectRejected("a\xC2\x85", "C1 control NEL");
  ExpectRejected("a\xC2\x9F", "C1 control U+009F");
  EXPECT_TRUE(ValidateName("a\xC2\xA0").ok());  // U+00A0 no-break space is printable-ish
}

TEST(ValidateName, ReservedCharacters_Rejected) {
  ExpectRejected("w#exp_avg", "'#' separates state keys");
  ExpectRejected("w@0,0", "'@' separates chunk offsets");
  ExpectRejected("#", "'#' alone");
  ExpectRejected("@", "'@' alone");
  absl::Status s = ValidateName("a#b");
  EXPECT_NE(s.message().find('#'), absl::string_view::npos) << s;
}

TEST(TensorKey, EachKind) {
  EXPECT_EQ(TensorKey(v1::SHARD_KIND_PARAM, "l.0.w", "", 3), "l.0.w");
  EXPECT_EQ(TensorKey(v1::SHARD_KIND_PARAM, "l.0.w", "ignored", 3), "l.0.w");
  EXPECT_EQ(TensorKey(v1::SHARD_KIND_OPTIMIZER, "l.0.w", "exp_avg", 3), "l.0.w#exp_avg");
  EXPECT_EQ(TensorKey(v1::SHARD_KIND_EXTRA, "rng_state", "", 17), "rng_state#rank17");
  EXPECT_EQ(TensorKey(v1::SHARD_KIND_EXTRA, "rng_state", "", 0), "rng_state#rank0");
}

TEST(TensorKey, DistinctForDistinctShards) {
  EXPECT_NE(TensorKey(v1::SHARD_KIND_OPTIMIZER, "w", "exp_avg", 0),
            TensorKey(v1::SHARD_KIND_OPTIMIZER, "w", "exp_avg_sq", 0));
  EXPECT_NE(TensorKey(v1::SHARD_KIND_EXTRA, "w", "", 1), TensorKey(v1::SHARD_KIND_EXTRA, "w", "", 2));
  EXPECT_NE(TensorKey(v1::SHARD_KIND_PARAM, "w", "", 0),
            TensorKey(v1::SHARD_KIND_EXTRA, "w", "", 0));
}

TEST(TensorKeyOf, ReadsShardDesc) {
  v1::ShardDesc shard;
  shard.set_fqn("layers.1.ffn.w2.weight");
  shard.set_kind(v1::SHARD_KIND_OPTIMIZER);
  shard.set_state_key("exp_avg_sq");
  EXPECT_EQ(TensorKeyOf(shard, 4), "layers.1.ffn.w2.weight#exp_avg_sq");
  shard.set_kind(v1::SHARD_KIND_PARAM);
  EXPECT_EQ(TensorKeyOf(shard, 4), "layers.1.ffn.w2.weight");
  shard.set_kind(v1::SHARD_KIND_EXTRA);
  EXPECT_EQ(TensorKeyOf(shard, 4), "layers.1.ffn.w2.weight#rank4");
}

Box MakeBox(std::vector<int64_t> offsets, std::vector<int64_t> lengths) {
  Box box;
  box.offsets = std::move(offsets);
  box.lengths = std::move(lengths);
  return box;
}

TEST(ChunkName, Format) {
  EXPECT_EQ(ChunkName("w", MakeBox({0, 128}, {64, 64})), "w@0,128");
  EXPECT_EQ(ChunkName("w#exp_avg", MakeBox({4096}, {1})), "w#exp_avg@4096");
  EXPECT_EQ(ChunkName("scalar", MakeBox({}, {})), "scalar@");
}

TEST(ParseChunkName, RoundTrip) {
  const std::vector<std::pair<std::string, Box>> cases = {
      {"layers.0.wq.weight", MakeBox({0, 128}, {64, 64})},
      {"layers.0.wq.weight#exp_avg", MakeBox({1, 2, 3}, {1, 1, 1})},
      {"rng#rank7", MakeBox({0}, {16})},
      {"scalar", MakeBox({}, {})},  // 0-d tensor: no offsets
      {"层.0.weight", MakeBox({9223372036854775807}, {0})},
  };
  for (const auto& [key, box] : cases) {
    std::string name = ChunkName(key, box);
    absl::StatusOr<ParsedChunkName> parsed = ParseChunkName(name);
    ASSERT_TRUE(parsed.ok()) << name << ": " << parsed.status();
    EXPECT_EQ(parsed->key, key);
    EXPECT_EQ(parsed->offsets, box.offsets) << name;
  }
}

TEST(ParseChunkName, Malformed_Rejected) {
  for (const char* name :
       {"", "w", "@0", "@", "w@a", "w@1,", "w@,1", "w@1,,2", "w@-1", "w@1.5", "w@0x10",
        "w@ 1", "w@1 ", "w@+1", "w@1;2", "w@99999999999999999999"}) {
    absl::StatusOr<ParsedChunkName> parsed = ParseChunkName(name);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << '"' << name << '"';
  }
}

}  // namespace
}  // namespace tessera
