#include "client/staging_estimate.h"

#include <cstdint>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace tessera {
namespace {

// A distributed-optimizer slice [first, second) of a 1-d fp32 box of `box` elements.
TensorRef Slice(int64_t box, int64_t first, int64_t second) {
  TensorRef t;
  t.fqn = "w";
  t.kind = v1::SHARD_KIND_OPTIMIZER;
  t.state_key = "exp_avg";
  t.dtype = v1::DTYPE_F32;
  t.global_shape = {box};
  t.flat_range = std::make_pair(first, second);
  t.nbytes = static_cast<size_t>(second - first) * 4;
  return t;
}

TensorRef Whole(int64_t elements) {
  TensorRef t;
  t.fqn = "p";
  t.dtype = v1::DTYPE_BF16;
  t.global_shape = {elements};
  t.nbytes = static_cast<size_t>(elements) * 2;
  return t;
}

TEST(DeclareStagingTest, NoSlices_OwnBytesOnly) {
  const std::vector<TensorRef> tensors = {Whole(1000), Whole(24)};
  const StagingDeclaration d = DeclareStaging(tensors);
  EXPECT_EQ(d.bytes, 2048u);
  EXPECT_EQ(d.tensors, 2u);
  EXPECT_EQ(d.gather_bytes, 0u);
}

// Two DP ranks: a leader receives the other half, and the estimate is all of it.
TEST(DeclareStagingTest, TwoDpRanks_TheWholeOtherHalf) {
  const std::vector<TensorRef> tensors = {Slice(1000, 0, 500), Slice(64, 32, 64)};
  EXPECT_EQ(DeclareStaging(tensors).gather_bytes, (500u + 32u) * 4);
}

// Four DP ranks: twice the balanced share of the other three quarters (3/8 of the box), not
// all of them.
TEST(DeclareStagingTest, FourDpRanks_TwiceTheBalancedShare) {
  const std::vector<TensorRef> tensors = {Slice(1024, 256, 512)};
  EXPECT_EQ(DeclareStaging(tensors).gather_bytes, 384u * 4);
}

// An uneven split: a rank holding most of a box is capped at what its peers hold.
TEST(DeclareStagingTest, LargeSlice_CappedAtThePeersBytes) {
  const std::vector<TensorRef> tensors = {Slice(100, 0, 90)};
  EXPECT_EQ(DeclareStaging(tensors).gather_bytes, 10u * 4);
}

// A box of a larger tensor (TP-sharded, then DP-sliced): the box counts, not the tensor.
TEST(DeclareStagingTest, SliceOfABox_TheBoxCounts) {
  TensorRef t = Slice(0, 0, 0);
  t.global_shape = {8, 100};
  t.box.offsets = {4, 0};
  t.box.lengths = {4, 100};  // 400 elements
  t.flat_range = std::make_pair(int64_t{200}, int64_t{400});
  t.nbytes = 200 * 4;
  EXPECT_EQ(DeclareStaging({t}).gather_bytes, 200u * 4);
}

TEST(DeclareStagingTest, AbsentStateAndMalformedRanges_AddNothing) {
  TensorRef absent = Slice(100, 0, 50);
  absent.state_absent = true;
  absent.state_key.clear();
  absent.nbytes = 0;
  TensorRef outside = Slice(100, 50, 150);  // beyond the box: DescribeShards refuses it
  const StagingDeclaration d = DeclareStaging({absent, outside});
  EXPECT_EQ(d.tensors, 1u);
  EXPECT_EQ(d.bytes, 400u);
  EXPECT_EQ(d.gather_bytes, 0u);
}

}  // namespace
}  // namespace tessera
