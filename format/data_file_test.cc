#include "format/data_file.h"

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/box.h"
#include "common/dtype.h"
#include "common/status.h"
#include "common/tensor_key.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;
using ::testing::Pair;

ChunkSpec Chunk(std::string key, std::vector<int64_t> offsets, std::vector<int64_t> lengths,
                v1::DType dtype, size_t elem_size) {
  ChunkSpec spec;
  spec.key = std::move(key);
  Box box{std::move(offsets), std::move(lengths)};
  spec.box = BoxToProto(box);
  spec.dtype = dtype;
  int64_t volume = 1;
  for (int64_t l : box.lengths) volume *= l;
  spec.nbytes = static_cast<uint64_t>(volume) * elem_size;
  return spec;
}

SafetensorsHeader MustParse(const FileLayout& layout) {
  absl::StatusOr<SafetensorsHeader> header = ParseSafetensorsHeader(layout.header);
  EXPECT_TRUE(header.ok()) << header.status();
  return header.ok() ? *header : SafetensorsHeader();
}

// The invariants every layout must satisfy; also checks the parsed header against it.
void CheckInvariants(const FileLayout& layout, const std::vector<ChunkSpec>& chunks) {
  ASSERT_EQ(layout.header.size(), layout.data_start);
  EXPECT_EQ(layout.data_start % kDataAlignment, 0u);
  EXPECT_EQ(layout.data_size % kDataAlignment, 0u);
  ASSERT_EQ(layout.items.size(), chunks.size());
  uint64_t previous_end = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const FileLayoutItem& item = layout.items[i];
    EXPECT_EQ(item.file_offset % kDataAlignment, 0u) << item.name;
    EXPECT_EQ(item.staging_offset, item.file_offset - layout.data_start);
    EXPECT_GE(item.staging_offset, previous_end) << "chunks are laid out in input order";
    EXPECT_LE(item.staging_offset + item.nbytes, layout.data_size);
    EXPECT_EQ(item.nbytes, chunks[i].nbytes);
    EXPECT_EQ(item.name, ChunkName(chunks[i].key, BoxFromProto(chunks[i].box)));
    previous_end = item.staging_offset + item.nbytes;
  }
  SafetensorsHeader header = MustParse(layout);
  EXPECT_EQ(header.data_start, layout.data_start);
  EXPECT_TRUE(ValidateSafetensorsLayout(header, layout.file_size()).ok())
      << ValidateSafetensorsLayout(header, layout.file_size());
  EXPECT_THAT(header.metadata,
              ::testing::ElementsAre(Pair("format", "tessera"), Pair("version", "1")));
  // Every chunk appears with its dtype, shape and offsets; everything else is padding that
  // matches layout.padding exactly.
  size_t chunk_entries = 0;
  std::vector<PaddingRange> pads;
  for (const SafetensorsEntry& entry : header.entries) {
    auto it = std::find_if(layout.items.begin(), layout.items.end(),
                           [&](const FileLayoutItem& item) { return item.name == entry.name; });
    if (it == layout.items.end()) {
      EXPECT_THAT(entry.name, ::testing::MatchesRegex("__tessera_pad_[0-9]+__"));
      EXPECT_EQ(entry.dtype, "U8");
      EXPECT_EQ(entry.shape, std::vector<uint64_t>{entry.end - entry.begin});
      EXPECT_GT(entry.end, entry.begin) << "no empty pads";
      pads.push_back(PaddingRange{entry.begin, entry.end - entry.begin});
      continue;
    }
    ++chunk_entries;
    const size_t i = it - layout.items.begin();
    EXPECT_EQ(entry.dtype, std::string(DTypeName(chunks[i].dtype)));
    std::vector<uint64_t> shape(chunks[i].box.lengths().begin(), chunks[i].box.lengths().end());
    EXPECT_EQ(entry.shape, shape);
    EXPECT_EQ(entry.begin, it->staging_offset);
    EXPECT_EQ(entry.end, it->staging_offset + it->nbytes);
  }
  EXPECT_EQ(chunk_entries, chunks.size());
  ASSERT_EQ(pads.size(), layout.padding.size());
  for (size_t i = 0; i < pads.size(); ++i) {
    EXPECT_EQ(pads[i].staging_offset, layout.padding[i].staging_offset);
    EXPECT_EQ(pads[i].nbytes, layout.padding[i].nbytes);
  }
}

