// Reading, writing and validating a checkpoint's manifest (proto/tessera/v1/manifest.proto).
//
// A checkpoint directory holds `manifest.pb` (the serialized tessera.v1.Manifest, which is
// authoritative) and `manifest.json` (the same message as pretty-printed proto3 JSON with the
// .proto field names, for people and scripts; never read back by Tessera). Each is written to
// a unique temporary name in the directory, fsynced and renamed into place, and the directory
// is fsynced last, so a reader sees either no manifest or a complete one. manifest.json is
// written first: whoever sees manifest.pb also finds manifest.json.
//
// ValidateManifest is the single definition of a well-formed manifest: CommitCheckpoint
// refuses to commit anything it rejects, and ReadManifest refuses to return it, so a reader
// can trust every offset, size and box it is given without re-checking. It checks each
// entry on its own (O(chunks)); whether a tensor's chunks tile its shape is VerifyCheckpoint's
// job (format/verify.h), and the reader checks coverage of what it reads.
//
// Thread-safety: free functions; concurrent WriteManifest calls on one directory are safe
// (unique temporary names, atomic renames; the last rename wins).
#ifndef TESSERA_FORMAT_MANIFEST_IO_H_
#define TESSERA_FORMAT_MANIFEST_IO_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "storage/storage.h"
#include "tessera/v1/manifest.pb.h"

namespace tessera {

inline constexpr absl::string_view kManifestFileName = "manifest.pb";
inline constexpr absl::string_view kManifestJsonFileName = "manifest.json";
inline constexpr uint32_t kManifestFormatVersion = 1;

// True if `name` can name a data file inside a checkpoint directory: non-empty, at most 255
// bytes, no '/', no NUL, not "." or "..", and not one of the manifest's own names. Manifest
// file names are never joined onto a path without this check.
bool IsPlainFileName(absl::string_view name);

// OK if `manifest` is well formed:
//   - format_version is kManifestFormatVersion; job_id is a valid job id (common/ids.h);
//     step >= 0; session_id is non-empty;
//   - tensor keys are unique and each equals TensorKey(kind, fqn, state_key, rank), with
//     fqn (and an optimizer entry's state_key) valid names (common/tensor_key.h) and kind set;
//   - dtype is known; global_shape has non-negative dims whose element count fits int64;
//   - state_absent only on optimizer entries, which then have no chunks;
//   - every chunk's box has the tensor's rank and lies inside global_shape; its file is a
//     plain file name; nbytes = box volume x dtype size; offset + nbytes does not overflow;
//     block_size > 0 when nbytes > 0 and block_xxh3 holds ceil(nbytes / block_size) sums;
//   - total_bytes is the sum of chunk nbytes.
// Errors: InvalidArgument naming the first offending tensor key and chunk box.
absl::Status ValidateManifest(const v1::Manifest& manifest);

// `manifest` as pretty-printed JSON (what manifest.json holds).
// Errors: Internal if protobuf's JSON printer fails (it does not for valid messages).
absl::StatusOr<std::string> ManifestToJson(const v1::Manifest& manifest);

// Writes dir/manifest.json and dir/manifest.pb atomically (temporary name, fsync, rename) and
// fsyncs `dir`. Does not validate: CommitCheckpoint validates before it calls this, and tests
// write malformed manifests on purpose.
// Errors: NotFound if `dir` does not exist; I/O errors from `storage` with IO_ERROR and the
// path (storage/storage.h); Internal if JSON conversion fails. On error no temporary file is
// left behind (best effort) and an existing manifest is either untouched or fully replaced.
absl::Status WriteManifest(Storage& storage, const std::string& dir,
                           const v1::Manifest& manifest);

// Reads and validates dir/manifest.pb.
// Errors: NotFound + CHECKPOINT_NOT_FOUND with the path if there is no manifest (or no `dir`);
// DataLoss with the path if it does not parse or ValidateManifest rejects it (the message
// says why); other I/O errors from `storage` with IO_ERROR and the path.
absl::StatusOr<v1::Manifest> ReadManifest(Storage& storage, const std::string& dir);

// Where the data files of the checkpoint whose manifest `manifest` was read from `dir` are:
// `dir` itself where checkpoints are published by renaming the session's directory; on an
// object store, the session's directory beside it, TmpDirName(step, session_id), which the
// manifest names by its step and session and where the data stays (decision 0041). Every
// reader of a checkpoint's data files asks this. Errors: none.
std::string DataDirOf(const Storage& storage, const std::string& dir,
                      const v1::Manifest& manifest);

}  // namespace tessera

#endif  // TESSERA_FORMAT_MANIFEST_IO_H_
