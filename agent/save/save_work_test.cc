// The save work functions on real files in a temporary directory.
#include "agent/save/save_work.h"

#include <memory>
#include <string>
#include <vector>

#include "common/box.h"
#include "common/ids.h"
#include "format/test_checkpoint.h"
#include "gtest/gtest.h"
#include "storage/posix_storage.h"
#include "storage/testing.h"

namespace tessera {
namespace {

using testing_checkpoint::RandomTensor;
using testing_checkpoint::TestCheckpointOptions;
using testing_checkpoint::TestTensor;
using testing_checkpoint::WriteTestData;

TEST(PrepareStaging, MemorySmallerThanTheLayout_FailedPreconditionNamingBoth) {
  StagingLayout layout;
  layout.total_bytes = 8192;
  std::vector<unsigned char> memory(4096);
  absl::Status s = PrepareStaging(layout, StagingMemory{"/r", memory.data(), memory.size()});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("4096"), std::string::npos) << s;
  EXPECT_NE(s.message().find("8192"), std::string::npos) << s;
}

TEST(WriteShards, LayoutWithoutAFile_NothingWrittenNoChunks) {
  PosixStorage storage;
  const std::string dir = MakeTempDir("save_work_test") + "/never-created";
  PersistWork work{dir, std::make_shared<const StagingLayout>(), nullptr};
  absl::StatusOr<std::vector<v1::ChunkReport>> chunks = WriteShards(storage, work, {});
  ASSERT_TRUE(chunks.ok()) << chunks.status();
  EXPECT_TRUE(chunks->empty());
  EXPECT_EQ(storage.ListDir(dir).status().code(), absl::StatusCode::kNotFound);
}

class ResolveAndRetainTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = MakeTempDir("save_work_commit_test");
    tmp_dir_ = TmpDirPath(root_, "job", 100, options_.session_id);
    ASSERT_TRUE(storage_.CreateDirs(tmp_dir_).ok());
    TestTensor t = RandomTensor("w", v1::DTYPE_F32, {16}, 1);
    t.chunks.push_back({FullBox({16}), 0});
    absl::StatusOr<v1::Manifest> manifest = WriteTestData(storage_, tmp_dir_, {t}, options_);
    ASSERT_TRUE(manifest.ok()) << manifest.status();
    auto commit = std::make_shared<v1::CommitCommand>();
    *commit->mutable_manifest() = *manifest;
    commit->add_retire_steps(90);
    work_ = CommitWork{tmp_dir_, StepDirPath(root_, "job", 100), JobDirPath(root_, "job"), 100,
                       commit};
  }

  PosixStorage storage_;
  TestCheckpointOptions options_;
  std::string root_, tmp_dir_;
  CommitWork work_;
};

TEST_F(ResolveAndRetainTest, Committed_RetentionRanAndRemovedAnOlderTmpDir) {
  const std::string stale = TmpDirPath(root_, "job", 50, "s50-00000000000000bb");
  ASSERT_TRUE(storage_.CreateDirs(stale).ok());
  CommitWorkResult result = ResolveAndRetain(storage_, work_);
  EXPECT_EQ(result.resolution.outcome, CommitOutcome::kCommitted) << result.resolution.status;
  ASSERT_TRUE(result.retention.has_value());
  ASSERT_TRUE(result.retention->ok()) << result.retention->status();
  EXPECT_EQ((*result.retention)->removed,
            std::vector<std::string>{TmpDirName(50, "s50-00000000000000bb")});
  EXPECT_TRUE(storage_.FileSize(work_.final_dir + "/manifest.pb").ok());
}

TEST_F(ResolveAndRetainTest, DataFilesGone_RolledBackAndNoRetention) {
  ASSERT_TRUE(storage_.RemoveTree(tmp_dir_ + "/" + testing_checkpoint::DataFileName(0)).ok());
  CommitWorkResult result = ResolveAndRetain(storage_, work_);
  EXPECT_EQ(result.resolution.outcome, CommitOutcome::kRolledBack);
  EXPECT_FALSE(result.retention.has_value());
}

}  // namespace
}  // namespace tessera