TEST(FileLayout, MixedChunks_AlignedAndPadsTileHoles) {
  std::vector<ChunkSpec> chunks = {
      Chunk("layers.0.w", {0, 0}, {3, 5}, v1::DTYPE_F32, 4),         // 60 bytes
      Chunk("layers.0.w#exp_avg", {0, 0}, {1024, 2}, v1::DTYPE_BF16, 2),  // 4096: no pad after
      Chunk("layers.1.b", {8}, {7}, v1::DTYPE_F64, 8),                 // 56
      Chunk("emb", {0, 64}, {2, 2048}, v1::DTYPE_U8, 1),               // 4096
  };
  absl::StatusOr<FileLayout> layout = ComputeFileLayout(chunks);
  ASSERT_TRUE(layout.ok()) << layout.status();
  CheckInvariants(*layout, chunks);
  EXPECT_EQ(layout->items[0].staging_offset, 0u);
  EXPECT_EQ(layout->items[1].staging_offset, 4096u);
  EXPECT_EQ(layout->items[2].staging_offset, 8192u);
  EXPECT_EQ(layout->items[3].staging_offset, 12288u);
  EXPECT_EQ(layout->data_size, 16384u);
  // Holes after chunk 0 and chunk 2; chunk 1 and 3 end aligned.
  ASSERT_EQ(layout->padding.size(), 2u);
  EXPECT_EQ(layout->padding[0].staging_offset, 60u);
  EXPECT_EQ(layout->padding[0].nbytes, 4096u - 60);
  EXPECT_EQ(layout->padding[1].staging_offset, 8192u + 56);
}

TEST(FileLayout, HeaderPrefixAndSpacePadding) {
  std::vector<ChunkSpec> chunks = {Chunk("x", {0}, {10}, v1::DTYPE_F32, 4)};
  absl::StatusOr<FileLayout> layout = ComputeFileLayout(chunks);
  ASSERT_TRUE(layout.ok());
  uint64_t n = 0;
  for (int b = 7; b >= 0; --b) n = (n << 8) | static_cast<unsigned char>(layout->header[b]);
  EXPECT_EQ(n, layout->data_start - 8);
  EXPECT_EQ(layout->header[8], '{');
  const size_t close = layout->header.rfind('}');
  ASSERT_NE(close, std::string::npos);
  EXPECT_EQ(layout->header.find_first_not_of(' ', close + 1), std::string::npos);
  EXPECT_EQ(layout->data_start, 4096u);
  EXPECT_THAT(layout->header, HasSubstr(
      R"({"__metadata__":{"format":"tessera","version":"1"},"x@0":{"dtype":"F32","shape":[10],"data_offsets":[0,40]},"__tessera_pad_0__":{"dtype":"U8","shape":[4056],"data_offsets":[40,4096]}})"));
}

TEST(FileLayout, ZeroByteChunk_EmptyOffsetsStillTiled) {
  std::vector<ChunkSpec> chunks = {
      Chunk("a", {0}, {3}, v1::DTYPE_F32, 4),
      Chunk("empty", {5, 0}, {0, 4}, v1::DTYPE_F32, 4),
      Chunk("b", {0}, {1}, v1::DTYPE_I64, 8),
  };
  absl::StatusOr<FileLayout> layout = ComputeFileLayout(chunks);
  ASSERT_TRUE(layout.ok()) << layout.status();
  CheckInvariants(*layout, chunks);
  EXPECT_EQ(layout->items[1].nbytes, 0u);
  EXPECT_EQ(layout->items[1].name, "empty@5,0");
  EXPECT_EQ(layout->items[2].staging_offset, layout->items[1].staging_offset);
}

