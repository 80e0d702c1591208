#include "agent/save/staging_layout.h"

#include <limits>

#include "common/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

v1::ShardDesc Shard(const std::string& fqn, uint64_t nbytes) {
  v1::ShardDesc s;
  s.set_fqn(fqn);
  s.set_dtype(v1::DTYPE_F32);
  s.set_nbytes(nbytes);
  return s;
}

v1::WriteItem Item(const std::string& key, int64_t elements) {
  v1::WriteItem w;
  w.set_key(key);
  w.set_dtype(v1::DTYPE_F32);
  w.set_nbytes(elements * 4);
  w.mutable_box()->add_offsets(0);
  w.mutable_box()->add_lengths(elements);
  return w;
}

void AddSource(v1::WriteItem& w, uint32_t rank, int32_t local, int64_t begin, int64_t end) {
  v1::ChunkSource* s = w.add_sources();
  s->set_rank(rank);
  s->set_local_shard(local);
  if (begin >= 0) {
    s->mutable_range()->set_begin(begin);
    s->mutable_range()->set_end(end);
  }
}

TEST(StagingLayoutTest, WrittenShardsStagedInPlace_OthersAfterTheDataSection) {
  google::protobuf::RepeatedPtrField<v1::ShardDesc> shards;
  *shards.Add() = Shard("a", 400);   // written
  *shards.Add() = Shard("b", 100);   // replica: hashed only
  *shards.Add() = Shard("c", 40);    // slice sent to a leader
  shards[2].set_kind(v1::SHARD_KIND_OPTIMIZER);
  shards[2].set_state_key("exp_avg");
  shards[2].mutable_box()->add_offsets(8);
  shards[2].mutable_box()->add_lengths(16);
  v1::RankAssignment a;
  a.set_file("data-00000.safetensors");
  v1::WriteItem* w = a.add_writes();
  *w = Item("a", 100);
  AddSource(*w, 0, 0, -1, -1);
  v1::HashItem* h = a.add_hashes();
  h->set_local_shard(1);
  h->set_chunk(7);
  v1::GatherSend* g = a.add_sends();
  g->set_local_shard(2);
  g->set_leader_rank(3);
  g->mutable_range()->set_begin(10);
  g->mutable_range()->set_end(20);

  absl::StatusOr<StagingLayout> layout = ComputeStagingLayout(a, shards, 0);
  ASSERT_TRUE(layout.ok()) << layout.status();
  ASSERT_TRUE(layout->file.has_value());
  EXPECT_EQ(layout->shards[0].offset, layout->file->items[0].staging_offset);
  EXPECT_EQ(layout->shards[0].nbytes, 400u);
  EXPECT_GE(layout->shards[1].offset, layout->file->data_size);
  EXPECT_EQ(layout->shards[1].offset % kDataAlignment, 0u);
  EXPECT_GT(layout->shards[2].offset, layout->shards[1].offset);
  EXPECT_EQ(layout->shards[2].offset % kDataAlignment, 0u);
  ASSERT_EQ(layout->hashes.size(), 1u);
  EXPECT_EQ(layout->hashes[0].chunk, 7u);  // reported back as ReplicaHash.chunk
  EXPECT_EQ(layout->hashes[0].range.offset, layout->shards[1].offset);
  ASSERT_EQ(layout->sends.size(), 1u);
  EXPECT_EQ(layout->sends[0].peer, 3u);
  EXPECT_EQ(layout->sends[0].begin, 10);
  // A send names its local shard: key and box are the shard's.
  EXPECT_EQ(layout->sends[0].key, "c#exp_avg");
  EXPECT_EQ(layout->sends[0].box.offsets(0), 8);
  EXPECT_EQ(layout->sends[0].box.lengths(0), 16);
  EXPECT_GE(layout->total_bytes, layout->shards[2].offset + 40);
  // What a trainer can reserve before the plan (ReserveStaging) covers this layout.
  EXPECT_GE(StagingBytesBound(400 + 100 + 40, 3), layout->total_bytes);
}

TEST(StagingLayoutTest, StagingBytesBound_EachTensorAlignedAtLeastOneUnitSaturates) {
  EXPECT_EQ(StagingBytesBound(0, 0), kDataAlignment);
  EXPECT_EQ(StagingBytesBound(1, 1), kDataAlignment);
  EXPECT_EQ(StagingBytesBound(kDataAlignment + 1, 2), 3 * kDataAlignment);
  // An upper bound: tensors already aligned get up to one unit each they do not need.
  EXPECT_EQ(StagingBytesBound(10 * kDataAlignment, 10), 20 * kDataAlignment);
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  EXPECT_EQ(StagingBytesBound(kMax - 10, 1), kMax);
  EXPECT_EQ(StagingBytesBound(1, kMax / 2), kMax);
}

