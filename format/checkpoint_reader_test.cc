#include "format/checkpoint_reader.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/box.h"
#include "common/checksum.h"
#include "common/status.h"
#include "format/manifest_io.h"
#include "format/test_checkpoint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/posix_storage.h"
#include "storage/testing.h"
#include "storage/storage.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;
using testing_checkpoint::DataFileName;
using testing_checkpoint::GridChunks;
using testing_checkpoint::RandomTensor;
using testing_checkpoint::Reference;
using testing_checkpoint::TestChunk;
using testing_checkpoint::TestTensor;

// Overwrites one byte of a file in place (Storage::OpenForWrite would truncate it).
void FlipByte(const std::string& path, uint64_t offset) {
  int fd = open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  char c = 0;
  ASSERT_EQ(pread(fd, &c, 1, offset), 1);
  c = static_cast<char>(c ^ 0x5a);
  ASSERT_EQ(pwrite(fd, &c, 1, offset), 1);
  close(fd);
}

Box MakeBox(std::vector<int64_t> offsets, std::vector<int64_t> lengths) {
  return Box{std::move(offsets), std::move(lengths)};
}

v1::FlatRange Range(int64_t begin, int64_t end) {
  v1::FlatRange r;
  r.set_begin(begin);
  r.set_end(end);
  return r;
}

// A checkpoint saved with a PP2 x TP2 style layout: every 2-d weight cut into a 2 x 2 grid
// with one piece per rank file, plus optimizer state gathered per row block, a 3-d tensor, a
// replicated norm, a scalar, an extra and an absent optimizer state.
//
// Parameter: whether every read, however small, bypasses the page cache (O_DIRECT with the
// storage's bounce buffers for unaligned ends) or none does.
PosixStorageOptions StorageOptions(bool direct) {
  PosixStorageOptions options;
  options.direct_io = direct;
  options.direct_read_min_bytes = 0;
  return options;
}

class CheckpointReaderTest : public ::testing::TestWithParam<bool> {
 protected:
  CheckpointReaderTest() : storage_(StorageOptions(GetParam())) {}

  void SetUp() override {
    dir_ = MakeTempDir("checkpoint_reader_test");
    ASSERT_FALSE(dir_.empty());

    TestTensor wq = RandomTensor("layers.0.attn.wq", v1::DTYPE_F32, {8, 12}, 11);
    wq.chunks = GridChunks(wq.shape, {2, 2}, 4);
    TestTensor exp_avg = RandomTensor("layers.0.attn.wq", v1::DTYPE_F32, {8, 12}, 12);
    exp_avg.kind = v1::SHARD_KIND_OPTIMIZER;
    exp_avg.state_key = "exp_avg";
    exp_avg.chunks = GridChunks(exp_avg.shape, {2, 1}, 2);
    TestTensor mlp = RandomTensor("layers.1.mlp.w", v1::DTYPE_BF16, {4, 6, 10}, 13);
    mlp.chunks = GridChunks(mlp.shape, {1, 2, 2}, 4);
    TestTensor norm = RandomTensor("norm.weight", v1::DTYPE_F32, {12}, 14);
    norm.chunks = {TestChunk{FullBox(norm.shape), 0}};
    TestTensor scalar = RandomTensor("step", v1::DTYPE_I64, {}, 15);
    scalar.chunks = {TestChunk{Box{}, 1}};
    TestTensor extra = RandomTensor("rng", v1::DTYPE_U8, {20}, 16);
    extra.kind = v1::SHARD_KIND_EXTRA;
    extra.rank = 3;
    extra.chunks = {TestChunk{FullBox(extra.shape), 3}};
    TestTensor absent;
    absent.kind = v1::SHARD_KIND_OPTIMIZER;
    absent.fqn = "layers.1.mlp.w";
    absent.state_key = "exp_avg";
    absent.dtype = v1::DTYPE_BF16;
    absent.shape = {4, 6, 10};
    absent.state_absent = true;
    tensors_ = {wq, exp_avg, mlp, norm, scalar, extra, absent};

    absl::StatusOr<v1::Manifest> m =
        testing_checkpoint::WriteTestCheckpoint(storage_, dir_, tensors_);
    ASSERT_TRUE(m.ok()) << m.status();
    manifest_ = *m;
  }

  std::unique_ptr<CheckpointReader> Open(CheckpointReaderOptions options = {}) {
    absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
        CheckpointReader::Open(&storage_, dir_, options);
    EXPECT_TRUE(reader.ok()) << reader.status();
    return reader.ok() ? *std::move(reader) : nullptr;
  }

  const TestTensor& Tensor(const std::string& key) {
    for (const TestTensor& t : tensors_) {
      if (t.key() == key) return t;
    }
    ADD_FAILURE() << key;
    return tensors_[0];
  }

  // A request for `box` (and flat range) of `key` into `*dest`, sized to fit.
  ReadRequest Request(const std::string& key, Box box, std::string* dest,
                      std::optional<v1::FlatRange> range = std::nullopt) {
    const TestTensor& t = Tensor(key);
    *dest = std::string(Reference(t, box, range).size(), '\x77');
    ReadRequest r;
    r.key = key;
    r.dtype = t.dtype;
    r.global_shape = t.shape;
    r.box = std::move(box);
    r.flat_range = range;
    r.dest = dest->data();
    r.dest_size = dest->size();
    return r;
  }

  // Reads one region and compares it with the brute-force reference.
  void ExpectReadMatches(CheckpointReader& reader, const std::string& key, const Box& box,
                         std::optional<v1::FlatRange> range = std::nullopt) {
    SCOPED_TRACE(absl::StrCat(
        key, " ", BoxToString(box),
        range ? absl::StrCat(" flat [", range->begin(), ", ", range->end(), ")") : ""));
    std::string got;
    ReadRequest r = Request(key, box, &got, range);
    absl::StatusOr<std::vector<ReadResult>> results = reader.Read({r});
    ASSERT_TRUE(results.ok()) << results.status();
    EXPECT_FALSE((*results)[0].state_absent);
    EXPECT_EQ(got, Reference(Tensor(key), box, range));
  }

  // Reads the whole of `key` with `memory`'s copies resident, checks it against the reference
  // and returns the read's stats.
  ReadStats ReadWholeWithMemory(const std::string& key, const ResidentFiles* memory) {
    const TestTensor& t = Tensor(key);
    std::unique_ptr<CheckpointReader> reader = Open();
    ReadStats stats;
    if (reader == nullptr) return stats;
    std::string got;
    absl::Status s = reader->Read({Request(key, FullBox(t.shape), &got)}, &stats, memory).status();
    EXPECT_TRUE(s.ok()) << s;
    EXPECT_EQ(got, Reference(t, FullBox(t.shape), std::nullopt));
    return stats;
  }

