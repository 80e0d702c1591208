// A checkpoint on an object store (decision 0041), against a real SeaweedFS: the commit by a
// conditional PUT of the manifest, its idempotence and exclusiveness, the readers finding the
// data in the session's directory, the roll back, and retention.
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "common/ids.h"
#include "common/status.h"
#include "format/checkpoint_reader.h"
#include "format/commit.h"
#include "format/manifest_io.h"
#include "format/test_checkpoint.h"
#include "format/verify.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/s3/s3_storage.h"
#include "storage/s3/testing/seaweedfs.h"

namespace tessera {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;
using testing_checkpoint::GridChunks;
using testing_checkpoint::RandomTensor;
using testing_checkpoint::TestCheckpointOptions;
using testing_checkpoint::TestTensor;

class ObjectStoreCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<s3::testing::SeaweedFs*> shared = s3::testing::SharedSeaweedFs();
    ASSERT_TRUE(shared.ok()) << shared.status();
    s3::testing::SeaweedFs* server = *shared;
    absl::StatusOr<std::string> bucket = server->NewBucket();
    ASSERT_TRUE(bucket.ok()) << bucket.status();
    job_dir_ = "s3://" + *bucket + "/root/job";
    absl::StatusOr<std::unique_ptr<S3Storage>> storage =
        S3Storage::Create(std::shared_ptr<s3::S3Client>(server->NewClient()));
    ASSERT_TRUE(storage.ok()) << storage.status();
    storage_ = *std::move(storage);
  }

  std::string TmpDir(int64_t step, const std::string& session) const {
    return JoinPath(job_dir_, TmpDirName(step, session));
  }
  std::string StepDir(int64_t step) const { return JoinPath(job_dir_, StepDirName(step)); }

  // Writes a session's data files into its directory, as its agents would; its manifest.
  v1::Manifest Stage(int64_t step, const std::string& session) {
    TestTensor w = RandomTensor("w", v1::DTYPE_F32, {4, 4}, step);
    w.chunks = GridChunks(w.shape, {2, 1}, 2);
    TestCheckpointOptions options;
    options.step = step;
    options.session_id = session;
    absl::StatusOr<v1::Manifest> m =
        testing_checkpoint::WriteTestData(*storage_, TmpDir(step, session), {w}, options);
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? *m : v1::Manifest();
  }

  absl::Status Commit(const v1::Manifest& m) {
    return CommitCheckpoint(*storage_, TmpDir(m.step(), m.session_id()), StepDir(m.step()), m);
  }

  std::vector<std::string> Names() {
    absl::StatusOr<std::vector<std::string>> names = storage_->ListDir(job_dir_);
    EXPECT_TRUE(names.ok()) << names.status();
    return names.ok() ? *names : std::vector<std::string>();
  }

  std::string job_dir_;
  std::unique_ptr<S3Storage> storage_;
};

TEST_F(ObjectStoreCheckpointTest, Commit_ManifestCreated_DataStaysInItsSession_ReadAndVerified) {
  const v1::Manifest m = Stage(7, "s7-a");
  EXPECT_THAT(*ListCheckpoints(*storage_, job_dir_), IsEmpty());
  ASSERT_TRUE(Commit(m).ok());

  EXPECT_THAT(*ListCheckpoints(*storage_, job_dir_), ElementsAre(7));
  EXPECT_THAT(*storage_->ListDir(StepDir(7)), ElementsAre("manifest.json", "manifest.pb"));
  EXPECT_EQ(DataDirOf(*storage_, StepDir(7), m), TmpDir(7, "s7-a"));
  // Every reader goes through the manifest to the data.
  VerifyReport report = VerifyCheckpoint(*storage_, StepDir(7), VerifyOptions());
  EXPECT_TRUE(report.ok()) << (report.problems.empty() ? "" : report.problems[0].message);
  EXPECT_EQ(report.files, 2u);  // GridChunks(..., 2): two writers' files
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
      CheckpointReader::Open(storage_.get(), StepDir(7));
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->dir(), TmpDir(7, "s7-a"));
  // Idempotent: a committer that retries (or a second one of the same session) gets OK.
  EXPECT_TRUE(Commit(m).ok());
}

TEST_F(ObjectStoreCheckpointTest, Commit_AnotherSessionOfTheStep_StepExistsAndNothingReplaced) {
  ASSERT_TRUE(Commit(Stage(3, "s3-first")).ok());
  const v1::Manifest second = Stage(3, "s3-second");
  absl::Status refused = Commit(second);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(GetErrorCode(refused), v1::ERROR_CODE_STEP_EXISTS);
  absl::StatusOr<v1::Manifest> there = ReadManifest(*storage_, StepDir(3));
  ASSERT_TRUE(there.ok());
  EXPECT_EQ(there->session_id(), "s3-first");
}

