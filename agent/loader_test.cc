#include "agent/loader.h"

#include <unistd.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "agent/memory_tier.h"
#include "agent/staging_pool.h"
#include "common/box.h"
#include "common/checksum.h"
#include "common/ids.h"
#include "common/status.h"
#include "format/manifest_io.h"
#include "format/test_checkpoint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shm/mapped_region.h"
#include "storage/posix_storage.h"
#include "storage/storage.h"
#include "storage/testing.h"

namespace tessera {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing_checkpoint::GridChunks;
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
      Box{{64, 0}, {128, 1024}},  // across both chunks, in place
      Box{{0, 512}, {256, 512}},  // a column half, through the reader's bounce buffer
      Box{{255, 0}, {1, 1024}},   // the last row: the tail of the data file
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

TEST_F(LoaderTest, Load_RegionReservedInChunksAheadOfTheReads_EveryByteRight) {
  LoaderOptions options;
  options.reserve_chunk_bytes = 64 << 10;  // 1 MiB of reads behind sixteen chunks
  Loader loader(&storage_, pool_.get(), /*rank=*/0, options);
  loader.SetJobDir(job_dir_);
  std::vector<Box> boxes;
  for (int64_t row = 0; row < 256; row += 16) boxes.push_back(Box{{row, 0}, {16, 1024}});
  boxes.push_back(Box{{3, 100}, {7, 300}});  // and a piece read through a bounce buffer
  const std::string id = LoadAndCheck(loader, boxes);
  ASSERT_FALSE(id.empty());
  loader.Release(id);
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

// The memory tier: the agent still holds the checkpoint's data files (here: read into a
// resident region of a save pool, as a committed save leaves them).
class LoaderMemoryTierTest : public LoaderTest {
 protected:
  void SetUp() override {
    LoaderTest::SetUp();
    const std::string dir = JoinPath(job_dir_, StepDirName(7));
    absl::StatusOr<v1::Manifest> manifest = ReadManifest(storage_, dir);
    ASSERT_TRUE(manifest.ok()) << manifest.status();
    file_ = manifest->tensors(0).chunks(0).file();
    for (const v1::ChunkEntry& c : manifest->tensors(0).chunks()) ASSERT_EQ(c.file(), file_);
    session_id_ = manifest->session_id();
    manifest_ = *manifest;
    first_chunk_offset_ = manifest->tensors(0).chunks(0).offset();
    std::ifstream in(JoinPath(dir, file_), std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), {});

    StagingPoolOptions options;
    options.job_id = absl::StrCat("loader_tier_test.", getpid());
    options.pin = false;
    options.budget_bytes = 64 << 20;
    absl::StatusOr<std::unique_ptr<StagingPool>> pool = StagingPool::Create(options);
    ASSERT_TRUE(pool.ok()) << pool.status();
    save_pool_ = *std::move(pool);
    absl::StatusOr<std::vector<StagingSlot>> slots = save_pool_->Acquire({bytes.size()});
    ASSERT_TRUE(slots.ok()) << slots.status();
    memcpy((*slots)[0].data, bytes.data(), bytes.size());
    std::vector<ResidentRegion> regions = save_pool_->Retain((*slots)[0].acquisition);
    ASSERT_EQ(regions.size(), 1u);
    region_ = regions[0];
    file_size_ = bytes.size();
  }

  // `nbytes`: how much of the file, from its start, the region holds (0: all of it).
  void Publish(const std::string& session_id, uint64_t nbytes = 0) {
    memory_.Publish(
        ResidentCheckpoint{7, session_id, file_, 0, nbytes > 0 ? nbytes : file_size_, region_});
  }

  // The coordinator's answer: rank 1 on `node` holds the file in the region.
  std::vector<v1::MemoryCopy> PeerCopy(const std::string& node) const {
    v1::MemoryCopy copy;
    copy.set_step(7);
    copy.set_session_id(session_id_);
    copy.set_file(file_);
    copy.set_file_offset(0);
    copy.set_nbytes(file_size_);
    copy.set_region(region_.name);
    copy.set_rank(1);
    copy.set_node_id(node);
    return {copy};
  }

  // A load of `box` of the tensor at step 7.
  v1::LoadRequest Request(const Box& box) const {
    v1::LoadRequest request;
    request.set_step(7);
    *request.add_shards() = Shard(tensor_, box);
    return request;
  }

  // Loads `box` of the tensor, checks the bytes where the reply's slot says, and returns the
  // reply. The trainer's mapping is read-only, as the client maps a load region.
  v1::LoadResponse LoadAll(LoaderOptions options = {}, const Box& box = Box{{0, 0}, {256, 1024}}) {
    if (options.memory == nullptr && !options.find_copies) options.memory = &memory_;
    Loader loader(&storage_, pool_.get(), /*rank=*/0, options);
    loader.SetJobDir(job_dir_);
    absl::StatusOr<v1::LoadResponse> response = loader.Load(Request(box));
    EXPECT_TRUE(response.ok()) << response.status();
    if (!response.ok()) return {};
    MapStagingOptions read_only;
    read_only.read_only = true;
    absl::StatusOr<std::unique_ptr<MappedStaging>> mapped =
        MappedStaging::Map(response->shm_name(), response->shm_size(), read_only);
    EXPECT_TRUE(mapped.ok()) << mapped.status();
    const std::string want = Reference(tensor_, box);
    EXPECT_EQ(response->slots_size(), 1);
    if (mapped.ok() && response->slots_size() == 1) {
      EXPECT_EQ(response->slots(0).nbytes(), want.size());
      EXPECT_EQ(
          std::memcmp(static_cast<const char*>((*mapped)->data()) + response->slots(0).offset(),
                      want.data(), want.size()),
          0);
    }
    loader.Release(response->load_id());
    return *response;
  }

  static constexpr uint64_t kTensorBytes = 256 * 1024 * 4;
  MemoryTier memory_;
  std::unique_ptr<StagingPool> save_pool_;
  ResidentRegion region_;
  std::string file_;
  std::string session_id_;
  v1::Manifest manifest_;  // of step 7
  uint64_t file_size_ = 0;
  uint64_t first_chunk_offset_ = 0;
};

TEST_F(LoaderMemoryTierTest, Load_CheckpointResident_ServedInPlaceFromTheResidentRegion) {
  Publish(session_id_);
  const v1::LoadResponse response = LoadAll();
  // The trainer is handed the resident region itself: no load region is made.
  EXPECT_EQ(response.shm_name(), region_.name);
  EXPECT_EQ(response.shm_size(), region_.capacity);
  ASSERT_EQ(response.slots_size(), 1);
  EXPECT_EQ(response.slots(0).offset(), first_chunk_offset_);
  EXPECT_EQ(pool_->regions_created(), 0u);
  EXPECT_EQ(response.bytes_from_memory(), kTensorBytes);
  EXPECT_EQ(response.bytes_from_disk(), 0u);
  EXPECT_EQ(response.memory_blocks_rejected(), 0u);
}

TEST_F(LoaderMemoryTierTest, Load_RowsAcrossBothChunks_InPlaceWhereTheFileHasThemInARow) {
  Publish(session_id_);
  const Box rows{{64, 0}, {128, 1024}};  // the second half of chunk 0, the first of chunk 1
  const v1::LoadResponse response = LoadAll({}, rows);
  EXPECT_EQ(response.shm_name(), region_.name);
  EXPECT_EQ(response.slots(0).offset(), first_chunk_offset_ + 64 * 1024 * 4);
  EXPECT_EQ(pool_->regions_created(), 0u);
  EXPECT_EQ(response.bytes_from_memory(), 128u * 1024 * 4);
}

TEST_F(LoaderMemoryTierTest, Load_ResidentRegionHandedOut_NoSaveWritesItUntilReleased) {
  Publish(session_id_);
  LoaderOptions options;
  options.memory = &memory_;
  Loader loader(&storage_, pool_.get(), /*rank=*/0, options);
  loader.SetJobDir(job_dir_);
  absl::StatusOr<v1::LoadResponse> response = loader.Load(Request(Box{{0, 0}, {256, 1024}}));
  ASSERT_TRUE(response.ok()) << response.status();
  ASSERT_EQ(response->shm_name(), region_.name);
  // A save retains a new region: the handed-out one becomes the next save's set...
  absl::StatusOr<std::vector<StagingSlot>> next = save_pool_->Acquire({file_size_});
  ASSERT_TRUE(next.ok()) << next.status();
  ASSERT_EQ(save_pool_->Retain((*next)[0].acquisition).size(), 1u);
  // ...but while the trainer reads it, the save after stages in another one.
  absl::StatusOr<std::vector<StagingSlot>> during = save_pool_->Acquire({file_size_});
  ASSERT_TRUE(during.ok()) << during.status();
  EXPECT_NE((*during)[0].name, region_.name);
  const std::string want = Reference(tensor_, Box{{0, 0}, {256, 1024}});
  EXPECT_EQ(std::memcmp(region_.data + response->slots(0).offset(), want.data(), want.size()), 0);
}

TEST_F(LoaderMemoryTierTest, Load_FlippedByteInMemory_CopiedWithThatBlockFromDisk) {
  Publish(session_id_);
  // A byte of the first chunk's second 4 KiB block (its body starts 4 KiB-aligned).
  const_cast<char*>(region_.data)[first_chunk_offset_ + 4096 + 10] ^= 0x5a;
  const v1::LoadResponse response = LoadAll();
  // Not handed out: copied into a load region, the bad block read from the file.
  EXPECT_NE(response.shm_name(), region_.name);
  EXPECT_EQ(pool_->regions_created(), 1u);
  EXPECT_EQ(response.memory_blocks_rejected(), 1u);
  EXPECT_EQ(response.bytes_from_disk(), 4096u);
  EXPECT_EQ(response.bytes_from_memory(), kTensorBytes - 4096u);
}

TEST_F(LoaderMemoryTierTest, Load_ClientVerifies_InPlaceWithItsBlocksListedUnread) {
  Publish(session_id_);
  // The agent does not read the region: a flipped byte does not stop it handing it out, and
  // the listed checksum of that block shows the client the mismatch.
  const uint64_t flipped = first_chunk_offset_ + 4096 + 10;
  const_cast<char*>(region_.data)[flipped] ^= 0x5a;
  Loader loader(&storage_, pool_.get(), /*rank=*/0, LoaderOptions{&memory_});
  loader.SetJobDir(job_dir_);
  v1::LoadRequest request = Request(Box{{0, 0}, {256, 1024}});
  request.set_client_verifies(true);
  absl::StatusOr<v1::LoadResponse> response = loader.Load(request);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->shm_name(), region_.name);
  EXPECT_EQ(pool_->regions_created(), 0u);
  EXPECT_EQ(response->memory_blocks_rejected(), 0u);
  EXPECT_EQ(response->bytes_from_memory(), kTensorBytes);
  // Both chunks' 4 KiB blocks, in region order, covering the slot exactly.
  ASSERT_EQ(response->unverified_blocks_size(), static_cast<int>(kTensorBytes / 4096));
  uint64_t at = response->slots(0).offset();
  std::vector<uint64_t> mismatched;
  for (const v1::BlockCheck& block : response->unverified_blocks()) {
    EXPECT_EQ(block.offset(), at);
    EXPECT_EQ(block.length(), 4096u);
    at = block.offset() + block.length();
    if (Xxh3(region_.data + block.offset(), block.length()) != block.xxh3()) {
      mismatched.push_back(block.offset());
    }
  }
  EXPECT_EQ(at, response->slots(0).offset() + kTensorBytes);
  EXPECT_THAT(mismatched, ElementsAre(first_chunk_offset_ + 4096));
  loader.Release(response->load_id());
}

