// Storage: the file-system operations the shard writer, the committer and the checkpoint
// reader need, behind an interface so tests can inject faults (FaultInjectingStorage) and a
// future object store can stand in for POSIX.
//
// Errors. Every failure is an absl::Status whose message names the operation, the path and the
// errno text ("pwrite /ckpt/x.safetensors at offset 4096 (8388608 bytes): No space left on
// device (errno 28)") and whose payload is a tessera.v1.ErrorDetail with code IO_ERROR and
// `path` set (common/status.h MakeError). The status code follows the errno, chosen by who
// retries (STYLE.md 3):
//   ENOSPC, EDQUOT, EFBIG, EMFILE, ENFILE, ENOMEM -> ResourceExhausted (free space, then retry)
//   EACCES, EPERM                          -> PermissionDenied
//   EROFS                                  -> FailedPrecondition (remount read-write first)
//   EIO                                    -> DataLoss (bytes already handed to the kernel are
//                                             lost; after a failed fsync the file is suspect)
//   ENOENT                                 -> NotFound
//   EEXIST, ENOTEMPTY                      -> AlreadyExists
//   ENOTDIR, EISDIR, ENAMETOOLONG, EINVAL  -> InvalidArgument
//   ETIMEDOUT, ESTALE, EAGAIN, EBUSY       -> Unavailable (network file systems)
//   anything else                          -> Internal
// EINTR is retried internally and never surfaces.
//
// Lifecycle: a Storage outlives the files it opened. Thread-safety: Storage implementations
// are thread-safe; a WritableFile or ReadableFile may be used from several threads for
// disjoint ranges (WriteAt/ReadAt are positional), but Close() must not race other calls.
#ifndef TESSERA_AGENT_STORAGE_H_
#define TESSERA_AGENT_STORAGE_H_

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace tessera {

// Alignment of O_DIRECT transfers (buffer address, file offset and length). 4 KiB satisfies
// every local file system's logical block size we target.
inline constexpr size_t kDirectIoAlignment = 4096;

// The status for `err` (an errno value) from operation `op` on `path`, mapped as described in
// the header comment, carrying ErrorDetail{IO_ERROR, path}. `what` is optional detail appended
// after the path ("at offset 4096 (8388608 bytes)").
absl::Status ErrnoToStatus(int err, absl::string_view op, absl::string_view path,
                           absl::string_view what = "");

// The status code an errno maps to (see the header comment).
absl::StatusCode ErrnoToCode(int err);

// A file open for writing. Bytes written are durable only after Sync() returned OK.
class WritableFile {
 public:
  virtual ~WritableFile() = default;

  // Writes data[0, size) at `offset` (pwrite semantics; short writes are continued).
  // Errors: see the header comment; ENOSPC -> ResourceExhausted. After an error the bytes at
  // [offset, offset + size) are unspecified.
  virtual absl::Status WriteAt(uint64_t offset, const void* data, size_t size) = 0;

  // fsync(2): the file's data and size are durable. Errors: EIO -> DataLoss (the kernel may
  // have dropped the dirty pages; the file must be rewritten, never trusted).
  virtual absl::Status Sync() = 0;

  // Closes the file. Further calls fail. Errors: as for Sync (close can report deferred
  // write errors on network file systems). Idempotent.
  virtual absl::Status Close() = 0;

  virtual const std::string& path() const = 0;
};

// A file open for reading.
class ReadableFile {
 public:
  virtual ~ReadableFile() = default;

  // Reads exactly `size` bytes at `offset` into `out`. Errors: OutOfRange naming the path if
  // the file ends first; otherwise see the header comment.
  virtual absl::Status ReadAt(uint64_t offset, void* out, size_t size) = 0;

  // The file's size now. Errors: see the header comment.
  virtual absl::StatusOr<uint64_t> Size() = 0;

  virtual const std::string& path() const = 0;
};

class Storage {
 public:
  virtual ~Storage() = default;

  // Creates `path` and its missing parents (mkdir -p); OK if it already is a directory.
  // Errors: AlreadyExists if `path` exists and is not a directory; see the header comment.
  virtual absl::Status CreateDirs(const std::string& path) = 0;

  // Creates or truncates `path` for writing. The parent must exist.
  // Errors: NotFound if the parent does not exist; see the header comment.
  virtual absl::StatusOr<std::unique_ptr<WritableFile>> OpenForWrite(const std::string& path) = 0;

  // Opens an existing file for reading. Errors: NotFound; see the header comment.
  virtual absl::StatusOr<std::unique_ptr<ReadableFile>> OpenForRead(const std::string& path) = 0;

  // fsync(2) of a directory: entries created, renamed or removed in it are durable.
  // Errors: NotFound; see the header comment.
  virtual absl::Status SyncDir(const std::string& path) = 0;

  // rename(2): atomically replaces `to` (an empty directory or a file) with `from`. Does not
  // sync the parent directory. Errors: NotFound if `from` is missing; AlreadyExists if `to`
  // is a non-empty directory; see the header comment.
  virtual absl::Status Rename(const std::string& from, const std::string& to) = 0;

  // Removes a file, or a directory and everything under it (symlinks are removed, never
  // followed). OK if `path` does not exist, so garbage collection is idempotent.
  // Errors: see the header comment; the first failure stops the walk.
  virtual absl::Status RemoveTree(const std::string& path) = 0;

  // Size of the file at `path`. Errors: NotFound; see the header comment.
  virtual absl::StatusOr<uint64_t> FileSize(const std::string& path) = 0;

  // Names in directory `path` (no "." or ".."), sorted. Errors: NotFound; InvalidArgument
  // if `path` is not a directory; see the header comment.
  virtual absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path) = 0;
};

