#include "server/storage_committer.h"

#include <limits>

#include "common/log.h"
#include "format/commit.h"

namespace tessera {

absl::Status StorageCommitter::Commit(const v1::Manifest& manifest, const std::string& tmp_dir,
                                      const std::string& final_dir) {
  return CommitCheckpoint(*storage_, tmp_dir, final_dir, manifest);
}

absl::Status StorageCommitter::RemoveDir(const std::string& tmp_dir) {
  return storage_->RemoveTree(tmp_dir);
}

absl::Status StorageCommitter::CollectGarbage(const std::string& job_dir, int keep_last,
                                              const std::string& protect_session_id) {
  // keep_last 0 keeps every checkpoint but still removes orphaned temporary directories.
  absl::StatusOr<GcReport> report = tessera::CollectGarbage(
      *storage_, job_dir, keep_last > 0 ? keep_last : std::numeric_limits<int>::max(),
      protect_session_id);
  if (!report.ok()) return report.status();
  for (const std::string& name : report->removed) LogInfo("retention removed ", job_dir, "/", name);
  for (const auto& [name, status] : report->failed) {
    LogWarning("retention could not remove ", job_dir, "/", name, ": ", status.ToString());
  }
  return absl::OkStatus();
}

}  // namespace tessera