TEST_F(LoaderMemoryTierTest, ResidentBlocks_ListedAheadAsAnInPlaceLoadListsThem) {
  Publish(session_id_);
  Loader loader(&storage_, pool_.get(), /*rank=*/0, LoaderOptions{&memory_});
  loader.SetJobDir(job_dir_);
  absl::StatusOr<v1::ListResidentBlocksResponse> listed = loader.ResidentBlocks();
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(listed->shm_name(), region_.name);
  EXPECT_EQ(listed->step(), 7);
  // The whole tensor's load, served in place, lists the same blocks: a client that checked
  // them ahead finds each one it is handed.
  v1::LoadRequest request = Request(Box{{0, 0}, {256, 1024}});
  request.set_client_verifies(true);
  absl::StatusOr<v1::LoadResponse> response = loader.Load(request);
  ASSERT_TRUE(response.ok()) << response.status();
  ASSERT_EQ(response->unverified_blocks_size(), listed->blocks_size());
  for (int b = 0; b < listed->blocks_size(); ++b) {
    EXPECT_EQ(listed->blocks(b).offset(), response->unverified_blocks(b).offset()) << b;
    EXPECT_EQ(listed->blocks(b).length(), response->unverified_blocks(b).length()) << b;
    EXPECT_EQ(listed->blocks(b).xxh3(), response->unverified_blocks(b).xxh3()) << b;
    EXPECT_EQ(Xxh3(region_.data + listed->blocks(b).offset(), listed->blocks(b).length()),
              listed->blocks(b).xxh3())
        << b;
  }
  loader.Release(response->load_id());
}

