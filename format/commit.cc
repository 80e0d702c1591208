#include "format/commit.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/ids.h"
#include "common/status.h"
#include "format/manifest_io.h"

namespace tessera {
namespace {

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
  bool io_error = false;  // kUnreadable because reading failed, not because it is garbage
};

FinalCheck CheckFinal(Storage& storage, const std::string& final_dir,
                      const std::string& session_id) {
  absl::StatusOr<v1::Manifest> existing = ReadManifest(storage, final_dir);
  if (existing.ok()) {
    if (existing->session_id() == session_id) return {FinalState::kSameSession, ""};
    return {FinalState::kOtherSession, existing->session_id()};
  }
  if (absl::IsNotFound(existing.status())) return {FinalState::kAbsent, ""};
  return {FinalState::kUnreadable, std::string(existing.status().message()),
          GetErrorCode(existing.status()) == v1::ERROR_CODE_IO_ERROR};
}

absl::Status FinalStateError(const std::string& final_dir, const FinalCheck& check) {
  if (check.state == FinalState::kOtherSession) {
    return StepExists(final_dir,
                      absl::StrCat("it is already committed by session ", check.detail));
  }
  return StepExists(final_dir, absl::StrCat("it holds an unreadable manifest (", check.detail,
                                            "); remove it by hand if it is garbage"));
}

// FailedPrecondition, not DataLoss: retrying cannot bring the data back, and DataLoss is what
// an EIO maps to (storage/storage.h), which a retry may get past.
absl::Status MissingData(const std::string& path, absl::string_view why) {
  v1::ErrorDetail detail;
  detail.set_code(v1::ERROR_CODE_IO_ERROR);
  detail.set_path(path);
  detail.set_message(absl::StrCat("cannot commit: data file ", path, " ", why));
  return MakeError(absl::StatusCode::kFailedPrecondition, detail);
}

// Makes a rename in `parent` durable, and `parent`'s own entry in its parent (the storage root
// holds the job directory, which the first save of a job creates).
absl::Status SyncParents(Storage& storage, const std::string& parent) {
  RETURN_IF_ERROR(storage.SyncDir(parent));
  return storage.SyncDir(SplitPath(parent).first);
}

// Makes the checkpoint in tmp_dir committed as final_dir, the one atomic step of a commit
// (decision 0041): where the storage renames, the manifest goes into tmp_dir and tmp_dir is
// renamed to final_dir; on an object store, final_dir/manifest.pb is created only if absent
// (the data stays in tmp_dir, which the manifest names by its session).
absl::Status Publish(Storage& storage, const std::string& tmp_dir, const std::string& final_dir,
                     const v1::Manifest& manifest) {
  if (storage.publication(final_dir) == Publication::kRenameDirectory) {
    RETURN_IF_ERROR(WriteManifest(storage, tmp_dir, manifest));
    return storage.Rename(tmp_dir, final_dir);
  }
  std::string binary;
  if (!manifest.SerializeToString(&binary)) {
    return absl::InternalError("cannot serialize the manifest");
  }
  return storage.PutFile(JoinPath(final_dir, kManifestFileName), binary, PutMode::kCreateOnly);
}

// One commit attempt: its status, and whether the session can never commit (nothing of it is
// under final_dir, and no retry could put it there). Errno-mapped storage errors share status
// codes with these refusals (EINVAL is InvalidArgument, EROFS FailedPrecondition), so the
// attempt says which is which rather than its caller guessing from the code.
struct Attempt {
  absl::Status status;
  bool refused_for_good = false;
};

Attempt Refused(absl::Status status) { return {std::move(status), true}; }

// Every data file the manifest names exists in `dir` and reaches the end of its last chunk;
// refused for good if one does not.
Attempt CheckDataFiles(Storage& storage, const std::string& dir, const v1::Manifest& manifest) {
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
    if (absl::IsNotFound(size.status())) return Refused(MissingData(path, "does not exist"));
    if (!size.ok()) return {size.status()};
    if (*size < end) {
      return Refused(
          MissingData(path, absl::StrCat("holds ", *size, " bytes but its chunks end at ", end)));
    }
  }
  return {};
}

