#include "storage/fault_injecting_storage.h"
#include "storage/posix_storage.h"
#include "storage/storage.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/status.h"
#include "storage/testing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

struct AlignedFree {
  void operator()(void* p) const { free(p); }
};
std::unique_ptr<char, AlignedFree> AlignedBytes(size_t size, char seed) {
  void* p = nullptr;
  EXPECT_EQ(posix_memalign(&p, kDirectIoAlignment, size), 0);
  char* c = static_cast<char*>(p);
  for (size_t i = 0; i < size; ++i) c[i] = static_cast<char>(seed + i * 7 + (i >> 12));
  return std::unique_ptr<char, AlignedFree>(c);
}

std::string IoPath(const absl::Status& status) {
  std::optional<v1::ErrorDetail> detail = GetErrorDetail(status);
  return detail.has_value() ? detail->path() : "";
}

// Writes an aligned 64 KiB file and an unaligned one in `dir` and checks both read back.
void CheckBothWritePaths(const std::string& dir) {
  PosixStorage storage;
  const size_t size = 64 << 10;
  auto aligned = AlignedBytes(size, 1);
  auto file = storage.OpenForWrite(dir + "/aligned");
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_TRUE((*file)->WriteAt(0, aligned.get(), size).ok());
  ASSERT_TRUE((*file)->Sync().ok());
  ASSERT_TRUE((*file)->Close().ok());
  if (SupportsDirectIo(dir)) {
    EXPECT_EQ(storage.direct_bytes_written(), size);
    EXPECT_EQ(storage.buffered_bytes_written(), 0u);
  } else {
    EXPECT_EQ(storage.buffered_bytes_written(), size);
  }
  absl::StatusOr<std::string> back = ReadFileToString(storage, dir + "/aligned");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, std::string(aligned.get(), size));

  // Unaligned buffer, offset and size: always through the page cache.
  const uint64_t direct_before = storage.direct_bytes_written();
  auto file2 = storage.OpenForWrite(dir + "/unaligned");
  ASSERT_TRUE(file2.ok());
  ASSERT_TRUE((*file2)->WriteAt(3, aligned.get() + 1, 1000).ok());
  ASSERT_TRUE((*file2)->Close().ok());
  EXPECT_EQ(storage.direct_bytes_written(), direct_before);
  back = ReadFileToString(storage, dir + "/unaligned");
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, std::string(3, '\0') + std::string(aligned.get() + 1, 1000));
}

TEST(PosixStorage, WritePaths_TestTmpdir_DirectAndBufferedBothRoundTrip) {
  CheckBothWritePaths(MakeTempDir("storage_test"));
}

TEST(PosixStorage, WritePaths_Tmpfs_DirectAndBufferedBothRoundTrip) {
  struct stat st;
  if (stat("/dev/shm", &st) != 0) GTEST_SKIP() << "no /dev/shm";
  const std::string dir = MakeTempDir("storage_test", "/dev/shm");
  CheckBothWritePaths(dir);
  PosixStorage storage;
  EXPECT_TRUE(storage.RemoveTree(dir).ok());
}

TEST(PosixStorage, MixedAlignedAndUnalignedWrites_OneFile_BytesMatch) {
  const std::string dir = MakeTempDir("storage_test");
  PosixStorage storage;
  auto data = AlignedBytes(3 * 4096, 5);
  auto file = storage.OpenForWrite(dir + "/mixed");
  ASSERT_TRUE(file.ok());
  ASSERT_TRUE((*file)->WriteAt(4096, data.get() + 4096, 8192).ok());  // aligned
  ASSERT_TRUE((*file)->WriteAt(0, data.get(), 100).ok());             // unaligned size
  ASSERT_TRUE((*file)->WriteAt(100, data.get() + 100, 3996).ok());    // unaligned offset
  ASSERT_TRUE((*file)->Sync().ok());
  ASSERT_TRUE((*file)->Close().ok());
  absl::StatusOr<std::string> back = ReadFileToString(storage, dir + "/mixed");
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, std::string(data.get(), 3 * 4096));
}

TEST(PosixStorage, DirectIoDisabled_AlignedWritesBuffered) {
  const std::string dir = MakeTempDir("storage_test");
  PosixStorageOptions options;
  options.direct_io = false;
  PosixStorage storage(options);
  auto data = AlignedBytes(8192, 9);
  auto file = storage.OpenForWrite(dir + "/f");
  ASSERT_TRUE(file.ok());
  ASSERT_TRUE((*file)->WriteAt(0, data.get(), 8192).ok());
  ASSERT_TRUE((*file)->Close().ok());
  EXPECT_EQ(storage.direct_bytes_written(), 0u);
  EXPECT_EQ(storage.buffered_bytes_written(), 8192u);
}

