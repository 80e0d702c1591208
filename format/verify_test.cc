#include "format/verify.h"

#include <fcntl.h>
#include <unistd.h>

#include <functional>
#include <string>
#include <vector>

#include "storage/posix_storage.h"
#include "storage/storage.h"
#include "common/box.h"
#include "common/status.h"
#include "format/manifest_io.h"
#include "format/test_checkpoint.h"
#include "storage/testing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;
using testing_checkpoint::DataFileName;
using testing_checkpoint::GridChunks;
using testing_checkpoint::RandomTensor;
using testing_checkpoint::TestChunk;
using testing_checkpoint::TestTensor;

void OverwriteByte(const std::string& path, uint64_t offset, char value) {
  int fd = open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(pwrite(fd, &value, 1, offset), 1);
  close(fd);
}

void FlipByte(const std::string& path, uint64_t offset) {
  int fd = open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  char c = 0;
  ASSERT_EQ(pread(fd, &c, 1, offset), 1);
  close(fd);
  OverwriteByte(path, offset, static_cast<char>(c ^ 0x01));
}

std::string Describe(const VerifyReport& report) {
  std::string out;
  for (const VerifyProblem& p : report.problems) {
    absl::StrAppend(&out, ProblemKindName(p.kind), ": ", p.message, "\n");
  }
  return out;
}

class VerifyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("verify_test");
    ASSERT_FALSE(dir_.empty());
    TestTensor wq = RandomTensor("layers.0.wq", v1::DTYPE_F32, {8, 12}, 1);
    wq.chunks = GridChunks(wq.shape, {2, 2}, 4);
    TestTensor mlp = RandomTensor("layers.1.mlp", v1::DTYPE_BF16, {6, 6, 10}, 2);
    mlp.chunks = GridChunks(mlp.shape, {3, 1, 2}, 3);
    TestTensor scalar = RandomTensor("step", v1::DTYPE_I64, {}, 3);
    scalar.chunks = {TestChunk{Box{}, 1}};
    TestTensor empty = RandomTensor("empty", v1::DTYPE_F32, {0, 5}, 4);
    empty.chunks = {TestChunk{FullBox(empty.shape), 2}};
    TestTensor absent;
    absent.kind = v1::SHARD_KIND_OPTIMIZER;
    absent.fqn = "layers.0.wq";
    absent.state_key = "exp_avg";
    absent.shape = {8, 12};
    absent.state_absent = true;
    absl::StatusOr<v1::Manifest> m = testing_checkpoint::WriteTestCheckpoint(
        storage_, dir_, {wq, mlp, scalar, empty, absent});
    ASSERT_TRUE(m.ok()) << m.status();
    manifest_ = *m;
  }

  void RewriteManifest(const std::function<void(v1::Manifest&)>& mutate) {
    v1::Manifest m = manifest_;
    mutate(m);
    uint64_t total = 0;
    for (const v1::TensorEntry& t : m.tensors()) {
      for (const v1::ChunkEntry& c : t.chunks()) total += c.nbytes();
    }
    m.set_total_bytes(total);
    ASSERT_TRUE(WriteManifest(storage_, dir_, m).ok());
  }

  VerifyReport Verify(VerifyOptions options = {}) {
    options.max_read_bytes = 128;  // several reads per chunk
    return VerifyCheckpoint(storage_, dir_, options);
  }

  PosixStorage storage_;
  std::string dir_;
  v1::Manifest manifest_;
};

TEST_F(VerifyTest, Verify_IntactCheckpoint_NoProblems) {
  VerifyReport report = Verify();
  EXPECT_TRUE(report.ok()) << Describe(report);
  EXPECT_EQ(report.tensors, 5u);
  EXPECT_EQ(report.chunks, 4u + 6u + 1u + 1u);
  EXPECT_EQ(report.files, 4u);
  EXPECT_EQ(report.bytes_verified, manifest_.total_bytes());
}