Attempt AttemptCommit(Storage& storage, const std::string& tmp_dir, const std::string& final_dir,
                      const v1::Manifest& manifest) {
  if (absl::Status s = ValidateManifest(manifest); !s.ok()) {
    return Refused(absl::InvalidArgumentError(
        absl::StrCat("refusing to commit a malformed manifest: ", s.message())));
  }
  const auto [tmp_parent, tmp_name] = SplitPath(tmp_dir);
  const auto [parent, final_name] = SplitPath(final_dir);
  const std::string want_tmp = TmpDirName(manifest.step(), manifest.session_id());
  const std::string want_final = StepDirName(manifest.step());
  if (tmp_parent != parent || tmp_name != want_tmp || final_name != want_final) {
    return Refused(absl::InvalidArgumentError(absl::StrCat(
        "commit of step ", manifest.step(), " session ", manifest.session_id(), " expects ",
        JoinPath(parent, want_tmp), " -> ", JoinPath(parent, want_final), ", not ", tmp_dir,
        " -> ", final_dir)));
  }
  // Whether final_dir holds something that is not this session's checkpoint, for good: an
  // I/O error reading its manifest may pass, a manifest that does not parse will not.
  auto not_ours = [&](const FinalCheck& check) -> Attempt {
    absl::Status error = FinalStateError(final_dir, check);
    if (check.state == FinalState::kUnreadable && check.io_error) return {error, false};
    return Refused(error);
  };

  // What makes a commit whose manifest is under final_dir complete, for this attempt or an
  // earlier one: on a file system the parents' fsync (the previous attempt may have died
  // before it); on an object store the human-readable manifest.json beside it.
  const bool by_rename = storage.publication(final_dir) == Publication::kRenameDirectory;
  auto finish = [&]() -> Attempt {
    if (by_rename) return {SyncParents(storage, parent)};
    absl::StatusOr<std::string> json = ManifestToJson(manifest);
    if (!json.ok()) return {json.status()};
    return {storage.PutFile(JoinPath(final_dir, kManifestJsonFileName), *json, PutMode::kReplace)};
  };

  const FinalCheck before = CheckFinal(storage, final_dir, manifest.session_id());
  switch (before.state) {
    case FinalState::kSameSession:
      return finish();  // committed already
    case FinalState::kOtherSession:
    case FinalState::kUnreadable:
      return not_ours(before);
    case FinalState::kAbsent:
      break;
  }

  // ListDir first so a missing tmp_dir reads as NotFound (the data is gone), not as missing
  // data files.
  Attempt step;
  if (absl::Status listed = storage.ListDir(tmp_dir).status(); !listed.ok()) {
    step = {listed, absl::IsNotFound(listed)};
  } else {
    step = CheckDataFiles(storage, tmp_dir, manifest);
    if (step.status.ok()) step.status = Publish(storage, tmp_dir, final_dir, manifest);
  }
  const absl::Status& status = step.status;
  if (!status.ok()) {
    // A concurrent committer of the same session may have published it under us (or this
    // attempt's own PUT, retried, found its first try's object).
    const FinalCheck after = CheckFinal(storage, final_dir, manifest.session_id());
    if (after.state == FinalState::kSameSession) return finish();
    if (after.state != FinalState::kAbsent) return not_ours(after);
    if (by_rename && absl::IsAlreadyExists(status)) {
      return Refused(StepExists(final_dir, "it is a non-empty directory without a manifest; "
                                           "remove it by hand if it is garbage"));
    }
    return step;
  }
  return finish();
}

}  // namespace

absl::Status CommitCheckpoint(Storage& storage, const std::string& tmp_dir,
                              const std::string& final_dir, const v1::Manifest& manifest) {
  return AttemptCommit(storage, tmp_dir, final_dir, manifest).status;
}