  // Reads "layers.0.attn.wq" whole through a memory-only reader of the manifest
  // (FromManifest) over the copies `files`; the status of that read.
  absl::Status ReadWqFromMemoryOnly(const ResidentFiles* files) {
    absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
        CheckpointReader::FromManifest(manifest_, "memory-only step");
    if (!reader.ok()) return reader.status();
    std::string got;
    return (*reader)
        ->Read({Request("layers.0.attn.wq", FullBox({8, 12}), &got)}, nullptr, files)
        .status();
  }

  // Rewrites the manifest after `mutate`, keeping total_bytes consistent.
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

  PosixStorage storage_;
  std::string dir_;
  std::vector<TestTensor> tensors_;
  v1::Manifest manifest_;
};

TEST_P(CheckpointReaderTest, Read_WholeTensors_MatchSavedBytes) {
  std::unique_ptr<CheckpointReader> reader = Open();
  ASSERT_NE(reader, nullptr);
  for (const TestTensor& t : tensors_) {
    if (t.state_absent) continue;
    ExpectReadMatches(*reader, t.key(), FullBox(t.shape));
  }
}

TEST_P(CheckpointReaderTest, Read_ReshardedBoxes_MatchReference) {
  std::unique_ptr<CheckpointReader> reader = Open();
  ASSERT_NE(reader, nullptr);
  // Row slice crossing the row-chunk boundary at 4 (e.g. loading on PP1 x TP4 along rows).
  ExpectReadMatches(*reader, "layers.0.attn.wq", MakeBox({2, 0}, {3, 12}));
  // Column slice crossing the column-chunk boundary at 6.
  ExpectReadMatches(*reader, "layers.0.attn.wq", MakeBox({0, 5}, {8, 4}));
  // TP4 column shard of a TP2-saved tensor.
  ExpectReadMatches(*reader, "layers.0.attn.wq", MakeBox({0, 9}, {8, 3}));
  // A 3-d sub-box crossing chunk boundaries on two axes.
  ExpectReadMatches(*reader, "layers.1.mlp.w", MakeBox({1, 2, 3}, {2, 3, 6}));
  // A flat range of a box crossing chunk boundaries (a distributed optimizer's slice).
  ExpectReadMatches(*reader, "layers.0.attn.wq", MakeBox({0, 4}, {8, 8}), Range(10, 50));
  ExpectReadMatches(*reader, "layers.0.attn.wq#exp_avg", MakeBox({2, 0}, {6, 12}), Range(7, 61));
  ExpectReadMatches(*reader, "layers.1.mlp.w", MakeBox({0, 1, 2}, {4, 5, 7}), Range(33, 100));
  // Empty flat range and empty box: nothing to read.
  ExpectReadMatches(*reader, "layers.0.attn.wq", MakeBox({0, 4}, {8, 8}), Range(5, 5));
  ExpectReadMatches(*reader, "layers.0.attn.wq", MakeBox({3, 4}, {0, 8}));
}

TEST_P(CheckpointReaderTest, Read_RandomRegions_MatchReference) {
  std::mt19937_64 gen(2024);
  auto uniform = [&](int64_t lo, int64_t hi) {  // [lo, hi]
    return std::uniform_int_distribution<int64_t>(lo, hi)(gen);
  };
  for (const CheckpointReaderOptions& options :
       {CheckpointReaderOptions{64, 1}, CheckpointReaderOptions{128, 3},
        CheckpointReaderOptions{1 << 20, 4}}) {
    std::unique_ptr<CheckpointReader> reader = Open(options);
    ASSERT_NE(reader, nullptr);
    for (int iter = 0; iter < 150; ++iter) {
      const std::string key = iter % 3 == 0   ? "layers.1.mlp.w"
                              : iter % 3 == 1 ? "layers.0.attn.wq"
                                              : "layers.0.attn.wq#exp_avg";
      const TestTensor& t = Tensor(key);
      Box box;
      for (int64_t dim : t.shape) {
        const int64_t off = uniform(0, dim - 1);
        box.offsets.push_back(off);
        box.lengths.push_back(uniform(1, dim - off));
      }
      std::optional<v1::FlatRange> range;
      if (iter % 2 == 1) {
        const int64_t volume = *Volume(box);
        const int64_t begin = uniform(0, volume);
        range = Range(begin, uniform(begin, volume));
      }
      ExpectReadMatches(*reader, key, box, range);
    }
  }
}

TEST_P(CheckpointReaderTest, Read_SeveralRequestsAtOnce_EachFilled) {
  std::unique_ptr<CheckpointReader> reader = Open(CheckpointReaderOptions{64, 3});
  ASSERT_NE(reader, nullptr);
  std::string a, b, c, d, e;
  std::vector<ReadRequest> requests = {
      Request("layers.0.attn.wq", MakeBox({0, 0}, {4, 12}), &a),
      Request("layers.0.attn.wq", MakeBox({4, 0}, {4, 12}), &b),  // same chunks, other rows
      Request("norm.weight", MakeBox({3}, {5}), &c),
      Request("step", Box{}, &d),
      Request("rng#rank3", MakeBox({0}, {20}), &e),
  };
  absl::StatusOr<std::vector<ReadResult>> results = reader->Read(requests);
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_EQ(a, Reference(Tensor("layers.0.attn.wq"), requests[0].box));
  EXPECT_EQ(b, Reference(Tensor("layers.0.attn.wq"), requests[1].box));
  EXPECT_EQ(c, Reference(Tensor("norm.weight"), requests[2].box));
  EXPECT_EQ(d, Tensor("step").data);
  EXPECT_EQ(e, Tensor("rng#rank3").data);
}

TEST_P(CheckpointReaderTest, ContiguousFile_OneChunkNamesItsFile_AcrossFilesRefused) {
  std::unique_ptr<CheckpointReader> reader = Open();
  ASSERT_NE(reader, nullptr);
  std::string chunk_file;  // the file of wq's top-left chunk, as the manifest says
  for (const v1::TensorEntry& tensor : manifest_.tensors()) {
    if (tensor.key() != "layers.0.attn.wq") continue;
    for (const v1::ChunkEntry& chunk : tensor.chunks()) {
      if (chunk.box().offsets(0) == 0 && chunk.box().offsets(1) == 0) chunk_file = chunk.file();
    }
  }
  ASSERT_FALSE(chunk_file.empty());
  std::string a, b, c;
  absl::StatusOr<std::string> file =
      reader->ContiguousFile({Request("layers.0.attn.wq", MakeBox({0, 0}, {4, 6}), &a),
                              Request("layers.0.attn.wq", MakeBox({1, 0}, {2, 6}), &b)});
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(*file, chunk_file);

  // The whole rows span the chunk beside it, in another file.
  absl::Status wide =
      reader->ContiguousFile({Request("layers.0.attn.wq", MakeBox({0, 0}, {4, 12}), &c)}).status();
  EXPECT_EQ(wide.code(), absl::StatusCode::kFailedPrecondition) << wide;
  EXPECT_THAT(wide.message(), HasSubstr("layers.0.attn.wq"));
}

