#include "format/commit.h"

#include <string>
#include <vector>

#include "agent/storage.h"
#include "common/ids.h"
#include "common/status.h"
#include "format/manifest_io.h"
#include "format/test_checkpoint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;
using testing_checkpoint::GridChunks;
using testing_checkpoint::MakeTempDir;
using testing_checkpoint::RandomTensor;
using testing_checkpoint::TestCheckpointOptions;
using testing_checkpoint::TestTensor;

class CommitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    job_dir_ = MakeTempDir("commit_test");
    ASSERT_FALSE(job_dir_.empty());
  }

  // Writes the data of a session into its temporary directory; returns the manifest.
  v1::Manifest Stage(int64_t step, const std::string& session) {
    const std::string tmp = JoinPath(job_dir_, TmpDirName(step, session));
    EXPECT_TRUE(storage_.CreateDirs(tmp).ok());
    TestTensor w = RandomTensor("w", v1::DTYPE_F32, {4, 4}, step);
    w.chunks = GridChunks(w.shape, {2, 1}, 2);
    TestCheckpointOptions options;
    options.step = step;
    options.session_id = session;
    absl::StatusOr<v1::Manifest> m = testing_checkpoint::WriteTestData(storage_, tmp, {w}, options);
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? *m : v1::Manifest();
  }

  absl::Status Commit(Storage& storage, const v1::Manifest& m) {
    return CommitCheckpoint(storage, JoinPath(job_dir_, TmpDirName(m.step(), m.session_id())),
                            JoinPath(job_dir_, StepDirName(m.step())), m);
  }

  // Makes a committed step directly.
  void Committed(int64_t step) {
    ASSERT_TRUE(Commit(storage_, Stage(step, NewSessionId(step))).ok());
  }

  std::vector<std::string> Names() {
    absl::StatusOr<std::vector<std::string>> names = storage_.ListDir(job_dir_);
    EXPECT_TRUE(names.ok()) << names.status();
    return names.ok() ? *names : std::vector<std::string>();
  }

  PosixStorage storage_;
  std::string job_dir_;
};

TEST_F(CommitTest, Commit_FreshSession_RenamedWithManifest) {
  v1::Manifest m = Stage(1000, "s1000-aaaa");
  ASSERT_TRUE(Commit(storage_, m).ok());
  EXPECT_THAT(Names(), ElementsAre("step-000001000"));
  absl::StatusOr<v1::Manifest> read = ReadManifest(storage_, JoinPath(job_dir_, "step-000001000"));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->session_id(), "s1000-aaaa");
  absl::StatusOr<std::vector<std::string>> files =
      storage_.ListDir(JoinPath(job_dir_, "step-000001000"));
  EXPECT_THAT(*files, ElementsAre("data-0.safetensors", "data-1.safetensors", "manifest.json",
                                  "manifest.pb"));
  EXPECT_THAT(*ListCheckpoints(storage_, job_dir_), ElementsAre(1000));
  EXPECT_EQ(*LatestStep(storage_, job_dir_), 1000);
}

TEST_F(CommitTest, Commit_RetrySameSession_IdempotentOk) {
  v1::Manifest m = Stage(5, "s5-aaaa");
  ASSERT_TRUE(Commit(storage_, m).ok());
  // A second committer (or the coordinator after a restart) retries: the tmp dir is gone.
  absl::Status again = Commit(storage_, m);
  EXPECT_TRUE(again.ok()) << again;
  EXPECT_THAT(Names(), ElementsAre("step-000000005"));
}

TEST_F(CommitTest, Commit_OtherSessionCommittedStep_StepExists) {
  ASSERT_TRUE(Commit(storage_, Stage(5, "s5-aaaa")).ok());
  v1::Manifest other = Stage(5, "s5-bbbb");
  absl::Status s = Commit(storage_, other);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(GetErrorCode(s), v1::ERROR_CODE_STEP_EXISTS);
  EXPECT_THAT(s.message(), HasSubstr("s5-aaaa"));
  // The loser's data is untouched (GC collects it), the winner's manifest too.
  EXPECT_THAT(Names(), ElementsAre("step-000000005", "step-000000005.tmp-s5-bbbb"));
  EXPECT_EQ(ReadManifest(storage_, JoinPath(job_dir_, "step-000000005"))->session_id(),
            "s5-aaaa");
}

