#include "client/cli/json_writer.h"

#include "gtest/gtest.h"
#include "tessera/v1/types.pb.h"

namespace tessera {
namespace cli {
namespace {

TEST(JsonWriter, NestedDocument_PrettyPrinted) {
  JsonWriter w;
  w.BeginObject();
  w.Key("ok").Bool(false);
  w.Key("n").Int(-3);
  w.Key("big").Uint(18446744073709551615ull);
  w.Key("list").BeginArray().String("a").Null().EndArray();
  w.Key("empty").BeginObject().EndObject();
  w.Key("none").BeginArray().EndArray();
  w.EndObject();
  EXPECT_EQ(w.Finish(),
            "{\n"
            "  \"ok\": false,\n"
            "  \"n\": -3,\n"
            "  \"big\": 18446744073709551615,\n"
            "  \"list\": [\n"
            "    \"a\",\n"
            "    null\n"
            "  ],\n"
            "  \"empty\": {},\n"
            "  \"none\": []\n"
            "}\n");
}

TEST(JsonWriter, RawValue_InsertedVerbatim) {
  JsonWriter w;
  w.BeginArray().Raw("{\"x\":1}").Int(2).EndArray();
  EXPECT_EQ(w.Finish(), "[\n  {\"x\":1},\n  2\n]\n");
}

TEST(AppendJsonQuoted, EscapesQuotesControlAndInvalidUtf8) {
  std::string out;
  AppendJsonQuoted(&out, "a\"b\\c\nd\x01\x7f");
  EXPECT_EQ(out, "\"a\\\"b\\\\c\\nd\\u0001\\u007f\"");
  out.clear();
  AppendJsonQuoted(&out, "caf\xc3\xa9 \xf0\x9f\x98\x80");  // valid UTF-8 is kept
  EXPECT_EQ(out, "\"caf\xc3\xa9 \xf0\x9f\x98\x80\"");
  out.clear();
  // A lone continuation byte, a truncated sequence and an encoded surrogate are not UTF-8.
  AppendJsonQuoted(&out, std::string("\x80 \xc3 \xed\xa0\x80", 7));
  EXPECT_EQ(out, "\"\\u0080 \\u00c3 \\u00ed\\u00a0\\u0080\"");
}

TEST(ProtoToJson, FieldNamesAndDefaultsPrinted) {
  v1::RankRef ref;
  ref.set_coords("pp=1");
  absl::StatusOr<std::string> json = ProtoToJson(ref, /*pretty=*/false);
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_EQ(*json, "{\"rank\":0,\"coords\":\"pp=1\"}");
  json = ProtoToJson(ref, /*pretty=*/true);
  ASSERT_TRUE(json.ok());
  EXPECT_NE(json->find('\n'), std::string::npos);
  EXPECT_NE(json->back(), '\n');
}

}  // namespace
}  // namespace cli
}  // namespace tessera