TEST_F(LoaderMemoryTierTest, ResidentBlocks_NothingResidentOrAnotherSession_NotFound) {
  Loader loader(&storage_, pool_.get(), /*rank=*/0, LoaderOptions{&memory_});
  loader.SetJobDir(job_dir_);
  EXPECT_EQ(loader.ResidentBlocks().status().code(), absl::StatusCode::kNotFound);
  Publish("another-session");
  absl::Status other = loader.ResidentBlocks().status();
  EXPECT_EQ(other.code(), absl::StatusCode::kNotFound) << other;
  EXPECT_THAT(other.message(), HasSubstr("another-session"));
}

TEST_F(LoaderMemoryTierTest, Load_ClientVerifiesButCopied_AgentVerifiesNoBlocksListed) {
  Publish(session_id_);
  Loader loader(&storage_, pool_.get(), /*rank=*/0, LoaderOptions{&memory_});
  loader.SetJobDir(job_dir_);
  // A column half is not one run of the file: copied, and verified here as it is copied.
  v1::LoadRequest request = Request(Box{{0, 512}, {256, 512}});
  request.set_client_verifies(true);
  absl::StatusOr<v1::LoadResponse> response = loader.Load(request);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_NE(response->shm_name(), region_.name);
  EXPECT_EQ(response->unverified_blocks_size(), 0);
  EXPECT_EQ(response->bytes_from_memory(), kTensorBytes);
  loader.Release(response->load_id());
}

