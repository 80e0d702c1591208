#include "client/cli/offline_commands.h"

#include <fcntl.h>
#include <unistd.h>

#include <sstream>
#include <string>

#include "storage/posix_storage.h"
#include "storage/storage.h"
#include "client/cli/exit_codes.h"
#include "format/test_checkpoint.h"
#include "storage/testing.h"
#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"

namespace tessera {
namespace cli {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing_checkpoint::GridChunks;
using testing_checkpoint::RandomTensor;
using testing_checkpoint::TestChunk;
using testing_checkpoint::TestTensor;

// Parses `json` as a generic JSON document; fails the test if it is not one.
google::protobuf::Struct ParseJson(const std::string& json) {
  google::protobuf::Struct doc;
  auto status = google::protobuf::util::JsonStringToMessage(json, &doc);
  EXPECT_TRUE(status.ok()) << status.ToString() << "\n" << json;
  return doc;
}

void CorruptByte(const std::string& path, uint64_t offset) {
  int fd = open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  char c = 0;
  ASSERT_EQ(pread(fd, &c, 1, offset), 1);
  c ^= 0x01;
  ASSERT_EQ(pwrite(fd, &c, 1, offset), 1);
  close(fd);
}

class OfflineCommandsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("offline_commands_test");
    ASSERT_FALSE(dir_.empty());
    TestTensor wq = RandomTensor("layers.0.wq", v1::DTYPE_F32, {8, 12}, 1);
    wq.chunks = GridChunks(wq.shape, {2, 2}, 2);
    TestTensor absent;
    absent.kind = v1::SHARD_KIND_OPTIMIZER;
    absent.fqn = "layers.0.wq";
    absent.state_key = "exp_avg";
    absent.shape = {8, 12};
    absent.state_absent = true;
    TestTensor rng = RandomTensor("rng", v1::DTYPE_U8, {16}, 2);
    rng.kind = v1::SHARD_KIND_EXTRA;
    rng.chunks = {TestChunk{FullBox(rng.shape), 0}};
    auto m = testing_checkpoint::WriteTestCheckpoint(storage_, dir_, {wq, absent, rng});
    ASSERT_TRUE(m.ok()) << m.status();
    manifest_ = *m;
  }

  int Verify(VerifyCommandOptions options = {}) {
    out_.str("");
    err_.str("");
    return VerifyCommand(storage_, dir_, options, out_, err_);
  }

  int Inspect(InspectCommandOptions options = {}) {
    out_.str("");
    err_.str("");
    return InspectCommand(storage_, dir_, options, out_, err_);
  }

  PosixStorage storage_;
  std::string dir_;
  v1::Manifest manifest_;
  std::ostringstream out_;
  std::ostringstream err_;
};

TEST_F(OfflineCommandsTest, Verify_GoodCheckpoint_OkLine) {
  EXPECT_EQ(Verify(), kExitOk);
  EXPECT_THAT(out_.str(), HasSubstr("OK: 3 tensors, 5 chunks, 400 bytes verified"));
  // The count includes the per-rank extra (rng#rank0), and the line says so.
  EXPECT_THAT(out_.str(), HasSubstr("; of the tensors, 1 is a per-rank extra: objects, RNG state)"));
  EXPECT_EQ(err_.str(), "");
}

TEST_F(OfflineCommandsTest, Verify_FlippedByte_Exit1NamingTensorChunkAndFile) {
  const v1::ChunkEntry& chunk = manifest_.tensors(0).chunks(1);
  CorruptByte(JoinPath(dir_, chunk.file()), chunk.offset());
  EXPECT_EQ(Verify(), kExitFailed);
  EXPECT_THAT(out_.str(), HasSubstr("FAILED: 1 problem in " + dir_));
  EXPECT_THAT(out_.str(), HasSubstr("CHECKSUM_MISMATCH: "));
  EXPECT_THAT(out_.str(), HasSubstr("layers.0.wq"));
  EXPECT_THAT(out_.str(), HasSubstr("[0:4, 6:12]"));
  EXPECT_THAT(out_.str(), HasSubstr(chunk.file()));

  VerifyCommandOptions json;
  json.json = true;
  EXPECT_EQ(Verify(json), kExitFailed);
  google::protobuf::Struct doc = ParseJson(out_.str());
  EXPECT_FALSE(doc.fields().at("ok").bool_value());
  const auto& problems = doc.fields().at("problems").list_value();
  ASSERT_EQ(problems.values_size(), 1);
  const auto& p = problems.values(0).struct_value().fields();
  EXPECT_EQ(p.at("kind").string_value(), "CHECKSUM_MISMATCH");
  EXPECT_EQ(p.at("tensor").string_value(), "layers.0.wq");
  EXPECT_EQ(p.at("chunk").string_value(), "[0:4, 6:12]");
  EXPECT_EQ(p.at("file").string_value(), chunk.file());
}

