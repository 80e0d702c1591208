// Committing a checkpoint directory, listing committed checkpoints, and garbage collection.
//
// A save session writes its data files into <job_dir>/step-NNNNNNNNN.tmp-<session_id>
// (common/ids.h TmpDirName). CommitCheckpoint then writes the manifest into that directory
// and renames it to <job_dir>/step-NNNNNNNNN. "Committed" means exactly: a directory whose
// name ParseStepDirName accepts holds a manifest.pb. The rename is atomic, so a reader never
// sees a half-committed checkpoint, and the commit is idempotent: whoever retries it — the
// coordinator after a restart, or another committer agent after the first one died — gets OK
// if the same session already committed, and STEP_EXISTS if a different one did.
//
// Durability: the writers fsynced every data file and the temporary directory (see
// format/shard_writer.h), so the commit fsyncs only what it changes: the manifest files, the
// temporary directory (their entries) and, after the rename, the job directory.
//
// Garbage collection removes only names Tessera makes: committed step directories beyond the
// newest K, and temporary directories ("step-N.tmp-<session>") of sessions that are not in
// flight. Anything else in the job directory — other files, "step-N" without a manifest,
// non-canonical spellings — is left alone. A committed step is removed by first renaming it to
// a temporary name (so it stops being "committed" atomically and a crash mid-removal leaves an
// orphan the next collection removes), then deleting the tree.
//
// Thread-safety: free functions; safe to call concurrently (all decisions are re-checked
// against the file system, and renames are atomic).
#ifndef TESSERA_FORMAT_COMMIT_H_
#define TESSERA_FORMAT_COMMIT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "storage/storage.h"
#include "tessera/v1/manifest.pb.h"

namespace tessera {

// Commits the checkpoint `manifest` describes: tmp_dir must be
// <parent>/TmpDirName(manifest.step, manifest.session_id) and final_dir
// <parent>/StepDirName(manifest.step). Checks that every data file the manifest names exists
// in tmp_dir and is long enough for its chunks, writes the manifest (format/manifest_io.h),
// renames tmp_dir to final_dir and fsyncs the parent.
// Idempotent: if final_dir already holds a manifest of the same session, returns OK (after
// fsyncing the parent again, in case the previous attempt died before it).
// Errors: InvalidArgument if `manifest` fails ValidateManifest or the directory names do not
// match it; FailedPrecondition + STEP_EXISTS if final_dir holds a checkpoint of another
// session, an unreadable manifest, or is a non-empty directory without a manifest;
// DataLoss + IO_ERROR naming the file if a data file is missing or shorter than its chunks;
// NotFound + IO_ERROR if tmp_dir does not exist (and the session did not commit);
// other I/O errors from `storage` (storage/storage.h). After an error nothing was renamed,
// unless the error is the parent's fsync (the checkpoint may then be committed but not yet
// durable; retrying the commit makes it so).
absl::Status CommitCheckpoint(Storage& storage, const std::string& tmp_dir,
                              const std::string& final_dir, const v1::Manifest& manifest);

// Steps of the committed checkpoints in `job_dir`, ascending. A job directory that does not
// exist has none. Errors: I/O errors listing `job_dir` (storage/storage.h).
absl::StatusOr<std::vector<int64_t>> ListCheckpoints(Storage& storage, const std::string& job_dir);

// The newest committed step in `job_dir`.
// Errors: NotFound + CHECKPOINT_NOT_FOUND if there is none; as ListCheckpoints.
absl::StatusOr<int64_t> LatestStep(Storage& storage, const std::string& job_dir);

// What CollectGarbage did.
struct GcReport {
  // Names (relative to the job directory) removed, in the order they were removed.
  std::vector<std::string> removed;
  // Names that should have been removed but could not be, with the error.
  std::vector<std::pair<std::string, absl::Status>> failed;
};

// Removes committed checkpoints older than the newest `keep_last_k`, and every temporary
// directory except those of session `protect_session_id` (the session in flight; empty
// protects none). One failed removal does not stop the others; see GcReport.failed.
// Errors: InvalidArgument if keep_last_k < 1 (the latest checkpoint is never collected);
// I/O errors listing `job_dir`. A job directory that does not exist has nothing to collect.
absl::StatusOr<GcReport> CollectGarbage(Storage& storage, const std::string& job_dir,
                                        int keep_last_k, absl::string_view protect_session_id);

}  // namespace tessera

#endif  // TESSERA_FORMAT_COMMIT_H_