TEST_F(LoaderMemoryTierTest, Load_ColumnHalf_CopiedFromMemory) {
  Publish(session_id_);
  // Not one run of the file: each row's half lies apart from the next.
  const v1::LoadResponse response = LoadAll({}, Box{{0, 512}, {256, 512}});
  EXPECT_NE(response.shm_name(), region_.name);
  EXPECT_EQ(pool_->regions_created(), 1u);
  EXPECT_EQ(response.bytes_from_memory(), kTensorBytes);  // whole blocks, verified
  EXPECT_EQ(response.bytes_from_disk(), 0u);
}

TEST_F(LoaderMemoryTierTest, Load_RegionHoldsPartOfTheNeededBytes_CopiedRestFromDisk) {
  // The region holds the file up to the end of chunk 0 only.
  Publish(session_id_, first_chunk_offset_ + kTensorBytes / 2);
  const v1::LoadResponse response = LoadAll();
  EXPECT_NE(response.shm_name(), region_.name);
  EXPECT_EQ(pool_->regions_created(), 1u);
  EXPECT_EQ(response.bytes_from_memory(), kTensorBytes / 2);
  EXPECT_EQ(response.bytes_from_disk(), kTensorBytes / 2);
  EXPECT_EQ(response.memory_blocks_rejected(), 0u);

  // What the region does hold is served in place.
  const v1::LoadResponse first_half = LoadAll({}, Box{{0, 0}, {128, 1024}});
  EXPECT_EQ(first_half.shm_name(), region_.name);
  EXPECT_EQ(first_half.bytes_from_memory(), kTensorBytes / 2);
}

TEST_F(LoaderMemoryTierTest, Load_ResidentCopyOfAnotherSession_EveryByteFromDisk) {
  Publish("another-session");
  const v1::LoadResponse response = LoadAll();
  EXPECT_EQ(response.bytes_from_memory(), 0u);
  EXPECT_EQ(response.bytes_from_disk(), kTensorBytes);
}

TEST_F(LoaderMemoryTierTest, Load_ResidentRegionDropped_EveryByteFromDisk) {
  Publish(session_id_);
  save_pool_->ReleaseAll();  // as when a save needs the room
  const v1::LoadResponse response = LoadAll();
  EXPECT_EQ(response.bytes_from_memory(), 0u);
  EXPECT_EQ(response.bytes_from_disk(), kTensorBytes);
}

TEST_F(LoaderMemoryTierTest, Load_HeldByAPeerOnThisNode_EveryByteFromItsMemory) {
  LoaderOptions options;
  options.node_id = "node-a";
  int asked = 0;
  options.find_copies = [&](int64_t step, const std::string& session,
                            const std::vector<std::string>& files,
                            bool memory_only) -> absl::StatusOr<std::vector<v1::MemoryCopy>> {
    ++asked;
    EXPECT_EQ(step, 7);
    EXPECT_EQ(session, session_id_);
    // Only the files the load reads are asked for: here the one the tensor lies in.
    EXPECT_THAT(files, ElementsAre(PeerCopy("node-a")[0].file()));
    EXPECT_FALSE(memory_only);  // a checkpoint on disk
    return PeerCopy("node-a");
  };
  const v1::LoadResponse response = LoadAll(options);
  EXPECT_EQ(asked, 1);
  EXPECT_EQ(response.bytes_from_memory(), kTensorBytes);
  EXPECT_EQ(response.bytes_from_disk(), 0u);
}

TEST_F(LoaderMemoryTierTest, Load_PeerOnAnotherNodeOrCoordinatorDown_EveryByteFromDisk) {
  LoaderOptions options;
  options.node_id = "node-a";
  options.find_copies = [&](int64_t, const std::string&, const std::vector<std::string>&,
                            bool) -> absl::StatusOr<std::vector<v1::MemoryCopy>> {
    return PeerCopy("node-b");
  };
  EXPECT_EQ(LoadAll(options).bytes_from_disk(), kTensorBytes);

  options.find_copies = [&](int64_t, const std::string&, const std::vector<std::string>&,
                            bool) -> absl::StatusOr<std::vector<v1::MemoryCopy>> {
    return absl::UnavailableError("coordinator down");
  };
  EXPECT_EQ(LoadAll(options).bytes_from_disk(), kTensorBytes);

  // The peer's region is gone (its agent died): disk too.
  options.find_copies = [&](int64_t, const std::string&, const std::vector<std::string>&,
                            bool) -> absl::StatusOr<std::vector<v1::MemoryCopy>> {
    return PeerCopy("node-a");
  };
  save_pool_->ReleaseAll();
  region_ = ResidentRegion();
  EXPECT_EQ(LoadAll(options).bytes_from_disk(), kTensorBytes);
}