TEST_F(ObjectStoreCheckpointTest, Commit_TwoSessionsRacing_ExactlyOneCommits) {
  const v1::Manifest a = Stage(4, "s4-a");
  const v1::Manifest b = Stage(4, "s4-b");
  absl::Status results[2];
  absl::Notification go;
  std::thread ta([&] { go.WaitForNotification(); results[0] = Commit(a); });
  std::thread tb([&] { go.WaitForNotification(); results[1] = Commit(b); });
  go.Notify();
  ta.join();
  tb.join();
  ASSERT_NE(results[0].ok(), results[1].ok()) << results[0] << " / " << results[1];
  const absl::Status& loser = results[0].ok() ? results[1] : results[0];
  EXPECT_EQ(GetErrorCode(loser), v1::ERROR_CODE_STEP_EXISTS) << loser;
  absl::StatusOr<v1::Manifest> there = ReadManifest(*storage_, StepDir(4));
  ASSERT_TRUE(there.ok());
  EXPECT_EQ(there->session_id(), results[0].ok() ? "s4-a" : "s4-b");
}

TEST_F(ObjectStoreCheckpointTest, Commit_DataFileMissing_RefusedForGoodAndNothingPublished) {
  v1::Manifest m = Stage(5, "s5-a");
  ASSERT_TRUE(storage_->RemoveTree(JoinPath(TmpDir(5, "s5-a"), m.tensors(0).chunks(0).file()))
                  .ok());
  CommitResolution r = ResolveCommit(*storage_, TmpDir(5, "s5-a"), StepDir(5), m,
                                     /*roll_back_unless_committed=*/false);
  EXPECT_EQ(r.outcome, CommitOutcome::kRolledBack) << r.status;
  EXPECT_EQ(r.status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(*ListCheckpoints(*storage_, job_dir_), IsEmpty());
  EXPECT_EQ(storage_->FileSize(JoinPath(StepDir(5), kManifestFileName)).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(ObjectStoreCheckpointTest, Resolve_CommittedEarlier_CommittedEvenIfRollBackAsked) {
  const v1::Manifest m = Stage(6, "s6-a");
  ASSERT_TRUE(Commit(m).ok());
  CommitResolution r = ResolveCommit(*storage_, TmpDir(6, "s6-a"), StepDir(6), m,
                                     /*roll_back_unless_committed=*/true);
  EXPECT_EQ(r.outcome, CommitOutcome::kCommitted) << r.status;
}

TEST_F(ObjectStoreCheckpointTest, Retention_RetiredManifestsFirstThenData_KeepsCommittedData) {
  for (int64_t step : {1, 2, 3, 4, 5}) {
    ASSERT_TRUE(Commit(Stage(step, "s" + std::to_string(step))).ok());
  }
  Stage(3, "s3-aborted");   // an aborted session of a committed step
  const v1::Manifest inflight = Stage(6, "s6-inflight");  // a save in flight
  absl::StatusOr<RetentionReport> report = ApplyRetention(*storage_, job_dir_, {1, 2}, 5);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_THAT(report->failed, IsEmpty());
  EXPECT_THAT(report->removed, UnorderedElementsAre("step-000000001", "step-000000002",
                                                    "step-000000003.tmp-s3-aborted"));
  EXPECT_THAT(*ListCheckpoints(*storage_, job_dir_), ElementsAre(3, 4, 5));
  for (int64_t step : {3, 4, 5}) {
    EXPECT_TRUE(VerifyCheckpoint(*storage_, StepDir(step), VerifyOptions()).ok()) << step;
  }
  // No object of the retired steps is left (ListDir may still name an empty prefix for a
  // moment: SeaweedFS removes its empty folders in the background).
  for (const char* gone : {"root/job/step-000000001", "root/job/step-000000001.tmp-s1",
                           "root/job/step-000000002.tmp-s2"}) {
    absl::StatusOr<s3::ListObjectsResult> left = storage_->client().ListObjects(
        ParseS3ObjectPath(job_dir_)->bucket, std::string(gone) + "/");
    ASSERT_TRUE(left.ok());
    EXPECT_THAT(left->objects, IsEmpty()) << gone;
  }
  EXPECT_TRUE(
      storage_->FileSize(JoinPath(TmpDir(6, "s6-inflight"), inflight.tensors(0).chunks(0).file()))
          .ok());
}

}  // namespace
}  // namespace tessera