TEST_F(OfflineCommandsTest, Verify_ManyProblems_ListCapped) {
  // Remove both data files: every chunk's file is missing.
  ASSERT_TRUE(storage_.RemoveTree(JoinPath(dir_, "data-0.safetensors")).ok());
  ASSERT_TRUE(storage_.RemoveTree(JoinPath(dir_, "data-1.safetensors")).ok());
  VerifyCommandOptions options;
  options.max_listed = 1;
  EXPECT_EQ(Verify(options), kExitFailed);
  EXPECT_THAT(out_.str(), HasSubstr("FILE_MISSING"));
  EXPECT_THAT(out_.str(), HasSubstr("more (use --json for all)"));
}

TEST_F(OfflineCommandsTest, Verify_NoSuchDirectory_UsageError) {
  dir_ = JoinPath(dir_, "nope");
  EXPECT_EQ(Verify(), kExitError);
  EXPECT_THAT(err_.str(), HasSubstr("cannot read checkpoint directory"));
  EXPECT_EQ(out_.str(), "");
}

TEST_F(OfflineCommandsTest, Inspect_Table_TensorsAndFiles) {
  EXPECT_EQ(Inspect(), kExitOk);
  const std::string text = out_.str();
  EXPECT_THAT(text, HasSubstr("job job  step 100  session s100-00000000000000aa"));
  EXPECT_THAT(text, HasSubstr("3 tensors: 1 params, 1 optimizer (1 absent), 1 extra; 5 chunks in "
                              "2 data files; 400 B"));
  EXPECT_THAT(text, HasSubstr("KEY                  KIND                DTYPE  SHAPE    CHUNKS  "
                              "BYTES"));
  EXPECT_THAT(text, HasSubstr("layers.0.wq          param               F32    [8, 12]       4  "
                              "384 B\n"));
  EXPECT_THAT(text, HasSubstr("layers.0.wq#exp_avg  optimizer (absent)"));
  EXPECT_THAT(text, HasSubstr("rng#rank0            extra               U8     [16]"));
  EXPECT_THAT(text, HasSubstr("data-0.safetensors"));
  EXPECT_THAT(text, Not(HasSubstr("missing")));
  EXPECT_THAT(text, Not(HasSubstr("WRITER"))) << "chunks listed only with --chunks";
}

TEST_F(OfflineCommandsTest, Inspect_Json_ParsesWithChunksAndMissingFile) {
  ASSERT_TRUE(storage_.RemoveTree(JoinPath(dir_, "data-1.safetensors")).ok());
  InspectCommandOptions options;
  options.json = true;
  options.chunks = true;
  EXPECT_EQ(Inspect(options), kExitOk);
  google::protobuf::Struct doc = ParseJson(out_.str());
  EXPECT_EQ(doc.fields().at("step").number_value(), 100);
  const auto& tensors = doc.fields().at("tensors").list_value();
  ASSERT_EQ(tensors.values_size(), 3);
  const auto& wq = tensors.values(0).struct_value().fields();
  EXPECT_EQ(wq.at("key").string_value(), "layers.0.wq");
  EXPECT_EQ(wq.at("chunk_list").list_value().values_size(), 4);
  EXPECT_EQ(wq.at("shape").list_value().values(1).number_value(), 12);
  const auto& files = doc.fields().at("files").list_value();
  ASSERT_EQ(files.values_size(), 2);
  EXPECT_EQ(files.values(1).struct_value().fields().at("name").string_value(),
            "data-1.safetensors");
  EXPECT_EQ(files.values(1).struct_value().fields().at("size").kind_case(),
            google::protobuf::Value::kNullValue);
}

TEST_F(OfflineCommandsTest, Inspect_NoManifest_UsageError) {
  ASSERT_TRUE(storage_.RemoveTree(JoinPath(dir_, "manifest.pb")).ok());
  EXPECT_EQ(Inspect(), kExitError);
  EXPECT_THAT(err_.str(), HasSubstr("cannot read the manifest of " + dir_));
}

TEST_F(OfflineCommandsTest, Export_ReportSaysWhatWasSkipped) {
  const std::string out_dir = MakeTempDir("offline_commands_test_out");
  ASSERT_FALSE(out_dir.empty());
  std::ostringstream out, err;
  EXPECT_EQ(ExportCommand(storage_, dir_, JoinPath(out_dir, "m.safetensors"), {}, false, out, err),
            kExitOk);
  EXPECT_THAT(out.str(), HasSubstr("1 tensor, 384 B"));
  EXPECT_THAT(out.str(), HasSubstr("skipped 1 extra (per-rank opaque bytes, not tensors): "
                                   "rng#rank0"));
  EXPECT_THAT(out.str(), HasSubstr("skipped 1 optimizer state recorded as absent"));

  std::ostringstream out2, err2;
  EXPECT_EQ(ExportCommand(storage_, JoinPath(dir_, "nope"), JoinPath(out_dir, "x.safetensors"), {},
                          false, out2, err2),
            kExitError);
  EXPECT_THAT(err2.str(), HasSubstr("export of"));
}

}  // namespace
}  // namespace cli
}  // namespace tessera