// A node that replaced a lost one: rank 1 on node-b holds the file; "fetching" copies the
// region's bytes, as ReadMemoryCopy would, and counts the fetches.
class LoaderFetchTest : public LoaderMemoryTierTest {
 protected:
  LoaderOptions FetchOptions() {
    LoaderOptions options;
    options.node_id = "node-a";
    options.find_copies = [this](int64_t, const std::string&, const std::vector<std::string>&,
                                 bool) -> absl::StatusOr<std::vector<v1::MemoryCopy>> {
      return RemoteCopy();
    };
    options.fetch_copy = [this](const v1::MemoryCopy& copy, char* dest) {
      ++fetches_;
      EXPECT_EQ(copy.nbytes(), file_size_);
      memcpy(dest, region_.data, copy.nbytes());
      if (flip_) dest[first_chunk_offset_ + 4096 + 10] ^= 0x5a;
      return absl::OkStatus();
    };
    return options;
  }

  // Rank 1's copy on node-b: the whole file, or from file offset `copy_from_`; with a bulk
  // port if `holder_bulk_` names one.
  std::vector<v1::MemoryCopy> RemoteCopy() const {
    std::vector<v1::MemoryCopy> copies = PeerCopy("node-b");
    copies[0].set_peer_address("node-b:7001");
    copies[0].set_bulk_address(holder_bulk_);
    copies[0].set_file_offset(copy_from_);
    copies[0].set_nbytes(file_size_ - copy_from_);
    return copies;
  }

  // A loader of rank 0 over the job directory `dir`.
  std::unique_ptr<Loader> NewLoader(const LoaderOptions& options, const std::string& dir) {
    auto loader = std::make_unique<Loader>(&storage_, pool_.get(), /*rank=*/0, options);
    loader->SetJobDir(dir);
    return loader;
  }

  // A loader of rank 0 for which step 7 is a memory-only commit: the coordinator gives its
  // manifest, and the job directory has no step directory.
  std::unique_ptr<Loader> NewMemoryOnlyLoader(LoaderOptions options) {
    options.memory_manifest = [this](int64_t) -> absl::StatusOr<v1::Manifest> {
      return manifest_;
    };
    const std::string dir = JoinPath(job_dir_, "memory-only-job");
    EXPECT_TRUE(storage_.CreateDirs(dir).ok());
    return NewLoader(options, dir);
  }

  // The whole tensor, for a trainer that checks what it copies and, with `fetches`, reads a
  // copy on another node itself.
  v1::LoadRequest TrainerRequest(bool fetches) const {
    v1::LoadRequest request = Request(Box{{0, 0}, {256, 1024}});
    request.set_client_verifies(true);
    request.set_client_fetches(fetches);
    return request;
  }

  int fetches_ = 0;
  bool flip_ = false;
  std::string holder_bulk_;
  uint64_t copy_from_ = 0;
};

TEST_F(LoaderFetchTest, Load_HeldOnAnotherNodeOnly_FetchedIntoTheLoadRegionAndServedThere) {
  const v1::LoadResponse response = LoadAll(FetchOptions());
  EXPECT_EQ(fetches_, 1);
  // One load region, holding the file's bytes where the file has them: the tensor's slot is
  // at its chunk's offset, not at 0 as a copied load's would be.
  EXPECT_EQ(pool_->regions_created(), 1u);
  ASSERT_EQ(response.slots_size(), 1);
  EXPECT_EQ(response.slots(0).offset(), first_chunk_offset_);
  EXPECT_EQ(response.bytes_fetched_from_peers(), file_size_);
  EXPECT_EQ(response.bytes_from_memory(), kTensorBytes);
  EXPECT_EQ(response.bytes_from_disk(), 0u);
}

TEST_F(LoaderFetchTest, Load_FetchedCopyWithAFlippedByte_ThatBlockReadFromDiskInPlace) {
  flip_ = true;
  const v1::LoadResponse response = LoadAll(FetchOptions());
  // Fetched once; the block that does not match is read from the file over the fetched bytes,
  // and the load is served from the fetched region (it used to be fetched a second time by
  // the copying path).
  EXPECT_EQ(fetches_, 1);
  EXPECT_EQ(pool_->regions_created(), 1u);
  ASSERT_EQ(response.slots_size(), 1);
  EXPECT_EQ(response.slots(0).offset(), first_chunk_offset_);
  EXPECT_EQ(response.memory_blocks_rejected(), 1u);
  EXPECT_EQ(response.bytes_from_disk(), 4096u);
  EXPECT_EQ(response.bytes_from_memory(), kTensorBytes - 4096u);
  EXPECT_EQ(response.bytes_fetched_from_peers(), file_size_);
}