TEST(FileLayout, ZeroDimTensor_ShapeEmptyNameEndsAtSign) {
  std::vector<ChunkSpec> chunks = {Chunk("step", {}, {}, v1::DTYPE_I64, 8)};
  absl::StatusOr<FileLayout> layout = ComputeFileLayout(chunks);
  ASSERT_TRUE(layout.ok()) << layout.status();
  CheckInvariants(*layout, chunks);
  EXPECT_EQ(layout->items[0].name, "step@");
  EXPECT_EQ(layout->items[0].nbytes, 8u);
  EXPECT_THAT(layout->header, HasSubstr(R"("step@":{"dtype":"I64","shape":[],)"));
}

TEST(FileLayout, NoChunks_HeaderOnlyFile) {
  absl::StatusOr<FileLayout> layout = ComputeFileLayout({});
  ASSERT_TRUE(layout.ok());
  EXPECT_EQ(layout->data_size, 0u);
  EXPECT_EQ(layout->file_size(), 4096u);
  SafetensorsHeader header = MustParse(*layout);
  EXPECT_TRUE(header.entries.empty());
  EXPECT_TRUE(ValidateSafetensorsLayout(header, layout->file_size()).ok());
}

TEST(FileLayout, ManyChunks_AllAlignedAndRoundTrip) {
  std::vector<ChunkSpec> chunks;
  for (int i = 0; i < 5000; ++i) {
    chunks.push_back(Chunk(absl::StrCat("model.layers.", i / 10, ".mlp.w", i % 10), {i, 0},
                           {1 + i % 17, 3}, i % 2 ? v1::DTYPE_BF16 : v1::DTYPE_F32,
                           i % 2 ? 2 : 4));
  }
  absl::StatusOr<FileLayout> layout = ComputeFileLayout(chunks);
  ASSERT_TRUE(layout.ok()) << layout.status();
  CheckInvariants(*layout, chunks);
  EXPECT_GT(layout->data_start, 4096u) << "a header this large spans several pages";
}

TEST(FileLayout, BadChunks_MalformedShard) {
  auto code_of = [](std::vector<ChunkSpec> chunks) {
    return GetErrorCode(ComputeFileLayout(chunks).status());
  };
  ChunkSpec wrong_size = Chunk("w", {0}, {4}, v1::DTYPE_F32, 4);
  wrong_size.nbytes = 15;
  EXPECT_EQ(code_of({wrong_size}), v1::ERROR_CODE_MALFORMED_SHARD);
  absl::Status status = ComputeFileLayout({wrong_size}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("nbytes is 15"));

  ChunkSpec no_dtype = Chunk("w", {0}, {4}, v1::DTYPE_UNSPECIFIED, 0);
  EXPECT_EQ(code_of({no_dtype}), v1::ERROR_CODE_MALFORMED_SHARD);

  ChunkSpec ragged = Chunk("w", {0}, {4}, v1::DTYPE_F32, 4);
  ragged.box.add_offsets(1);
  EXPECT_EQ(code_of({ragged}), v1::ERROR_CODE_MALFORMED_SHARD);

  ChunkSpec negative = Chunk("w", {-1}, {4}, v1::DTYPE_F32, 4);
  EXPECT_EQ(code_of({negative}), v1::ERROR_CODE_MALFORMED_SHARD);

  ChunkSpec bad_utf8 = Chunk("w\xc3", {0}, {4}, v1::DTYPE_F32, 4);
  EXPECT_EQ(code_of({bad_utf8}), v1::ERROR_CODE_MALFORMED_SHARD);
  EXPECT_THAT(ComputeFileLayout({bad_utf8}).status().message(), HasSubstr("w\\xc3"));

  ChunkSpec dup = Chunk("w", {0}, {4}, v1::DTYPE_F32, 4);
  status = ComputeFileLayout({dup, dup}).status();
  EXPECT_EQ(GetErrorCode(status), v1::ERROR_CODE_MALFORMED_SHARD);
  EXPECT_THAT(status.message(), HasSubstr("twice"));

  ChunkSpec huge = Chunk("w", {0, 0}, {1, 1}, v1::DTYPE_F64, 8);
  huge.box.set_lengths(0, int64_t{1} << 40);
  huge.box.set_lengths(1, int64_t{1} << 40);
  EXPECT_EQ(code_of({huge}), v1::ERROR_CODE_MALFORMED_SHARD);
}

