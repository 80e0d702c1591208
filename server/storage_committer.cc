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
                                              const std::string& /*protect_session_id*/) {
  absl::StatusOr<std::vector<int64_t>> steps = ListCheckpoints(*storage_, job_dir);
  if (!steps.ok()) return steps.status();
  if (steps->empty()) return absl::OkStatus();
  std::vector<int64_t> retire;
  if (keep_last > 0 && steps->size() > static_cast<size_t>(keep_last)) {
    retire.assign(steps->begin(), steps->end() - keep_last);
  }
  absl::StatusOr<RetentionReport> report =
      ApplyRetention(*storage_, job_dir, retire, steps->back());
  if (!report.ok()) return report.status();
  for (const std::string& name : report->removed) LogInfo("retention removed ", job_dir, "/", name);
  for (const auto& [name, status] : report->failed) {
    LogWarning("retention could not remove ", job_dir, "/", name, ": ", status.ToString());
  }
  return absl::OkStatus();
}

}  // namespace tessera