TEST_F(LoaderFetchTest, Load_ClientVerifies_FetchedOnceBlocksListed) {
  flip_ = true;
  std::unique_ptr<Loader> loader = NewLoader(FetchOptions(), job_dir_);
  v1::LoadRequest request = TrainerRequest(/*fetches=*/false);
  absl::StatusOr<v1::LoadResponse> response = loader->Load(request);
  ASSERT_TRUE(response.ok()) << response.status();
  // Served from the fetched region unread: the flipped byte is the client's to find.
  EXPECT_EQ(fetches_, 1);
  EXPECT_EQ(response->slots(0).offset(), first_chunk_offset_);
  EXPECT_EQ(response->unverified_blocks_size(), static_cast<int>(kTensorBytes / 4096));
  EXPECT_EQ(response->memory_blocks_rejected(), 0u);
  loader->Release(response->load_id());

  // The client's retry once its check fails (Client::Load): fetched again, verified here, the
  // bad block read from the file over it; two fetches in all (it used to take three).
  request.set_client_verifies(false);
  response = loader->Load(request);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(fetches_, 2);
  EXPECT_EQ(response->slots(0).offset(), first_chunk_offset_);
  EXPECT_EQ(response->unverified_blocks_size(), 0);
  EXPECT_EQ(response->memory_blocks_rejected(), 1u);
  EXPECT_EQ(response->bytes_from_disk(), 4096u);
  loader->Release(response->load_id());
}

TEST_F(LoaderFetchTest, Load_ClientFetches_TheCopyNamedNothingReadNoRegion) {
  holder_bulk_ = "node-b:7002";
  LoaderOptions options = FetchOptions();
  options.job_id = "job-7";
  std::unique_ptr<Loader> loader = NewLoader(options, job_dir_);
  v1::LoadRequest request = TrainerRequest(/*fetches=*/true);
  absl::StatusOr<v1::LoadResponse> response = loader->Load(request);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(fetches_, 0);
  EXPECT_EQ(pool_->regions_created(), 0u);
  EXPECT_EQ(response->shm_name(), "");
  EXPECT_EQ(response->fetch().job_id(), "job-7");
  EXPECT_EQ(response->fetch().copy().bulk_address(), "node-b:7002");
  EXPECT_EQ(response->fetch().copy().file(), RemoteCopy()[0].file());
  EXPECT_EQ(response->shm_size(), file_size_);
  // Offsets from the copy's first byte, every block of the slot listed for the trainer.
  ASSERT_EQ(response->slots_size(), 1);
  EXPECT_EQ(response->slots(0).offset(), first_chunk_offset_);
  ASSERT_EQ(response->unverified_blocks_size(), static_cast<int>(kTensorBytes / 4096));
  EXPECT_EQ(response->unverified_blocks(0).offset(), first_chunk_offset_);
  // The trainer reads the blocks it checks, not the whole copy.
  EXPECT_EQ(response->bytes_fetched_from_peers(), kTensorBytes);
  EXPECT_EQ(response->bytes_from_memory(), kTensorBytes);
  EXPECT_EQ(response->bytes_from_disk(), 0u);
  loader->Release(response->load_id());

  // The trainer's retry when its fetch or check fails (Client::Load): the agent fetches.
  request.set_client_fetches(false);
  response = loader->Load(request);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(fetches_, 1);
  EXPECT_FALSE(response->has_fetch());
  EXPECT_EQ(pool_->regions_created(), 1u);
  loader->Release(response->load_id());
}

TEST_F(LoaderFetchTest, Load_ClientFetchesACopyFromAFileOffset_OffsetsFromTheCopysFirstByte) {
  // The holder's copy starts at the first chunk, not at the file's first byte: the slot and
  // the blocks are where those bytes lie in the copy, each block's XXH3 that of those bytes.
  holder_bulk_ = "node-b:7002";
  copy_from_ = first_chunk_offset_;
  std::unique_ptr<Loader> loader = NewLoader(FetchOptions(), job_dir_);
  absl::StatusOr<v1::LoadResponse> response = loader->Load(TrainerRequest(/*fetches=*/true));
  ASSERT_TRUE(response.ok()) << response.status();
  ASSERT_TRUE(response->has_fetch());
  EXPECT_EQ(response->shm_size(), file_size_ - first_chunk_offset_);
  ASSERT_EQ(response->slots_size(), 1);
  EXPECT_EQ(response->slots(0).offset(), 0u);
  ASSERT_EQ(response->unverified_blocks_size(), static_cast<int>(kTensorBytes / 4096));
  const char* copy = static_cast<const char*>(region_.data) + first_chunk_offset_;
  for (const v1::BlockCheck& block : response->unverified_blocks()) {
    ASSERT_LE(block.offset() + block.length(), response->shm_size());
    EXPECT_EQ(block.xxh3(), Xxh3(copy + block.offset(), block.length())) << block.offset();
  }
  EXPECT_EQ(response->unverified_blocks(0).offset(), 0u);
  loader->Release(response->load_id());
}

