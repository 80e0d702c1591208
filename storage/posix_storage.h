// PosixStorage: Storage (storage/storage.h) on a local or network POSIX file system, with
// O_DIRECT where the file system takes it.
#ifndef TESSERA_STORAGE_POSIX_STORAGE_H_
#define TESSERA_STORAGE_POSIX_STORAGE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "storage/storage.h"

namespace tessera {

struct PosixStorageOptions {
  // Open files with O_DIRECT too. Writes use it where buffer address, offset and length are
  // all multiples of kDirectIoAlignment; reads of at least direct_read_min_bytes use it for
  // any range (the blocks around the range are read, the partial ones at either end through
  // an aligned bounce buffer; the whole range goes through one where the destination's
  // address and the offset are not equally aligned). Other transfers, and all transfers of a
  // file once the file system refuses O_DIRECT (EINVAL, at open or at the first transfer),
  // go through the page cache, as do ReadSharedAt's reads of any size. Default: true.
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

}  // namespace tessera

#endif  // TESSERA_STORAGE_POSIX_STORAGE_H_
