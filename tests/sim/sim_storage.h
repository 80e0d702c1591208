// SimStorage: an in-memory file system behind the Storage interface (storage/storage.h), for
// the deterministic simulation. Every operation consults a fault hook that may fail it with an
// errno — before it takes effect, or after (a rename that happened but reported EIO) — so the
// simulation can put a storage error at any operation, around every fsync and after every
// rename. Errors are exactly what PosixStorage would return (ErrnoToStatus).
//
// It models the namespace and file contents, not the page cache: what an operation did is
// visible at once, and a process crash loses nothing. Enough for the protocol's invariants
// ("the final directory holds this session's manifest"), which are about names.
//
// Thread-safety: none; the simulation is single-threaded.
#ifndef TESSERA_TESTS_SIM_SIM_STORAGE_H_
#define TESSERA_TESTS_SIM_SIM_STORAGE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "storage/storage.h"

namespace tessera::sim {

enum class StorageOp {
  kCreateDirs,
  kOpenForWrite,
  kOpenForRead,
  kWrite,
  kRead,
  kSync,
  kClose,
  kSyncDir,
  kRename,
  kRemoveTree,
  kFileSize,
  kListDir,
};

// What the fault hook decides for one operation.
struct StorageFault {
  int err = 0;             // 0: no fault
  bool after = false;      // the operation takes effect, then reports `err`
};

class SimStorage : public Storage {
 public:
  using FaultHook = std::function<StorageFault(StorageOp op, const std::string& path)>;

  SimStorage() = default;
  // Consulted before every operation; default none.
  void set_fault_hook(FaultHook hook) { hook_ = std::move(hook); }

  // Direct inspection for invariants, bypassing the hook.
  bool IsDir(const std::string& path) const { return dirs_.count(Norm(path)) > 0; }
  bool IsFile(const std::string& path) const { return files_.count(Norm(path)) > 0; }
  const std::string* Contents(const std::string& path) const;
  std::vector<std::string> Children(const std::string& dir) const;
  uint64_t operations() const { return operations_; }

  absl::Status CreateDirs(const std::string& path) override;
  absl::StatusOr<std::unique_ptr<WritableFile>> OpenForWrite(const std::string& path) override;
  absl::StatusOr<std::unique_ptr<ReadableFile>> OpenForRead(const std::string& path) override;
  absl::Status SyncDir(const std::string& path) override;
  absl::Status Rename(const std::string& from, const std::string& to) override;
  absl::Status RemoveTree(const std::string& path) override;
  absl::StatusOr<uint64_t> FileSize(const std::string& path) override;
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path) override;

 private:
  friend class SimWritableFile;
  friend class SimReadableFile;
  static std::string Norm(const std::string& path);
  static std::string Parent(const std::string& path);
  StorageFault Check(StorageOp op, const std::string& path);
  absl::Status Error(int err, const char* op, const std::string& path) const;

  FaultHook hook_;
  std::set<std::string> dirs_ = {"/"};
  std::map<std::string, std::shared_ptr<std::string>> files_;  // path -> contents
  uint64_t operations_ = 0;
};

}  // namespace tessera::sim

#endif  // TESSERA_TESTS_SIM_SIM_STORAGE_H_
