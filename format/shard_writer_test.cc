#include "format/shard_writer.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "format/data_file.h"
#include "storage/fault_injecting_storage.h"
#include "storage/testing.h"
#include "storage/posix_storage.h"
#include "storage/storage.h"
#include "common/box.h"
#include "common/checksum.h"
#include "common/dtype.h"
#include "common/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

ChunkSpec Chunk(std::string key, std::vector<int64_t> offsets, std::vector<int64_t> lengths,
                v1::DType dtype, size_t elem_size) {
  ChunkSpec spec;
  spec.key = std::move(key);
  int64_t volume = 1;
  for (int64_t l : lengths) volume *= l;
  spec.box = BoxToProto(Box{std::move(offsets), std::move(lengths)});
  spec.dtype = dtype;
  spec.nbytes = static_cast<uint64_t>(volume) * elem_size;
  return spec;
}

struct AlignedFree {
  void operator()(void* p) const { free(p); }
};

// A layout plus page-aligned staging holding a distinct byte pattern per chunk.
struct Staged {
  FileLayout layout;
  std::unique_ptr<char, AlignedFree> staging;
};

Staged Stage(const std::vector<ChunkSpec>& chunks) {
  Staged s;
  absl::StatusOr<FileLayout> layout = ComputeFileLayout(chunks);
  EXPECT_TRUE(layout.ok()) << layout.status();
  s.layout = *layout;
  void* p = nullptr;
  EXPECT_EQ(posix_memalign(&p, 4096, std::max<uint64_t>(s.layout.data_size, 1)), 0);
  s.staging.reset(static_cast<char*>(p));
  memset(p, 0x77, s.layout.data_size);  // garbage in the padding until ZeroPadding
  for (size_t i = 0; i < s.layout.items.size(); ++i) {
    const FileLayoutItem& item = s.layout.items[i];
    for (uint64_t b = 0; b < item.nbytes; ++b) {
      s.staging.get()[item.staging_offset + b] = static_cast<char>((i * 37 + b * 11 + (b >> 9)));
    }
  }
  ZeroPadding(s.layout, s.staging.get());
  return s;
}

std::vector<ChunkSpec> SomeChunks() {
  return {
      Chunk("layers.0.attn.w", {0, 0}, {300, 70}, v1::DTYPE_F32, 4),  // 84000 bytes
      Chunk("layers.0.attn.w#exp_avg", {0, 0}, {300, 70}, v1::DTYPE_F32, 4),
      Chunk("norm", {16}, {5}, v1::DTYPE_BF16, 2),
      Chunk("empty", {0, 3}, {0, 9}, v1::DTYPE_F16, 2),
      Chunk("step", {}, {}, v1::DTYPE_I64, 8),
  };
}

// Reads `path` and checks: header and data equal the layout and staging; each entry's
// checksums verify against the file's bytes.
void CheckWritten(Storage& storage, const Staged& s, const WrittenFile& written,
                  const std::string& file_name, uint32_t block_size) {
  absl::StatusOr<std::string> bytes = ReadFileToString(storage, written.path);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  ASSERT_EQ(bytes->size(), s.layout.file_size());
  EXPECT_EQ(written.bytes, s.layout.file_size());
  EXPECT_EQ(bytes->substr(0, s.layout.data_start), s.layout.header);
  EXPECT_TRUE(bytes->compare(s.layout.data_start, s.layout.data_size, s.staging.get(),
                             s.layout.data_size) == 0)
      << "data section differs from staging";
  absl::StatusOr<SafetensorsHeader> header = ParseSafetensorsHeader(*bytes);
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_TRUE(ValidateSafetensorsLayout(*header, bytes->size()).ok());

  ASSERT_EQ(written.chunks.size(), s.layout.items.size());
  for (size_t i = 0; i < written.chunks.size(); ++i) {
    const v1::ChunkEntry& entry = written.chunks[i];
    const FileLayoutItem& item = s.layout.items[i];
    EXPECT_EQ(entry.file(), file_name);
    EXPECT_EQ(entry.offset(), item.file_offset);
    EXPECT_EQ(entry.nbytes(), item.nbytes);
    EXPECT_EQ(entry.box().SerializeAsString(), item.box.SerializeAsString());
    EXPECT_EQ(entry.block_size(), block_size);
    const std::vector<uint64_t> expected =
        BlockChecksums(bytes->data() + entry.offset(), entry.nbytes(), block_size);
    EXPECT_EQ(std::vector<uint64_t>(entry.block_xxh3().begin(), entry.block_xxh3().end()),
              expected)
        << item.name;
    EXPECT_EQ(static_cast<uint64_t>(entry.block_xxh3_size()),
              (item.nbytes + block_size - 1) / block_size);
  }
}

