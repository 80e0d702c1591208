#include "client/cli/export.h"

#include <fcntl.h>
#include <unistd.h>

#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "format/data_file.h"
#include "storage/posix_storage.h"
#include "storage/storage.h"
#include "common/box.h"
#include "common/dtype.h"
#include "common/status.h"
#include "format/test_checkpoint.h"
#include "storage/testing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace cli {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;
using testing_checkpoint::GridChunks;
using testing_checkpoint::RandomTensor;
using testing_checkpoint::TestChunk;
using testing_checkpoint::TestTensor;

// What a consolidated file holds, parsed with the data-file library's strict reader.
struct Parsed {
  SafetensorsHeader header;
  std::map<std::string, std::string> bodies;  // entry name -> bytes
  std::map<std::string, const SafetensorsEntry*> entries;
};

Parsed ParseExport(Storage& storage, const std::string& path) {
  Parsed parsed;
  absl::StatusOr<std::string> bytes = ReadFileToString(storage, path);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  if (!bytes.ok()) return parsed;
  absl::StatusOr<SafetensorsHeader> header = ParseSafetensorsHeader(*bytes);
  EXPECT_TRUE(header.ok()) << header.status();
  if (!header.ok()) return parsed;
  // What safetensors readers check: known dtypes, sizes, and a data section tiled exactly.
  EXPECT_TRUE(ValidateSafetensorsLayout(*header, bytes->size()).ok());
  EXPECT_EQ(header->data_start % 8, 0u) << "data starts 8-byte aligned";
  parsed.header = *std::move(header);
  for (const SafetensorsEntry& e : parsed.header.entries) {
    parsed.bodies[e.name] = bytes->substr(parsed.header.data_start + e.begin, e.end - e.begin);
    parsed.entries[e.name] = &e;
  }
  return parsed;
}

class ExportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("export_test");
    ASSERT_FALSE(dir_.empty());
    // Parameters of several dtypes, chunked across files, plus every kind of thing that is
    // not a parameter.
    wq_ = RandomTensor("layers.0.wq", v1::DTYPE_F32, {8, 12}, 1);
    wq_.chunks = GridChunks(wq_.shape, {2, 3}, 3);
    mlp_ = RandomTensor("layers.1.mlp", v1::DTYPE_BF16, {6, 6, 10}, 2);
    mlp_.chunks = GridChunks(mlp_.shape, {3, 1, 2}, 2);
    step_ = RandomTensor("step", v1::DTYPE_I64, {}, 3);
    step_.chunks = {TestChunk{Box{}, 1}};
    empty_ = RandomTensor("empty", v1::DTYPE_F32, {0, 5}, 4);
    empty_.chunks = {TestChunk{FullBox(empty_.shape), 0}};
    mask_ = RandomTensor("mask", v1::DTYPE_BOOL, {7}, 5);
    mask_.chunks = GridChunks(mask_.shape, {2}, 1);
    exp_avg_ = RandomTensor("layers.0.wq", v1::DTYPE_F32, {8, 12}, 6);
    exp_avg_.kind = v1::SHARD_KIND_OPTIMIZER;
    exp_avg_.state_key = "exp_avg";
    exp_avg_.chunks = GridChunks(exp_avg_.shape, {4, 1}, 2);
    absent_.kind = v1::SHARD_KIND_OPTIMIZER;
    absent_.fqn = "layers.1.mlp";
    absent_.state_key = "exp_avg";
    absent_.dtype = v1::DTYPE_BF16;
    absent_.shape = {6, 6, 10};
    absent_.state_absent = true;
    rng_ = RandomTensor("rng", v1::DTYPE_U8, {16}, 7);
    rng_.kind = v1::SHARD_KIND_EXTRA;
    rng_.rank = 3;
    rng_.chunks = {TestChunk{FullBox(rng_.shape), 0}};
    auto m = testing_checkpoint::WriteTestCheckpoint(
        storage_, dir_, {wq_, mlp_, step_, empty_, mask_, exp_avg_, absent_, rng_});
    ASSERT_TRUE(m.ok()) << m.status();
    manifest_ = *m;
    out_dir_ = MakeTempDir("export_test_out");
    ASSERT_FALSE(out_dir_.empty());
  }

  void ExpectTensor(const Parsed& parsed, const TestTensor& t) {
    auto it = parsed.entries.find(t.key());
    ASSERT_NE(it, parsed.entries.end()) << t.key();
    EXPECT_EQ(it->second->dtype, DTypeName(t.dtype)) << t.key();
    EXPECT_EQ(it->second->shape, std::vector<uint64_t>(t.shape.begin(), t.shape.end())) << t.key();
    EXPECT_EQ(parsed.bodies.at(t.key()), t.data) << t.key() << ": bytes differ";
    // Each tensor starts aligned to its element size.
    EXPECT_EQ((parsed.header.data_start + it->second->begin) % DTypeSize(t.dtype), 0u) << t.key();
  }

  PosixStorage storage_;
  std::string dir_;
  std::string out_dir_;
  v1::Manifest manifest_;
  TestTensor wq_, mlp_, step_, empty_, mask_, exp_avg_, absent_, rng_;
};

