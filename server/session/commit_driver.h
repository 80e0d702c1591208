// The coordinator's storage I/O for sessions, at the edge of the core: the commit (resolved
// from the disk), retention, and removal of aborted sessions' directories. The shells run a
// step's CommitAttempt, RetentionWork and remove_dirs (effects.h) through a CommitEdge;
// StorageCommitEdge is the real one, over storage/storage.h. Tests and the simulation supply
// their own.
//
// Thread-safety: StorageCommitEdge is safe for concurrent use (over a thread-safe Storage).
#ifndef TESSERA_SERVER_SESSION_COMMIT_DRIVER_H_
#define TESSERA_SERVER_SESSION_COMMIT_DRIVER_H_

#include <string>

#include "absl/status/status.h"
#include "format/commit.h"
#include "server/session/effects.h"
#include "storage/storage.h"

namespace tessera {

// What the coordinator does to the checkpoint storage it has mounted.
class CommitEdge {
 public:
  virtual ~CommitEdge() = default;
  // Resolves `work`'s commit from the disk (format/commit.h ResolveCommit).
  virtual CommitResolution Commit(const CommitAttempt& work) = 0;
  // Applies retention. OK only if every retired step is gone. Errors: those of listing the job
  // directory; the first removal that failed.
  virtual absl::Status Retain(const RetentionWork& work) = 0;
  // Removes an aborted session's temporary directory `dir`. Idempotent.
  // Errors: InvalidArgument if `dir` is not a session's temporary directory; the storage's.
  virtual absl::Status Remove(const std::string& dir) = 0;
};

class StorageCommitEdge : public CommitEdge {
 public:
  // `storage` must outlive this; checkpoints live under `storage_root`.
  StorageCommitEdge(Storage* storage, std::string storage_root);

  CommitResolution Commit(const CommitAttempt& work) override;
  // Logs what was removed and what could not be.
  absl::Status Retain(const RetentionWork& work) override;
  // Refuses anything that is not a session's temporary directory of a job under the storage
  // root (a name TmpDirPath makes), so a bad path can never remove something else.
  absl::Status Remove(const std::string& dir) override;

 private:
  Storage* const storage_;
  const std::string storage_root_;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_SESSION_COMMIT_DRIVER_H_
