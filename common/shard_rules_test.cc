#include "common/shard_rules.h"

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

MeshLayout Mesh() {
  v1::Layout proto;
  for (auto [name, degree] : {std::pair<const char*, uint32_t>{"tp", 2}, {"dp", 4}}) {
    v1::MeshDim* dim = proto.add_dims();
    dim->set_name(name);
    dim->set_degree(degree);
  }
  return MeshLayout::FromProto(proto).value();
}

// Rows 4..7 of an F32 [8, 6] parameter, a replica over dp.
v1::ShardDesc Param() {
  v1::ShardDesc s;
  s.set_fqn("layers.0.w");
  s.set_kind(v1::SHARD_KIND_PARAM);
  s.set_dtype(v1::DTYPE_F32);
  s.add_global_shape(8);
  s.add_global_shape(6);
  s.mutable_box()->add_offsets(4);
  s.mutable_box()->add_offsets(0);
  s.mutable_box()->add_lengths(4);
  s.mutable_box()->add_lengths(6);
  s.add_replicated_over("dp");
  s.set_nbytes(4 * 6 * 4);
  return s;
}

TEST(CheckShardForm, AWellFormedShard_ItsExtent) {
  ShardExtent extent;
  ASSERT_TRUE(CheckShardForm(Mesh(), Param(), &extent).ok());
  EXPECT_EQ(extent.box_elements, 24);
  EXPECT_EQ(extent.begin, 0);
  EXPECT_EQ(extent.end, 24);
  EXPECT_EQ(extent.replicated_mask, uint64_t{1} << 1);  // dp is dim 1

  v1::ShardDesc slice = Param();  // a distributed optimizer's slice of the box
  slice.set_kind(v1::SHARD_KIND_OPTIMIZER);
  slice.set_state_key("exp_avg");
  slice.clear_replicated_over();
  slice.mutable_flat_range()->set_begin(10);
  slice.mutable_flat_range()->set_end(16);
  slice.set_nbytes(6 * 4);
  ASSERT_TRUE(CheckShardForm(Mesh(), slice, &extent).ok());
  EXPECT_EQ(extent.begin, 10);
  EXPECT_EQ(extent.end, 16);
  EXPECT_EQ(extent.replicated_mask, 0u);
}

TEST(CheckShardForm, EachRuleBroken_InvalidArgumentWithItsReason) {
  struct Case {
    const char* rule;
    std::function<void(v1::ShardDesc*)> brk;
    std::string reason;
  };
  const std::vector<Case> cases = {
      {"fqn", [](v1::ShardDesc* s) { s->set_fqn("a#b"); }, "bad fqn: "},
      {"kind", [](v1::ShardDesc* s) { s->set_kind(v1::SHARD_KIND_UNSPECIFIED); },
       "kind 0 is not a shard kind"},
      {"dtype", [](v1::ShardDesc* s) { s->set_dtype(v1::DTYPE_UNSPECIFIED); },
       "dtype 0 is not known"},
      {"axes",
       [](v1::ShardDesc* s) {
         s->clear_global_shape();
         for (int i = 0; i < 65; ++i) s->add_global_shape(1);
       },
       "the tensor has 65 axes; at most 64 are supported"},
      {"box outside", [](v1::ShardDesc* s) { s->mutable_box()->set_offsets(0, 5); },
       "box [5:9, 0:6] is outside the tensor on axis 0 (size 8)"},
      {"box rank", [](v1::ShardDesc* s) { s->mutable_box()->mutable_offsets()->RemoveLast(); },
       "box has 1 offsets but 2 lengths"},
      {"flat range",
       [](v1::ShardDesc* s) {
         s->mutable_flat_range()->set_begin(20);
         s->mutable_flat_range()->set_end(30);
       },
       "flat range [20, 30) is not within the 24 elements of box [4:8, 0:6]"},
      {"state_key on a param", [](v1::ShardDesc* s) { s->set_state_key("exp_avg"); },
       "only optimizer shards have a state_key or state_absent"},
      {"optimizer without state_key", [](v1::ShardDesc* s) { s->set_kind(v1::SHARD_KIND_OPTIMIZER); },
       "optimizer shards need a state_key (or state_absent)"},
      {"absent with a state_key",
       [](v1::ShardDesc* s) {
         s->set_kind(v1::SHARD_KIND_OPTIMIZER);
         s->set_state_absent(true);
         s->set_state_key("exp_avg");
       },
       "absent optimizer state has an empty state_key"},
      {"extra not U8", [](v1::ShardDesc* s) { s->set_kind(v1::SHARD_KIND_EXTRA); },
       "extra shards must be U8, 1-d, and hold their whole tensor (no flat range)"},
      {"nbytes", [](v1::ShardDesc* s) { s->set_nbytes(95); },
       "nbytes is 95 but 24 F32 elements are 96"},
      {"absent with bytes",
       [](v1::ShardDesc* s) {
         s->set_kind(v1::SHARD_KIND_OPTIMIZER);
         s->set_state_absent(true);
       },
       "nbytes is 96 but absent state stages nothing (0)"},
      {"replicated_over", [](v1::ShardDesc* s) { s->add_replicated_over("pp"); },
       "replicated_over names \"pp\", which is not a dim of the mesh {tp, dp}"},
  };
  for (const Case& c : cases) {
    v1::ShardDesc s = Param();
    c.brk(&s);
    ShardExtent extent;
    absl::Status st = CheckShardForm(Mesh(), s, &extent);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << c.rule;
    EXPECT_THAT(std::string(st.message()), HasSubstr(c.reason)) << c.rule;
  }
}

TEST(CheckBoxAndRange, TheGeometryRulesAlone) {
  EXPECT_EQ(CheckBoxAndRange({4, 3}, {0, 0}, {4, 3}, std::nullopt).value(), 12);
  EXPECT_EQ(CheckBoxAndRange({}, {}, {}, std::nullopt).value(), 1);  // 0-d: one element
  absl::StatusOr<int64_t> reversed = CheckBoxAndRange({4, 3}, {0, 0}, {4, 3}, {{5, 4}});
  EXPECT_EQ(reversed.status().message(),
            "flat range [5, 4) is not within the 12 elements of box [0:4, 0:3]");
  EXPECT_FALSE(CheckBoxAndRange({4}, {-1}, {2}, std::nullopt).ok());
  EXPECT_FALSE(CheckBoxAndRange({int64_t{1} << 62, 8}, {0, 0}, {1, 1}, std::nullopt).ok())
      << "a shape whose volume overflows";
}

}  // namespace
}  // namespace tessera