TEST_F(CommitTest, Commit_FinalDirNonEmptyWithoutManifest_StepExists) {
  v1::Manifest m = Stage(5, "s5-aaaa");
  ASSERT_TRUE(storage_.CreateDirs(JoinPath(job_dir_, "step-000000005/junk")).ok());
  absl::Status s = Commit(storage_, m);
  EXPECT_EQ(GetErrorCode(s), v1::ERROR_CODE_STEP_EXISTS) << s;
  EXPECT_THAT(s.message(), HasSubstr("without a manifest"));
}

TEST_F(CommitTest, Commit_RenameFails_ErrorThenRetrySucceeds) {
  v1::Manifest m = Stage(7, "s7-aaaa");
  FaultInjectingStorage faulty(&storage_);
  faulty.FailRename(EIO);
  absl::Status s = Commit(faulty, m);
  EXPECT_EQ(GetErrorCode(s), v1::ERROR_CODE_IO_ERROR) << s;
  EXPECT_THAT(*ListCheckpoints(storage_, job_dir_), IsEmpty());
  faulty.Reset();
  EXPECT_TRUE(Commit(faulty, m).ok());
  EXPECT_THAT(*ListCheckpoints(storage_, job_dir_), ElementsAre(7));
}

TEST_F(CommitTest, Commit_ParentSyncFails_RetryMakesItDurable) {
  v1::Manifest m = Stage(7, "s7-aaaa");
  FaultInjectingStorage faulty(&storage_);
  faulty.FailSyncDir(EIO);
  EXPECT_FALSE(Commit(faulty, m).ok());
  faulty.Reset();
  EXPECT_TRUE(Commit(faulty, m).ok());
  EXPECT_THAT(*ListCheckpoints(storage_, job_dir_), ElementsAre(7));
}

TEST_F(CommitTest, Commit_DataFileMissing_DataLossNamingFile) {
  v1::Manifest m = Stage(3, "s3-aaaa");
  const std::string tmp = JoinPath(job_dir_, TmpDirName(3, "s3-aaaa"));
  ASSERT_TRUE(storage_.RemoveTree(JoinPath(tmp, "data-1.safetensors")).ok());
  absl::Status s = Commit(storage_, m);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_EQ(GetErrorDetail(s)->path(), JoinPath(tmp, "data-1.safetensors"));
  EXPECT_THAT(*ListCheckpoints(storage_, job_dir_), IsEmpty());
}

TEST_F(CommitTest, Commit_TmpDirMissing_NotFound) {
  v1::Manifest m = Stage(3, "s3-aaaa");
  ASSERT_TRUE(storage_.RemoveTree(JoinPath(job_dir_, TmpDirName(3, "s3-aaaa"))).ok());
  absl::Status s = Commit(storage_, m);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
}

TEST_F(CommitTest, Commit_NamesDisagreeWithManifest_InvalidArgument) {
  v1::Manifest m = Stage(3, "s3-aaaa");
  absl::Status s = CommitCheckpoint(storage_, JoinPath(job_dir_, TmpDirName(3, "s3-aaaa")),
                                    JoinPath(job_dir_, StepDirName(4)), m);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  m.set_format_version(9);
  s = Commit(storage_, m);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("format_version"));
  EXPECT_THAT(*ListCheckpoints(storage_, job_dir_), IsEmpty());
}

