#include "server/session/commit_driver.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/ids.h"
#include "common/log.h"

namespace tessera {

StorageCommitEdge::StorageCommitEdge(Storage* storage, std::string storage_root)
    : storage_(storage), storage_root_(std::move(storage_root)) {}

CommitResolution StorageCommitEdge::Commit(const CommitAttempt& work) {
  return ResolveCommit(*storage_, work.tmp_dir, work.final_dir, *work.manifest,
                       work.roll_back_unless_committed);
}

absl::Status StorageCommitEdge::Retain(const RetentionWork& work) {
  absl::StatusOr<RetentionReport> report =
      ApplyRetention(*storage_, work.job_dir, work.retire_steps, work.committed_step);
  if (!report.ok()) return report.status();
  for (const std::string& name : report->removed) {
    LogInfo("retention removed ", work.job_dir, "/", name);
  }
  for (const auto& [name, status] : report->failed) {
    LogWarning("retention could not remove ", work.job_dir, "/", name, ": ", status.ToString());
  }
  if (!report->failed.empty()) {
    return absl::Status(report->failed.front().second.code(),
                        absl::StrCat("retention could not remove ", work.job_dir, "/",
                                     report->failed.front().first, ": ",
                                     report->failed.front().second.message()));
  }
  return absl::OkStatus();
}

absl::Status StorageCommitEdge::Remove(const std::string& dir) {
  const size_t slash = dir.rfind('/');
  const size_t job_slash =
      slash == std::string::npos || slash == 0 ? std::string::npos : dir.rfind('/', slash - 1);
  std::optional<std::pair<int64_t, std::string>> tmp;
  if (job_slash != std::string::npos) tmp = ParseTmpDirName(dir.substr(slash + 1));
  if (!tmp.has_value() ||
      dir != TmpDirPath(storage_root_, dir.substr(job_slash + 1, slash - job_slash - 1),
                        tmp->first, tmp->second)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "refusing to remove ", dir, ": it is not a session's temporary directory under ",
        storage_root_));
  }
  return storage_->RemoveTree(dir);
}

}  // namespace tessera
