// FaultInjectingStorage: a Storage decorator that fails chosen operations, for tests and the
// test-only --inject_storage_fault flags of the agent and the coordinator.
#ifndef TESSERA_STORAGE_FAULT_INJECTING_STORAGE_H_
#define TESSERA_STORAGE_FAULT_INJECTING_STORAGE_H_

#include <cerrno>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "storage/storage.h"

namespace tessera {

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

  // Once a directory has been renamed (a commit's rename, or a rollback's), the next `n`
  // SyncDir calls fail with `err`: the rename is done but not yet durable, as after a parent
  // fsync that fails for a while. Armed once: only the first directory rename from now counts.
  void FailSyncDirAfterDirRename(uint64_t n, int err = EIO);

  // Runs `hook(from, to)` right after the first directory rename from now succeeds (the
  // Configure item crash_after_dir_rename SIGKILLs the process there). Null disarms.
  void SetAfterDirRename(std::function<void(const std::string& from, const std::string& to)> hook);

  // Every WriteAt waits until the file `release_path` exists (checked every 10 ms through the
  // wrapped storage), or ReleaseHeldWrites(), so that a test can hold a writer in the middle
  // of a save and let it go on an event of its own. A write still held after `max_hold` fails
  // with EIO, so a forgotten release cannot hang a process forever. The first held write logs
  // "fault injection: holding writes until <path> exists". Empty path: writes are not held.
  void HoldWritesUntil(std::string release_path, absl::Duration max_hold = absl::Minutes(5));
  // Lets every held write go on, and later writes are not held.
  void ReleaseHeldWrites();
  // Waits until at least `n` writes are held at once, or `timeout`; true if they are.
  bool AwaitHeldWrites(int n, absl::Duration timeout) const;

  // Clears every fault.
  void Reset();

  // Arms the faults a spec names (the agent's test-only --inject_storage_fault flag), each
  // fault one `;`-separated item:
  //   ERR:after_bytes=N   writes fail with ERR once N bytes were written (FailWritesAfterBytes)
  //   ERR:write=N         the N-th write fails with ERR (FailNthWrite)
  //   ERR:sync            every fsync of a written file fails (FailSync)
  //   ERR:syncdir         every directory fsync fails (FailSyncDir)
  //   ERR:rename          every rename fails (FailRename)
  //   ERR:syncdir_after_dir_rename=N
  //                       the N directory fsyncs after the first directory rename fail
  //                       (FailSyncDirAfterDirRename)
  //   readonly            every mutation fails with EROFS (SetReadOnly)
  //   crash_after_dir_rename
  //                       SIGKILL the process right after the first directory rename
  //                       succeeds, logging "fault injection: crashing after renaming <from>
  //                       to <to>" first (SetAfterDirRename)
  //   hold_writes=PATH    every write waits until the file PATH exists (HoldWritesUntil; PATH
  //                       may not contain ';')
  // ERR is one of enospc, eio, edquot, erofs, eacces (case-insensitive). An empty spec arms
  // nothing. Errors: InvalidArgument naming the item that does not parse (nothing is armed).
  absl::Status Configure(absl::string_view spec);

  uint64_t bytes_written() const;
  uint64_t writes() const;

  // As the wrapped storage's.
  Publication publication(const std::string& path) const override;
  absl::Status CheckAccess(const std::string& dir) override { return base_->CheckAccess(dir); }
  // Where the wrapped storage publishes by rename, Storage::PutFile through this decorator:
  // the faults of its writes, sync and rename apply. On an object store, the wrapped storage's
  // one atomic operation, failing as a write would (read-only: EROFS).
  absl::Status PutFile(const std::string& path, absl::string_view data, PutMode mode) override;
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
  // Blocks while writes are held (HoldWritesUntil). Returns EIO if held past the limit, else 0.
  int WaitUntilWritesReleased();
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
  // FailSyncDirAfterDirRename: armed_ until the first directory rename, which moves the count
  // into sync_dir_failures_left_.
  bool sync_dir_after_rename_armed_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t sync_dir_after_rename_n_ ABSL_GUARDED_BY(mu_) = 0;
  int sync_dir_after_rename_errno_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t sync_dir_failures_left_ ABSL_GUARDED_BY(mu_) = 0;
  std::function<void(const std::string&, const std::string&)> after_dir_rename_
      ABSL_GUARDED_BY(mu_);
  // HoldWritesUntil.
  std::string hold_release_path_ ABSL_GUARDED_BY(mu_);
  absl::Duration max_hold_ ABSL_GUARDED_BY(mu_) = absl::Minutes(5);
  bool writes_released_ ABSL_GUARDED_BY(mu_) = true;
  bool hold_logged_ ABSL_GUARDED_BY(mu_) = false;
  int writes_held_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tessera

#endif  // TESSERA_STORAGE_FAULT_INJECTING_STORAGE_H_