TEST_F(CommitTest, LatestStep_NoCheckpoint_CheckpointNotFound) {
  absl::StatusOr<int64_t> latest = LatestStep(storage_, job_dir_);
  EXPECT_EQ(latest.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(GetErrorCode(latest.status()), v1::ERROR_CODE_CHECKPOINT_NOT_FOUND);
  EXPECT_THAT(*ListCheckpoints(storage_, JoinPath(job_dir_, "never-saved")), IsEmpty());
}

TEST_F(CommitTest, ListCheckpoints_IgnoresUncommittedAndForeign) {
  Committed(20);
  Committed(3);
  Stage(30, "s30-aaaa");  // in flight
  ASSERT_TRUE(storage_.CreateDirs(JoinPath(job_dir_, "step-000000040")).ok());  // no manifest
  ASSERT_TRUE(storage_.CreateDirs(JoinPath(job_dir_, "step-50")).ok());
  EXPECT_THAT(*ListCheckpoints(storage_, job_dir_), ElementsAre(3, 20));
  EXPECT_EQ(*LatestStep(storage_, job_dir_), 20);
}

TEST_F(CommitTest, Gc_KeepsNewestKAndProtectedSession_RemovesOrphansOnly) {
  for (int64_t step : {1, 2, 3, 4, 5}) Committed(step);
  Stage(6, "s6-inflight");
  Stage(3, "s3-crashed");
  ASSERT_TRUE(storage_.CreateDirs(JoinPath(job_dir_, "step-000000002.tmp-gc-0001")).ok());
  // Foreign names, never ours to delete.
  for (const char* foreign : {"notes", "step-7", "step-000000008", "step-000000009.tmp-",
                              "step-000000001.bak"}) {
    ASSERT_TRUE(storage_.CreateDirs(JoinPath(job_dir_, foreign)).ok());
  }

  absl::StatusOr<GcReport> report = CollectGarbage(storage_, job_dir_, 2, "s6-inflight");
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_THAT(report->failed, IsEmpty());
  EXPECT_THAT(report->removed,
              UnorderedElementsAre("step-000000001", "step-000000002", "step-000000003",
                                   "step-000000003.tmp-s3-crashed", "step-000000002.tmp-gc-0001"));
  EXPECT_THAT(*ListCheckpoints(storage_, job_dir_), ElementsAre(4, 5));
  EXPECT_THAT(Names(), ElementsAre("notes", "step-000000001.bak", "step-000000004",
                                   "step-000000005", "step-000000006.tmp-s6-inflight",
                                   "step-000000008", "step-000000009.tmp-", "step-7"));

  // Nothing left to do: idempotent.
  report = CollectGarbage(storage_, job_dir_, 2, "s6-inflight");
  ASSERT_TRUE(report.ok());
  EXPECT_THAT(report->removed, IsEmpty());
}

TEST_F(CommitTest, Gc_NoProtectedSession_RemovesAllTmpDirs) {
  Committed(1);
  Stage(2, "s2-a");
  absl::StatusOr<GcReport> report = CollectGarbage(storage_, job_dir_, 1, "");
  ASSERT_TRUE(report.ok());
  EXPECT_THAT(report->removed, ElementsAre("step-000000002.tmp-s2-a"));
  EXPECT_THAT(Names(), ElementsAre("step-000000001"));
}

TEST_F(CommitTest, Gc_KeepZero_InvalidArgument) {
  Committed(1);
  EXPECT_EQ(CollectGarbage(storage_, job_dir_, 0, "").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(*ListCheckpoints(storage_, job_dir_), ElementsAre(1));
}

TEST_F(CommitTest, Gc_RenameFails_ReportedAndCheckpointKept) {
  Committed(1);
  Committed(2);
  FaultInjectingStorage faulty(&storage_);
  faulty.FailRename(EIO);
  absl::StatusOr<GcReport> report = CollectGarbage(faulty, job_dir_, 1, "");
  ASSERT_TRUE(report.ok());
  EXPECT_THAT(report->removed, IsEmpty());
  ASSERT_EQ(report->failed.size(), 1u);
  EXPECT_EQ(report->failed[0].first, "step-000000001");
  EXPECT_THAT(*ListCheckpoints(storage_, job_dir_), ElementsAre(1, 2));
}

}  // namespace
}  // namespace tessera
