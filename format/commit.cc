#include "format/commit.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/ids.h"
#include "common/status.h"
#include "format/manifest_io.h"

namespace tessera {
namespace {

constexpr absl::string_view kTmpInfix = ".tmp-";

// `path` without trailing slashes, split into parent and last component.
std::pair<std::string, std::string> SplitPath(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return {".", path};
  return {slash == 0 ? "/" : path.substr(0, slash), path.substr(slash + 1)};
}

absl::Status StepExists(const std::string& final_dir, absl::string_view why) {
  v1::ErrorDetail detail;
  detail.set_code(v1::ERROR_CODE_STEP_EXISTS);
  detail.set_path(final_dir);
  detail.set_message(absl::StrCat("cannot commit to ", final_dir, ": ", why));
  return MakeError(absl::StatusCode::kFailedPrecondition, detail);
}

// What final_dir holds now.
enum class FinalState { kAbsent, kSameSession, kOtherSession, kUnreadable };

struct FinalCheck {
  FinalState state;
  std::string detail;  // the other session id, or why the manifest is unreadable
};

FinalCheck CheckFinal(Storage& storage, const std::string& final_dir,
                      const std::string& session_id) {
  absl::StatusOr<v1::Manifest> existing = ReadManifest(storage, final_dir);
  if (existing.ok()) {
    if (existing->session_id() == session_id) return {FinalState::kSameSession, ""};
    return {FinalState::kOtherSession, existing->session_id()};
  }
  if (absl::IsNotFound(existing.status())) return {FinalState::kAbsent, ""};
  return {FinalState::kUnreadable, std::string(existing.status().message())};
}

absl::Status FinalStateError(const std::string& final_dir, const FinalCheck& check) {
  if (check.state == FinalState::kOtherSession) {
    return StepExists(final_dir,
                      absl::StrCat("it is already committed by session ", check.detail));
  }
  return StepExists(final_dir, absl::StrCat("it holds an unreadable manifest (", check.detail,
                                            "); remove it by hand if it is garbage"));
}

absl::Status MissingData(const std::string& path, absl::string_view why) {
  v1::ErrorDetail detail;
  detail.set_code(v1::ERROR_CODE_IO_ERROR);
  detail.set_path(path);
  detail.set_message(absl::StrCat("cannot commit: data file ", path, " ", why));
  return MakeError(absl::StatusCode::kDataLoss, detail);
}

// Every data file the manifest names exists in `dir` and reaches the end of its last chunk.
absl::Status CheckDataFiles(Storage& storage, const std::string& dir,
                            const v1::Manifest& manifest) {
  absl::flat_hash_map<std::string, uint64_t> needed;  // file -> end of its last chunk
  for (const v1::TensorEntry& tensor : manifest.tensors()) {
    for (const v1::ChunkEntry& chunk : tensor.chunks()) {
      uint64_t& end = needed[chunk.file()];
      end = std::max(end, chunk.offset() + chunk.nbytes());
    }
  }
  std::vector<std::pair<std::string, uint64_t>> files(needed.begin(), needed.end());
  std::sort(files.begin(), files.end());
  for (const auto& [file, end] : files) {
    const std::string path = JoinPath(dir, file);
    absl::StatusOr<uint64_t> size = storage.FileSize(path);
    if (absl::IsNotFound(size.status())) return MissingData(path, "does not exist");
    RETURN_IF_ERROR(size.status());
    if (*size < end) {
      return MissingData(path, absl::StrCat("holds ", *size, " bytes but its chunks end at ", end));
    }
  }
  return absl::OkStatus();
}

// The session id of a temporary directory name, or nullopt for any other name.
std::optional<std::string> TmpSession(absl::string_view name) {
  if (!IsTmpDirName(name)) return std::nullopt;
  return std::string(name.substr(name.find(kTmpInfix) + kTmpInfix.size()));
}

}  // namespace

absl::Status CommitCheckpoint(Storage& storage, const std::string& tmp_dir,
                              const std::string& final_dir, const v1::Manifest& manifest) {
  if (absl::Status s = ValidateManifest(manifest); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("refusing to commit a malformed manifest: ", s.message()));
  }
  const auto [tmp_parent, tmp_name] = SplitPath(tmp_dir);
  const auto [parent, final_name] = SplitPath(final_dir);
  const std::string want_tmp = TmpDirName(manifest.step(), manifest.session_id());
  const std::string want_final = StepDirName(manifest.step());
  if (tmp_parent != parent || tmp_name != want_tmp || final_name != want_final) {
    return absl::InvalidArgumentError(absl::StrCat(
        "commit of step ", manifest.step(), " session ", manifest.session_id(), " expects ",
        JoinPath(parent, want_tmp), " -> ", JoinPath(parent, want_final), ", not ", tmp_dir,
        " -> ", final_dir));
  }