TEST(ShardWriter, WriteFile_BytesMatchStagingChecksumsVerify) {
  const std::string dir = MakeTempDir("shard_writer_test");
  PosixStorage storage;
  Staged s = Stage(SomeChunks());
  ShardWriterOptions options;
  options.writer_rank = 5;
  absl::StatusOr<WrittenFile> written =
      ShardWriter::WriteFile(storage, dir, "data-00005.safetensors", s.layout, s.staging.get(),
                             options);
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_EQ(written->path, dir + "/data-00005.safetensors");
  CheckWritten(storage, s, *written, "data-00005.safetensors", kDefaultBlockSize);
  for (const v1::ChunkEntry& entry : written->chunks) EXPECT_EQ(entry.writer_rank(), 5u);
  EXPECT_EQ(written->chunks[3].block_xxh3_size(), 0) << "a 0-byte chunk has no blocks";
  // Everything was aligned, so the whole file went through O_DIRECT where it is supported.
  if (SupportsDirectIo(dir)) {
    EXPECT_EQ(storage.direct_bytes_written(), s.layout.file_size());
  } else {
    EXPECT_EQ(storage.buffered_bytes_written(), s.layout.file_size());
  }
}

TEST(ShardWriter, WriteFile_SmallBlocksAndWrites_SequentialChecksumsSameResult) {
  const std::string dir = MakeTempDir("shard_writer_test");
  PosixStorage posix;
  FaultInjectingStorage storage(&posix);  // counts writes
  Staged s = Stage(SomeChunks());
  ShardWriterOptions options;
  options.block_size = 4096;
  options.write_size = 5000;  // rounded up to 8192
  absl::StatusOr<WrittenFile> overlapped =
      ShardWriter::WriteFile(storage, dir, "a.safetensors", s.layout, s.staging.get(), options);
  ASSERT_TRUE(overlapped.ok()) << overlapped.status();
  CheckWritten(storage, s, *overlapped, "a.safetensors", 4096);
  EXPECT_EQ(storage.writes(), 1 + (s.layout.data_size + 8191) / 8192);
  EXPECT_GT(overlapped->chunks[0].block_xxh3_size(), 20);

  options.overlap_checksums = false;
  absl::StatusOr<WrittenFile> sequential =
      ShardWriter::WriteFile(storage, dir, "b.safetensors", s.layout, s.staging.get(), options);
  ASSERT_TRUE(sequential.ok());
  for (size_t i = 0; i < sequential->chunks.size(); ++i) {
    EXPECT_EQ(sequential->chunks[i].block_xxh3().size(), overlapped->chunks[i].block_xxh3().size());
    for (int b = 0; b < sequential->chunks[i].block_xxh3_size(); ++b) {
      EXPECT_EQ(sequential->chunks[i].block_xxh3(b), overlapped->chunks[i].block_xxh3(b));
    }
  }
}

TEST(ShardWriter, WriteFile_SeveralWritesInFlight_SameFileAsOneAtATime) {
  const std::string dir = MakeTempDir("shard_writer_test");
  PosixStorage posix;
  FaultInjectingStorage storage(&posix);  // counts writes
  Staged s = Stage(SomeChunks());
  ShardWriterOptions options;
  options.write_size = 8192;  // many pieces, so the threads interleave
  std::string files[2];
  for (int in_flight : {1, 8}) {
    const uint64_t writes_before = storage.writes();
    options.writes_in_flight = in_flight;
    const std::string name = absl::StrCat("w", in_flight, ".safetensors");
    absl::StatusOr<WrittenFile> written =
        ShardWriter::WriteFile(storage, dir, name, s.layout, s.staging.get(), options);
    ASSERT_TRUE(written.ok()) << written.status();
    CheckWritten(storage, s, *written, name, kDefaultBlockSize);
    // Each piece written once, whatever the threads' order.
    EXPECT_EQ(storage.writes() - writes_before, 1 + (s.layout.data_size + 8191) / 8192)
        << in_flight;
    std::ifstream in(written->path, std::ios::binary);
    files[in_flight == 1 ? 0 : 1].assign(std::istreambuf_iterator<char>(in), {});
  }
  EXPECT_EQ(files[0].size(), s.layout.file_size());
  EXPECT_TRUE(files[0] == files[1]);
}