TEST_P(CheckpointReaderTest, Plan_RowSlice_RunsFromBothRowChunks) {
  std::unique_ptr<CheckpointReader> reader = Open();
  ASSERT_NE(reader, nullptr);
  std::string dest;
  // Rows 3..4 of the 8 x 12 F32 tensor saved as 4 x 6 chunks: row 3 from the top two chunks,
  // row 4 from the bottom two; each chunk contributes one 24-byte run.
  absl::StatusOr<std::vector<RequestPlan>> plans =
      reader->Plan({Request("layers.0.attn.wq", MakeBox({3, 0}, {2, 12}), &dest)});
  ASSERT_TRUE(plans.ok()) << plans.status();
  const std::vector<ByteRun>& runs = (*plans)[0].runs;
  ASSERT_EQ(runs.size(), 4u);
  const v1::TensorEntry& tensor = manifest_.tensors(0);
  struct Want {
    int chunk;
    uint64_t chunk_offset, dest_offset;
  } want[] = {{0, 3 * 24, 0}, {1, 3 * 24, 24}, {2, 0, 48}, {3, 0, 72}};
  for (int i = 0; i < 4; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(runs[i].chunk->file(), tensor.chunks(want[i].chunk).file());
    EXPECT_EQ(runs[i].chunk_offset, want[i].chunk_offset);
    EXPECT_EQ(runs[i].length, 24u);
    EXPECT_EQ(runs[i].dest_offset, want[i].dest_offset);
    EXPECT_EQ(runs[i].file_offset(), tensor.chunks(want[i].chunk).offset() + want[i].chunk_offset);
  }
}

TEST_P(CheckpointReaderTest, Read_StateAbsent_FlagSetAndDestinationUntouched) {
  std::unique_ptr<CheckpointReader> reader = Open();
  ASSERT_NE(reader, nullptr);
  std::string dest;
  ReadRequest r = Request("layers.0.attn.wq", MakeBox({0, 0}, {1, 1}), &dest);
  std::string absent_dest(4 * 6 * 10 * 2, '\x77');
  ReadRequest absent;
  absent.key = "layers.1.mlp.w#exp_avg";
  absent.dtype = v1::DTYPE_BF16;
  absent.global_shape = {4, 6, 10};
  absent.box = FullBox(absent.global_shape);
  absent.dest = absent_dest.data();
  absent.dest_size = absent_dest.size();
  absl::StatusOr<std::vector<ReadResult>> results = reader->Read({absent, r});
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_TRUE((*results)[0].state_absent);
  EXPECT_FALSE((*results)[1].state_absent);
  EXPECT_EQ(absent_dest, std::string(absent_dest.size(), '\x77'));
}