TEST_F(LoaderFetchTest, Load_AHolderTheTrainerCouldNotRead_NotTriedAgainTheFileReadInstead) {
  holder_bulk_ = "node-b:7002";
  std::unique_ptr<Loader> loader = NewLoader(FetchOptions(), job_dir_);
  v1::LoadRequest request = TrainerRequest(/*fetches=*/false);
  request.add_unreadable_holders("node-b:7002");
  absl::StatusOr<v1::LoadResponse> response = loader->Load(request);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(fetches_, 0);
  EXPECT_EQ(response->bytes_from_disk(), kTensorBytes);
  EXPECT_EQ(response->bytes_fetched_from_peers(), 0u);
  loader->Release(response->load_id());

  // Another holder's copy is still read.
  request.clear_unreadable_holders();
  request.add_unreadable_holders("node-c:7002");
  response = loader->Load(request);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(fetches_, 1);
  EXPECT_EQ(response->bytes_from_disk(), 0u);
  loader->Release(response->load_id());
}

TEST_F(LoaderFetchTest, Load_MemoryOnlyAndAHolderTheTrainerCouldNotRead_TriedAgain) {
  // Step 7 as a memory-only commit (no step directory in this job's dir): the holder may have
  // its only copy, so it is asked again.
  holder_bulk_ = "node-b:7002";
  LoaderOptions options = FetchOptions();
  std::unique_ptr<Loader> loader = NewMemoryOnlyLoader(options);
  v1::LoadRequest request = TrainerRequest(/*fetches=*/false);
  request.add_unreadable_holders("node-b:7002");
  absl::StatusOr<v1::LoadResponse> response = loader->Load(request);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_TRUE(response->memory_only());
  EXPECT_EQ(fetches_, 1);
  EXPECT_EQ(response->bytes_from_memory(), kTensorBytes);
  loader->Release(response->load_id());
}

TEST_F(LoaderFetchTest, Load_MemoryOnlyAndTheCoordinatorCannotSayWhereItsCopiesAre_Unavailable) {
  // Step 7 as a memory-only commit this agent holds nothing of; the coordinator gave its
  // manifest but cannot answer where the copies are (it restarted and this agent has not
  // registered again yet, or it is unreachable): the step is not lost, the load is retried.
  LoaderOptions options = FetchOptions();
  options.find_copies = [](int64_t, const std::string&, const std::vector<std::string>&,
                           bool memory_only) -> absl::StatusOr<std::vector<v1::MemoryCopy>> {
    EXPECT_TRUE(memory_only);  // the coordinator then gives no answer it may not know whole
    return absl::NotFoundError("job \"job\" has no agent of rank 0");
  };
  std::unique_ptr<Loader> loader = NewMemoryOnlyLoader(options);
  absl::StatusOr<v1::LoadResponse> response = loader->Load(TrainerRequest(/*fetches=*/false));
  ASSERT_EQ(response.status().code(), absl::StatusCode::kUnavailable) << response.status();
  EXPECT_NE(GetErrorCode(response.status()), v1::ERROR_CODE_MEMORY_COPY_LOST);
  EXPECT_NE(response.status().message().find("has no agent of rank 0"), std::string::npos)
      << response.status();
  EXPECT_EQ(fetches_, 0);
}

TEST_F(LoaderFetchTest, Load_AHolderThatCouldNotBeRead_NotReadAgainByTheCopyingPath) {
  LoaderOptions options = FetchOptions();
  options.fetch_copy = [this](const v1::MemoryCopy&, char*) {
    ++fetches_;
    return absl::UnavailableError("node-b:7001 reset the connection");
  };
  std::unique_ptr<Loader> loader = NewLoader(options, job_dir_);
  absl::StatusOr<v1::LoadResponse> response = loader->Load(TrainerRequest(/*fetches=*/false));
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(fetches_, 1);
  EXPECT_EQ(response->bytes_from_disk(), kTensorBytes);
  EXPECT_EQ(response->bytes_fetched_from_peers(), 0u);
  loader->Release(response->load_id());
}

TEST_F(LoaderFetchTest, Load_MemoryOnlyHolderFailsOnce_AskedAgainByTheCopyingPath) {
  // The holder may have the step's only copy: one failed read does not give it up.
  LoaderOptions options = FetchOptions();
  const FetchMemoryCopy fetch = options.fetch_copy;
  options.fetch_copy = [this, fetch](const v1::MemoryCopy& copy, char* dest) {
    if (fetches_ == 0) {
      ++fetches_;
      return absl::UnavailableError("node-b:7001 reset the connection");
    }
    return fetch(copy, dest);
  };
  std::unique_ptr<Loader> loader = NewMemoryOnlyLoader(options);
  absl::StatusOr<v1::LoadResponse> response = loader->Load(TrainerRequest(/*fetches=*/false));
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(fetches_, 2);
  EXPECT_EQ(response->bytes_from_memory(), kTensorBytes);
  loader->Release(response->load_id());
}

TEST_F(LoaderFetchTest, Load_MemoryOnlyHolderCannotBeRead_UnavailableNamingItNotLost) {
  LoaderOptions options = FetchOptions();
  options.fetch_copy = [this](const v1::MemoryCopy&, char*) {
    ++fetches_;
    return absl::UnavailableError("node-b:7001 reset the connection");
  };
  std::unique_ptr<Loader> loader = NewMemoryOnlyLoader(options);
  absl::StatusOr<v1::LoadResponse> response = loader->Load(TrainerRequest(/*fetches=*/false));
  ASSERT_EQ(response.status().code(), absl::StatusCode::kUnavailable) << response.status();
  EXPECT_NE(GetErrorCode(response.status()), v1::ERROR_CODE_MEMORY_COPY_LOST);
  EXPECT_NE(response.status().message().find("rank 1 on node-b holds data-0.safetensors"),
            std::string::npos)
      << response.status();
  EXPECT_EQ(fetches_, 2);
}

