// Storage: the operations the shard writer, the committer and the checkpoint reader need, behind
// an interface with two kinds of implementation: a POSIX file system (PosixStorage) and an
// S3-compatible object store (storage/s3/s3_storage.h), and a decorator that injects faults
// for tests (FaultInjectingStorage). What both kinds offer:
//   - a data file written in parts (WritableFile::WriteAt, positional; on an object store a
//     multipart upload that appears whole at Sync, never in part);
//   - ranged reads (ReadableFile::ReadAt);
//   - list and delete by prefix (ListDir, RemoveTree);
//   - a small file written whole and atomically (PutFile), optionally only if absent;
//   - a way to publish a checkpoint atomically (publication(): a directory rename where there
//     is one, else the creation of its manifest). The commit rule itself — what is checked,
//     what "committed" means, what a roll back establishes — is format/commit.h's, in one place.
// Paths are strings: a file system path, or "s3://bucket/key" for an object; a "directory" of
// an object store is a key prefix ending before a '/'.
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
#ifndef TESSERA_STORAGE_STORAGE_H_
#define TESSERA_STORAGE_STORAGE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

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

// A status with `code` and `message` carrying ErrorDetail{IO_ERROR, path}: for storage errors
// that are not an errno (a short read, a refused transfer).
absl::Status IoError(absl::StatusCode code, absl::string_view path, std::string message);

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

  // ReadAt for bytes that another reader of this file is likely to read soon too: ranks
  // resharding a row-major tensor by columns each read every checksum block of it. Where the
  // storage has a cache its readers share (PosixStorage: the page cache), the bytes go through
  // it, so the device serves them once per machine rather than once per rank. Same contract
  // and errors as ReadAt. Default: ReadAt.
  virtual absl::Status ReadSharedAt(uint64_t offset, void* out, size_t size) {
    return ReadAt(offset, out, size);
  }

  // The file's size now. Errors: see the header comment.
  virtual absl::StatusOr<uint64_t> Size() = 0;

  virtual const std::string& path() const = 0;
};

// How a storage publishes a checkpoint (format/commit.h).
enum class Publication {
  // The session's directory is renamed to the step's, atomically (rename(2)).
  kRenameDirectory,
  // There is no rename: the step's manifest is created, only if absent (PutFile kCreateOnly),
  // and names the session's directory, where the data stays.
  kCreateManifest,
};

// What PutFile does where a file of that name exists.
enum class PutMode {
  kReplace,     // replaces it, atomically
  kCreateOnly,  // leaves it: AlreadyExists
};

class Storage {
 public:
  virtual ~Storage() = default;

  // How checkpoints under `path` are published. Default: kRenameDirectory.
  virtual Publication publication(const std::string& path) const {
    (void)path;
    return Publication::kRenameDirectory;
  }

  // Checks that checkpoints under `dir` can be reached, before anything is written there: on an
  // object store, that the bucket exists and the credentials may list it. The default (a file
  // system, where a missing directory is made when first written) is OK.
  // Errors: NotFound naming a bucket that does not exist; PermissionDenied for credentials or a
  // policy that refuse; Unavailable if the store cannot be reached; see the header comment.
  virtual absl::Status CheckAccess(const std::string& dir) {
    (void)dir;
    return absl::OkStatus();
  }

  // Writes `data` as the whole file `path`, atomically: a reader sees the file as it was (or
  // none) or all of `data`, never a part. The file's bytes are durable when it returns OK; on a
  // file system its directory entry is durable after SyncDir of the parent. With kCreateOnly,
  // only if no file `path` exists: of several writers racing for one name, exactly one
  // succeeds. The default writes a unique temporary name in the same directory (OpenForWrite,
  // WriteAt, Sync, Close) and renames it over `path` (kReplace only).
  // Errors: AlreadyExists (kCreateOnly) if `path` exists; Unimplemented for kCreateOnly where
  // the storage publishes by rename; NotFound if the parent does not exist; see the header
  // comment. After an error no temporary file is left.
  virtual absl::Status PutFile(const std::string& path, absl::string_view data, PutMode mode);

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
  // is a non-empty directory; Unimplemented on a storage whose publication is kCreateManifest
  // (an object store has no rename); see the header comment.
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

}  // namespace tessera

#endif  // TESSERA_STORAGE_STORAGE_H_