TEST(FileLayout, TrickyNames_EscapedAndParsedBack) {
  const std::vector<std::string> keys = {
      "quote\"inside", "back\\slash", "new\nline\ttab\x01\x1f", "del\x7f",
      "caf\xc3\xa9",                         // é
      "\xe6\x97\xa5\xe6\x9c\xac",            // 日本
      "emoji\xf0\x9f\x98\x80",               // U+1F600
      "slash/and:colon",
  };
  std::vector<ChunkSpec> chunks;
  for (size_t i = 0; i < keys.size(); ++i) {
    chunks.push_back(Chunk(keys[i], {static_cast<int64_t>(i)}, {1}, v1::DTYPE_U8, 1));
  }
  absl::StatusOr<FileLayout> layout = ComputeFileLayout(chunks);
  ASSERT_TRUE(layout.ok()) << layout.status();
  CheckInvariants(*layout, chunks);
  EXPECT_THAT(layout->header, HasSubstr(R"("quote\"inside@0")"));
  EXPECT_THAT(layout->header, HasSubstr(R"("back\\slash@1")"));
  EXPECT_THAT(layout->header, HasSubstr(R"("new\u000aline\u0009tab\u0001\u001f@2")"));
  EXPECT_THAT(layout->header, HasSubstr(R"("del\u007f@3")"));
}

// Stands in for v1::WriteItem (coordinator.proto), which this test does not link.
struct FakeWriteItem {
  std::string k;
  v1::Box b;
  const std::string& key() const { return k; }
  const v1::Box& box() const { return b; }
  v1::DType dtype() const { return v1::DTYPE_F16; }
  uint64_t nbytes() const { return 6; }
};

TEST(ChunkSpecsFromWriteItems, CopiesFields) {
  std::vector<FakeWriteItem> items = {{"w", BoxToProto(Box{{4}, {3}})}};
  std::vector<ChunkSpec> specs = ChunkSpecsFromWriteItems(items);
  ASSERT_EQ(specs.size(), 1u);
  EXPECT_EQ(specs[0].key, "w");
  EXPECT_EQ(specs[0].box.offsets(0), 4);
  EXPECT_EQ(specs[0].dtype, v1::DTYPE_F16);
  EXPECT_EQ(specs[0].nbytes, 6u);
  EXPECT_TRUE(ComputeFileLayout(specs).ok());
}

TEST(AppendJsonString, EscapesExactly) {
  std::string out;
  AppendJsonString(&out, std::string("a\"b\\c\x00\x1f\xc3\xa9", 9));
  EXPECT_EQ(out, R"("a\"b\\c\u0000\u001f)" "\xc3\xa9\"");
}

TEST(IsValidUtf8, AcceptsWellFormedRejectsRest) {
  EXPECT_TRUE(IsValidUtf8("plain"));
  EXPECT_TRUE(IsValidUtf8("\xc3\xa9\xe6\x97\xa5\xf0\x9f\x98\x80"));
  EXPECT_FALSE(IsValidUtf8("\xc0\xaf"));          // overlong '/'
  EXPECT_FALSE(IsValidUtf8("\xed\xa0\x80"));      // surrogate
  EXPECT_FALSE(IsValidUtf8("\xf4\x90\x80\x80"));  // > U+10FFFF
  EXPECT_FALSE(IsValidUtf8("\xe6\x97"));          // truncated
  EXPECT_FALSE(IsValidUtf8("\x80"));
}

TEST(ZeroPadding, ClearsOnlyPadding) {
  std::vector<ChunkSpec> chunks = {Chunk("a", {0}, {10}, v1::DTYPE_U8, 1),
                                   Chunk("b", {0}, {10}, v1::DTYPE_U8, 1)};
  absl::StatusOr<FileLayout> layout = ComputeFileLayout(chunks);
  ASSERT_TRUE(layout.ok());
  std::string staging(layout->data_size, '\xee');
  EXPECT_FALSE(PaddingIsZero(*layout, staging.data()));
  ZeroPadding(*layout, staging.data());
  EXPECT_TRUE(PaddingIsZero(*layout, staging.data()));
  EXPECT_EQ(staging.substr(0, 10), std::string(10, '\xee'));
  EXPECT_EQ(staging.substr(10, 4086), std::string(4086, '\0'));
  EXPECT_EQ(staging.substr(4096, 10), std::string(10, '\xee'));
}

// --- Parser --------------------------------------------------------------------------------

std::string WithPrefix(absl::string_view json) {
  std::string out(8, '\0');
  const uint64_t n = json.size();
  for (int b = 0; b < 8; ++b) out[b] = static_cast<char>((n >> (8 * b)) & 0xff);
  return out + std::string(json);
}

absl::Status ParseJson(absl::string_view json) {
  return ParseSafetensorsHeader(WithPrefix(json)).status();
}

TEST(ParseSafetensorsHeader, ForeignWriterStyle_Accepted) {
  // Whitespace, field order and escapes as another writer might produce them.
  absl::StatusOr<SafetensorsHeader> header = ParseSafetensorsHeader(WithPrefix(
      "{ \"a\" : { \"data_offsets\" : [ 0 , 8 ], \"shape\": [2], \"dtype\": \"F32\" },\n"
      "  \"__metadata__\": {\"format\": \"pt\"},\r\n"
      "  \"\\u0041\\/\\ud83d\\ude00\\b\\f\\n\\r\\t\": {\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[8,9]}\t}   "));
  ASSERT_TRUE(header.ok()) << header.status();
  ASSERT_EQ(header->entries.size(), 2u);
  EXPECT_EQ(header->entries[0].name, "a");
  EXPECT_EQ(header->entries[0].dtype, "F32");
  EXPECT_EQ(header->entries[0].shape, std::vector<uint64_t>{2});
  EXPECT_EQ(header->entries[0].end, 8u);
  EXPECT_EQ(header->entries[1].name, "A/\xf0\x9f\x98\x80\b\f\n\r\t");
  EXPECT_TRUE(header->entries[1].shape.empty());
  EXPECT_THAT(header->metadata, ::testing::ElementsAre(Pair("format", "pt")));
  EXPECT_TRUE(ValidateSafetensorsLayout(*header, header->data_start + 9).ok());
  EXPECT_FALSE(ValidateSafetensorsLayout(*header, header->data_start + 10).ok());
}

TEST(ParseSafetensorsHeader, MalformedInputs_DataLossNeverCrash) {
  const char* const kBad[] = {
      "",                                   // empty
      " {}",                                // leading whitespace
      "[]",                                 // not an object
      "{",                                  // truncated
      "{}x",                                // trailing garbage
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}",                             // missing field
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}",  // unknown
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}",      // negative
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[1.0],\"data_offsets\":[0,4]}}",     // float
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[01],\"data_offsets\":[0,4]}}",      // leading zero
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}",     // 3 offsets
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}",       // begin > end
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[99999999999999999999],\"data_offsets\":[0,4]}}",
      "{\"a\":{\"dtype\":5,\"shape\":[1],\"data_offsets\":[0,4]}}",             // dtype number
      "{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
      "{\"a\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]},"
      "\"a\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[1,2]}}",          // duplicate name
      "{\"__metadata__\":{\"k\":1}}",                                           // non-string meta
      "{\"__metadata__\":{},\"__metadata__\":{}}",
      "{\"bad\\x\":{}}",                    // bad escape
      "{\"\\ud800\":{}}",                   // unpaired high surrogate
      "{\"\\udc00\":{}}",                   // unpaired low surrogate
      "{\"\\u12\":{}}",                     // short \u
      "{\"tab\there\":{}}",                 // raw control character
      "{\"\xc3\":{}}",                      // invalid UTF-8
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[1,],\"data_offsets\":[0,4]}}",      // trailing comma
      "{\"a\" {}}",                         // missing colon
  };
  for (const char* bad : kBad) {
    absl::Status status = ParseJson(bad);
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << "accepted: " << bad;
    EXPECT_THAT(status.message(), HasSubstr("safetensors header")) << bad;
  }
}

