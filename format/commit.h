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
// temporary directory (their entries) and, after the rename, the job directory and the storage
// root (the job directory's own entry: the first commit of a job creates it).
//
// The commit edge (DESIGN.md "Save protocol"): a session that reached COMMITTING ends
// COMMITTED, or ABORTED only once its directory is provably out of the committed namespace.
// ResolveCommit decides which from the disk, never from a timer.
//
// Retention removes only names Tessera makes: the committed step directories it is told to
// retire, and temporary directories ("step-N.tmp-<session>") of steps that cannot be in flight.
// Anything else in the job directory — other files, "step-N" without a manifest, non-canonical
// spellings — is left alone. A committed step is removed by first renaming it to a temporary
// name (so it stops being "committed" atomically and a crash mid-removal leaves an orphan the
// next retention removes), then deleting the tree.
//
// On an object store (Storage::publication() kCreateManifest; decision 0041) there is no
// rename. The writers' directory stays where it is and holds the data for good; the commit
// creates <job_dir>/step-NNNNNNNNN/manifest.pb only if it is absent (If-None-Match: *), then
// writes manifest.json beside it. "Committed" means exactly: that manifest.pb exists. The
// rules are the same — the data files are checked first; the commit is idempotent (the
// manifest there names this session: OK) and exclusive (another session's: STEP_EXISTS); a
// roll back establishes the manifest's absence — and a reader finds the data through
// DataDirOf (format/manifest_io.h). Retention deletes a retired checkpoint's manifest first,
// then its session's directory; it never removes a directory a committed manifest names.
// Nothing needs an fsync there: a PUT is durable when it is answered.
//
// Thread-safety: free functions; safe to call concurrently (all decisions are re-checked
// against the storage, and renames and conditional creates are atomic).
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
// fsyncing the parents again, in case the previous attempt died before it).
// Errors: InvalidArgument if `manifest` fails ValidateManifest or the directory names do not
// match it; FailedPrecondition + STEP_EXISTS if final_dir holds a checkpoint of another
// session, an unreadable manifest, or is a non-empty directory without a manifest;
// FailedPrecondition + IO_ERROR naming the file if a data file is missing or shorter than its
// chunks; NotFound + IO_ERROR if tmp_dir does not exist (and the session did not commit);
// other I/O errors from `storage` (storage/storage.h). After an error nothing was renamed,
// unless the error is a parent's fsync (the checkpoint may then be committed but not yet
// durable; retrying the commit makes it so).
absl::Status CommitCheckpoint(Storage& storage, const std::string& tmp_dir,
                              const std::string& final_dir, const v1::Manifest& manifest);

// What became of a session's checkpoint directory.
enum class CommitOutcome {
  // final_dir holds this session's manifest; the rename and the parents are fsynced.
  kCommitted,
  // The session's directory is provably not under final_dir, durably: the commit was refused
  // for good (final_dir holds another session's checkpoint; the data files or the temporary
  // directory are gone; the manifest or the names are invalid), or it was rolled back (it
  // never got there).
  kRolledBack,
  // Neither could be established: an I/O error. Nothing is decided; retry.
  kUnresolved,
};

struct CommitResolution {
  CommitOutcome outcome = CommitOutcome::kUnresolved;
  // kRolledBack: why the checkpoint is not committed. kUnresolved: the error to retry after.
  // OK for kCommitted.
  absl::Status status;
};

// Resolves a session's commit from the disk: commits it (CommitCheckpoint) and says whether
// it is committed. With `roll_back_unless_committed` (the session's COMMITTING deadline has
// passed), a commit that does not complete is rolled back instead: the parent is fsynced so
// that the directory's absence under final_dir is durable. A directory that is under
// final_dir with this session's manifest is never rolled back, whatever is asked: its commit
// is done but for a parent's fsync, and an earlier call may have answered kCommitted (a
// committer reported it, applied retention; readers took it as `latest`). While that fsync
// fails the answer is kUnresolved; once it works, kCommitted. Idempotent: safe to call again
// after any outcome, by another committer, and after a crash; a kCommitted or kRolledBack
// answer is final for the session (a later call gives the same outcome unless someone else
// changes the directory). A session ends COMMITTED only on kCommitted and ABORTED only on
// kRolledBack.
CommitResolution ResolveCommit(Storage& storage, const std::string& tmp_dir,
                               const std::string& final_dir, const v1::Manifest& manifest,
                               bool roll_back_unless_committed);

// Steps of the committed checkpoints in `job_dir`, ascending. A job directory that does not
// exist has none; a step directory without a manifest is not one. Errors: I/O errors listing
// `job_dir` or looking up a manifest (an unreadable checkpoint is not an absent one).
absl::StatusOr<std::vector<int64_t>> ListCheckpoints(Storage& storage, const std::string& job_dir);

// The newest committed step in `job_dir`.
// Errors: NotFound + CHECKPOINT_NOT_FOUND if there is none; as ListCheckpoints.
absl::StatusOr<int64_t> LatestStep(Storage& storage, const std::string& job_dir);

// What ApplyRetention did.
struct RetentionReport {
  // Names (relative to the job directory) removed, in the order they were removed.
  std::vector<std::string> removed;
  // Names that should have been removed but could not be, with the error.
  std::vector<std::pair<std::string, absl::Status>> failed;
};

// Retention after the commit of `committed_step`: removes the committed checkpoints of
// `retire_steps` (the coordinator dropped their records), and the temporary directories of
// steps not newer than `committed_step` — aborted or crashed sessions, interrupted removals.
// No session of such a step can be in flight: a job saves one step at a time, and the
// coordinator refuses a step that is not newer than its latest. Temporary directories of newer
// steps are left alone, as are checkpoints not named and names Tessera does not make. One
// failed removal does not stop the others; see RetentionReport.failed.
// Errors: InvalidArgument if `retire_steps` names `committed_step` (the newest checkpoint is
// never retired); I/O errors listing `job_dir`. A job directory that does not exist has
// nothing to remove.
absl::StatusOr<RetentionReport> ApplyRetention(Storage& storage, const std::string& job_dir,
                                               const std::vector<int64_t>& retire_steps,
                                               int64_t committed_step);

}  // namespace tessera

#endif  // TESSERA_FORMAT_COMMIT_H_