TEST_F(VerifyTest, Verify_FlippedByte_ChecksumMismatchNamingTensorAndChunk) {
  const v1::ChunkEntry& chunk = manifest_.tensors(0).chunks(1);  // rows 0..3, cols 6..11
  FlipByte(JoinPath(dir_, chunk.file()), chunk.offset() + 65);
  VerifyReport report = Verify();
  ASSERT_EQ(report.problems.size(), 1u) << Describe(report);
  const VerifyProblem& p = report.problems[0];
  EXPECT_EQ(p.kind, ProblemKind::kChecksumMismatch);
  EXPECT_EQ(p.code, v1::ERROR_CODE_CHECKSUM_MISMATCH);
  EXPECT_EQ(p.tensor_key, "layers.0.wq");
  EXPECT_EQ(p.chunk, "[0:4, 6:12]");
  EXPECT_EQ(p.file, chunk.file());
  EXPECT_THAT(p.message, HasSubstr("block 1"));
  EXPECT_THAT(p.message, HasSubstr("\"layers.0.wq\""));
}

TEST_F(VerifyTest, Verify_ChecksumsOff_FlippedByteNotSeen) {
  const v1::ChunkEntry& chunk = manifest_.tensors(0).chunks(1);
  FlipByte(JoinPath(dir_, chunk.file()), chunk.offset() + 65);
  VerifyOptions options;
  options.checksums = false;
  VerifyReport report = Verify(options);
  EXPECT_TRUE(report.ok()) << Describe(report);
  EXPECT_EQ(report.bytes_verified, 0u);
}

TEST_F(VerifyTest, Verify_MissingChunk_IncompleteCoverageWithRegion) {
  RewriteManifest([](v1::Manifest& m) {
    m.mutable_tensors(0)->mutable_chunks()->DeleteSubrange(2, 1);  // rows 4..7, cols 0..5
    m.mutable_tensors(1)->mutable_chunks()->DeleteSubrange(3, 1);  // [2:4, 0:6, 5:10]
  });
  VerifyReport report = Verify();
  ASSERT_EQ(report.problems.size(), 2u) << Describe(report);
  EXPECT_EQ(report.problems[0].kind, ProblemKind::kIncompleteCoverage);
  EXPECT_EQ(report.problems[0].code, v1::ERROR_CODE_INCOMPLETE_COVERAGE);
  EXPECT_EQ(report.problems[0].tensor_key, "layers.0.wq");
  EXPECT_THAT(report.problems[0].message, HasSubstr("cover 72 of 96 elements"));
  EXPECT_THAT(report.problems[0].message, HasSubstr("region [4:8, 0:6] is in no chunk"));
  EXPECT_EQ(report.problems[1].tensor_key, "layers.1.mlp");
  EXPECT_THAT(report.problems[1].message, HasSubstr("region [2:4, 0:6, 5:10] is in no chunk"));
}

TEST_F(VerifyTest, Verify_ScalarWithoutChunk_IncompleteCoverage) {
  RewriteManifest([](v1::Manifest& m) { m.mutable_tensors(2)->clear_chunks(); });
  VerifyReport report = Verify();
  ASSERT_EQ(report.problems.size(), 1u) << Describe(report);
  EXPECT_EQ(report.problems[0].kind, ProblemKind::kIncompleteCoverage);
  EXPECT_EQ(report.problems[0].tensor_key, "step");
}

TEST_F(VerifyTest, Verify_DuplicatedChunk_Overlap) {
  RewriteManifest([](v1::Manifest& m) {
    *m.mutable_tensors(1)->add_chunks() = m.tensors(1).chunks(4);
  });
  VerifyReport report = Verify();
  ASSERT_EQ(report.problems.size(), 1u) << Describe(report);
  EXPECT_EQ(report.problems[0].kind, ProblemKind::kOverlappingChunks);
  EXPECT_EQ(report.problems[0].code, v1::ERROR_CODE_OVERLAPPING_SHARDS);
  EXPECT_EQ(report.problems[0].tensor_key, "layers.1.mlp");
  EXPECT_THAT(report.problems[0].message, HasSubstr("overlaps"));
}

TEST_F(VerifyTest, Verify_PartialOverlapSameVolume_Overlap) {
  // Move one chunk onto its neighbour: the volume still sums up, the tiling is wrong.
  RewriteManifest([](v1::Manifest& m) {
    m.mutable_tensors(0)->mutable_chunks(3)->mutable_box()->set_offsets(1, 5);
  });
  VerifyReport report = Verify();
  ASSERT_FALSE(report.problems.empty());
  EXPECT_EQ(report.problems[0].kind, ProblemKind::kOverlappingChunks) << Describe(report);
  EXPECT_THAT(report.problems[0].message, HasSubstr("[4:8, 5:11]"));
}