TEST_F(LoaderFetchTest, Load_ClientFetchesButTheHolderHasNoBulkPort_FetchedHere) {
  std::unique_ptr<Loader> loader = NewLoader(FetchOptions(), job_dir_);
  absl::StatusOr<v1::LoadResponse> response = loader->Load(TrainerRequest(/*fetches=*/true));
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(fetches_, 1);
  EXPECT_FALSE(response->has_fetch());
  EXPECT_NE(response->shm_name(), "");
  loader->Release(response->load_id());
}

TEST_F(LoaderFetchTest, Load_ColumnHalf_FetchedOnceAndCopied) {
  // Not one run of the file: the copying path alone fetches it (into this agent's heap).
  const v1::LoadResponse response = LoadAll(FetchOptions(), Box{{0, 512}, {256, 512}});
  EXPECT_EQ(fetches_, 1);
  EXPECT_EQ(response.slots(0).offset(), 0u);
  EXPECT_EQ(response.bytes_from_disk(), 0u);
  EXPECT_EQ(response.bytes_fetched_from_peers(), file_size_);
}

TEST_F(LoaderFetchTest, Load_AlsoHeldOnThisNode_ReadFromThereNotFetched) {
  LoaderOptions options = FetchOptions();
  options.find_copies = [this](int64_t, const std::string&, const std::vector<std::string>&,
                               bool) -> absl::StatusOr<std::vector<v1::MemoryCopy>> {
    std::vector<v1::MemoryCopy> copies = RemoteCopy();
    copies.push_back(PeerCopy("node-a")[0]);
    return copies;
  };
  const v1::LoadResponse response = LoadAll(options);
  EXPECT_EQ(fetches_, 0);
  EXPECT_EQ(response.bytes_from_memory(), kTensorBytes);
  EXPECT_EQ(response.bytes_from_disk(), 0u);
}

// A Storage whose OpenForRead, once armed, waits until released: a load held in its reads.
class HeldOpenStorage : public Storage {
 public:
  explicit HeldOpenStorage(Storage* base) : base_(base) {}
  absl::Notification entered, release;
  std::atomic<bool> armed{false};

  absl::StatusOr<std::unique_ptr<ReadableFile>> OpenForRead(const std::string& path) override {
    if (armed.exchange(false)) {
      entered.Notify();
      release.WaitForNotification();
    }
    return base_->OpenForRead(path);
  }
  absl::Status CreateDirs(const std::string& path) override { return base_->CreateDirs(path); }
  absl::StatusOr<std::unique_ptr<WritableFile>> OpenForWrite(const std::string& path) override {
    return base_->OpenForWrite(path);
  }
  absl::Status SyncDir(const std::string& path) override { return base_->SyncDir(path); }
  absl::Status Rename(const std::string& from, const std::string& to) override {
    return base_->Rename(from, to);
  }
  absl::Status RemoveTree(const std::string& path) override { return base_->RemoveTree(path); }
  absl::StatusOr<uint64_t> FileSize(const std::string& path) override {
    return base_->FileSize(path);
  }
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path) override {
    return base_->ListDir(path);
  }

 private:
  Storage* const base_;
};

// The agent registering again (its lifeline after a lapsed heartbeat, a restarted
// coordinator) sets the job directory while a trainer's load is in its reads: it must not wait
// for the load, since the lifeline heartbeats again only after it, and a load may take
// minutes (memory copies fetched from other nodes) — the coordinator would expire a live
// agent. Failed before: SetJobDir waited on the mutex the load holds for its whole length.
TEST_F(LoaderTest, SetJobDir_WhileALoadReads_DoesNotWaitForIt) {
  HeldOpenStorage held(&storage_);
  Loader loader(&held, pool_.get(), /*rank=*/0);
  loader.SetJobDir(job_dir_);
  held.armed = true;
  absl::StatusOr<v1::LoadResponse> loaded;
  std::thread load([&] {
    v1::LoadRequest request;
    request.set_step(7);
    *request.add_shards() = Shard(tensor_, Box{{0, 0}, {1, 1024}});
    loaded = loader.Load(request);
  });
  held.entered.WaitForNotification();
  absl::Notification set;
  std::thread registration([&] {
    loader.SetJobDir(job_dir_);
    set.Notify();
  });
  const bool returned = set.WaitForNotificationWithTimeout(absl::Seconds(30));
  held.release.Notify();
  load.join();
  registration.join();
  EXPECT_TRUE(returned) << "SetJobDir waited for the load's reads";
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->step(), 7);
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