TEST(ShardWriter, WriteFile_Tmpfs_Works) {
  struct stat st;
  if (stat("/dev/shm", &st) != 0) GTEST_SKIP() << "no /dev/shm";
  const std::string dir = MakeTempDir("shard_writer_test", "/dev/shm");
  PosixStorage storage;
  Staged s = Stage(SomeChunks());
  absl::StatusOr<WrittenFile> written =
      ShardWriter::WriteFile(storage, dir, "x.safetensors", s.layout, s.staging.get());
  ASSERT_TRUE(written.ok()) << written.status();
  CheckWritten(storage, s, *written, "x.safetensors", kDefaultBlockSize);
  EXPECT_TRUE(storage.RemoveTree(dir).ok());
}

TEST(ShardWriter, WriteFile_NoChunks_HeaderOnly) {
  const std::string dir = MakeTempDir("shard_writer_test");
  PosixStorage storage;
  Staged s = Stage({});
  absl::StatusOr<WrittenFile> written =
      ShardWriter::WriteFile(storage, dir, "empty.safetensors", s.layout, nullptr);
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_TRUE(written->chunks.empty());
  EXPECT_EQ(written->bytes, 4096u);
}

TEST(ShardWriter, WriteFile_EnospcMidWrite_IoErrorNamingPathNoFileLeft) {
  const std::string dir = MakeTempDir("shard_writer_test");
  PosixStorage posix;
  FaultInjectingStorage storage(&posix);
  Staged s = Stage(SomeChunks());
  storage.FailWritesAfterBytes(s.layout.data_start + 100000, ENOSPC);
  ShardWriterOptions options;
  options.write_size = 64 << 10;
  const std::string path = dir + "/data-00001.safetensors";
  absl::StatusOr<WrittenFile> written = ShardWriter::WriteFile(
      storage, dir, "data-00001.safetensors", s.layout, s.staging.get(), options);
  ASSERT_FALSE(written.ok());
  EXPECT_EQ(written.status().code(), absl::StatusCode::kResourceExhausted);
  std::optional<v1::ErrorDetail> detail = GetErrorDetail(written.status());
  ASSERT_TRUE(detail.has_value());
  EXPECT_EQ(detail->code(), v1::ERROR_CODE_IO_ERROR);
  EXPECT_EQ(detail->path(), path);
  EXPECT_THAT(written.status().message(), HasSubstr("No space left on device"));
  EXPECT_THAT(written.status().message(), HasSubstr(path));
  EXPECT_FALSE(Exists(path)) << "the partial file must not survive";
}