TEST(ParseSafetensorsHeader, LengthPrefixProblems_DataLoss) {
  EXPECT_EQ(ParseSafetensorsHeader("1234567").status().code(), absl::StatusCode::kDataLoss);
  std::string too_long = WithPrefix("{}");
  too_long[0] = 3;  // claims 3 bytes of header, "{}" is 2 - then "{}" then nothing
  EXPECT_FALSE(ParseSafetensorsHeader(too_long).ok());
  std::string truncated = WithPrefix("{}");
  truncated[0] = 100;
  EXPECT_EQ(ParseSafetensorsHeader(truncated).status().code(), absl::StatusCode::kDataLoss);
  std::string huge(8, '\xff');
  EXPECT_EQ(ParseSafetensorsHeader(huge).status().code(), absl::StatusCode::kDataLoss);
}

TEST(ParseSafetensorsHeader, EveryTruncationAndMutation_NoCrash) {
  std::vector<ChunkSpec> chunks = {Chunk("a\"b", {0, 1}, {2, 3}, v1::DTYPE_F32, 4),
                                   Chunk("\xe6\x97\xa5", {}, {}, v1::DTYPE_I64, 8)};
  absl::StatusOr<FileLayout> layout = ComputeFileLayout(chunks);
  ASSERT_TRUE(layout.ok());
  const std::string& valid = layout->header;
  const size_t json_end = valid.rfind('}') + 1;
  // Shortening the declared header anywhere inside the JSON must be rejected.
  for (size_t n = 0; n + 8 < json_end; ++n) {
    std::string cut = valid.substr(0, 8 + n);
    for (int b = 0; b < 8; ++b) cut[b] = static_cast<char>((n >> (8 * b)) & 0xff);
    EXPECT_FALSE(ParseSafetensorsHeader(cut).ok()) << n;
  }
  std::mt19937 rng(1234);
  for (int round = 0; round < 20000; ++round) {
    std::string mutated = valid.substr(0, json_end);
    const int flips = 1 + round % 3;
    for (int f = 0; f < flips; ++f) {
      mutated[8 + rng() % (json_end - 8)] = static_cast<char>(rng() & 0xff);
    }
    absl::StatusOr<SafetensorsHeader> header = ParseSafetensorsHeader(mutated);
    if (header.ok()) (void)ValidateSafetensorsLayout(*header, layout->file_size());
  }
}