TEST(StagingLayoutTest, ReservedStagingBytes_OwnBytesPlusPeersSlices) {
  // 3 tensors of 1,000 bytes in all, and room for 5,000 bytes of DP peers' slices.
  EXPECT_EQ(*ReservedStagingBytes(1000, 5000, 3), StagingBytesBound(6000, 3));
  EXPECT_EQ(*ReservedStagingBytes(1000, 0, 3), StagingBytesBound(1000, 3));
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  EXPECT_EQ(*ReservedStagingBytes(kMax - 10, kMax - 10, 1), kMax);
  absl::StatusOr<uint64_t> nothing = ReservedStagingBytes(0, 5000, 3);
  EXPECT_EQ(nothing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(nothing.status().message(), ::testing::HasSubstr("bytes is 0"));
}

TEST(StagingLayoutTest, GatheredChunk_OwnSliceInPlace_PeerSlicesReceivedInPlace) {
  google::protobuf::RepeatedPtrField<v1::ShardDesc> shards;
  *shards.Add() = Shard("m#exp_avg", 30 * 4);  // elements [30, 60) of a 100-element box
  v1::RankAssignment a;
  a.set_file("data-00001.safetensors");
  v1::WriteItem* w = a.add_writes();
  *w = Item("m#exp_avg", 100);
  AddSource(*w, 0, 0, 0, 30);
  AddSource(*w, 1, 0, 30, 60);  // this rank
  AddSource(*w, 2, 0, 60, 100);

  absl::StatusOr<StagingLayout> layout = ComputeStagingLayout(a, shards, 1);
  ASSERT_TRUE(layout.ok()) << layout.status();
  const uint64_t base = layout->file->items[0].staging_offset;
  EXPECT_EQ(layout->shards[0].offset, base + 30 * 4);
  ASSERT_EQ(layout->recvs.size(), 2u);
  EXPECT_EQ(layout->recvs[0].peer, 0u);
  EXPECT_EQ(layout->recvs[0].range.offset, base);
  EXPECT_EQ(layout->recvs[0].range.nbytes, 120u);
  EXPECT_EQ(layout->recvs[1].peer, 2u);
  EXPECT_EQ(layout->recvs[1].range.offset, base + 60 * 4);
  EXPECT_EQ(layout->recvs[1].range.nbytes, 160u);
}

TEST(StagingLayoutTest, AbsentAndEmptyShards_NeedNoSlot) {
  google::protobuf::RepeatedPtrField<v1::ShardDesc> shards;
  v1::ShardDesc absent = Shard("w", 0);
  absent.set_state_absent(true);
  *shards.Add() = absent;
  *shards.Add() = Shard("empty", 0);
  absl::StatusOr<StagingLayout> layout = ComputeStagingLayout(v1::RankAssignment(), shards, 0);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_FALSE(layout->file.has_value());
  EXPECT_EQ(layout->shards[0].nbytes, 0u);
  EXPECT_EQ(layout->shards[1].nbytes, 0u);
  EXPECT_EQ(layout->total_bytes, kDataAlignment);
}

TEST(StagingLayoutTest, BadAssignments_Rejected) {
  google::protobuf::RepeatedPtrField<v1::ShardDesc> shards;
  *shards.Add() = Shard("a", 400);
  // Shard left unplaced.
  EXPECT_EQ(ComputeStagingLayout(v1::RankAssignment(), shards, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Index out of range.
  v1::RankAssignment out_of_range;
  out_of_range.add_hashes()->set_local_shard(5);
  EXPECT_EQ(ComputeStagingLayout(out_of_range, shards, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Size mismatch between the chunk's source and the shard.
  v1::RankAssignment mismatch;
  v1::WriteItem* w = mismatch.add_writes();
  *w = Item("a", 50);
  AddSource(*w, 0, 0, -1, -1);
  EXPECT_EQ(ComputeStagingLayout(mismatch, shards, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Placed twice.
  v1::RankAssignment twice;
  w = twice.add_writes();
  *w = Item("a", 100);
  AddSource(*w, 0, 0, -1, -1);
  twice.add_hashes()->set_local_shard(0);
  EXPECT_EQ(ComputeStagingLayout(twice, shards, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tessera