TEST(PosixStorage, CreateDirs_NestedAndIdempotent_FileInTheWayRejected) {
  const std::string dir = MakeTempDir("storage_test");
  PosixStorage storage;
  ASSERT_TRUE(storage.CreateDirs(dir + "/a/b/c").ok());
  ASSERT_TRUE(storage.CreateDirs(dir + "/a/b/c").ok());
  ASSERT_TRUE(storage.CreateDirs(dir + "/a/b/c/").ok());
  struct stat st;
  ASSERT_EQ(stat((dir + "/a/b/c").c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));

  auto file = storage.OpenForWrite(dir + "/plain");
  ASSERT_TRUE(file.ok());
  ASSERT_TRUE((*file)->Close().ok());
  absl::Status status = storage.CreateDirs(dir + "/plain");
  EXPECT_EQ(status.code(), absl::StatusCode::kAlreadyExists) << status;
  status = storage.CreateDirs(dir + "/plain/sub");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_EQ(GetErrorCode(status), v1::ERROR_CODE_IO_ERROR);
}

TEST(PosixStorage, OpenForWrite_MissingParent_NotFoundNamingPathAndErrno) {
  const std::string dir = MakeTempDir("storage_test");
  PosixStorage storage;
  const std::string path = dir + "/missing/file";
  auto file = storage.OpenForWrite(path);
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(GetErrorCode(file.status()), v1::ERROR_CODE_IO_ERROR);
  EXPECT_EQ(IoPath(file.status()), path);
  EXPECT_THAT(file.status().message(), HasSubstr(path));
  EXPECT_THAT(file.status().message(), HasSubstr("No such file or directory"));
}