TEST(ShardWriter, WriteFile_ReadOnlyStorage_IoError) {
  const std::string dir = MakeTempDir("shard_writer_test");
  PosixStorage posix;
  FaultInjectingStorage storage(&posix);
  storage.SetReadOnly(true);
  Staged s = Stage(SomeChunks());
  absl::StatusOr<WrittenFile> written =
      ShardWriter::WriteFile(storage, dir, "d.safetensors", s.layout, s.staging.get());
  ASSERT_FALSE(written.ok());
  EXPECT_EQ(written.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(GetErrorCode(written.status()), v1::ERROR_CODE_IO_ERROR);
  EXPECT_EQ(GetErrorDetail(written.status())->path(), dir + "/d.safetensors");
  EXPECT_THAT(written.status().message(), HasSubstr("Read-only file system"));
}

TEST(ShardWriter, WriteFile_FsyncFails_DataLossNotReported) {
  const std::string dir = MakeTempDir("shard_writer_test");
  PosixStorage posix;
  FaultInjectingStorage storage(&posix);
  storage.FailSync(EIO);
  Staged s = Stage(SomeChunks());
  absl::StatusOr<WrittenFile> written =
      ShardWriter::WriteFile(storage, dir, "e.safetensors", s.layout, s.staging.get());
  ASSERT_FALSE(written.ok());
  EXPECT_EQ(written.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(GetErrorCode(written.status()), v1::ERROR_CODE_IO_ERROR);
  EXPECT_FALSE(Exists(dir + "/e.safetensors"));

  storage.Reset();
  storage.FailSyncDir(EIO);
  written = ShardWriter::WriteFile(storage, dir, "e.safetensors", s.layout, s.staging.get());
  EXPECT_EQ(written.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(GetErrorDetail(written.status())->path(), dir);
}

TEST(ShardWriter, WriteFile_NthWriteFails_Error) {
  const std::string dir = MakeTempDir("shard_writer_test");
  PosixStorage posix;
  FaultInjectingStorage storage(&posix);
  Staged s = Stage(SomeChunks());
  for (uint64_t n = 1; n <= 3; ++n) {
    storage.Reset();
    storage.FailNthWrite(n, EIO);
    ShardWriterOptions options;
    options.write_size = 64 << 10;
    absl::StatusOr<WrittenFile> written = ShardWriter::WriteFile(
        storage, dir, "f.safetensors", s.layout, s.staging.get(), options);
    EXPECT_EQ(written.status().code(), absl::StatusCode::kDataLoss) << "write " << n;
    EXPECT_EQ(GetErrorCode(written.status()), v1::ERROR_CODE_IO_ERROR);
  }
}

// A storage whose errors carry no ErrorDetail: the writer must still return IO_ERROR + path.
class BareErrorStorage : public FaultInjectingStorage {
 public:
  using FaultInjectingStorage::FaultInjectingStorage;
  absl::StatusOr<std::unique_ptr<WritableFile>> OpenForWrite(const std::string& path) override {
    return absl::UnavailableError("object store unreachable");
  }
};

TEST(ShardWriter, WriteFile_ErrorWithoutPayload_GetsIoErrorAndPath) {
  const std::string dir = MakeTempDir("shard_writer_test");
  PosixStorage posix;
  BareErrorStorage storage(&posix);
  Staged s = Stage(SomeChunks());
  absl::StatusOr<WrittenFile> written =
      ShardWriter::WriteFile(storage, dir, "g.safetensors", s.layout, s.staging.get());
  EXPECT_EQ(written.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(GetErrorCode(written.status()), v1::ERROR_CODE_IO_ERROR);
  EXPECT_EQ(GetErrorDetail(written.status())->path(), dir + "/g.safetensors");
}

TEST(ShardWriter, WriteFile_BadArguments_Rejected) {
  const std::string dir = MakeTempDir("shard_writer_test");
  PosixStorage storage;
  Staged s = Stage(SomeChunks());
  for (const char* name : {"", ".", "..", "a/b", "../x"}) {
    EXPECT_EQ(ShardWriter::WriteFile(storage, dir, name, s.layout, s.staging.get())
                  .status()
                  .code(),
              absl::StatusCode::kInvalidArgument)
        << name;
  }
  EXPECT_EQ(ShardWriter::WriteFile(storage, dir, "x", s.layout, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  ShardWriterOptions zero_block;
  zero_block.block_size = 0;
  EXPECT_EQ(
      ShardWriter::WriteFile(storage, dir, "x", s.layout, s.staging.get(), zero_block)
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
  for (int in_flight : {0, ShardWriterOptions::kMostWritesInFlight + 1}) {
    ShardWriterOptions bad;
    bad.writes_in_flight = in_flight;
    EXPECT_EQ(ShardWriter::WriteFile(storage, dir, "x", s.layout, s.staging.get(), bad)
                  .status()
                  .code(),
              absl::StatusCode::kInvalidArgument)
        << in_flight;
    EXPECT_THAT(std::string(bad.Check().message()), HasSubstr("writes_in_flight is"));
  }
  EXPECT_TRUE(ShardWriterOptions().Check().ok());
  // Padding left dirty would put bytes no checksum covers into the file.
  s.staging.get()[s.layout.padding[0].staging_offset] = 1;
  absl::StatusOr<WrittenFile> dirty =
      ShardWriter::WriteFile(storage, dir, "x", s.layout, s.staging.get());
  EXPECT_EQ(dirty.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(Exists(dir + "/x"));
}

TEST(ShardWriter, WriteFiles_ParallelOneFails_OthersWritten) {
  const std::string dir = MakeTempDir("shard_writer_test");
  PosixStorage storage;
  std::vector<Staged> staged;
  for (int i = 0; i < 4; ++i) {
    staged.push_back(Stage({Chunk(absl::StrCat("t", i), {0}, {1000 + i}, v1::DTYPE_F32, 4)}));
  }
  std::vector<FileWrite> files;
  for (int i = 0; i < 4; ++i) {
    files.push_back(FileWrite{i == 2 ? dir + "/missing" : dir, absl::StrCat("f", i),
                              &staged[i].layout, staged[i].staging.get()});
  }
  std::vector<absl::StatusOr<WrittenFile>> results =
      ShardWriter::WriteFiles(storage, files, 2);
  ASSERT_EQ(results.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    if (i == 2) {
      EXPECT_EQ(results[i].status().code(), absl::StatusCode::kNotFound);
      EXPECT_EQ(GetErrorCode(results[i].status()), v1::ERROR_CODE_IO_ERROR);
      continue;
    }
    ASSERT_TRUE(results[i].ok()) << results[i].status();
    CheckWritten(storage, staged[i], *results[i], absl::StrCat("f", i), kDefaultBlockSize);
  }
}

// --- The independent Python reader ----------------------------------------------------------

// Runs `command`, returning its stdout; *exit_code gets the exit status.
std::string RunCommand(const std::string& command, int* exit_code) {
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) {
    *exit_code = -1;
    return "";
  }
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
  const int status = pclose(pipe);
  *exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

TEST(ShardWriter, PythonReader_ParsesWriterOutput_SameBytes) {
  const char* kPython = "/usr/bin/python3";
  const char* kScript = "format/testdata/read_safetensors.py";
  if (access(kPython, X_OK) != 0) GTEST_SKIP() << "no " << kPython;
  ASSERT_EQ(access(kScript, R_OK), 0) << "run under bazel test (the script is a data dep)";

  const std::string dir = MakeTempDir("shard_writer_test");
  PosixStorage storage;
  std::vector<ChunkSpec> chunks = SomeChunks();
  chunks.push_back(Chunk("quote\"back\\slash\nnewline", {0}, {3}, v1::DTYPE_U8, 1));
  chunks.push_back(Chunk("caf\xc3\xa9.\xe6\x97\xa5\xf0\x9f\x98\x80", {2, 0}, {2, 2}, v1::DTYPE_I32, 4));
  chunks.push_back(Chunk("fp8", {0}, {5}, v1::DTYPE_F8_E4M3, 1));
  Staged s = Stage(chunks);
  absl::StatusOr<WrittenFile> written =
      ShardWriter::WriteFile(storage, dir, "py.safetensors", s.layout, s.staging.get());
  ASSERT_TRUE(written.ok()) << written.status();

  int exit_code = 0;
  const std::string out = RunCommand(
      absl::StrCat(kPython, " ", kScript, " --machine ", written->path), &exit_code);
  ASSERT_EQ(exit_code, 0) << out;
  std::vector<std::string> lines = absl::StrSplit(out, '\n', absl::SkipEmpty());
  // Chunks plus padding entries, in data order.
  ASSERT_GE(lines.size(), chunks.size());
  size_t seen = 0;
  for (const std::string& line : lines) {
    std::vector<std::string> fields = absl::StrSplit(line, '\t');
    ASSERT_EQ(fields.size(), 5u) << line;
    const std::string name = absl::HexStringToBytes(fields[0]);
    const std::string body = absl::HexStringToBytes(fields[4]);
    auto it = std::find_if(s.layout.items.begin(), s.layout.items.end(),
                           [&](const FileLayoutItem& item) { return item.name == name; });
    if (it == s.layout.items.end()) {
      EXPECT_EQ(name.rfind("__tessera_pad_", 0), 0u) << name;
      EXPECT_EQ(body, std::string(body.size(), '\0')) << "padding holds zeros";
      continue;
    }
    ++seen;
    const size_t i = it - s.layout.items.begin();
    EXPECT_EQ(fields[1], std::string(DTypeName(chunks[i].dtype))) << name;
    EXPECT_EQ(fields[2], absl::StrJoin(chunks[i].box.lengths(), ",")) << name;
    EXPECT_EQ(body, std::string(s.staging.get() + it->staging_offset, it->nbytes)) << name;
  }
  EXPECT_EQ(seen, chunks.size());
}

TEST(ShardWriter, PythonReader_RejectsCorruptTiling) {
  const char* kPython = "/usr/bin/python3";
  const char* kScript = "format/testdata/read_safetensors.py";
  if (access(kPython, X_OK) != 0) GTEST_SKIP() << "no " << kPython;
  const std::string dir = MakeTempDir("shard_writer_test");
  PosixStorage storage;
  Staged s = Stage({Chunk("a", {0}, {10}, v1::DTYPE_F32, 4)});
  absl::StatusOr<WrittenFile> written =
      ShardWriter::WriteFile(storage, dir, "ok.safetensors", s.layout, s.staging.get());
  ASSERT_TRUE(written.ok());
  // Truncating the file breaks the tiling: the reader must notice, so it can fail this test.
  ASSERT_EQ(truncate(written->path.c_str(), s.layout.file_size() - 1), 0);
  int exit_code = 0;
  RunCommand(absl::StrCat(kPython, " ", kScript, " ", written->path, " 2>/dev/null"), &exit_code);
  EXPECT_NE(exit_code, 0);
}

}  // namespace
}  // namespace tessera