TEST_F(ExportTest, Params_WholeTensorsReadable_NonParamsReported) {
  const std::string out = JoinPath(out_dir_, "model.safetensors");
  absl::StatusOr<ExportReport> report = ExportConsolidated(storage_, dir_, out);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->tensors, 5u);
  EXPECT_EQ(report->data_bytes,
            wq_.data.size() + mlp_.data.size() + step_.data.size() + mask_.data.size());
  EXPECT_THAT(report->skipped_extras, ElementsAre("rng#rank3"));
  EXPECT_THAT(report->skipped_absent_optimizer, ElementsAre("layers.1.mlp#exp_avg"));
  EXPECT_THAT(report->skipped_optimizer, ElementsAre("layers.0.wq#exp_avg"));

  absl::StatusOr<uint64_t> size = storage_.FileSize(out);
  ASSERT_TRUE(size.ok());
  EXPECT_EQ(*size, report->file_bytes);
  Parsed parsed = ParseExport(storage_, out);
  EXPECT_EQ(parsed.entries.size(), 5u) << "no padding entries, nothing but the params";
  for (const TestTensor* t : {&wq_, &mlp_, &step_, &empty_, &mask_}) ExpectTensor(parsed, *t);
  EXPECT_THAT(
      parsed.header.metadata,
      ElementsAre(Pair("format", "pt"), Pair("tessera_job", "job"), Pair("tessera_step", "100"),
                  Pair("tessera_session", "s100-00000000000000aa")));
  // No temporary file is left next to the output.
  EXPECT_TRUE(absl::IsNotFound(storage_.FileSize(out + ".tessera-tmp").status()));
}

TEST_F(ExportTest, FilterAll_IncludesPresentOptimizerState) {
  const std::string out = JoinPath(out_dir_, "all.safetensors");
  ExportOptions options;
  options.filter = ExportFilter::kAll;
  absl::StatusOr<ExportReport> report = ExportConsolidated(storage_, dir_, out, options);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->tensors, 6u);
  EXPECT_TRUE(report->skipped_optimizer.empty());
  EXPECT_THAT(report->skipped_absent_optimizer, ElementsAre("layers.1.mlp#exp_avg"));
  Parsed parsed = ParseExport(storage_, out);
  EXPECT_EQ(parsed.entries.size(), 6u);
  for (const TestTensor* t : {&wq_, &mlp_, &step_, &empty_, &mask_, &exp_avg_}) {
    ExpectTensor(parsed, *t);
  }
}