  const FinalCheck before = CheckFinal(storage, final_dir, manifest.session_id());
  switch (before.state) {
    case FinalState::kSameSession:
      // Committed already; the previous attempt may have died before the parent's fsync.
      return storage.SyncDir(parent);
    case FinalState::kOtherSession:
    case FinalState::kUnreadable:
      return FinalStateError(final_dir, before);
    case FinalState::kAbsent:
      break;
  }

  // ListDir first so a missing tmp_dir reads as NotFound, not as missing data files.
  absl::Status status = storage.ListDir(tmp_dir).status();
  if (status.ok()) status = CheckDataFiles(storage, tmp_dir, manifest);
  if (status.ok()) status = WriteManifest(storage, tmp_dir, manifest);
  if (status.ok()) status = storage.Rename(tmp_dir, final_dir);
  if (!status.ok()) {
    // A concurrent committer of the same session may have renamed tmp_dir under us.
    const FinalCheck after = CheckFinal(storage, final_dir, manifest.session_id());
    if (after.state == FinalState::kSameSession) return storage.SyncDir(parent);
    if (after.state != FinalState::kAbsent) return FinalStateError(final_dir, after);
    if (absl::IsAlreadyExists(status)) {
      return StepExists(final_dir, "it is a non-empty directory without a manifest; "
                                   "remove it by hand if it is garbage");
    }
    return status;
  }
  return storage.SyncDir(parent);
}

absl::StatusOr<std::vector<int64_t>> ListCheckpoints(Storage& storage,
                                                     const std::string& job_dir) {
  absl::StatusOr<std::vector<std::string>> names = storage.ListDir(job_dir);
  if (absl::IsNotFound(names.status())) return std::vector<int64_t>();
  RETURN_IF_ERROR(names.status());
  std::vector<int64_t> steps;
  for (const std::string& name : *names) {
    std::optional<int64_t> step = ParseStepDirName(name);
    if (!step.has_value()) continue;
    // The manifest's presence is what committed means; its contents are the reader's concern.
    if (!storage.FileSize(JoinPath(JoinPath(job_dir, name), kManifestFileName)).ok()) continue;
    steps.push_back(*step);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

absl::StatusOr<int64_t> LatestStep(Storage& storage, const std::string& job_dir) {
  ASSIGN_OR_RETURN(std::vector<int64_t> steps, ListCheckpoints(storage, job_dir));
  if (steps.empty()) {
    v1::ErrorDetail detail;
    detail.set_code(v1::ERROR_CODE_CHECKPOINT_NOT_FOUND);
    detail.set_path(job_dir);
    detail.set_message(absl::StrCat("no committed checkpoint in ", job_dir));
    return MakeError(absl::StatusCode::kNotFound, detail);
  }
  return steps.back();
}

absl::StatusOr<GcReport> CollectGarbage(Storage& storage, const std::string& job_dir,
                                        int keep_last_k, absl::string_view protect_session_id) {
  if (keep_last_k < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("keep_last_k is ", keep_last_k, "; at least the latest checkpoint is kept"));
  }
  GcReport report;
  absl::StatusOr<std::vector<std::string>> names = storage.ListDir(job_dir);
  if (absl::IsNotFound(names.status())) return report;
  RETURN_IF_ERROR(names.status());

  auto remove = [&](const std::string& name) {
    if (absl::Status s = storage.RemoveTree(JoinPath(job_dir, name)); s.ok()) {
      report.removed.push_back(name);
    } else {
      report.failed.emplace_back(name, std::move(s));
    }
  };

  // Old committed steps first: each is renamed out of the committed namespace, then deleted.
  ASSIGN_OR_RETURN(std::vector<int64_t> steps, ListCheckpoints(storage, job_dir));
  const size_t keep = static_cast<size_t>(keep_last_k);
  const size_t drop = steps.size() > keep ? steps.size() - keep : 0;
  for (size_t i = 0; i < drop; ++i) {
    const std::string name = StepDirName(steps[i]);
    const std::string doomed =
        TmpDirName(steps[i], absl::StrFormat("gc-%016x", NewIncarnation()));
    absl::Status s = storage.Rename(JoinPath(job_dir, name), JoinPath(job_dir, doomed));
    if (s.ok()) s = storage.SyncDir(job_dir);
    if (!s.ok()) {
      report.failed.emplace_back(name, std::move(s));
      continue;
    }
    if (absl::Status r = storage.RemoveTree(JoinPath(job_dir, doomed)); r.ok()) {
      report.removed.push_back(name);
    } else {
      // No longer committed; the next collection removes the orphan.
      report.failed.emplace_back(name, std::move(r));
    }
  }

  // Orphaned temporary directories: aborted or crashed sessions, and interrupted collections.
  for (const std::string& name : *names) {
    std::optional<std::string> session = TmpSession(name);
    if (!session.has_value()) continue;
    if (!protect_session_id.empty() && *session == protect_session_id) continue;
    remove(name);
  }
  return report;
}

}  // namespace tessera