TEST_P(CheckpointReaderTest, Read_SeveralShapeMismatches_OneErrorNamingEveryTensor) {
  std::unique_ptr<CheckpointReader> reader = Open();
  ASSERT_NE(reader, nullptr);
  std::string dest, good_dest;
  ReadRequest good = Request("layers.0.attn.wq", MakeBox({0, 0}, {1, 1}), &good_dest);
  ReadRequest shape = Request("layers.0.attn.wq", MakeBox({0, 0}, {1, 1}), &dest);
  shape.global_shape = {8, 24};
  std::string absent_dest(4 * 6 * 10 * 4, '\0');
  ReadRequest dtype;
  dtype.key = "layers.1.mlp.w#exp_avg";
  dtype.dtype = v1::DTYPE_F32;  // the checkpoint holds BF16
  dtype.global_shape = {4, 6, 10};
  dtype.box = FullBox(dtype.global_shape);
  dtype.dest = absent_dest.data();
  dtype.dest_size = absent_dest.size();

  absl::Status s = reader->Read({shape, good, dtype}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  std::optional<v1::ErrorDetail> detail = GetErrorDetail(s);
  ASSERT_TRUE(detail.has_value()) << s;
  EXPECT_EQ(detail->code(), v1::ERROR_CODE_SHAPE_MISMATCH);
  EXPECT_THAT(std::vector<std::string>(detail->fqns().begin(), detail->fqns().end()),
              ::testing::ElementsAre("layers.0.attn.wq", "layers.1.mlp.w#exp_avg"));
  EXPECT_THAT(s.message(), HasSubstr("2 tensors differ from the checkpoint in dtype or shape"));
  EXPECT_THAT(s.message(), HasSubstr("[8, 12]"));
  EXPECT_THAT(s.message(), HasSubstr("BF16"));
}

TEST_P(CheckpointReaderTest, Read_BadRequests_InvalidArgumentNamingKey) {
  std::unique_ptr<CheckpointReader> reader = Open();
  ASSERT_NE(reader, nullptr);
  std::string dest;

  ReadRequest unknown = Request("layers.0.attn.wq", MakeBox({0, 0}, {1, 1}), &dest);
  unknown.key = "layers.9.attn.wq";
  absl::Status s = reader->Read({unknown}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("layers.9.attn.wq"));

  ReadRequest shape = Request("layers.0.attn.wq", MakeBox({0, 0}, {1, 1}), &dest);
  shape.global_shape = {8, 24};
  s = reader->Read({shape}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GetErrorCode(s), v1::ERROR_CODE_SHAPE_MISMATCH);
  EXPECT_THAT(s.message(), HasSubstr("layers.0.attn.wq"));
  EXPECT_THAT(s.message(), HasSubstr("[8, 12]"));

  ReadRequest dtype = Request("layers.0.attn.wq", MakeBox({0, 0}, {1, 1}), &dest);
  dtype.dtype = v1::DTYPE_I32;  // same size, different type
  s = reader->Read({dtype}).status();
  EXPECT_EQ(GetErrorCode(s), v1::ERROR_CODE_SHAPE_MISMATCH);

  ReadRequest outside = Request("layers.0.attn.wq", MakeBox({0, 0}, {1, 1}), &dest);
  outside.box = MakeBox({7, 0}, {2, 1});
  EXPECT_EQ(reader->Read({outside}).status().code(), absl::StatusCode::kInvalidArgument);

  ReadRequest size = Request("layers.0.attn.wq", MakeBox({0, 0}, {1, 1}), &dest);
  size.dest_size = 8;
  s = reader->Read({size}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("destination holds 8 bytes"));

  ReadRequest range = Request("layers.0.attn.wq", MakeBox({0, 0}, {2, 2}), &dest);
  range.flat_range = Range(2, 5);
  EXPECT_EQ(reader->Read({range}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_P(CheckpointReaderTest, Read_FlippedByte_ChecksumMismatchNamingTensorChunkFileBlock) {
  // Chunk 1 of wq: rows 0..3, columns 6..11, 96 bytes in blocks of 64: flip a byte of block 1.
  const v1::ChunkEntry& chunk = manifest_.tensors(0).chunks(1);
  ASSERT_EQ(chunk.block_xxh3_size(), 2);
  FlipByte(JoinPath(dir_, chunk.file()), chunk.offset() + 70);

  std::unique_ptr<CheckpointReader> reader = Open();
  ASSERT_NE(reader, nullptr);
  std::string dest;
  absl::Status s = reader->Read({Request("layers.0.attn.wq", FullBox({8, 12}), &dest)}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_EQ(GetErrorCode(s), v1::ERROR_CODE_CHECKSUM_MISMATCH);
  EXPECT_THAT(s.message(), HasSubstr("\"layers.0.attn.wq\""));
  EXPECT_THAT(s.message(), HasSubstr("[0:4, 6:12]"));
  EXPECT_THAT(s.message(), HasSubstr(chunk.file()));
  EXPECT_THAT(s.message(), HasSubstr("block 1"));
  std::optional<v1::ErrorDetail> detail = GetErrorDetail(s);
  ASSERT_TRUE(detail.has_value());
  EXPECT_EQ(detail->path(), JoinPath(dir_, chunk.file()));
  EXPECT_THAT(detail->fqns(), ::testing::ElementsAre("layers.0.attn.wq"));
  EXPECT_EQ(BoxFromProto(detail->region()), MakeBox({0, 6}, {4, 6}));

  // Rows 0..1 of that chunk lie in block 0 only: verified and served.
  ExpectReadMatches(*reader, "layers.0.attn.wq", MakeBox({0, 6}, {2, 6}));
}

// Memory tier: every data file's bytes, as an agent's staging would hold them after the save.
class ResidentCopies {
 public:
  ResidentCopies(const std::string& dir, const v1::Manifest& manifest) {
    for (const v1::TensorEntry& t : manifest.tensors()) {
      for (const v1::ChunkEntry& c : t.chunks()) {
        if (bytes_.count(c.file()) != 0) continue;
        std::ifstream in(JoinPath(dir, c.file()), std::ios::binary);
        bytes_[c.file()].assign(std::istreambuf_iterator<char>(in), {});
      }
    }
    Refresh();
  }

  // The copy of `file`, to corrupt or cut short; call Refresh() after.
  std::string& bytes(const std::string& file) { return bytes_.at(file); }

  // Only file bytes [from, to) of `file` stay resident.
  void Keep(const std::string& file, uint64_t from, uint64_t to) { kept_[file] = {from, to}; }

  void Refresh() {
    files_.clear();
    for (auto& [name, data] : bytes_) {
      uint64_t from = 0;
      uint64_t to = data.size();
      if (auto it = kept_.find(name); it != kept_.end()) std::tie(from, to) = it->second;
      files_[name] = ResidentBytes{from, data.data() + from, to - from};
    }
  }

  const ResidentFiles* files() const { return &files_; }

 private:
  std::map<std::string, std::string> bytes_;
  std::map<std::string, std::pair<uint64_t, uint64_t>> kept_;
  ResidentFiles files_;
};

TEST_P(CheckpointReaderTest, Read_EveryFileResident_NothingReadFromFiles) {
  ResidentCopies memory(dir_, manifest_);
  for (const TestTensor& t : tensors_) {
    if (t.state_absent) continue;
    SCOPED_TRACE(t.key());
    const ReadStats stats = ReadWholeWithMemory(t.key(), memory.files());
    EXPECT_EQ(stats.bytes_read, 0u);
    EXPECT_EQ(stats.read_calls, 0u);
    EXPECT_EQ(stats.memory_blocks_rejected, 0u);
    EXPECT_EQ(stats.bytes_from_memory, Reference(t, FullBox(t.shape), std::nullopt).size());
  }
}

TEST_P(CheckpointReaderTest, Read_ResidentCopyWithFlippedByte_ThatBlockReadFromFile) {
  // Chunk 1 of wq: 96 bytes in blocks of 64; flip a byte of block 1 (32 bytes) in memory.
  const v1::ChunkEntry& chunk = manifest_.tensors(0).chunks(1);
  ASSERT_EQ(chunk.block_xxh3_size(), 2);
  ResidentCopies memory(dir_, manifest_);
  memory.bytes(chunk.file())[chunk.offset() + 70] ^= 0x5a;

  const ReadStats stats = ReadWholeWithMemory("layers.0.attn.wq", memory.files());
  EXPECT_EQ(stats.memory_blocks_rejected, 1u);
  EXPECT_EQ(stats.bytes_read, 32u);
  EXPECT_EQ(stats.read_calls, 1u);
  EXPECT_EQ(stats.bytes_from_memory, 8u * 12 * 4 - 32);
}

TEST_P(CheckpointReaderTest, Read_ResidentCopyWithTwoBadBlocksApart_EachReadFromFile) {
  // exp_avg's chunk 0: rows 0..3, 192 bytes in blocks of 64. Blocks 0 and 2 are bad in memory,
  // block 1 between them is good.
  const v1::ChunkEntry& chunk = manifest_.tensors(1).chunks(0);
  ASSERT_EQ(chunk.block_xxh3_size(), 3);
  ResidentCopies memory(dir_, manifest_);
  memory.bytes(chunk.file())[chunk.offset() + 1] ^= 0x5a;
  memory.bytes(chunk.file())[chunk.offset() + 130] ^= 0x5a;

  const ReadStats stats = ReadWholeWithMemory("layers.0.attn.wq#exp_avg", memory.files());
  EXPECT_EQ(stats.memory_blocks_rejected, 2u);
  EXPECT_EQ(stats.bytes_read, 128u);
  EXPECT_EQ(stats.read_calls, 2u);
  EXPECT_EQ(stats.bytes_from_memory, 8u * 12 * 4 - 128);
}

TEST_P(CheckpointReaderTest, Read_ResidentCopyAndFileBothCorrupt_ChecksumMismatch) {
  const v1::ChunkEntry& chunk = manifest_.tensors(0).chunks(1);
  ResidentCopies memory(dir_, manifest_);
  memory.bytes(chunk.file())[chunk.offset() + 70] ^= 0x5a;
  FlipByte(JoinPath(dir_, chunk.file()), chunk.offset() + 71);

  std::unique_ptr<CheckpointReader> reader = Open();
  ASSERT_NE(reader, nullptr);
  std::string got;
  absl::Status s =
      reader->Read({Request("layers.0.attn.wq", FullBox({8, 12}), &got)}, nullptr, memory.files())
          .status();
  EXPECT_EQ(GetErrorCode(s), v1::ERROR_CODE_CHECKSUM_MISMATCH) << s;
  EXPECT_THAT(s.message(), HasSubstr("block 1"));
  EXPECT_THAT(s.message(), HasSubstr(chunk.file()));
}

TEST_P(CheckpointReaderTest, Read_ResidentCopyCoversPartOfFile_RestReadFromFile) {
  // wq's chunk 1 stays resident up to its last byte exclusive: that chunk comes from the file.
  const v1::ChunkEntry& chunk = manifest_.tensors(0).chunks(1);
  ResidentCopies memory(dir_, manifest_);
  memory.Keep(chunk.file(), 0, chunk.offset() + chunk.nbytes() - 1);
  memory.Refresh();

  const ReadStats stats = ReadWholeWithMemory("layers.0.attn.wq", memory.files());
  EXPECT_EQ(stats.bytes_read, chunk.nbytes());
  EXPECT_EQ(stats.bytes_from_memory, 8u * 12 * 4 - chunk.nbytes());
  EXPECT_EQ(stats.memory_blocks_rejected, 0u);
}

TEST_P(CheckpointReaderTest, ResidentBlocks_EveryWholeBlockOfTheFileInRegionOrder) {
  // The file of wq's chunk 1, resident up to the last byte of its last chunk exclusive: that
  // chunk's last block is not listed, every other block of every chunk in the file is, once.
  const std::string file = manifest_.tensors(0).chunks(1).file();
  const v1::ChunkEntry* last = nullptr;
  for (const v1::TensorEntry& t : manifest_.tensors()) {
    for (const v1::ChunkEntry& c : t.chunks()) {
      if (c.file() == file && (last == nullptr || c.offset() > last->offset())) last = &c;
    }
  }
  ASSERT_NE(last, nullptr);
  const v1::ChunkEntry& cut = *last;
  ResidentCopies memory(dir_, manifest_);
  memory.Keep(file, 0, cut.offset() + cut.nbytes() - 1);
  memory.Refresh();
  const ResidentBytes& resident = memory.files()->at(file);
  std::unique_ptr<CheckpointReader> reader = Open();
  ASSERT_NE(reader, nullptr);

  const std::vector<BlockCheck> blocks = reader->ResidentBlocks(file, resident);
  uint64_t expected_bytes = 0;
  size_t expected_blocks = 0;
  std::set<uint64_t> chunk_offsets;  // a chunk listed under two entries counts once
  for (const v1::TensorEntry& t : manifest_.tensors()) {
    for (const v1::ChunkEntry& c : t.chunks()) {
      if (c.file() != file || !chunk_offsets.insert(c.offset()).second) continue;
      expected_bytes += c.nbytes();
      expected_blocks += c.block_xxh3_size();
    }
  }
  const uint64_t cut_block = cut.nbytes() - (cut.block_xxh3_size() - 1) * uint64_t{cut.block_size()};
  ASSERT_GT(expected_blocks, 2u);
  EXPECT_EQ(blocks.size(), expected_blocks - 1);
  uint64_t listed = 0;
  for (size_t b = 0; b < blocks.size(); ++b) {
    if (b > 0) {
      EXPECT_GT(blocks[b].offset, blocks[b - 1].offset) << b;
    }
    ASSERT_LE(blocks[b].offset + blocks[b].length, resident.size) << b;
    // Where it lies and what it must hash to: the intact copy's bytes hash to it.
    EXPECT_EQ(Xxh3(resident.data + blocks[b].offset, blocks[b].length), blocks[b].xxh3) << b;
    listed += blocks[b].length;
  }
  EXPECT_EQ(listed, expected_bytes - cut_block);
  EXPECT_TRUE(reader->ResidentBlocks("no-such-file.safetensors", resident).empty());
}

TEST_P(CheckpointReaderTest, LocateInMemory_Unverified_ListsEachBlockOnceHashesNone) {
  // wq's top-left chunk: 4 x 6 f32, 96 bytes in blocks of 64.
  const v1::ChunkEntry* chunk = nullptr;
  for (const v1::ChunkEntry& c : manifest_.tensors(0).chunks()) {
    if (c.box().offsets(0) == 0 && c.box().offsets(1) == 0) chunk = &c;
  }
  ASSERT_NE(chunk, nullptr);
  ASSERT_EQ(chunk->block_xxh3_size(), 2);
  ResidentCopies memory(dir_, manifest_);
  memory.bytes(chunk->file())[chunk->offset() + 70] ^= 0x5a;  // block 1 no longer matches
  memory.Refresh();
  const ResidentBytes& resident = memory.files()->at(chunk->file());
  std::unique_ptr<CheckpointReader> reader = Open();
  ASSERT_NE(reader, nullptr);
  // Rows 0 and 1 as two requests: both in block 0, which is listed once.
  std::string row0, rest;
  const std::vector<ReadRequest> requests = {
      Request("layers.0.attn.wq", MakeBox({0, 0}, {1, 6}), &row0),
      Request("layers.0.attn.wq", MakeBox({1, 0}, {3, 6}), &rest)};

  ReadStats stats;
  std::vector<BlockCheck> blocks;
  absl::StatusOr<std::vector<ReadResult>> located =
      reader->LocateInMemory(requests, chunk->file(), resident, &stats, &blocks);
  ASSERT_TRUE(located.ok()) << located.status();
  ASSERT_EQ(located->size(), 2u);
  EXPECT_EQ((*located)[0].resident_offset, chunk->offset() - resident.file_offset);
  EXPECT_EQ((*located)[1].resident_offset, chunk->offset() + 24 - resident.file_offset);
  ASSERT_EQ(blocks.size(), 2u);
  for (int b = 0; b < 2; ++b) {
    EXPECT_EQ(blocks[b].offset, chunk->offset() + 64 * b - resident.file_offset) << b;
    EXPECT_EQ(blocks[b].length, b == 0 ? 64u : 32u);
    EXPECT_EQ(blocks[b].xxh3, chunk->block_xxh3(b)) << b;
  }
  EXPECT_EQ(stats.blocks_verified, 0u);
  EXPECT_EQ(stats.memory_blocks_rejected, 0u) << "nothing was hashed";
  EXPECT_EQ(stats.bytes_from_memory, 96u);
  // The caller's check finds what verifying here finds.
  EXPECT_NE(Xxh3(resident.data + blocks[1].offset, blocks[1].length), blocks[1].xxh3);
  EXPECT_EQ(Xxh3(resident.data + blocks[0].offset, blocks[0].length), blocks[0].xxh3);

  absl::Status verified = reader->LocateInMemory(requests, chunk->file(), resident, &stats).status();
  EXPECT_EQ(verified.code(), absl::StatusCode::kFailedPrecondition) << verified;
  EXPECT_THAT(verified.message(), HasSubstr("block 1 does not match"));
  EXPECT_EQ(stats.memory_blocks_rejected, 1u);
}

// What a load reads, before it has destinations: each data file its bytes lie in, once, sorted.
TEST_P(CheckpointReaderTest, DataFiles_EveryFileTheRequestsTouch_SortedOnceWithoutDestinations) {
  std::set<std::string> want;
  for (const v1::ChunkEntry& c : manifest_.tensors(0).chunks()) want.insert(c.file());
  ASSERT_GE(want.size(), 1u);
  std::string whole, row0;
  std::vector<ReadRequest> requests = {
      Request(manifest_.tensors(0).key(), FullBox({8, 12}), &whole),
      Request(manifest_.tensors(0).key(), MakeBox({0, 0}, {1, 12}), &row0)};
  for (ReadRequest& r : requests) r.dest = nullptr;  // not needed
  std::unique_ptr<CheckpointReader> reader = Open();
  ASSERT_NE(reader, nullptr);
  absl::StatusOr<std::vector<std::string>> files = reader->DataFiles(requests);
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_EQ(*files, std::vector<std::string>(want.begin(), want.end()));
  requests[0].key = "no.such.tensor";
  EXPECT_EQ(reader->DataFiles(requests).status().code(), absl::StatusCode::kInvalidArgument);
}

// A copy the caller may write (a fetched one): a block that does not match is read from the
// file over it, so the copy is served in place, repaired; with no file behind it (memory-only)
// or a bad block in the file too, it is refused.
TEST_P(CheckpointReaderTest, RepairInMemory_BadBlock_ReadFromFileOverTheCopy) {
  const v1::ChunkEntry* chunk = nullptr;
  for (const v1::ChunkEntry& c : manifest_.tensors(0).chunks()) {
    if (c.box().offsets(0) == 0 && c.box().offsets(1) == 0) chunk = &c;
  }
  ASSERT_NE(chunk, nullptr);
  ASSERT_EQ(chunk->block_xxh3_size(), 2);  // 96 bytes in blocks of 64
  ResidentCopies memory(dir_, manifest_);
  const std::string good = memory.bytes(chunk->file());
  std::string& copy = memory.bytes(chunk->file());
  copy[chunk->offset() + 70] ^= 0x5a;  // block 1 no longer matches
  std::string row0, rest;
  const std::vector<ReadRequest> requests = {
      Request("layers.0.attn.wq", MakeBox({0, 0}, {1, 6}), &row0),
      Request("layers.0.attn.wq", MakeBox({1, 0}, {3, 6}), &rest)};
  std::unique_ptr<CheckpointReader> reader = Open();
  ASSERT_NE(reader, nullptr);

  ReadStats stats;
  absl::StatusOr<std::vector<ReadResult>> located =
      reader->RepairInMemory(requests, chunk->file(), copy.data(), 0, copy.size(), &stats);
  ASSERT_TRUE(located.ok()) << located.status();
  ASSERT_EQ(located->size(), 2u);
  EXPECT_EQ((*located)[0].resident_offset, chunk->offset());
  EXPECT_EQ((*located)[1].resident_offset, chunk->offset() + 24);
  EXPECT_TRUE(copy == good) << "the bad block was replaced by the file's";
  EXPECT_EQ(stats.memory_blocks_rejected, 1u);
  EXPECT_EQ(stats.bytes_read, 32u);  // block 1: the chunk's last 32 bytes
  // Block 0 is checked for each request that touches it (as LocateInMemory checks): blocks
  // 0 | 0, 1 — 64 + 96 bytes, less block 1's 32 read from the file.
  EXPECT_EQ(stats.blocks_verified, 3u);
  EXPECT_EQ(stats.bytes_from_memory, 128u);
  // Now it matches: served with nothing read.
  ASSERT_TRUE(reader->RepairInMemory(requests, chunk->file(), copy.data(), 0, copy.size(), &stats)
                  .ok());
  EXPECT_EQ(stats.memory_blocks_rejected, 0u);
  EXPECT_EQ(stats.bytes_read, 0u);

  // The file's block 1 is bad as well: refused, naming the block.
  copy[chunk->offset() + 70] ^= 0x5a;
  FlipByte(JoinPath(dir_, chunk->file()), chunk->offset() + 71);
  absl::Status both =
      reader->RepairInMemory(requests, chunk->file(), copy.data(), 0, copy.size()).status();
  EXPECT_EQ(GetErrorCode(both), v1::ERROR_CODE_CHECKSUM_MISMATCH) << both;
  EXPECT_THAT(both.message(), HasSubstr("block 1"));

  // Memory-only: no file to repair from; the copy is refused as LocateInMemory refuses it.
  copy = good;
  copy[chunk->offset() + 70] ^= 0x5a;
  absl::StatusOr<std::unique_ptr<CheckpointReader>> memory_only =
      CheckpointReader::FromManifest(manifest_, "memory-only step");
  ASSERT_TRUE(memory_only.ok()) << memory_only.status();
  absl::Status refused =
      (*memory_only)->RepairInMemory(requests, chunk->file(), copy.data(), 0, copy.size()).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("block 1 does not match"));
}

// A memory-only checkpoint (FromManifest): memory is the only source, always verified.
TEST_P(CheckpointReaderTest, FromManifest_EveryFileResident_ReadsFromMemoryOnly) {
  ResidentCopies memory(dir_, manifest_);
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
      CheckpointReader::FromManifest(manifest_, "memory-only step");
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_FALSE((*reader)->on_disk());
  const TestTensor& t = Tensor("layers.0.attn.wq");
  std::string got;
  ReadStats stats;
  absl::Status s =
      (*reader)->Read({Request(t.key(), FullBox(t.shape), &got)}, &stats, memory.files()).status();
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(got, Reference(t, FullBox(t.shape), std::nullopt));
  EXPECT_EQ(stats.bytes_read, 0u);
  EXPECT_EQ(stats.bytes_from_memory, got.size());
}

TEST_P(CheckpointReaderTest, FromManifest_ChunkInNoCopy_MemoryCopyLostNamingFile) {
  const v1::ChunkEntry& chunk = manifest_.tensors(0).chunks(1);
  ResidentCopies memory(dir_, manifest_);
  memory.Keep(chunk.file(), 0, chunk.offset());  // that chunk is in no copy
  memory.Refresh();
  const absl::Status s = ReadWqFromMemoryOnly(memory.files());
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_EQ(GetErrorCode(s), v1::ERROR_CODE_MEMORY_COPY_LOST) << s;
  EXPECT_THAT(s.message(), HasSubstr(chunk.file()));
  EXPECT_THAT(s.message(), HasSubstr("no file to read them from"));
}

TEST_P(CheckpointReaderTest, FromManifest_FlippedByteInMemory_ChecksumMismatchNotServed) {
  const v1::ChunkEntry& chunk = manifest_.tensors(0).chunks(1);
  ResidentCopies memory(dir_, manifest_);
  memory.bytes(chunk.file())[chunk.offset() + 70] ^= 0x5a;
  const absl::Status s = ReadWqFromMemoryOnly(memory.files());
  EXPECT_EQ(GetErrorCode(s), v1::ERROR_CODE_CHECKSUM_MISMATCH) << s;
  EXPECT_THAT(s.message(), HasSubstr("block 1"));
}

// A memory-only manifest comes from the coordinator: it is validated as one read from storage
// is, before any offset in it is trusted (a block size of 0 divided by zero; found by
// tests/fuzz:checkpoint_reader_fuzzer).
TEST_P(CheckpointReaderTest, FromManifest_MalformedManifest_DataLossBeforeAnyRead) {
  v1::Manifest bad = manifest_;
  bad.mutable_tensors(0)->mutable_chunks(1)->set_block_size(0);
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
      CheckpointReader::FromManifest(bad, "memory-only step");
  ASSERT_FALSE(reader.ok());
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kDataLoss) << reader.status();
  EXPECT_THAT(reader.status().message(), HasSubstr("memory-only step"));
  EXPECT_THAT(reader.status().message(), HasSubstr("block_size"));
}

TEST_P(CheckpointReaderTest, Read_GapInChunks_DataLossIncompleteCoverage) {
  // Drop the chunk holding wq rows 4..7, columns 0..5.
  RewriteManifest(
      [](v1::Manifest& m) { m.mutable_tensors(0)->mutable_chunks()->DeleteSubrange(2, 1); });
  std::unique_ptr<CheckpointReader> reader = Open();
  ASSERT_NE(reader, nullptr);
  std::string dest;
  absl::Status s =
      reader->Read({Request("layers.0.attn.wq", MakeBox({3, 2}, {3, 4}), &dest)}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_EQ(GetErrorCode(s), v1::ERROR_CODE_INCOMPLETE_COVERAGE);
  EXPECT_THAT(s.message(), HasSubstr("layers.0.attn.wq"));
  EXPECT_THAT(s.message(), HasSubstr("element [4, 2] is in no chunk"));
  // Regions the remaining chunks cover still load.
  ExpectReadMatches(*reader, "layers.0.attn.wq", MakeBox({0, 0}, {4, 12}));
  ExpectReadMatches(*reader, "layers.0.attn.wq", MakeBox({4, 6}, {4, 6}));
}

TEST_P(CheckpointReaderTest, Read_OverlappingChunks_DataLoss) {
  RewriteManifest(
      [](v1::Manifest& m) { *m.mutable_tensors(0)->add_chunks() = m.tensors(0).chunks(0); });
  std::unique_ptr<CheckpointReader> reader = Open();
  ASSERT_NE(reader, nullptr);
  std::string dest;
  absl::Status s = reader->Read({Request("layers.0.attn.wq", FullBox({8, 12}), &dest)}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr("more than one chunk"));
}

TEST_P(CheckpointReaderTest, Read_TruncatedFile_DataLossNamingFile) {
  const v1::ChunkEntry& chunk = manifest_.tensors(0).chunks(3);
  const std::string path = JoinPath(dir_, chunk.file());
  ASSERT_EQ(truncate(path.c_str(), chunk.offset() + 10), 0);
  std::unique_ptr<CheckpointReader> reader = Open();
  ASSERT_NE(reader, nullptr);
  std::string dest;
  absl::Status s = reader->Read({Request("layers.0.attn.wq", FullBox({8, 12}), &dest)}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr(path));
  EXPECT_THAT(s.message(), HasSubstr("shorter than the manifest"));
  EXPECT_EQ(GetErrorDetail(s)->path(), path);
}

TEST_P(CheckpointReaderTest, Read_MissingFile_DataLossNamingFile) {
  ASSERT_TRUE(storage_.RemoveTree(JoinPath(dir_, DataFileName(2))).ok());
  std::unique_ptr<CheckpointReader> reader = Open();
  ASSERT_NE(reader, nullptr);
  std::string dest;
  absl::Status s = reader->Read({Request("layers.0.attn.wq", FullBox({8, 12}), &dest)}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr(DataFileName(2)));
  // Tensors without chunks in that file still load.
  ExpectReadMatches(*reader, "norm.weight", FullBox({12}));
}

TEST_P(CheckpointReaderTest, Open_NoManifest_NotFound) {
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
      CheckpointReader::Open(&storage_, JoinPath(dir_, "missing"));
  EXPECT_EQ(GetErrorCode(reader.status()), v1::ERROR_CODE_CHECKPOINT_NOT_FOUND);
}

INSTANTIATE_TEST_SUITE_P(PageCacheAndDirect, CheckpointReaderTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Direct" : "PageCache";
                         });

// Block-level accounting on a 64 x 16 F32 tensor in one chunk, one 64-byte block per row.
TEST(CheckpointReaderIoTest, Read_PartOfChunk_ReadsOnlyTouchedBlocks) {
  PosixStorage storage;
  const std::string dir = MakeTempDir("checkpoint_reader_io_test");
  TestTensor t = RandomTensor("big", v1::DTYPE_F32, {64, 16}, 7);
  t.chunks = {TestChunk{FullBox(t.shape), 0}};
  ASSERT_TRUE(testing_checkpoint::WriteTestCheckpoint(storage, dir, {t}).ok());
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
      CheckpointReader::Open(&storage, dir, CheckpointReaderOptions{256, 1});
  ASSERT_TRUE(reader.ok()) << reader.status();

  auto read = [&](Box box, std::optional<v1::FlatRange> range) {
    std::string dest(Reference(t, box, range).size(), '\0');
    ReadRequest r{"big", v1::DTYPE_F32, t.shape, box, range, dest.data(), dest.size()};
    ReadStats stats;
    EXPECT_TRUE((*reader)->Read({r}, &stats).ok());
    EXPECT_EQ(dest, Reference(t, box, range));
    return stats;
  };
  // One whole row: one block, read straight into the destination.
  ReadStats stats = read(MakeBox({10, 0}, {1, 16}), std::nullopt);
  EXPECT_EQ(stats.bytes_read, 64u);
  EXPECT_EQ(stats.bytes_read_shared, 0u);
  EXPECT_EQ(stats.blocks_verified, 1u);
  EXPECT_EQ(stats.read_calls, 1u);
  // Four elements of a row: the whole block is read and verified, 16 bytes copied; the other
  // 48 are someone else's, so the block is read shared.
  stats = read(MakeBox({10, 4}, {1, 4}), std::nullopt);
  EXPECT_EQ(stats.bytes_read, 64u);
  EXPECT_EQ(stats.bytes_read_shared, 64u);
  EXPECT_EQ(stats.bytes_copied, 16u);
  // Rows 8..19: 12 blocks, in reads of at most 256 bytes aligned to 256-byte windows.
  stats = read(MakeBox({8, 0}, {12, 16}), std::nullopt);
  EXPECT_EQ(stats.bytes_read, 12u * 64);
  EXPECT_EQ(stats.bytes_read_shared, 0u);
  EXPECT_EQ(stats.read_calls, 3u);
  // A flat range of the whole tensor covering the end of row 60 and all of row 61: one span,
  // its first 12 bytes not wanted.
  stats = read(FullBox(t.shape), Range(60 * 16 + 3, 62 * 16));
  EXPECT_EQ(stats.bytes_read, 2u * 64);
  EXPECT_EQ(stats.bytes_read_shared, 2u * 64);
  EXPECT_EQ(stats.bytes_copied, (2u * 16 - 3) * 4);
  // An empty flat range reads nothing.
  stats = read(FullBox(t.shape), v1::FlatRange());
  EXPECT_EQ(stats.bytes_read, 0u);
  // A column touches every row's block, all of them shared.
  stats = read(MakeBox({0, 3}, {64, 1}), std::nullopt);
  EXPECT_EQ(stats.bytes_read, 64u * 64);
  EXPECT_EQ(stats.bytes_read_shared, 64u * 64);
  EXPECT_EQ(stats.bytes_copied, 64u * 4);
}

// A 1 MiB tensor in two row chunks with 4 KiB blocks, the shape of a real load: whole chunks
// and row slices go to the destination in place with O_DIRECT, column slices through the
// reader's aligned bounce buffer; page-aligned and misaligned destinations match alike.
TEST(CheckpointReaderIoTest, Read_LargeChunksDirect_InPlaceAndBounced_MatchReference) {
  PosixStorage storage(StorageOptions(/*direct=*/true));
  const std::string dir = MakeTempDir("checkpoint_reader_direct_test");
  TestTensor t = RandomTensor("w", v1::DTYPE_F32, {256, 1024}, 9);
  t.chunks = GridChunks(t.shape, {2, 1}, 1);
  testing_checkpoint::TestCheckpointOptions options;
  options.block_size = 4096;
  ASSERT_TRUE(testing_checkpoint::WriteTestCheckpoint(storage, dir, {t}, options).ok());
  CheckpointReaderOptions reader_options;
  reader_options.max_read_bytes = 64 << 10;  // many windows, so several threads read
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
      CheckpointReader::Open(&storage, dir, reader_options);
  ASSERT_TRUE(reader.ok()) << reader.status();

  const std::vector<std::pair<Box, std::optional<v1::FlatRange>>> regions = {
      {FullBox(t.shape), std::nullopt},                     // both chunks whole
      {MakeBox({100, 0}, {60, 1024}), std::nullopt},        // rows across the chunk boundary
      {MakeBox({3, 0}, {250, 1024}), Range(1000, 200000)},  // a distributed-optimizer slice
      {MakeBox({0, 512}, {256, 512}), std::nullopt},        // right half: bounced per row
      {MakeBox({127, 5}, {2, 3}), std::nullopt},            // a few elements
  };
  for (const auto& [box, range] : regions) {
    const std::string want = Reference(t, box, range);
    for (size_t misalign : {size_t{0}, size_t{4}}) {
      SCOPED_TRACE(absl::StrCat(BoxToString(box), " misalign ", misalign));
      void* mem = nullptr;
      ASSERT_EQ(posix_memalign(&mem, kDirectIoAlignment, want.size() + misalign), 0);
      std::unique_ptr<char, decltype(&free)> buf(static_cast<char*>(mem), &free);
      memset(buf.get(), 0x77, want.size() + misalign);
      ReadRequest r{"w", v1::DTYPE_F32, t.shape, box, range, buf.get() + misalign, want.size()};
      ReadStats stats;
      absl::StatusOr<std::vector<ReadResult>> results = (*reader)->Read({r}, &stats);
      ASSERT_TRUE(results.ok()) << results.status();
      EXPECT_TRUE(std::string(buf.get() + misalign, want.size()) == want) << "bytes differ";
      EXPECT_EQ(stats.bytes_copied, want.size());
    }
  }
  EXPECT_GT(storage.direct_bytes_read(), 0u);

  // Two ranks resharding by columns each read every block; both halves come through the page
  // cache, so the machine reads the tensor from the device once. Whole chunks and row slices
  // do not.
  struct Case {
    Box box;
    bool shared;
  };
  for (const Case& c : {Case{MakeBox({0, 0}, {256, 512}), true},
                        Case{MakeBox({0, 512}, {256, 512}), true},
                        Case{FullBox(t.shape), false}, Case{MakeBox({100, 0}, {60, 1024}), false}}) {
    SCOPED_TRACE(BoxToString(c.box));
    const std::string want = Reference(t, c.box);
    std::string dest(want.size(), '\0');
    const uint64_t direct_before = storage.direct_bytes_read();
    const uint64_t buffered_before = storage.buffered_bytes_read();
    ReadRequest r{"w", v1::DTYPE_F32, t.shape, c.box, std::nullopt, dest.data(), dest.size()};
    ReadStats stats;
    ASSERT_TRUE((*reader)->Read({r}, &stats).ok());
    EXPECT_TRUE(dest == want) << "bytes differ";
    const uint64_t blocks_bytes = c.shared ? t.shape[0] * 4096 : want.size();
    EXPECT_EQ(stats.bytes_read, blocks_bytes);
    EXPECT_EQ(stats.bytes_read_shared, c.shared ? blocks_bytes : 0);
    EXPECT_EQ(storage.buffered_bytes_read() - buffered_before, c.shared ? blocks_bytes : 0);
    if (SupportsDirectIo(dir)) {
      EXPECT_EQ(storage.direct_bytes_read() - direct_before, c.shared ? 0 : blocks_bytes);
    }
  }

  // A corrupt block is still caught on the direct path.
  const v1::ChunkEntry& second = (*reader)->manifest().tensors(0).chunks(1);
  FlipByte(JoinPath(dir, second.file()), second.offset() + 5000);
  std::string dest(Reference(t, FullBox(t.shape)).size(), '\0');
  ReadRequest r{"w",          v1::DTYPE_F32, t.shape,    FullBox(t.shape),
                std::nullopt, dest.data(),   dest.size()};
  absl::StatusOr<std::vector<ReadResult>> results = (*reader)->Read({r});
  EXPECT_EQ(GetErrorCode(results.status()), v1::ERROR_CODE_CHECKSUM_MISMATCH) << results.status();
}

}  // namespace
}  // namespace tessera
