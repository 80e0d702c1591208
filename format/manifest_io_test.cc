#include "format/manifest_io.h"

#include <string>
#include <vector>

#include "storage/fault_injecting_storage.h"
#include "storage/posix_storage.h"
#include "storage/storage.h"
#include "common/box.h"
#include "common/status.h"
#include "format/test_checkpoint.h"
#include "storage/testing.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing_checkpoint::GridChunks;
using testing_checkpoint::RandomTensor;
using testing_checkpoint::TestTensor;

class ManifestIoTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("manifest_io_test");
    ASSERT_FALSE(dir_.empty());
    TestTensor w = RandomTensor("layers.0.w", v1::DTYPE_F32, {8, 6}, 1);
    w.chunks = GridChunks(w.shape, {2, 2}, 2);
    TestTensor absent;
    absent.kind = v1::SHARD_KIND_OPTIMIZER;
    absent.fqn = "layers.0.w";
    absent.state_key = "exp_avg";
    absent.shape = {8, 6};
    absent.state_absent = true;
    absl::StatusOr<v1::Manifest> m =
        testing_checkpoint::WriteTestData(storage_, dir_, {w, absent});
    ASSERT_TRUE(m.ok()) << m.status();
    manifest_ = *m;
  }

  // Writes `m` unvalidated and reads it back.
  absl::StatusOr<v1::Manifest> RoundTrip(const v1::Manifest& m) {
    RETURN_IF_ERROR(WriteManifest(storage_, dir_, m));
    return ReadManifest(storage_, dir_);
  }

  PosixStorage storage_;
  std::string dir_;
  v1::Manifest manifest_;
};

TEST_F(ManifestIoTest, Write_ThenRead_SameManifestAndReadableJson) {
  ASSERT_TRUE(ValidateManifest(manifest_).ok()) << ValidateManifest(manifest_);
  absl::StatusOr<v1::Manifest> read = RoundTrip(manifest_);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*read, manifest_));

  absl::StatusOr<std::string> json =
      ReadFileToString(storage_, JoinPath(dir_, kManifestJsonFileName));
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_THAT(*json, HasSubstr("\n"));  // pretty-printed
  EXPECT_THAT(*json, HasSubstr("\"global_shape\""));  // .proto field names
  EXPECT_THAT(*json, HasSubstr("\"layers.0.w#exp_avg\""));
  v1::Manifest from_json;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(*json, &from_json).ok());
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(from_json, manifest_));
}

TEST_F(ManifestIoTest, Write_LeavesNoTemporaryFiles) {
  ASSERT_TRUE(WriteManifest(storage_, dir_, manifest_).ok());
  ASSERT_TRUE(WriteManifest(storage_, dir_, manifest_).ok());  // replaces
  absl::StatusOr<std::vector<std::string>> names = storage_.ListDir(dir_);
  ASSERT_TRUE(names.ok());
  EXPECT_THAT(*names, ElementsAre("data-0.safetensors", "data-1.safetensors", "manifest.json",
                                  "manifest.pb"));
}

TEST_F(ManifestIoTest, Write_RenameFails_ErrorAndNoTemporaryFiles) {
  FaultInjectingStorage faulty(&storage_);
  faulty.FailRename(EIO);
  absl::Status s = WriteManifest(faulty, dir_, manifest_);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_EQ(GetErrorCode(s), v1::ERROR_CODE_IO_ERROR);
  absl::StatusOr<std::vector<std::string>> names = storage_.ListDir(dir_);
  ASSERT_TRUE(names.ok());
  EXPECT_THAT(*names, ElementsAre("data-0.safetensors", "data-1.safetensors"));
}

TEST_F(ManifestIoTest, Read_NoManifest_NotFoundCheckpointNotFound) {
  absl::StatusOr<v1::Manifest> read = ReadManifest(storage_, dir_);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(GetErrorCode(read.status()), v1::ERROR_CODE_CHECKPOINT_NOT_FOUND);
  EXPECT_EQ(GetErrorDetail(read.status())->path(), JoinPath(dir_, "manifest.pb"));

  read = ReadManifest(storage_, JoinPath(dir_, "no-such-dir"));
  EXPECT_EQ(GetErrorCode(read.status()), v1::ERROR_CODE_CHECKPOINT_NOT_FOUND);
}

TEST_F(ManifestIoTest, Read_GarbageBytes_DataLossWithPath) {
  absl::StatusOr<std::unique_ptr<WritableFile>> f =
      storage_.OpenForWrite(JoinPath(dir_, "manifest.pb"));
  ASSERT_TRUE(f.ok());
  const std::string garbage = "\xff\xff\xff\xff not a protobuf";
  ASSERT_TRUE((*f)->WriteAt(0, garbage.data(), garbage.size()).ok());
  ASSERT_TRUE((*f)->Close().ok());
  absl::StatusOr<v1::Manifest> read = ReadManifest(storage_, dir_);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(read.status().message(), HasSubstr(JoinPath(dir_, "manifest.pb")));
  EXPECT_EQ(GetErrorDetail(read.status())->path(), JoinPath(dir_, "manifest.pb"));
}

// Each mutation makes the manifest malformed; the message must say why.
struct Malformation {
  const char* name;
  void (*mutate)(v1::Manifest&);
  const char* expect;
};