TEST(ValidateSafetensorsLayout, HolesOverlapsAndSizes_Rejected) {
  auto validate = [](absl::string_view json, uint64_t data_size) {
    absl::StatusOr<SafetensorsHeader> header = ParseSafetensorsHeader(WithPrefix(json));
    EXPECT_TRUE(header.ok()) << header.status();
    return ValidateSafetensorsLayout(*header, header->data_start + data_size);
  };
  EXPECT_TRUE(validate(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},
                          "b":{"dtype":"U8","shape":[1],"data_offsets":[8,9]}})", 9).ok());
  absl::Status hole = validate(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},
                                   "b":{"dtype":"U8","shape":[1],"data_offsets":[9,10]}})", 10);
  EXPECT_EQ(hole.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(hole.message(), HasSubstr("hole"));
  absl::Status overlap = validate(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},
                                      "b":{"dtype":"U8","shape":[2],"data_offsets":[7,9]}})", 9);
  EXPECT_THAT(overlap.message(), HasSubstr("overlap"));
  EXPECT_FALSE(validate(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8).ok());
  EXPECT_FALSE(validate(R"({"a":{"dtype":"C64","shape":[1],"data_offsets":[0,8]}})", 8).ok());
  EXPECT_FALSE(validate(R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}})", 9).ok());
  EXPECT_FALSE(validate(R"({"a":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8).ok());
}

}  // namespace
}  // namespace tessera