TEST(PosixStorage, RenameSyncDirListDir_Work) {
  const std::string dir = MakeTempDir("storage_test");
  PosixStorage storage;
  ASSERT_TRUE(storage.CreateDirs(dir + "/step.tmp").ok());
  for (const char* name : {"b", "a", "c"}) {
    auto file = storage.OpenForWrite(dir + "/step.tmp/" + name);
    ASSERT_TRUE(file.ok());
    ASSERT_TRUE((*file)->WriteAt(0, name, 1).ok());
    ASSERT_TRUE((*file)->Sync().ok());
    ASSERT_TRUE((*file)->Close().ok());
  }
  ASSERT_TRUE(storage.SyncDir(dir + "/step.tmp").ok());
  ASSERT_TRUE(storage.Rename(dir + "/step.tmp", dir + "/step").ok());
  ASSERT_TRUE(storage.SyncDir(dir).ok());
  absl::StatusOr<std::vector<std::string>> names = storage.ListDir(dir + "/step");
  ASSERT_TRUE(names.ok());
  EXPECT_THAT(*names, ElementsAre("a", "b", "c"));
  absl::StatusOr<uint64_t> size = storage.FileSize(dir + "/step/a");
  ASSERT_TRUE(size.ok());
  EXPECT_EQ(*size, 1u);

  EXPECT_EQ(storage.Rename(dir + "/nope", dir + "/x").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(storage.ListDir(dir + "/nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(storage.ListDir(dir + "/step/a").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(storage.SyncDir(dir + "/nope").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(storage.FileSize(dir + "/nope").status().code(), absl::StatusCode::kNotFound);
}

TEST(PosixStorage, PutFile_ReplacesWholeAndLeavesNoTemporary_CreateOnlyUnimplemented) {
  const std::string dir = MakeTempDir("storage_test");
  PosixStorage storage;
  ASSERT_TRUE(storage.PutFile(dir + "/m", "first", PutMode::kReplace).ok());
  ASSERT_TRUE(storage.PutFile(dir + "/m", "second", PutMode::kReplace).ok());
  absl::StatusOr<std::string> read = ReadFileToString(storage, dir + "/m");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, "second");
  // A file system publishes by rename: only an object store creates only if absent.
  EXPECT_EQ(storage.publication(dir), Publication::kRenameDirectory);
  EXPECT_EQ(storage.PutFile(dir + "/n", "x", PutMode::kCreateOnly).code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_EQ(storage.PutFile(dir + "/nope/m", "x", PutMode::kReplace).code(),
            absl::StatusCode::kNotFound);
  absl::StatusOr<std::vector<std::string>> names = storage.ListDir(dir);
  ASSERT_TRUE(names.ok());
  EXPECT_THAT(*names, ElementsAre("m"));
}

TEST(PosixStorage, RemoveTree_NestedDirsAndSymlink_RemovedWithoutFollowing) {
  const std::string dir = MakeTempDir("storage_test");
  PosixStorage storage;
  ASSERT_TRUE(storage.CreateDirs(dir + "/outside").ok());
  auto keep = storage.OpenForWrite(dir + "/outside/keep");
  ASSERT_TRUE(keep.ok());
  ASSERT_TRUE((*keep)->Close().ok());
  ASSERT_TRUE(storage.CreateDirs(dir + "/tree/x/y").ok());
  for (const char* f : {"/tree/f1", "/tree/x/f2", "/tree/x/y/f3"}) {
    auto file = storage.OpenForWrite(dir + f);
    ASSERT_TRUE(file.ok());
    ASSERT_TRUE((*file)->Close().ok());
  }
  ASSERT_EQ(symlink((dir + "/outside").c_str(), (dir + "/tree/x/link").c_str()), 0);

  ASSERT_TRUE(storage.RemoveTree(dir + "/tree").ok());
  struct stat st;
  EXPECT_NE(lstat((dir + "/tree").c_str(), &st), 0);
  EXPECT_EQ(stat((dir + "/outside/keep").c_str(), &st), 0) << "followed the symlink";
  // Idempotent, and files are removed too.
  EXPECT_TRUE(storage.RemoveTree(dir + "/tree").ok());
  EXPECT_TRUE(storage.RemoveTree(dir + "/outside/keep").ok());
  EXPECT_NE(stat((dir + "/outside/keep").c_str(), &st), 0);
}

TEST(PosixStorage, ReadAt_PastEnd_OutOfRange) {
  const std::string dir = MakeTempDir("storage_test");
  PosixStorage storage;
  auto file = storage.OpenForWrite(dir + "/short");
  ASSERT_TRUE(file.ok());
  ASSERT_TRUE((*file)->WriteAt(0, "0123456789", 10).ok());
  ASSERT_TRUE((*file)->Close().ok());
  auto in = storage.OpenForRead(dir + "/short");
  ASSERT_TRUE(in.ok());
  char buf[8];
  ASSERT_TRUE((*in)->ReadAt(2, buf, 8).ok());
  EXPECT_EQ(std::string(buf, 8), "23456789");
  absl::Status status = (*in)->ReadAt(5, buf, 8);
  EXPECT_EQ(status.code(), absl::StatusCode::kOutOfRange) << status;
  EXPECT_EQ(IoPath(status), dir + "/short");
  EXPECT_EQ(storage.OpenForRead(dir).status().code(), absl::StatusCode::kInvalidArgument);
}

PosixStorageOptions ReadOptions(bool direct, uint64_t direct_min, bool refuse = false) {
  PosixStorageOptions options;
  options.direct_io = direct;
  options.direct_read_min_bytes = direct_min;
  options.refuse_direct_reads_for_testing = refuse;
  return options;
}

// A file of `size` bytes with a varying pattern, written through the page cache and synced.
std::string WritePatternFile(const std::string& path, size_t size) {
  std::string data(size, '\0');
  for (size_t i = 0; i < size; ++i) data[i] = static_cast<char>(i * 131 + (i >> 12) * 7 + 1);
  PosixStorage writer(ReadOptions(/*direct=*/false, 0));
  auto file = writer.OpenForWrite(path);
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return "";
  EXPECT_TRUE((*file)->WriteAt(0, data.data(), data.size()).ok());
  EXPECT_TRUE((*file)->Sync().ok());
  EXPECT_TRUE((*file)->Close().ok());
  return data;
}

// Reads [offset, offset + size) into a page-aligned buffer at `misalign` bytes past a page
// boundary and compares with `data`.
void ExpectReadMatches(ReadableFile& file, const std::string& data, uint64_t offset,
                       size_t size, size_t misalign) {
  SCOPED_TRACE(absl::StrCat("offset ", offset, " size ", size, " misalign ", misalign));
  auto buf = AlignedBytes(size + misalign + 1, 0);
  char* dest = buf.get() + misalign;
  dest[size] = '\x5a';
  absl::Status s = file.ReadAt(offset, dest, size);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(std::string(dest, size) == data.substr(offset, size)) << "bytes differ";
  EXPECT_EQ(dest[size], '\x5a') << "wrote past the end";
}

// Offsets and sizes around 4 KiB boundaries and the file's unaligned tail, into destinations
// equally aligned with the offset (read in place) and not (through the bounce buffer).
void CheckDirectReadEdges(const std::string& dir) {
  const size_t kSize = (9 << 20) + 1234;  // more than two bounce buffers, tail not aligned
  const std::string data = WritePatternFile(dir + "/data", kSize);
  ASSERT_EQ(data.size(), kSize);
  PosixStorage storage(ReadOptions(/*direct=*/true, 0));
  auto file = storage.OpenForRead(dir + "/data");
  ASSERT_TRUE(file.ok()) << file.status();
  const uint64_t k = kDirectIoAlignment;
  const std::vector<std::pair<uint64_t, size_t>> ranges = {
      {0, k},               {0, 3 * k},          {k, 5 * k},          // aligned
      {1, k},               {100, 10},           {k - 1, 2},          // within and across a page
      {k + 7, 3 * k},       {5, 2 * k - 5},      {3 * k, k + 1},      // unaligned head or tail
      {k - 3, 8 * k + 6},   {kSize - 1234, 1234}, {kSize - 1, 1},     // both; the tail
      {kSize - 5000, 5000}, {0, kSize},          {4097, kSize - 4097},  // to the end; all
  };
  for (const auto& [offset, size] : ranges) {
    ExpectReadMatches(**file, data, offset, size, offset % k);  // in place where aligned
    ExpectReadMatches(**file, data, offset, size, (offset + 1) % k);  // always bounced
  }
  if (SupportsDirectIo(dir)) {
    EXPECT_GT(storage.direct_bytes_read(), 0u);
    EXPECT_EQ(storage.buffered_bytes_read(), 0u);
  } else {
    EXPECT_EQ(storage.direct_bytes_read(), 0u);
  }
  // Past the end: OutOfRange naming the path, whether the interior or the tail is missing.
  for (const auto& [offset, size] : std::vector<std::pair<uint64_t, size_t>>{
           {kSize - 1234, 1235}, {kSize - 4 * k, 8 * k}, {kSize + 10, 1}, {kSize - 1, 2}}) {
    auto buf = AlignedBytes(size + 1, 0);
    for (size_t misalign : {size_t{0}, size_t{1}}) {
      absl::Status s = (*file)->ReadAt(offset, buf.get() + misalign, size);
      EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << offset << " " << size << ": " << s;
      EXPECT_EQ(IoPath(s), dir + "/data");
    }
  }
}

TEST(PosixStorage, DirectReads_AlignmentEdgesAndTail_MatchFile) {
  CheckDirectReadEdges(MakeTempDir("storage_test"));
}

TEST(PosixStorage, DirectReads_Tmpfs_AlignmentEdgesAndTail_MatchFile) {
  struct stat st;
  if (stat("/dev/shm", &st) != 0) GTEST_SKIP() << "no /dev/shm";
  const std::string dir = MakeTempDir("storage_test", "/dev/shm");
  CheckDirectReadEdges(dir);
  PosixStorage storage;
  EXPECT_TRUE(storage.RemoveTree(dir).ok());
}

TEST(PosixStorage, DirectReads_Refused_FallBackToPageCache) {
  const std::string dir = MakeTempDir("storage_test");
  const std::string data = WritePatternFile(dir + "/data", (1 << 20) + 100);
  PosixStorage storage(ReadOptions(/*direct=*/true, 0, /*refuse=*/true));
  auto file = storage.OpenForRead(dir + "/data");
  ASSERT_TRUE(file.ok());
  ExpectReadMatches(**file, data, 0, 1 << 20, 0);
  ExpectReadMatches(**file, data, 4095, 10000, 4095);
  ExpectReadMatches(**file, data, 7, (1 << 20) + 93, 0);
  EXPECT_EQ(storage.direct_bytes_read(), 0u);
  EXPECT_EQ(storage.buffered_bytes_read(), (1u << 20) + 10000 + (1 << 20) + 93);
  char c;
  EXPECT_EQ((*file)->ReadAt(data.size(), &c, 1).code(), absl::StatusCode::kOutOfRange);
}

TEST(PosixStorage, Reads_DirectIoDisabledOrSmall_ThroughPageCache) {
  const std::string dir = MakeTempDir("storage_test");
  const std::string data = WritePatternFile(dir + "/data", 1 << 20);
  PosixStorage disabled(ReadOptions(/*direct=*/false, 0));
  auto file = disabled.OpenForRead(dir + "/data");
  ASSERT_TRUE(file.ok());
  ExpectReadMatches(**file, data, 0, 1 << 20, 0);
  EXPECT_EQ(disabled.direct_bytes_read(), 0u);
  EXPECT_EQ(disabled.buffered_bytes_read(), 1u << 20);

  // Defaults: small reads through the page cache, large ones around it.
  PosixStorage storage;
  file = storage.OpenForRead(dir + "/data");
  ASSERT_TRUE(file.ok());
  ExpectReadMatches(**file, data, 4096, 4096, 0);
  EXPECT_EQ(storage.buffered_bytes_read(), 4096u);
  ExpectReadMatches(**file, data, 0, 1 << 20, 0);
  if (SupportsDirectIo(dir)) {
    EXPECT_EQ(storage.direct_bytes_read(), 1u << 20);
  }
}

// Bytes another rank reads too: through the page cache whatever their size, so the second
// reader finds them there.
TEST(PosixStorage, ReadSharedAt_Large_ThroughPageCache) {
  const std::string dir = MakeTempDir("storage_test");
  const std::string data = WritePatternFile(dir + "/data", (2 << 20) + 100);
  PosixStorage storage(ReadOptions(/*direct=*/true, 0));
  auto file = storage.OpenForRead(dir + "/data");
  ASSERT_TRUE(file.ok()) << file.status();
  auto buf = AlignedBytes(2 << 20, 0);
  ASSERT_TRUE((*file)->ReadSharedAt(0, buf.get(), 2 << 20).ok());
  EXPECT_TRUE(std::string(buf.get(), 2 << 20) == data.substr(0, 2 << 20)) << "bytes differ";
  EXPECT_EQ(storage.buffered_bytes_read(), 2u << 20);
  EXPECT_EQ(storage.direct_bytes_read(), 0u);
  // Same contract as ReadAt past the end.
  absl::Status s = (*file)->ReadSharedAt(data.size() - 10, buf.get(), 11);
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
  EXPECT_EQ(IoPath(s), dir + "/data");
}

TEST(PosixStorage, DirectReads_ConcurrentUnalignedRanges_EachMatches) {
  const std::string dir = MakeTempDir("storage_test");
  const size_t kPiece = (1 << 20) + 333;
  const std::string data = WritePatternFile(dir + "/data", 4 * kPiece);
  PosixStorage storage(ReadOptions(/*direct=*/true, 0));
  auto file = storage.OpenForRead(dir + "/data");
  ASSERT_TRUE(file.ok());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (size_t misalign : {size_t{0}, size_t{17}}) {
        ExpectReadMatches(**file, data, t * kPiece, kPiece, misalign);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(storage.direct_bytes_read() + storage.buffered_bytes_read(), 8 * kPiece);
}

TEST(PosixStorage, WriteAfterClose_ErrorNotCrash) {
  const std::string dir = MakeTempDir("storage_test");
  PosixStorage storage;
  auto file = storage.OpenForWrite(dir + "/f");
  ASSERT_TRUE(file.ok());
  ASSERT_TRUE((*file)->Close().ok());
  EXPECT_FALSE((*file)->WriteAt(0, "x", 1).ok());
  EXPECT_FALSE((*file)->Sync().ok());
  EXPECT_TRUE((*file)->Close().ok());
}

TEST(PosixStorage, UnwritableDirectory_PermissionDenied) {
  if (geteuid() == 0) GTEST_SKIP() << "root ignores directory permissions";
  const std::string dir = MakeTempDir("storage_test");
  PosixStorage storage;
  ASSERT_TRUE(storage.CreateDirs(dir + "/ro").ok());
  ASSERT_EQ(chmod((dir + "/ro").c_str(), 0500), 0);
  auto file = storage.OpenForWrite(dir + "/ro/f");
  EXPECT_EQ(file.status().code(), absl::StatusCode::kPermissionDenied);
  chmod((dir + "/ro").c_str(), 0700);
}

TEST(ErrnoToStatus, Mapping_ByWhoRetries) {
  EXPECT_EQ(ErrnoToCode(ENOSPC), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ErrnoToCode(EDQUOT), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ErrnoToCode(EROFS), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ErrnoToCode(EACCES), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(ErrnoToCode(EIO), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ErrnoToCode(ENOENT), absl::StatusCode::kNotFound);
  EXPECT_EQ(ErrnoToCode(ESTALE), absl::StatusCode::kUnavailable);
  EXPECT_EQ(ErrnoToCode(EXDEV), absl::StatusCode::kInternal);

  absl::Status status = ErrnoToStatus(ENOSPC, "pwrite", "/ckpt/data-0.safetensors", "at offset 4096");
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(status.message(),
            "pwrite /ckpt/data-0.safetensors at offset 4096: No space left on device (errno 28)");
  std::optional<v1::ErrorDetail> detail = GetErrorDetail(status);
  ASSERT_TRUE(detail.has_value());
  EXPECT_EQ(detail->code(), v1::ERROR_CODE_IO_ERROR);
  EXPECT_EQ(detail->path(), "/ckpt/data-0.safetensors");
}

TEST(JoinPath, NoDoubleSlash) {
  EXPECT_EQ(JoinPath("a", "b"), "a/b");
  EXPECT_EQ(JoinPath("a/", "b"), "a/b");
  EXPECT_EQ(JoinPath("", "b"), "b");
}

// --- FaultInjectingStorage ---------------------------------------------------------------------

TEST(FaultInjectingStorage, PutFile_OnAFileSystem_RenameFaultApplies) {
  const std::string dir = MakeTempDir("storage_test");
  PosixStorage posix;
  FaultInjectingStorage storage(&posix);
  storage.FailRename(EIO);
  EXPECT_EQ(storage.PutFile(dir + "/m", "bytes", PutMode::kReplace).code(),
            absl::StatusCode::kDataLoss);
  absl::StatusOr<std::vector<std::string>> names = posix.ListDir(dir);
  ASSERT_TRUE(names.ok());
  EXPECT_THAT(*names, ElementsAre());  // nothing published, no temporary left
}

TEST(FaultInjectingStorage, FailWritesAfterBytes_PartialWriteThenEnospc) {
  const std::string dir = MakeTempDir("storage_test");
  PosixStorage posix;
  FaultInjectingStorage storage(&posix);
  storage.FailWritesAfterBytes(10000);
  auto data = AlignedBytes(8192, 3);
  auto file = storage.OpenForWrite(dir + "/f");
  ASSERT_TRUE(file.ok());
  ASSERT_TRUE((*file)->WriteAt(0, data.get(), 8192).ok());
  absl::Status status = (*file)->WriteAt(8192, data.get(), 8192);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_THAT(status.message(), HasSubstr("No space left on device"));
  EXPECT_THAT(status.message(), HasSubstr("at offset 10000"));
  EXPECT_EQ(IoPath(status), dir + "/f");
  EXPECT_FALSE((*file)->WriteAt(16384, data.get(), 1).ok());
  ASSERT_TRUE((*file)->Close().ok());
  absl::StatusOr<uint64_t> size = posix.FileSize(dir + "/f");
  ASSERT_TRUE(size.ok());
  EXPECT_EQ(*size, 10000u);
  EXPECT_EQ(storage.bytes_written(), 10000u);

  storage.Reset();
  auto again = storage.OpenForWrite(dir + "/g");
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE((*again)->WriteAt(0, data.get(), 8192).ok());
}

TEST(FaultInjectingStorage, FailNthWrite_OnlyThatWriteFails) {
  const std::string dir = MakeTempDir("storage_test");
  PosixStorage posix;
  FaultInjectingStorage storage(&posix);
  storage.FailNthWrite(2, EIO);
  auto file = storage.OpenForWrite(dir + "/f");
  ASSERT_TRUE(file.ok());
  EXPECT_TRUE((*file)->WriteAt(0, "a", 1).ok());
  absl::Status status = (*file)->WriteAt(1, "b", 1);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(), HasSubstr("Input/output error"));
  EXPECT_TRUE((*file)->WriteAt(2, "c", 1).ok());
  EXPECT_EQ(storage.writes(), 3u);
}

TEST(FaultInjectingStorage, Configure_SpecArmsFaults_BadSpecArmsNothing) {
  const std::string dir = MakeTempDir("storage_test");
  PosixStorage posix;
  FaultInjectingStorage storage(&posix);
  EXPECT_TRUE(storage.Configure("").ok());
  for (const char* bad : {"enospc", "enospc:after_bytes=x", "ebogus:sync", "eio:write=0",
                          "eio:sometimes", "eio:sync;readonly;enospc:after_bytes="}) {
    absl::Status status = storage.Configure(bad);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  // Nothing of the rejected specs was armed.
  auto file = storage.OpenForWrite(dir + "/f");
  ASSERT_TRUE(file.ok());
  EXPECT_TRUE((*file)->WriteAt(0, "abcdef", 6).ok());
  EXPECT_TRUE((*file)->Sync().ok());

  ASSERT_TRUE(storage.Configure("EIO:after_bytes=8; enospc:write=3").ok());
  // The byte limit counts from arming: 8 more bytes may be written.
  absl::Status status = (*file)->WriteAt(6, "abcdef", 6);  // 6 of 8
  EXPECT_TRUE(status.ok()) << status;
  status = (*file)->WriteAt(12, "abcdef", 6);  // 2 more fit, then EIO
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(), HasSubstr("at offset 14"));
  status = (*file)->WriteAt(18, "x", 1);  // the 3rd write since arming: ENOSPC
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;

  storage.Reset();
  ASSERT_TRUE(storage.Configure("readonly").ok());
  EXPECT_EQ(storage.CreateDirs(dir + "/d").code(), absl::StatusCode::kFailedPrecondition);
  storage.Reset();
  ASSERT_TRUE(storage.Configure("eio:sync").ok());
  EXPECT_EQ((*file)->Sync().code(), absl::StatusCode::kDataLoss);
}

TEST(FaultInjectingStorage, ReadOnly_EveryMutationFailsReadsWork) {
  const std::string dir = MakeTempDir("storage_test");
  PosixStorage posix;
  FaultInjectingStorage storage(&posix);
  auto file = storage.OpenForWrite(dir + "/f");
  ASSERT_TRUE(file.ok());
  ASSERT_TRUE((*file)->WriteAt(0, "abc", 3).ok());
  storage.SetReadOnly(true);
  EXPECT_EQ((*file)->WriteAt(3, "d", 1).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*file)->Sync().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(storage.OpenForWrite(dir + "/g").status().code(),
            absl::StatusCode::kFailedPrecondition);
  absl::Status status = storage.CreateDirs(dir + "/d");
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("Read-only file system"));
  EXPECT_EQ(storage.Rename(dir + "/f", dir + "/h").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(storage.RemoveTree(dir + "/f").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(storage.SyncDir(dir).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE((*file)->Close().ok());
  absl::StatusOr<std::string> back = ReadFileToString(storage, dir + "/f");
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, "abc");
  absl::StatusOr<std::vector<std::string>> names = storage.ListDir(dir);
  ASSERT_TRUE(names.ok());
  EXPECT_THAT(*names, ElementsAre("f"));
}

TEST(FaultInjectingStorage, FailSyncAndRename_ReportErrno) {
  const std::string dir = MakeTempDir("storage_test");
  PosixStorage posix;
  FaultInjectingStorage storage(&posix);
  storage.FailSync(EIO);
  storage.FailRename(EXDEV);
  storage.FailSyncDir(EIO);
  auto file = storage.OpenForWrite(dir + "/f");
  ASSERT_TRUE(file.ok());
  EXPECT_EQ((*file)->Sync().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(storage.SyncDir(dir).code(), absl::StatusCode::kDataLoss);
  absl::Status status = storage.Rename(dir + "/f", dir + "/g");
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(status.message(), HasSubstr("Invalid cross-device link"));
  storage.Reset();
  EXPECT_TRUE((*file)->Sync().ok());
  EXPECT_TRUE(storage.Rename(dir + "/f", dir + "/g").ok());
}

TEST(FaultInjectingStorage, SyncDirAfterDirRename_OnlyTheNFsyncsAfterTheFirstDirRenameFail) {
  const std::string dir = MakeTempDir("storage_test");
  PosixStorage posix;
  FaultInjectingStorage storage(&posix);
  ASSERT_TRUE(storage.Configure("eio:syncdir_after_dir_rename=2").ok());
  ASSERT_TRUE(posix.CreateDirs(dir + "/tmp").ok());
  auto file = storage.OpenForWrite(dir + "/tmp/.m");
  ASSERT_TRUE(file.ok());
  ASSERT_TRUE((*file)->Close().ok());
  // Before any directory rename, and after a file's rename, directory fsyncs work.
  EXPECT_TRUE(storage.SyncDir(dir).ok());
  ASSERT_TRUE(storage.Rename(dir + "/tmp/.m", dir + "/tmp/m").ok());
  EXPECT_TRUE(storage.SyncDir(dir + "/tmp").ok());
  // The directory's rename happens; the next two directory fsyncs fail, then they work.
  ASSERT_TRUE(storage.Rename(dir + "/tmp", dir + "/final").ok());
  EXPECT_TRUE(posix.FileSize(dir + "/final/m").ok());
  absl::Status status = storage.SyncDir(dir);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(), HasSubstr("Input/output error"));
  EXPECT_EQ(IoPath(status), dir);
  EXPECT_EQ(storage.SyncDir(dir).code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(storage.SyncDir(dir).ok());
  // Armed once: a later directory rename fails nothing.
  ASSERT_TRUE(storage.Rename(dir + "/final", dir + "/again").ok());
  EXPECT_TRUE(storage.SyncDir(dir).ok());
  for (const char* bad : {"eio:syncdir_after_dir_rename=0", "eio:syncdir_after_dir_rename=",
                          "eio:syncdir_after_dir_rename=x"}) {
    EXPECT_EQ(storage.Configure(bad).code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(FaultInjectingStorage, AfterDirRename_HookRunsOnceAfterTheFirstDirRename) {
  const std::string dir = MakeTempDir("storage_test");
  PosixStorage posix;
  FaultInjectingStorage storage(&posix);
  std::vector<std::string> seen;
  storage.SetAfterDirRename([&](const std::string& from, const std::string& to) {
    seen.push_back(from + " -> " + to);
    // The rename is done when the hook runs.
    EXPECT_TRUE(posix.ListDir(to).ok());
  });
  ASSERT_TRUE(posix.CreateDirs(dir + "/a").ok());
  auto file = storage.OpenForWrite(dir + "/f");
  ASSERT_TRUE(file.ok());
  ASSERT_TRUE((*file)->Close().ok());
  ASSERT_TRUE(storage.Rename(dir + "/f", dir + "/g").ok());  // a file: no hook
  EXPECT_TRUE(seen.empty());
  ASSERT_TRUE(storage.Rename(dir + "/a", dir + "/b").ok());
  ASSERT_TRUE(storage.Rename(dir + "/b", dir + "/c").ok());
  EXPECT_THAT(seen, ElementsAre(dir + "/a -> " + dir + "/b"));
}

TEST(FaultInjectingStorageDeathTest, CrashAfterDirRename_KillsTheProcessAfterTheRename) {
  const std::string dir = MakeTempDir("storage_test");
  ASSERT_TRUE(PosixStorage().CreateDirs(dir + "/a").ok());
  EXPECT_EXIT(
      {
        PosixStorage posix;
        FaultInjectingStorage storage(&posix);
        if (!storage.Configure("crash_after_dir_rename").ok()) _exit(3);
        if (!storage.Rename(dir + "/a", dir + "/b").ok()) _exit(4);
        _exit(0);
      },
      ::testing::KilledBySignal(SIGKILL), "fault injection: crashing after renaming");
  // The child renamed before it died.
  EXPECT_TRUE(PosixStorage().ListDir(dir + "/b").ok());
  EXPECT_FALSE(PosixStorage().ListDir(dir + "/a").ok());
}

TEST(FaultInjectingStorage, HoldWrites_WaitUntilTheReleaseFileExists) {
  const std::string dir = MakeTempDir("storage_test");
  PosixStorage posix;
  FaultInjectingStorage storage(&posix);
  ASSERT_TRUE(storage.Configure("hold_writes=" + dir + "/release").ok());
  EXPECT_EQ(storage.Configure("hold_writes=").code(), absl::StatusCode::kInvalidArgument);
  auto file = storage.OpenForWrite(dir + "/f");
  ASSERT_TRUE(file.ok());
  absl::Status written;
  absl::Notification done;
  std::thread writer([&] {
    written = (*file)->WriteAt(0, "abc", 3);
    done.Notify();
  });
  ASSERT_TRUE(storage.AwaitHeldWrites(1, absl::Seconds(30)));
  EXPECT_FALSE(done.HasBeenNotified());
  EXPECT_EQ(*posix.FileSize(dir + "/f"), 0u);  // nothing written while held
  auto release = posix.OpenForWrite(dir + "/release");
  ASSERT_TRUE(release.ok());
  ASSERT_TRUE((*release)->Close().ok());
  writer.join();
  EXPECT_TRUE(written.ok()) << written;
  EXPECT_EQ(*posix.FileSize(dir + "/f"), 3u);
  EXPECT_TRUE((*file)->WriteAt(3, "d", 1).ok());  // released for good
  ASSERT_TRUE((*file)->Close().ok());
}

TEST(FaultInjectingStorage, HoldWrites_ReleasedInProcessOrFailAfterTheLimit) {
  const std::string dir = MakeTempDir("storage_test");
  PosixStorage posix;
  FaultInjectingStorage storage(&posix);
  storage.HoldWritesUntil(dir + "/never", absl::InfiniteDuration());
  auto file = storage.OpenForWrite(dir + "/f");
  ASSERT_TRUE(file.ok());
  absl::Status written;
  std::thread writer([&] { written = (*file)->WriteAt(0, "abc", 3); });
  ASSERT_TRUE(storage.AwaitHeldWrites(1, absl::Seconds(30)));
  storage.ReleaseHeldWrites();
  writer.join();
  EXPECT_TRUE(written.ok()) << written;

  // A write held past the limit fails with EIO (a zero limit: at once).
  storage.HoldWritesUntil(dir + "/never", absl::ZeroDuration());
  absl::Status status = (*file)->WriteAt(3, "d", 1);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(), HasSubstr("held by fault injection"));
  ASSERT_TRUE((*file)->Close().ok());
  EXPECT_EQ(*posix.FileSize(dir + "/f"), 3u);
}

}  // namespace
}  // namespace tessera
