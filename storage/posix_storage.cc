#include "storage/posix_storage.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status.h"
#include "tessera/v1/types.pb.h"

namespace tessera {
namespace {

bool IsAligned(uint64_t v) { return v % kDirectIoAlignment == 0; }
uint64_t AlignDown(uint64_t v) { return v - v % kDirectIoAlignment; }
uint64_t AlignUp(uint64_t v) { return AlignDown(v + kDirectIoAlignment - 1); }

}  // namespace

// ---------------------------------------------------------------------------------------------
// PosixStorage

// Two descriptors on one file: `fd_` through the page cache and `direct_fd_` with O_DIRECT
// (-1 when disabled or refused). Linux keeps the page cache coherent with direct writes to
// other ranges of the same file, so the two can be mixed freely.
class PosixWritableFile : public WritableFile {
 public:
  PosixWritableFile(PosixStorage* storage, std::string path, int fd, int direct_fd,
                    bool drop_cache)
      : storage_(storage),
        path_(std::move(path)),
        fd_(fd),
        direct_fd_(direct_fd),
        drop_cache_(drop_cache) {}

  ~PosixWritableFile() override { CloseFds(); }

  absl::Status WriteAt(uint64_t offset, const void* data, size_t size) override {
    if (fd_ < 0) return ErrnoToStatus(EBADF, "pwrite", path_, "after close");
    const char* p = static_cast<const char*>(data);
    size_t done = 0;
    const bool aligned = IsAligned(reinterpret_cast<uintptr_t>(data)) && IsAligned(offset) &&
                         IsAligned(size);
    if (aligned && direct_fd_ >= 0 && !direct_refused_.load(std::memory_order_relaxed)) {
      while (done < size) {
        ssize_t n = pwrite(direct_fd_, p + done, size - done, offset + done);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno == EINVAL) {
          // The file system takes O_DIRECT opens but not these transfers: use the page cache
          // for the rest of this file.
          direct_refused_.store(true, std::memory_order_relaxed);
          break;
        }
        if (n < 0) return WriteError(errno, offset + done, size - done);
        if (n == 0) return WriteError(EIO, offset + done, size - done);
        done += static_cast<size_t>(n);
        // A short direct write leaves the remainder possibly unaligned: finish it buffered.
        if (done < size && !IsAligned(done)) break;
      }
      storage_->CountWrite(/*direct=*/true, done);
    }
    const size_t direct_done = done;
    while (done < size) {
      ssize_t n = pwrite(fd_, p + done, size - done, offset + done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return WriteError(errno, offset + done, size - done);
      if (n == 0) return WriteError(EIO, offset + done, size - done);
      done += static_cast<size_t>(n);
    }
    storage_->CountWrite(/*direct=*/false, done - direct_done);
    if (done > direct_done) wrote_buffered_.store(true, std::memory_order_relaxed);
    return absl::OkStatus();
  }

  absl::Status Sync() override {
    if (fd_ < 0) return ErrnoToStatus(EBADF, "fsync", path_, "after close");
    int rc;
    do {
      rc = fsync(fd_);
    } while (rc != 0 && errno == EINTR);
    if (rc != 0) return ErrnoToStatus(errno, "fsync", path_);
    if (drop_cache_ && wrote_buffered_.load(std::memory_order_relaxed)) {
      // Advisory: failure only means the pages stay cached.
      (void)posix_fadvise(fd_, 0, 0, POSIX_FADV_DONTNEED);
    }
    return absl::OkStatus();
  }

  absl::Status Close() override {
    int err = CloseFds();
    if (err != 0) return ErrnoToStatus(err, "close", path_);
    return absl::OkStatus();
  }

  const std::string& path() const override { return path_; }

 private:
  absl::Status WriteError(int err, uint64_t offset, size_t size) {
    return ErrnoToStatus(err, "pwrite", path_, absl::StrCat("at offset ", offset, " (", size,
                                                             " bytes)"));
  }