// Reads the whole file at `path`. Errors: as OpenForRead and ReadAt.
absl::StatusOr<std::string> ReadFileToString(Storage& storage, const std::string& path);

// "dir/name" without doubling a trailing '/'.
std::string JoinPath(absl::string_view dir, absl::string_view name);

struct PosixStorageOptions {
  // Open files with O_DIRECT too. Writes use it where buffer address, offset and length are
  // all multiples of kDirectIoAlignment; reads of at least direct_read_min_bytes use it for
  // any range (the blocks around the range are read, the partial ones at either end through
  // an aligned bounce buffer; the whole range goes through one where the destination's
  // address and the offset are not equally aligned). Other transfers, and all transfers of a
  // file once the file system refuses O_DIRECT (EINVAL, at open or at the first transfer),
  // go through the page cache. Default: true.
  bool direct_io = true;

  // Reads smaller than this go through the page cache even with direct_io: its read-ahead
  // serves runs of small reads (manifests, small tensors packed next to each other) better
  // than one device round trip each. Default: 64 KiB.
  uint64_t direct_read_min_bytes = 64 << 10;

  // Testing only: O_DIRECT reads fail with EINVAL, as on a file system that accepts
  // O_DIRECT opens but refuses the transfers. Default: false.
  bool refuse_direct_reads_for_testing = false;

  // After Sync() of a file written through the page cache, drop its cached pages
  // (posix_fadvise DONTNEED) so checkpoints do not evict the trainer's page cache.
  // Default: true.
  bool drop_cache_after_sync = true;
};

// Storage on a local or network POSIX file system. Thread-safe (stateless apart from options
// and counters).
class PosixStorage : public Storage {
 public:
  explicit PosixStorage(PosixStorageOptions options = {});

  absl::Status CreateDirs(const std::string& path) override;
  absl::StatusOr<std::unique_ptr<WritableFile>> OpenForWrite(const std::string& path) override;
  absl::StatusOr<std::unique_ptr<ReadableFile>> OpenForRead(const std::string& path) override;
  absl::Status SyncDir(const std::string& path) override;
  absl::Status Rename(const std::string& from, const std::string& to) override;
  absl::Status RemoveTree(const std::string& path) override;
  absl::StatusOr<uint64_t> FileSize(const std::string& path) override;
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path) override;

  // Bytes written with O_DIRECT and through the page cache by files of this storage, so tests
  // and metrics can tell which path was taken.
  uint64_t direct_bytes_written() const;
  uint64_t buffered_bytes_written() const;

  // Bytes delivered by ReadAt of files of this storage with O_DIRECT and through the page
  // cache (the bytes asked for, not the aligned blocks around them).
  uint64_t direct_bytes_read() const;
  uint64_t buffered_bytes_read() const;

 private:
  friend class PosixWritableFile;
  friend class PosixReadableFile;
  void CountWrite(bool direct, uint64_t bytes);
  void CountRead(bool direct, uint64_t bytes);

  const PosixStorageOptions options_;
  mutable absl::Mutex mu_;
  uint64_t direct_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t buffered_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Reads are many and concurrent: counted without the lock.
  std::atomic<uint64_t> direct_bytes_read_{0};
  std::atomic<uint64_t> buffered_bytes_read_{0};
};