TEST_F(VerifyTest, Verify_TruncatedFile_FileTooShortNamingChunks) {
  const v1::ChunkEntry& chunk = manifest_.tensors(0).chunks(3);
  const std::string path = JoinPath(dir_, chunk.file());
  ASSERT_EQ(truncate(path.c_str(), chunk.offset() + 10), 0);
  VerifyReport report = Verify();
  bool found = false;
  for (const VerifyProblem& p : report.problems) {
    if (p.kind == ProblemKind::kFileTooShort && p.tensor_key == "layers.0.wq") {
      found = true;
      EXPECT_EQ(p.chunk, "[4:8, 6:12]");
      EXPECT_EQ(p.file, chunk.file());
    }
  }
  EXPECT_TRUE(found) << Describe(report);
}

TEST_F(VerifyTest, Verify_MissingFile_FileMissing) {
  ASSERT_TRUE(storage_.RemoveTree(JoinPath(dir_, DataFileName(1))).ok());
  VerifyReport report = Verify();
  ASSERT_EQ(report.problems.size(), 1u) << Describe(report);
  EXPECT_EQ(report.problems[0].kind, ProblemKind::kFileMissing);
  EXPECT_EQ(report.problems[0].file, DataFileName(1));
}

TEST_F(VerifyTest, Verify_CorruptHeader_HeaderInvalid) {
  OverwriteByte(JoinPath(dir_, DataFileName(0)), 8, 'x');  // the JSON's opening brace
  VerifyReport report = Verify();
  ASSERT_EQ(report.problems.size(), 1u) << Describe(report);
  EXPECT_EQ(report.problems[0].kind, ProblemKind::kHeaderInvalid);
  EXPECT_EQ(report.problems[0].file, DataFileName(0));
}

TEST_F(VerifyTest, Verify_ManifestOffsetDisagreesWithHeader_HeaderMismatch) {
  RewriteManifest([](v1::Manifest& m) {
    v1::ChunkEntry* c = m.mutable_tensors(0)->mutable_chunks(0);
    c->set_offset(c->offset() + 4);
  });
  VerifyReport report = Verify();
  bool found = false;
  for (const VerifyProblem& p : report.problems) {
    if (p.kind == ProblemKind::kHeaderMismatch) {
      found = true;
      EXPECT_EQ(p.tensor_key, "layers.0.wq");
      EXPECT_EQ(p.chunk, "[0:4, 0:6]");
      EXPECT_THAT(p.message, HasSubstr("layers.0.wq@0,0"));
    }
  }
  EXPECT_TRUE(found) << Describe(report);
}

TEST_F(VerifyTest, Verify_MalformedOrMissingManifest_ManifestProblem) {
  RewriteManifest([](v1::Manifest& m) { m.set_format_version(7); });
  VerifyReport report = Verify();
  ASSERT_EQ(report.problems.size(), 1u) << Describe(report);
  EXPECT_EQ(report.problems[0].kind, ProblemKind::kManifest);
  EXPECT_THAT(report.problems[0].message, HasSubstr("format_version"));

  report = VerifyCheckpoint(storage_, JoinPath(dir_, "nowhere"));
  ASSERT_EQ(report.problems.size(), 1u);
  EXPECT_EQ(report.problems[0].code, v1::ERROR_CODE_CHECKPOINT_NOT_FOUND);
}

TEST_F(VerifyTest, Verify_ManyProblems_Capped) {
  for (int f = 0; f < 4; ++f) {
    ASSERT_TRUE(storage_.RemoveTree(JoinPath(dir_, DataFileName(f))).ok());
  }
  VerifyOptions options;
  options.max_problems = 2;
  VerifyReport report = Verify(options);
  EXPECT_EQ(report.problems.size(), 2u);
  EXPECT_EQ(report.problems_dropped, 2u);
  EXPECT_FALSE(report.ok());
}

}  // namespace
}  // namespace tessera