  // Returns the first close error (errno), 0 if none.
  int CloseFds() {
    int err = 0;
    if (direct_fd_ >= 0) {
      if (close(direct_fd_) != 0 && errno != EINTR) err = errno;
      direct_fd_ = -1;
    }
    if (fd_ >= 0) {
      if (close(fd_) != 0 && errno != EINTR && err == 0) err = errno;
      fd_ = -1;
    }
    return err;
  }

  PosixStorage* const storage_;
  const std::string path_;
  int fd_;
  int direct_fd_;
  const bool drop_cache_;
  std::atomic<bool> direct_refused_{false};
  std::atomic<bool> wrote_buffered_{false};
};

// Two descriptors on one file, as for writing: `fd_` through the page cache and `direct_fd_`
// with O_DIRECT (-1 when disabled or refused). Reads of at least direct_min_bytes_ use
// O_DIRECT: a cold checkpoint streams at the disk's bandwidth instead of the page cache's
// read-ahead (a third of it on the disks measured), and loading does not evict the trainer's
// page cache. Smaller reads (manifests, small tensors) keep the page cache's read-ahead.
class PosixReadableFile : public ReadableFile {
 public:
  // `direct_fd` is an O_DIRECT descriptor on the same file, or -1.
  PosixReadableFile(PosixStorage* storage, std::string path, int fd, int direct_fd,
                    uint64_t direct_min_bytes, bool refuse_direct)
      : storage_(storage),
        path_(std::move(path)),
        fd_(fd),
        direct_fd_(direct_fd),
        direct_min_bytes_(direct_min_bytes),
        refuse_direct_(refuse_direct) {}

  ~PosixReadableFile() override {
    if (direct_fd_ >= 0) close(direct_fd_);
    close(fd_);
  }

  absl::Status ReadAt(uint64_t offset, void* out, size_t size) override {
    char* p = static_cast<char*>(out);
    if (size > 0 && size >= direct_min_bytes_ && direct_fd_ >= 0 &&
        !direct_refused_.load(std::memory_order_relaxed)) {
      absl::StatusOr<bool> done = DirectReadAt(offset, p, size);
      if (!done.ok()) return done.status();
      if (*done) {
        storage_->CountRead(/*direct=*/true, size);
        return absl::OkStatus();
      }
      // Refused: the whole range again through the page cache.
    }
    RETURN_IF_ERROR(BufferedReadAt(offset, p, size));
    storage_->CountRead(/*direct=*/false, size);
    return absl::OkStatus();
  }

  // Through the page cache whatever the size: the bytes stay there for the next reader.
  absl::Status ReadSharedAt(uint64_t offset, void* out, size_t size) override {
    RETURN_IF_ERROR(BufferedReadAt(offset, static_cast<char*>(out), size));
    storage_->CountRead(/*direct=*/false, size);
    return absl::OkStatus();
  }

  absl::StatusOr<uint64_t> Size() override {
    struct stat st;
    if (fstat(fd_, &st) != 0) return ErrnoToStatus(errno, "fstat", path_);
    return static_cast<uint64_t>(st.st_size);
  }

  const std::string& path() const override { return path_; }

 private:
  // Bounce buffers: one per thread, reused, so unaligned reads cause no allocation churn.
  static constexpr size_t kBounceBytes = 4 << 20;

  absl::Status ReadError(int err, uint64_t offset, size_t size) const {
    return ErrnoToStatus(err, "pread", path_,
                         absl::StrCat("at offset ", offset, " (", size, " bytes)"));
  }

  absl::Status EndsEarly(uint64_t offset, size_t size, uint64_t file_end) const {
    return IoError(absl::StatusCode::kOutOfRange, path_,
                   absl::StrCat("pread ", path_, " at offset ", offset, " (", size,
                                " bytes): the file ends after ", file_end, " bytes"));
  }