// A Storage decorator for tests that fails chosen operations with a chosen errno, producing
// exactly the statuses the wrapped storage would (ErrnoToStatus). Thread-safe. The wrapped
// storage must outlive it and the files it opened.
class FaultInjectingStorage : public Storage {
 public:
  explicit FaultInjectingStorage(Storage* base);

  // Writes fail with `err` once `bytes` bytes have been written in total (all files): the
  // write that crosses the limit writes the bytes up to it, then fails, as a full disk does.
  void FailWritesAfterBytes(uint64_t bytes, int err = ENOSPC);

  // The n-th WriteAt (1-based, counted over all files from now) fails with `err` before
  // writing anything; later writes succeed.
  void FailNthWrite(uint64_t n, int err = EIO);

  // Every WritableFile::Sync fails with `err` (0 clears).
  void FailSync(int err = EIO);

  // Every SyncDir fails with `err` (0 clears).
  void FailSyncDir(int err = EIO);

  // Every Rename fails with `err` (0 clears).
  void FailRename(int err = EIO);

  // Every mutating operation (CreateDirs, OpenForWrite, WriteAt, Sync, SyncDir, Rename,
  // RemoveTree) fails with EROFS, as on a file system remounted read-only.
  void SetReadOnly(bool read_only);

  // Clears every fault.
  void Reset();

  // Arms the faults a spec names (the agent's test-only --inject_storage_fault flag), each
  // fault one `;`-separated item:
  //   ERR:after_bytes=N   writes fail with ERR once N bytes were written (FailWritesAfterBytes)
  //   ERR:write=N         the N-th write fails with ERR (FailNthWrite)
  //   ERR:sync            every fsync of a written file fails (FailSync)
  //   ERR:syncdir         every directory fsync fails (FailSyncDir)
  //   ERR:rename          every rename fails (FailRename)
  //   readonly            every mutation fails with EROFS (SetReadOnly)
  // ERR is one of enospc, eio, edquot, erofs, eacces (case-insensitive). An empty spec arms
  // nothing. Errors: InvalidArgument naming the item that does not parse (nothing is armed).
  absl::Status Configure(absl::string_view spec);

  uint64_t bytes_written() const;
  uint64_t writes() const;

  absl::Status CreateDirs(const std::string& path) override;
  absl::StatusOr<std::unique_ptr<WritableFile>> OpenForWrite(const std::string& path) override;
  absl::StatusOr<std::unique_ptr<ReadableFile>> OpenForRead(const std::string& path) override;
  absl::Status SyncDir(const std::string& path) override;
  absl::Status Rename(const std::string& from, const std::string& to) override;
  absl::Status RemoveTree(const std::string& path) override;
  absl::StatusOr<uint64_t> FileSize(const std::string& path) override;
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path) override;

 private:
  friend class FaultInjectingWritableFile;

  // What a WriteAt of `size` bytes may do: write `allowed` bytes (<= size), then fail with
  // `err` if it is non-zero. Records the bytes as written.
  struct WritePermit {
    size_t allowed;
    int err;
  };
  WritePermit AdmitWrite(size_t size);
  int sync_errno() const;
  bool read_only() const;

  Storage* const base_;
  mutable absl::Mutex mu_;
  bool read_only_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t bytes_written_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t writes_ ABSL_GUARDED_BY(mu_) = 0;
  // 0 = no limit is armed.
  int limit_errno_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t limit_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Fail the write whose 1-based number (counted in writes_) is nth_write_; 0 = disarmed.
  uint64_t nth_write_ ABSL_GUARDED_BY(mu_) = 0;
  int nth_errno_ ABSL_GUARDED_BY(mu_) = 0;
  int sync_errno_ ABSL_GUARDED_BY(mu_) = 0;
  int sync_dir_errno_ ABSL_GUARDED_BY(mu_) = 0;
  int rename_errno_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tessera

#endif  // TESSERA_AGENT_STORAGE_H_