CommitResolution ResolveCommit(Storage& storage, const std::string& tmp_dir,
                               const std::string& final_dir, const v1::Manifest& manifest,
                               bool roll_back_unless_committed) {
  const Attempt attempt = AttemptCommit(storage, tmp_dir, final_dir, manifest);
  if (attempt.status.ok()) return {CommitOutcome::kCommitted, absl::OkStatus()};
  if (!attempt.refused_for_good && !roll_back_unless_committed) {
    return {CommitOutcome::kUnresolved, attempt.status};
  }
  // Refused for good, or to be rolled back: make the directory's absence from final_dir
  // durable before anyone may call the session ABORTED.
  const std::string parent = SplitPath(final_dir).first;
  const FinalCheck check = CheckFinal(storage, final_dir, manifest.session_id());
  if (check.state == FinalState::kUnreadable && check.io_error) {
    return {CommitOutcome::kUnresolved, attempt.status};
  }
  if (check.state == FinalState::kSameSession) {
    // This session's manifest is under final_dir: its commit is done but for a parent's
    // fsync, which failed (this attempt's, or an earlier one's). It is never renamed back:
    // an earlier call may have answered kCommitted — a committer reported COMMIT_WRITTEN and
    // applied retention, a reader took it as `latest` — and that answer is final. An error
    // to retry: committed once the fsync works.
    return {CommitOutcome::kUnresolved, attempt.status};
  }
  if (absl::Status synced = storage.SyncDir(parent); !synced.ok()) {
    return {CommitOutcome::kUnresolved, synced};
  }
  if (attempt.refused_for_good) return {CommitOutcome::kRolledBack, attempt.status};
  return {CommitOutcome::kRolledBack,
          absl::Status(attempt.status.code(),
                       absl::StrCat("the commit did not complete and was rolled back: ",
                                    attempt.status.message()))};
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
    // Any error but its absence is an error: an unreadable checkpoint is not an absent one.
    absl::StatusOr<uint64_t> size =
        storage.FileSize(JoinPath(JoinPath(job_dir, name), kManifestFileName));
    if (absl::IsNotFound(size.status())) continue;
    RETURN_IF_ERROR(size.status());
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

absl::StatusOr<RetentionReport> ApplyRetention(Storage& storage, const std::string& job_dir,
                                               const std::vector<int64_t>& retire_steps,
                                               int64_t committed_step) {
  for (int64_t step : retire_steps) {
    if (step == committed_step) {
      return absl::InvalidArgumentError(absl::StrCat(
          "retention asked to retire step ", step, ", the checkpoint just committed"));
    }
  }
  RetentionReport report;
  absl::StatusOr<std::vector<std::string>> names = storage.ListDir(job_dir);
  if (absl::IsNotFound(names.status())) return report;
  RETURN_IF_ERROR(names.status());

  const bool by_rename = storage.publication(job_dir) == Publication::kRenameDirectory;
  // On an object store a committed checkpoint's data is its session's directory, which looks
  // like any other: by step, the session each kept checkpoint names (empty: its manifest could
  // not be read, so no directory of that step is removed).
  std::map<int64_t, std::string> kept_sessions;
  std::vector<std::string> removed_data;  // names of retired checkpoints' session directories
  // Retired checkpoints first, each out of the committed namespace before it is deleted. On a
  // file system it is renamed to a temporary name with a step not newer than committed_step,
  // so an interrupted removal is finished by the next retention; on an object store its
  // manifest is deleted first, then its session's directory, then the rest. Found by name
  // alone: a manifest that cannot be read (an I/O error) does not keep a retired checkpoint.
  for (const std::string& name : *names) {
    const std::optional<int64_t> step = ParseStepDirName(name);
    if (!step.has_value()) continue;
    const bool retire =
        std::find(retire_steps.begin(), retire_steps.end(), *step) != retire_steps.end();
    if (!by_rename) {
      const std::string dir = JoinPath(job_dir, name);
      absl::StatusOr<v1::Manifest> manifest = ReadManifest(storage, dir);
      if (!retire) {
        if (!absl::IsNotFound(manifest.status())) {
          kept_sessions[*step] = manifest.ok() ? manifest->session_id() : "";
        }
        continue;
      }
      absl::Status s = storage.RemoveTree(JoinPath(dir, kManifestFileName));
      if (s.ok() && manifest.ok()) {
        s = storage.RemoveTree(DataDirOf(storage, dir, *manifest));
        removed_data.push_back(TmpDirName(manifest->step(), manifest->session_id()));
      }
      if (s.ok()) s = storage.RemoveTree(dir);
      if (s.ok()) {
        report.removed.push_back(name);
      } else {
        report.failed.emplace_back(name, std::move(s));
      }
      continue;
    }
    if (!retire) continue;
    const std::string doomed =
        TmpDirName(*step, absl::StrFormat("gc-%016x", NewIncarnation()));
    absl::Status s = storage.Rename(JoinPath(job_dir, name), JoinPath(job_dir, doomed));
    if (s.ok()) s = storage.SyncDir(job_dir);
    if (!s.ok()) {
      report.failed.emplace_back(name, std::move(s));
      continue;
    }
    if (absl::Status r = storage.RemoveTree(JoinPath(job_dir, doomed)); r.ok()) {
      report.removed.push_back(name);
    } else {
      report.failed.emplace_back(name, std::move(r));  // no longer committed: an orphan
    }
  }

  for (const std::string& name : *names) {
    std::optional<std::pair<int64_t, std::string>> tmp = ParseTmpDirName(name);
    if (!tmp.has_value() || tmp->first > committed_step) continue;
    if (auto kept = kept_sessions.find(tmp->first);
        kept != kept_sessions.end() && (kept->second.empty() || kept->second == tmp->second)) {
      continue;  // a committed checkpoint's data (or maybe: its manifest is unreadable)
    }
    if (std::find(removed_data.begin(), removed_data.end(), name) != removed_data.end()) {
      continue;  // removed with its retired checkpoint
    }
    if (absl::Status s = storage.RemoveTree(JoinPath(job_dir, name)); s.ok()) {
      report.removed.push_back(name);
    } else {
      report.failed.emplace_back(name, std::move(s));
    }
  }
  return report;
}

}  // namespace tessera