  absl::Status BufferedReadAt(uint64_t offset, char* p, size_t size) {
    size_t done = 0;
    while (done < size) {
      ssize_t n = pread(fd_, p + done, size - done, offset + done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return ReadError(errno, offset + done, size - done);
      if (n == 0) return EndsEarly(offset, size, offset + done);
      done += static_cast<size_t>(n);
    }
    return absl::OkStatus();
  }

  // pread on the O_DIRECT descriptor of [offset, offset + size), all three aligned, into
  // `buf`. Returns the bytes read: fewer than `size` only where the file ends. Sets
  // direct_refused_ and returns Unimplemented if the file system refuses the transfer.
  absl::StatusOr<size_t> PreadDirect(uint64_t offset, char* buf, size_t size) {
    size_t done = 0;
    while (done < size) {
      ssize_t n = refuse_direct_ ? (errno = EINVAL, -1)
                                 : pread(direct_fd_, buf + done, size - done, offset + done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EINVAL) {
        direct_refused_.store(true, std::memory_order_relaxed);
        return absl::UnimplementedError("O_DIRECT refused");
      }
      if (n < 0) return ReadError(errno, offset + done, size - done);
      if (n == 0) break;
      done += static_cast<size_t>(n);
      // Only the end of the file stops a direct read short of a block boundary.
      if (!IsAligned(done)) break;
    }
    return done;
  }

  // [offset, offset + size) read with O_DIRECT as the aligned blocks around it, through this
  // thread's bounce buffer, copied to `p`. Returns false if O_DIRECT was refused.
  absl::StatusOr<bool> BouncedDirectRead(uint64_t offset, char* p, size_t size) {
    thread_local std::unique_ptr<char, decltype(&free)> bounce(nullptr, &free);
    if (bounce == nullptr) {
      void* mem = nullptr;
      if (posix_memalign(&mem, kDirectIoAlignment, kBounceBytes) != 0) {
        return ReadError(ENOMEM, offset, size);
      }
      bounce.reset(static_cast<char*>(mem));
    }
    const uint64_t end = offset + size;
    uint64_t pos = offset;
    while (pos < end) {
      const uint64_t from = AlignDown(pos);
      const uint64_t to = std::min<uint64_t>(AlignUp(end), from + kBounceBytes);
      absl::StatusOr<size_t> got = PreadDirect(from, bounce.get(), to - from);
      if (absl::IsUnimplemented(got.status())) return false;
      if (!got.ok()) return got.status();
      const uint64_t want = std::min(end, to);
      if (from + *got < want) return EndsEarly(offset, size, from + *got);
      memcpy(p + (pos - offset), bounce.get() + (pos - from), want - pos);
      pos = want;
    }
    return true;
  }

  // The range with O_DIRECT. Where the destination and the file offset are equally aligned
  // (the common case: 4 KiB-aligned chunk bodies into page-aligned staging), the aligned
  // interior is read in place and only the partial blocks at either end go through a bounce
  // buffer; otherwise all of it does. Returns false if O_DIRECT was refused (nothing of
  // value was written to `p` then).
  absl::StatusOr<bool> DirectReadAt(uint64_t offset, char* p, size_t size) {
    const uint64_t end = offset + size;
    const uint64_t inner_begin = AlignUp(offset);
    const uint64_t inner_end = AlignDown(end);
    const bool congruent = (reinterpret_cast<uintptr_t>(p) - offset) % kDirectIoAlignment == 0;
    if (!congruent || inner_begin >= inner_end) return BouncedDirectRead(offset, p, size);
    absl::StatusOr<size_t> got =
        PreadDirect(inner_begin, p + (inner_begin - offset), inner_end - inner_begin);
    if (absl::IsUnimplemented(got.status())) return false;
    if (!got.ok()) return got.status();
    if (*got < inner_end - inner_begin) return EndsEarly(offset, size, inner_begin + *got);
    if (offset < inner_begin) {
      absl::StatusOr<bool> head = BouncedDirectRead(offset, p, inner_begin - offset);
      if (!head.ok() || !*head) return head;
    }
    if (inner_end < end) {
      absl::StatusOr<bool> tail = BouncedDirectRead(inner_end, p + (inner_end - offset),
                                                    end - inner_end);
      if (!tail.ok() || !*tail) return tail;
    }
    return true;
  }

  PosixStorage* const storage_;
  const std::string path_;
  const int fd_;
  const int direct_fd_;
  const uint64_t direct_min_bytes_;
  const bool refuse_direct_;
  std::atomic<bool> direct_refused_{false};
};

namespace {

// Removes everything inside the directory open as `dir_fd` (consumed). `path` is for errors.
absl::Status RemoveContents(int dir_fd, const std::string& path) {
  DIR* dir = fdopendir(dir_fd);
  if (dir == nullptr) {
    int err = errno;
    close(dir_fd);
    return ErrnoToStatus(err, "opendir", path);
  }
  absl::Status status;
  while (status.ok()) {
    errno = 0;
    struct dirent* entry = readdir(dir);
    if (entry == nullptr) {
      if (errno != 0) status = ErrnoToStatus(errno, "readdir", path);
      break;
    }
    const char* name = entry->d_name;
    if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0) continue;
    const std::string child = JoinPath(path, name);
    struct stat st;
    if (fstatat(dirfd(dir), name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT) continue;  // removed concurrently
      status = ErrnoToStatus(errno, "stat", child);
      break;
    }
    if (S_ISDIR(st.st_mode)) {
      int child_fd = openat(dirfd(dir), name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (child_fd < 0) {
        if (errno == ENOENT) continue;
        status = ErrnoToStatus(errno, "open", child);
        break;
      }
      status = RemoveContents(child_fd, child);
      if (!status.ok()) break;
      if (unlinkat(dirfd(dir), name, AT_REMOVEDIR) != 0 && errno != ENOENT) {
        status = ErrnoToStatus(errno, "rmdir", child);
      }
    } else if (unlinkat(dirfd(dir), name, 0) != 0 && errno != ENOENT) {
      status = ErrnoToStatus(errno, "unlink", child);
    }
  }
  closedir(dir);
  return status;
}

}  // namespace

PosixStorage::PosixStorage(PosixStorageOptions options) : options_(options) {}

void PosixStorage::CountWrite(bool direct, uint64_t bytes) {
  if (bytes == 0) return;
  absl::MutexLock lock(&mu_);
  (direct ? direct_bytes_ : buffered_bytes_) += bytes;
}

uint64_t PosixStorage::direct_bytes_written() const {
  absl::MutexLock lock(&mu_);
  return direct_bytes_;
}

uint64_t PosixStorage::buffered_bytes_written() const {
  absl::MutexLock lock(&mu_);
  return buffered_bytes_;
}

void PosixStorage::CountRead(bool direct, uint64_t bytes) {
  (direct ? direct_bytes_read_ : buffered_bytes_read_).fetch_add(bytes, std::memory_order_relaxed);
}

uint64_t PosixStorage::direct_bytes_read() const {
  return direct_bytes_read_.load(std::memory_order_relaxed);
}

uint64_t PosixStorage::buffered_bytes_read() const {
  return buffered_bytes_read_.load(std::memory_order_relaxed);
}

absl::Status PosixStorage::CreateDirs(const std::string& path) {
  if (path.empty()) return ErrnoToStatus(ENOENT, "mkdir", path);
  // Create each prefix ending before a '/', then the whole path.
  for (size_t pos = 1; pos <= path.size(); ++pos) {
    if (pos < path.size() && path[pos] != '/') continue;
    const std::string prefix = path.substr(0, pos);
    if (mkdir(prefix.c_str(), 0755) == 0) continue;
    const int err = errno;
    if (err != EEXIST) return ErrnoToStatus(err, "mkdir", prefix);
    struct stat st;
    if (stat(prefix.c_str(), &st) != 0) return ErrnoToStatus(errno, "stat", prefix);
    if (!S_ISDIR(st.st_mode)) {
      return ErrnoToStatus(pos == path.size() ? EEXIST : ENOTDIR, "mkdir", prefix,
                           "(exists and is not a directory)");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<WritableFile>> PosixStorage::OpenForWrite(
    const std::string& path) {
  int fd;
  do {
    fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return ErrnoToStatus(errno, "open", path, "for writing");
  int direct_fd = -1;
  if (options_.direct_io) {
    // A refusal (EINVAL on tmpfs before Linux 6.6, some FUSE and network file systems) is not
    // an error: every write then goes through the page cache.
    do {
      direct_fd = open(path.c_str(), O_WRONLY | O_DIRECT | O_CLOEXEC);
    } while (direct_fd < 0 && errno == EINTR);
  }
  return std::unique_ptr<WritableFile>(std::make_unique<PosixWritableFile>(
      this, path, fd, direct_fd, options_.drop_cache_after_sync));
}

absl::StatusOr<std::unique_ptr<ReadableFile>> PosixStorage::OpenForRead(const std::string& path) {
  int fd;
  do {
    fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return ErrnoToStatus(errno, "open", path, "for reading");
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int err = errno;
    close(fd);
    return ErrnoToStatus(err, "fstat", path);
  }
  if (S_ISDIR(st.st_mode)) {
    close(fd);
    return ErrnoToStatus(EISDIR, "open", path, "for reading");
  }
  // Reads through the page cache are mostly sequential runs: ask for aggressive read-ahead.
  (void)posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  int direct_fd = -1;
  if (options_.direct_io) {
    // As for writing, a refusal only means every read goes through the page cache.
    do {
      direct_fd = open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
    } while (direct_fd < 0 && errno == EINTR);
  }
  return std::unique_ptr<ReadableFile>(std::make_unique<PosixReadableFile>(
      this, path, fd, direct_fd, options_.direct_read_min_bytes,
      options_.refuse_direct_reads_for_testing));
}

absl::Status PosixStorage::SyncDir(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, "open", path, "(directory)");
  int rc;
  do {
    rc = fsync(fd);
  } while (rc != 0 && errno == EINTR);
  const int err = errno;
  close(fd);
  if (rc != 0) return ErrnoToStatus(err, "fsync", path, "(directory)");
  return absl::OkStatus();
}

absl::Status PosixStorage::Rename(const std::string& from, const std::string& to) {
  if (rename(from.c_str(), to.c_str()) != 0) {
    return ErrnoToStatus(errno, "rename", from, absl::StrCat("to ", to));
  }
  return absl::OkStatus();
}

absl::Status PosixStorage::RemoveTree(const std::string& path) {
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return ErrnoToStatus(errno, "stat", path);
  }
  if (!S_ISDIR(st.st_mode)) {
    if (unlink(path.c_str()) != 0 && errno != ENOENT) return ErrnoToStatus(errno, "unlink", path);
    return absl::OkStatus();
  }
  int fd = open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return ErrnoToStatus(errno, "open", path, "(directory)");
  }
  RETURN_IF_ERROR(RemoveContents(fd, path));
  if (rmdir(path.c_str()) != 0 && errno != ENOENT) return ErrnoToStatus(errno, "rmdir", path);
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> PosixStorage::FileSize(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return ErrnoToStatus(errno, "stat", path);
  return static_cast<uint64_t>(st.st_size);
}

absl::StatusOr<std::vector<std::string>> PosixStorage::ListDir(const std::string& path) {
  DIR* dir = opendir(path.c_str());
  if (dir == nullptr) return ErrnoToStatus(errno, "opendir", path);
  std::vector<std::string> names;
  while (true) {
    errno = 0;
    struct dirent* entry = readdir(dir);
    if (entry == nullptr) {
      const int err = errno;
      closedir(dir);
      if (err != 0) return ErrnoToStatus(err, "readdir", path);
      break;
    }
    if (strcmp(entry->d_name, ".") == 0 || strcmp(entry->d_name, "..") == 0) continue;
    names.emplace_back(entry->d_name);
  }
  std::sort(names.begin(), names.end());
  return names;
}
}  // namespace tessera
