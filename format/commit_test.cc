#include "format/commit.h"

#include <string>
#include <vector>

#include "storage/fault_injecting_storage.h"
#include "storage/posix_storage.h"
#include "storage/storage.h"
#include "common/ids.h"
#include "common/status.h"
#include "format/manifest_io.h"
#include "format/test_checkpoint.h"
#include "storage/testing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;
using testing_checkpoint::GridChunks;
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

TEST_F(CommitTest, Commit_DataFileMissing_FailedPreconditionNamingFile) {
  v1::Manifest m = Stage(3, "s3-aaaa");
  const std::string tmp = JoinPath(job_dir_, TmpDirName(3, "s3-aaaa"));
  ASSERT_TRUE(storage_.RemoveTree(JoinPath(tmp, "data-1.safetensors")).ok());
  absl::Status s = Commit(storage_, m);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
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

TEST_F(CommitTest, Retention_RetiresNamedStepsAndTmpDirsNotNewer_KeepsTheRest) {
  for (int64_t step : {1, 2, 3, 4, 5}) Committed(step);
  Stage(6, "s6-inflight");
  Stage(3, "s3-crashed");
  ASSERT_TRUE(storage_.CreateDirs(JoinPath(job_dir_, "step-000000002.tmp-gc-0001")).ok());
  // Foreign names, never ours to delete.
  for (const char* foreign : {"notes", "step-7", "step-000000008", "step-000000009.tmp-",
                              "step-000000001.bak"}) {
    ASSERT_TRUE(storage_.CreateDirs(JoinPath(job_dir_, foreign)).ok());
  }

  absl::StatusOr<RetentionReport> report = ApplyRetention(storage_, job_dir_, {1, 2, 3}, 5);
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
  report = ApplyRetention(storage_, job_dir_, {1, 2, 3}, 5);
  ASSERT_TRUE(report.ok());
  EXPECT_THAT(report->removed, IsEmpty());
}

TEST_F(CommitTest, Retention_StepsNotNamed_Kept) {
  Committed(1);
  Committed(2);
  absl::StatusOr<RetentionReport> report = ApplyRetention(storage_, job_dir_, {}, 2);
  ASSERT_TRUE(report.ok());
  EXPECT_THAT(report->removed, IsEmpty());
  EXPECT_THAT(*ListCheckpoints(storage_, job_dir_), ElementsAre(1, 2));
}

TEST_F(CommitTest, Retention_RetiringTheCommittedStep_InvalidArgument) {
  Committed(1);
  EXPECT_EQ(ApplyRetention(storage_, job_dir_, {1}, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(*ListCheckpoints(storage_, job_dir_), ElementsAre(1));
}

TEST_F(CommitTest, Retention_RenameFails_ReportedAndCheckpointKept) {
  Committed(1);
  Committed(2);
  FaultInjectingStorage faulty(&storage_);
  faulty.FailRename(EIO);
  absl::StatusOr<RetentionReport> report = ApplyRetention(faulty, job_dir_, {1}, 2);
  ASSERT_TRUE(report.ok());
  EXPECT_THAT(report->removed, IsEmpty());
  ASSERT_EQ(report->failed.size(), 1u);
  EXPECT_EQ(report->failed[0].first, "step-000000001");
  EXPECT_THAT(*ListCheckpoints(storage_, job_dir_), ElementsAre(1, 2));
}

// Storage whose FileSize of one path fails with EIO.
class FailingFileSize : public FaultInjectingStorage {
 public:
  FailingFileSize(Storage* base, std::string path)
      : FaultInjectingStorage(base), path_(std::move(path)) {}
  absl::StatusOr<uint64_t> FileSize(const std::string& path) override {
    if (path == path_) return absl::UnavailableError("injected: EIO");
    return FaultInjectingStorage::FileSize(path);
  }

 private:
  const std::string path_;
};

// Found by tests/sim: retention found retired checkpoints through ListCheckpoints, which took
// a manifest it could not stat for an absent one, so the checkpoint stayed on disk while the
// retention reported nothing failed.
TEST_F(CommitTest, Regression_Retention_ManifestUnreadable_StillRemovesTheRetiredStep) {
  Committed(1);
  Committed(2);
  FailingFileSize faulty(&storage_, JoinPath(JoinPath(job_dir_, "step-000000001"), "manifest.pb"));
  absl::StatusOr<RetentionReport> report = ApplyRetention(faulty, job_dir_, {1}, 2);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_THAT(report->failed, IsEmpty());
  EXPECT_THAT(report->removed, ElementsAre("step-000000001"));
  EXPECT_THAT(*ListCheckpoints(storage_, job_dir_), ElementsAre(2));
}

// An unreadable checkpoint is not an absent one: `latest` does not silently go back.
TEST_F(CommitTest, ListCheckpoints_ManifestUnreadable_Error) {
  Committed(1);
  Committed(2);
  FailingFileSize faulty(&storage_, JoinPath(JoinPath(job_dir_, "step-000000002"), "manifest.pb"));
  EXPECT_EQ(ListCheckpoints(faulty, job_dir_).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(LatestStep(faulty, job_dir_).status().code(), absl::StatusCode::kUnavailable);
}

// Issue 11, bug 5: retention removed the temporary directory of every session, also one of a
// newer step that may be in flight. A step newer than the committed one may be.
TEST_F(CommitTest, Regression_Retention_TmpDirOfNewerStep_Kept) {
  Committed(1);
  Stage(2, "s2-a");
  absl::StatusOr<RetentionReport> report = ApplyRetention(storage_, job_dir_, {}, 1);
  ASSERT_TRUE(report.ok());
  EXPECT_THAT(report->removed, IsEmpty());
  EXPECT_THAT(Names(), ElementsAre("step-000000001", "step-000000002.tmp-s2-a"));
}

// Issue 11, bug 6: the job directory's own entry in the storage root was never fsynced, so a
// committed checkpoint of a new job could vanish with its job directory after a power loss.
TEST_F(CommitTest, Regression_Commit_SyncsStorageRootToo) {
  class RecordingStorage : public FaultInjectingStorage {
   public:
    using FaultInjectingStorage::FaultInjectingStorage;
    std::vector<std::string> synced;
    absl::Status SyncDir(const std::string& path) override {
      synced.push_back(path);
      return FaultInjectingStorage::SyncDir(path);
    }
  } recording(&storage_);
  v1::Manifest m = Stage(1, "s1-a");
  ASSERT_TRUE(Commit(recording, m).ok());
  const std::string root = job_dir_.substr(0, job_dir_.rfind('/'));
  EXPECT_THAT(recording.synced, ::testing::Contains(root));
}

// ---------------------------------------------------------------------------------------------
// ResolveCommit: the commit edge

class ResolveTest : public CommitTest {
 protected:
  CommitResolution Resolve(Storage& storage, const v1::Manifest& m, bool roll_back) {
    return ResolveCommit(storage, JoinPath(job_dir_, TmpDirName(m.step(), m.session_id())),
                         JoinPath(job_dir_, StepDirName(m.step())), m, roll_back);
  }
};

// Fsyncs of one directory fail while `fail` is set.
class SyncOfDirFails : public FaultInjectingStorage {
 public:
  using FaultInjectingStorage::FaultInjectingStorage;
  std::string dir;
  bool fail = true;
  absl::Status SyncDir(const std::string& path) override {
    if (fail && path == dir) return ErrnoToStatus(EIO, "fsync", path, "(directory)");
    return FaultInjectingStorage::SyncDir(path);
  }
};

TEST_F(ResolveTest, Resolve_Fresh_Committed) {
  v1::Manifest m = Stage(4, "s4-a");
  CommitResolution r = Resolve(storage_, m, /*roll_back=*/false);
  EXPECT_EQ(r.outcome, CommitOutcome::kCommitted) << r.status;
  EXPECT_THAT(*ListCheckpoints(storage_, job_dir_), ElementsAre(4));
  // Again, and with roll-back asked: committed stays committed.
  EXPECT_EQ(Resolve(storage_, m, true).outcome, CommitOutcome::kCommitted);
}

TEST_F(ResolveTest, Resolve_RenamedButParentFsyncFails_UnresolvedThenCommitted) {
  v1::Manifest m = Stage(4, "s4-a");
  SyncOfDirFails faulty(&storage_);
  faulty.dir = job_dir_;
  CommitResolution r = Resolve(faulty, m, false);
  EXPECT_EQ(r.outcome, CommitOutcome::kUnresolved);
  EXPECT_EQ(GetErrorCode(r.status), v1::ERROR_CODE_IO_ERROR) << r.status;
  // The rename happened: the directory is under its final name, not yet durably.
  EXPECT_THAT(Names(), ElementsAre("step-000000004"));
  faulty.fail = false;
  EXPECT_EQ(Resolve(faulty, m, false).outcome, CommitOutcome::kCommitted);
}

TEST_F(ResolveTest, Resolve_RollBackWhileFsyncFails_StaysUnresolvedInPlace) {
  v1::Manifest m = Stage(4, "s4-a");
  SyncOfDirFails faulty(&storage_);
  faulty.dir = job_dir_;
  // The commit goes first and renames the directory, but the parent's fsync fails: nothing
  // is proven, and a directory under its final name with this session's manifest is never
  // renamed back (it is committed once the fsync works).
  CommitResolution r = Resolve(faulty, m, true);
  EXPECT_EQ(r.outcome, CommitOutcome::kUnresolved) << r.status;
  EXPECT_THAT(Names(), ElementsAre("step-000000004"));
  faulty.fail = false;
  EXPECT_EQ(Resolve(faulty, m, true).outcome, CommitOutcome::kCommitted);
}

TEST_F(ResolveTest, Resolve_RollBackWhenRenameKeepsFailing_RolledBackDurably) {
  v1::Manifest m = Stage(4, "s4-a");
  FaultInjectingStorage faulty(&storage_);
  faulty.FailRename(EIO);
  EXPECT_EQ(Resolve(faulty, m, false).outcome, CommitOutcome::kUnresolved);
  CommitResolution r = Resolve(faulty, m, true);
  EXPECT_EQ(r.outcome, CommitOutcome::kRolledBack) << r.status;
  EXPECT_THAT(std::string(r.status.message()), HasSubstr("rolled back"));
  EXPECT_THAT(*ListCheckpoints(storage_, job_dir_), IsEmpty());
  EXPECT_THAT(Names(), ElementsAre("step-000000004.tmp-s4-a"));
}

TEST_F(ResolveTest, Resolve_RenamedEarlierThenRolledBack_MovedOutOfFinalName) {
  v1::Manifest m = Stage(4, "s4-a");
  SyncOfDirFails faulty(&storage_);
  faulty.dir = job_dir_;
  ASSERT_EQ(Resolve(faulty, m, false).outcome, CommitOutcome::kUnresolved);
  ASSERT_THAT(Names(), ElementsAre("step-000000004"));
  // The fsync works again just as the deadline asks for a roll-back: the commit completes
  // first, which wins (committed is the better outcome, and it is proven).
  faulty.fail = false;
  EXPECT_EQ(Resolve(faulty, m, true).outcome, CommitOutcome::kCommitted);
}

// The session was answered kCommitted (its committer reported COMMIT_WRITTEN, and retention
// removed the step before), then asked again with roll_back_unless_committed (the report had
// not reached the coordinator by the deadline), and the parent's fsync failed once. Before,
// that renamed the committed directory back and answered kRolledBack: a commit already
// reported undone, against "a kCommitted answer is final for the session". A session whose
// manifest is under final_dir is never rolled back; the failed fsync is an error to retry.
TEST_F(ResolveTest, Regression_CommittedThenFsyncFailsOnceWithRollBackAsked_NeverRolledBack) {
  v1::Manifest m = Stage(4, "s4-a");
  ASSERT_EQ(Resolve(storage_, m, /*roll_back=*/false).outcome, CommitOutcome::kCommitted);
  class FsyncFailsOnce : public FaultInjectingStorage {
   public:
    using FaultInjectingStorage::FaultInjectingStorage;
    int failures_left = 1;
    absl::Status SyncDir(const std::string& path) override {
      if (failures_left > 0) {
        --failures_left;
        return ErrnoToStatus(EIO, "fsync", path, "(directory)");
      }
      return FaultInjectingStorage::SyncDir(path);
    }
  } faulty(&storage_);
  CommitResolution r = Resolve(faulty, m, /*roll_back=*/true);
  EXPECT_EQ(r.outcome, CommitOutcome::kUnresolved) << r.status;
  EXPECT_EQ(GetErrorCode(r.status), v1::ERROR_CODE_IO_ERROR) << r.status;
  EXPECT_THAT(Names(), ElementsAre("step-000000004"));
  // Asked again once the fsync works: committed, as it was answered before.
  EXPECT_EQ(Resolve(faulty, m, /*roll_back=*/true).outcome, CommitOutcome::kCommitted);
}

TEST_F(ResolveTest, Resolve_OtherSessionCommitted_RolledBackForGood) {
  ASSERT_TRUE(Commit(storage_, Stage(5, "s5-a")).ok());
  v1::Manifest other = Stage(5, "s5-b");
  CommitResolution r = Resolve(storage_, other, false);
  EXPECT_EQ(r.outcome, CommitOutcome::kRolledBack);
  EXPECT_EQ(GetErrorCode(r.status), v1::ERROR_CODE_STEP_EXISTS) << r.status;
  EXPECT_EQ(ReadManifest(storage_, JoinPath(job_dir_, "step-000000005"))->session_id(), "s5-a");
}

TEST_F(ResolveTest, Resolve_DataGone_RolledBackForGood) {
  v1::Manifest m = Stage(3, "s3-a");
  ASSERT_TRUE(storage_.RemoveTree(JoinPath(job_dir_, TmpDirName(3, "s3-a"))).ok());
  CommitResolution r = Resolve(storage_, m, false);
  EXPECT_EQ(r.outcome, CommitOutcome::kRolledBack) << r.status;
  EXPECT_EQ(r.status.code(), absl::StatusCode::kNotFound);
}

TEST_F(ResolveTest, Resolve_ReadOnlyStorage_UnresolvedNotRefused) {
  // EROFS maps to FailedPrecondition, like a refusal; it is not one: remounted read-write,
  // the commit goes through.
  v1::Manifest m = Stage(3, "s3-a");
  FaultInjectingStorage faulty(&storage_);
  faulty.SetReadOnly(true);
  CommitResolution r = Resolve(faulty, m, false);
  EXPECT_EQ(r.outcome, CommitOutcome::kUnresolved) << r.status;
  faulty.SetReadOnly(false);
  EXPECT_EQ(Resolve(faulty, m, false).outcome, CommitOutcome::kCommitted);
}

}  // namespace
}  // namespace tessera