TEST_F(ManifestIoTest, Read_Malformed_DataLossSayingWhy) {
  const Malformation cases[] = {
      {"version", [](v1::Manifest& m) { m.set_format_version(2); }, "format_version is 2"},
      {"job", [](v1::Manifest& m) { m.set_job_id("../etc"); }, "job_id"},
      {"session", [](v1::Manifest& m) { m.clear_session_id(); }, "session_id is empty"},
      {"dup key", [](v1::Manifest& m) { *m.add_tensors() = m.tensors(0); },
       "appears more than once"},
      {"key", [](v1::Manifest& m) { m.mutable_tensors(0)->set_key("other"); },
       "key should be \"layers.0.w\""},
      {"fqn", [](v1::Manifest& m) {
         m.mutable_tensors(0)->set_fqn("a#b");
         m.mutable_tensors(0)->set_key("a#b");
       },
       "bad fqn"},
      {"dtype", [](v1::Manifest& m) { m.mutable_tensors(0)->set_dtype(v1::DTYPE_UNSPECIFIED); },
       "dtype"},
      {"box outside",
       [](v1::Manifest& m) { m.mutable_tensors(0)->mutable_chunks(3)->mutable_box()->set_offsets(0, 6); },
       "is not inside the tensor"},
      {"box rank",
       [](v1::Manifest& m) { m.mutable_tensors(0)->mutable_chunks(0)->mutable_box()->add_offsets(0); },
       "is not inside the tensor"},
      {"dotdot", [](v1::Manifest& m) { m.mutable_tensors(0)->mutable_chunks(0)->set_file(".."); },
       "not a plain file name"},
      {"slash",
       [](v1::Manifest& m) { m.mutable_tensors(0)->mutable_chunks(0)->set_file("../x.safetensors"); },
       "not a plain file name"},
      {"manifest as data",
       [](v1::Manifest& m) { m.mutable_tensors(0)->mutable_chunks(0)->set_file("manifest.pb"); },
       "not a plain file name"},
      {"nbytes", [](v1::Manifest& m) { m.mutable_tensors(0)->mutable_chunks(0)->set_nbytes(7); },
       "has nbytes 7"},
      {"blocks", [](v1::Manifest& m) { m.mutable_tensors(0)->mutable_chunks(0)->add_block_xxh3(1); },
       "block checksums"},
      {"block size", [](v1::Manifest& m) { m.mutable_tensors(0)->mutable_chunks(0)->set_block_size(0); },
       "block_size 0"},
      {"offset overflow",
       [](v1::Manifest& m) { m.mutable_tensors(0)->mutable_chunks(0)->set_offset(~0ull - 3); },
       "past 2^64"},
      {"absent on param", [](v1::Manifest& m) { m.mutable_tensors(0)->set_state_absent(true); },
       "state_absent"},
      {"total", [](v1::Manifest& m) { m.set_total_bytes(m.total_bytes() + 1); }, "total_bytes"},
  };
  for (const Malformation& c : cases) {
    SCOPED_TRACE(c.name);
    v1::Manifest m = manifest_;
    c.mutate(m);
    EXPECT_THAT(ValidateManifest(m).message(), HasSubstr(c.expect));
    absl::StatusOr<v1::Manifest> read = RoundTrip(m);
    EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss) << read.status();
    EXPECT_THAT(read.status().message(), HasSubstr(c.expect));
    EXPECT_THAT(read.status().message(), HasSubstr("manifest.pb"));
  }
}

// The planner records optimizer state that no rank has yet as one entry "<fqn>#" with an
// empty state key (server/plan/planner.h); such a manifest must commit and read back.
TEST_F(ManifestIoTest, Validate_AbsentOptimizerStateWithoutKey_Accepted) {
  v1::Manifest m = manifest_;
  v1::TensorEntry* absent = m.add_tensors();
  absent->set_key("layers.9.w#");
  absent->set_fqn("layers.9.w");
  absent->set_kind(v1::SHARD_KIND_OPTIMIZER);
  absent->set_state_absent(true);
  absent->set_dtype(v1::DTYPE_F32);
  absent->add_global_shape(4);
  EXPECT_TRUE(ValidateManifest(m).ok()) << ValidateManifest(m);
  absent->set_state_absent(false);  // an empty key is only the absent marker
  EXPECT_FALSE(ValidateManifest(m).ok());
}

TEST(IsPlainFileNameTest, OnlyPlainNames) {
  EXPECT_TRUE(IsPlainFileName("data-0.safetensors"));
  EXPECT_TRUE(IsPlainFileName("..data"));
  EXPECT_FALSE(IsPlainFileName(""));
  EXPECT_FALSE(IsPlainFileName("."));
  EXPECT_FALSE(IsPlainFileName(".."));
  EXPECT_FALSE(IsPlainFileName("a/b"));
  EXPECT_FALSE(IsPlainFileName("/abs"));
  EXPECT_FALSE(IsPlainFileName(std::string("a\0b", 3)));
  EXPECT_FALSE(IsPlainFileName(std::string(256, 'a')));
  EXPECT_FALSE(IsPlainFileName("manifest.json"));
}

}  // namespace
}  // namespace tessera
