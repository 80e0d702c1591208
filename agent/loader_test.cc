#include "agent/loader.h"

#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/staging_pool.h"
#include "storage/posix_storage.h"
#include "storage/storage.h"
#include "common/box.h"
#include "common/ids.h"
#include "common/status.h"
#include "format/test_checkpoint.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using testing_checkpoint::GridChunks;
using testing_checkpoint::MakeTempDir;
using testing_checkpoint::RandomTensor;
using testing_checkpoint::Reference;
using testing_checkpoint::TestTensor;

v1::ShardDesc Shard(const TestTensor& t, const Box& box) {
  v1::ShardDesc shard;
  shard.set_fqn(t.fqn);
  shard.set_kind(t.kind);
  shard.set_dtype(t.dtype);
  for (int64_t d : t.shape) shard.add_global_shape(d);
  *shard.mutable_box() = BoxToProto(box);
  shard.set_nbytes(Reference(t, box).size());
  return shard;
}

// A checkpoint of one 256 x 1024 F32 tensor saved as two row chunks (4 KiB blocks), loaded
// through the agent's Loader onto other row blocks and a column half: the bytes in the staging
// region the reply names match, with reads bypassing the page cache and a staging pool that
// does not pre-fault its regions (as the agent's load pool).
class LoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    job_dir_ = MakeTempDir("loader_test");
    ASSERT_FALSE(job_dir_.empty());
    tensor_ = RandomTensor("w", v1::DTYPE_F32, {256, 1024}, 5);
    tensor_.chunks = GridChunks(tensor_.shape, {2, 1}, 1);
    const std::string dir = JoinPath(job_dir_, StepDirName(7));
    ASSERT_TRUE(storage_.CreateDirs(dir).ok());
    testing_checkpoint::TestCheckpointOptions options;
    options.block_size = 4096;
    options.step = 7;
    ASSERT_TRUE(testing_checkpoint::WriteTestCheckpoint(storage_, dir, {tensor_}, options).ok());

    StagingPoolOptions pool_options;
    pool_options.job_id = absl::StrCat("loader_test.", getpid());
    pool_options.pin = false;
    pool_options.populate = false;
    pool_options.budget_bytes = 64 << 20;
    absl::StatusOr<std::unique_ptr<StagingPool>> pool = StagingPool::Create(pool_options);
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = *std::move(pool);
  }

  // Loads `boxes` of the tensor at step 7 and checks every slot against the reference.
  std::string LoadAndCheck(Loader& loader, const std::vector<Box>& boxes) {
    v1::LoadRequest request;
    request.set_step(7);
    for (const Box& box : boxes) *request.add_shards() = Shard(tensor_, box);
    absl::StatusOr<v1::LoadResponse> response = loader.Load(request);
    EXPECT_TRUE(response.ok()) << response.status();
    if (!response.ok()) return "";
    EXPECT_EQ(response->step(), 7);
    absl::StatusOr<std::unique_ptr<MappedStaging>> mapped =
        MapStaging(response->shm_name(), response->shm_size());
    EXPECT_TRUE(mapped.ok()) << mapped.status();
    if (!mapped.ok()) return "";
    EXPECT_EQ(response->slots_size(), static_cast<int>(boxes.size()));
    for (int i = 0; i < response->slots_size() && i < static_cast<int>(boxes.size()); ++i) {
      const std::string want = Reference(tensor_, boxes[i]);
      const v1::StagingSlot& slot = response->slots(i);
      EXPECT_EQ(slot.offset() % kDirectIoAlignment, 0u);
      EXPECT_EQ(slot.nbytes(), want.size());
      if (slot.nbytes() != want.size()) continue;
      EXPECT_TRUE(std::memcmp(static_cast<const char*>((*mapped)->data()) + slot.offset(),
                              want.data(), want.size()) == 0)
          << "slot " << i << " " << BoxToString(boxes[i]);
    }
    return response->load_id();
  }

  PosixStorage storage_;
  std::string job_dir_;
  TestTensor tensor_;
  std::unique_ptr<StagingPool> pool_;
};

TEST_F(LoaderTest, Load_ReshardedRowsAndColumns_StagingMatchesThenReleased) {
  Loader loader(&storage_, pool_.get(), /*rank=*/0);
  loader.SetJobDir(job_dir_);
  const std::vector<Box> boxes = {
      Box{{64, 0}, {128, 1024}},   // across both chunks, in place
      Box{{0, 512}, {256, 512}},   // a column half, through the reader's bounce buffer
      Box{{255, 0}, {1, 1024}},    // the last row: the tail of the data file
  };
  const std::string first = LoadAndCheck(loader, boxes);
  ASSERT_FALSE(first.empty());
  EXPECT_GT(pool_->mapped_bytes(), 0u);
  loader.Release(first);
  loader.Release(first);  // idempotent

  // A second load waits for the background release of the first, then stages afresh.
  const std::string second = LoadAndCheck(loader, {Box{{0, 0}, {256, 1024}}});
  ASSERT_FALSE(second.empty());
  EXPECT_NE(second, first);
  EXPECT_EQ(pool_->mapped_bytes(), 1u << 20);
  loader.Release("load-unknown");  // ignored
  EXPECT_EQ(pool_->mapped_bytes(), 1u << 20);
  loader.Release(second);
  // Destroying the loader waits for the release; the pool then holds nothing.
}

TEST_F(LoaderTest, ReleaseThenDestroy_RegionFreed) {
  {
    Loader loader(&storage_, pool_.get(), /*rank=*/0);
    loader.SetJobDir(job_dir_);
    const std::string id = LoadAndCheck(loader, {Box{{0, 0}, {256, 1024}}});
    ASSERT_FALSE(id.empty());
    loader.Release(id);
  }
  EXPECT_EQ(pool_->mapped_bytes(), 0u);
}

TEST_F(LoaderTest, Load_BeforeJobDir_FailedPrecondition) {
  Loader loader(&storage_, pool_.get(), /*rank=*/0);
  v1::LoadRequest request;
  request.set_step(7);
  *request.add_shards() = Shard(tensor_, Box{{0, 0}, {1, 1024}});
  EXPECT_EQ(loader.Load(request).status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace tessera
