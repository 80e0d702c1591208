// StorageCommitter: the SessionManager's Committer for a coordinator that has the checkpoint
// storage mounted. Delegates to format/commit.h (atomic rename, idempotent, garbage
// collection), over any Storage (PosixStorage in production, FaultInjectingStorage in tests).
//
// Thread-safety: as format/commit.h — safe for concurrent use.
#ifndef TESSERA_SERVER_STORAGE_COMMITTER_H_
#define TESSERA_SERVER_STORAGE_COMMITTER_H_

#include <string>

#include "storage/fault_injecting_storage.h"
#include "storage/posix_storage.h"
#include "storage/storage.h"
#include "server/session_manager.h"

namespace tessera {

class StorageCommitter : public Committer {
 public:
  // `storage` must outlive the committer.
  explicit StorageCommitter(Storage* storage) : storage_(storage) {}

  absl::Status Commit(const v1::Manifest& manifest, const std::string& tmp_dir,
                      const std::string& final_dir) override;
  absl::Status RemoveDir(const std::string& tmp_dir) override;
  absl::Status CollectGarbage(const std::string& job_dir, int keep_last,
                              const std::string& protect_session_id) override;

 private:
  Storage* const storage_;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_STORAGE_COMMITTER_H_