TEST_F(ExportTest, TinyBuffer_TensorsReadInPieces_SameBytes) {
  const std::string out = JoinPath(out_dir_, "pieces.safetensors");
  ExportOptions options;
  options.filter = ExportFilter::kAll;
  options.max_buffer_bytes = 36;  // 9 F32 elements: pieces cross chunk and row boundaries
  absl::StatusOr<ExportReport> report = ExportConsolidated(storage_, dir_, out, options);
  ASSERT_TRUE(report.ok()) << report.status();
  Parsed parsed = ParseExport(storage_, out);
  for (const TestTensor* t : {&wq_, &mlp_, &step_, &empty_, &mask_, &exp_avg_}) {
    ExpectTensor(parsed, *t);
  }
}

TEST_F(ExportTest, CorruptChunk_FailsWithChecksumMismatch_NoOutputLeft) {
  // Flip one byte of wq's first chunk.
  const v1::ChunkEntry& chunk = manifest_.tensors(0).chunks(0);
  const std::string file = JoinPath(dir_, chunk.file());
  int fd = open(file.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  char c = 0;
  ASSERT_EQ(pread(fd, &c, 1, chunk.offset() + 5), 1);
  c ^= 0x10;
  ASSERT_EQ(pwrite(fd, &c, 1, chunk.offset() + 5), 1);
  close(fd);

  const std::string out = JoinPath(out_dir_, "bad.safetensors");
  absl::StatusOr<ExportReport> report = ExportConsolidated(storage_, dir_, out);
  ASSERT_FALSE(report.ok());
  EXPECT_TRUE(absl::IsDataLoss(report.status())) << report.status();
  EXPECT_EQ(GetErrorCode(report.status()), v1::ERROR_CODE_CHECKSUM_MISMATCH) << report.status();
  EXPECT_TRUE(absl::IsNotFound(storage_.FileSize(out).status()));
  EXPECT_TRUE(absl::IsNotFound(storage_.FileSize(out + ".tessera-tmp").status()));
}

TEST_F(ExportTest, ExistingOutput_ReplacedWhole) {
  const std::string out = JoinPath(out_dir_, "model.safetensors");
  {
    auto f = storage_.OpenForWrite(out);
    ASSERT_TRUE(f.ok());
    const std::string junk(100000, 'x');  // longer than the export: must not linger
    ASSERT_TRUE((*f)->WriteAt(0, junk.data(), junk.size()).ok());
    ASSERT_TRUE((*f)->Close().ok());
  }
  absl::StatusOr<ExportReport> report = ExportConsolidated(storage_, dir_, out);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(*storage_.FileSize(out), report->file_bytes);
  ExpectTensor(ParseExport(storage_, out), wq_);
}

TEST_F(ExportTest, NoManifest_NotFound) {
  absl::StatusOr<ExportReport> report =
      ExportConsolidated(storage_, out_dir_, JoinPath(out_dir_, "x.safetensors"));
  ASSERT_FALSE(report.ok());
  EXPECT_TRUE(absl::IsNotFound(report.status())) << report.status();
  EXPECT_EQ(GetErrorCode(report.status()), v1::ERROR_CODE_CHECKPOINT_NOT_FOUND);
}

TEST_F(ExportTest, OutputDirMissing_NotFound) {
  absl::StatusOr<ExportReport> report =
      ExportConsolidated(storage_, dir_, JoinPath(out_dir_, "no/such/dir/x.safetensors"));
  ASSERT_FALSE(report.ok());
  EXPECT_TRUE(absl::IsNotFound(report.status())) << report.status();
}

TEST(ParseExportFilter, KnownNames_UnknownRejected) {
  EXPECT_EQ(*ParseExportFilter("params"), ExportFilter::kParams);
  EXPECT_EQ(*ParseExportFilter("all"), ExportFilter::kAll);
  absl::StatusOr<ExportFilter> bad = ParseExportFilter("optimizer");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("params or all"));
}

}  // namespace
}  // namespace cli
}  // namespace tessera
