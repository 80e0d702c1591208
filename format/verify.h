// VerifyCheckpoint: an offline, read-everything check of a checkpoint directory, for
// `tessera verify` and for tests. It trusts nothing it did not check:
//
//   1. the manifest reads and validates (format/manifest_io.h ReadManifest);
//   2. every tensor's chunks tile its global shape exactly: no two chunks share an element
//      (a sweep along the axis with the most distinct chunk offsets) and their volumes sum to
//      the tensor's (so, being disjoint and inside the shape, they cover it); a gap is
//      reported with a missing region when the chunk grid is small enough to locate one;
//   3. every data file exists and is long enough for its chunks;
//   4. its safetensors header parses, passes the checks a safetensors reader makes
//      (format/data_file.h ValidateSafetensorsLayout), and has for every chunk an entry
//      "<key>@<offsets>" whose dtype, shape and data_offsets agree with the manifest
//      (data start + data_offsets.begin == ChunkEntry.offset);
//   5. every block checksum of every chunk matches (reads every chunk byte once).
//
// Problems are collected, not returned as the first error, so one run lists everything wrong.
//
// Thread-safety: a free function; it reads files on options.parallelism threads.
#ifndef TESSERA_FORMAT_VERIFY_H_
#define TESSERA_FORMAT_VERIFY_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "storage/storage.h"
#include "tessera/v1/types.pb.h"

namespace tessera {

enum class ProblemKind {
  kManifest,            // manifest missing, unparseable or malformed (nothing else is checked)
  kOverlappingChunks,   // two chunks of a tensor share elements
  kIncompleteCoverage,  // the chunks of a tensor leave elements uncovered
  kFileMissing,         // a data file named by the manifest does not exist
  kFileTooShort,        // a data file ends before a chunk's last byte
  kFileUnreadable,      // an I/O error other than the above
  kHeaderInvalid,       // the safetensors header does not parse or is inconsistent
  kHeaderMismatch,      // the header's entry for a chunk disagrees with the manifest
  kChecksumMismatch,    // a block's XXH3 differs from the manifest's
};

// "CHECKSUM_MISMATCH" style names, for output.
absl::string_view ProblemKindName(ProblemKind kind);

struct VerifyProblem {
  ProblemKind kind;
  // The structured code the same problem carries as an error elsewhere (e.g. the reader's
  // CHECKSUM_MISMATCH), or ERROR_CODE_UNSPECIFIED where there is none.
  v1::ErrorCode code = v1::ERROR_CODE_UNSPECIFIED;
  std::string tensor_key;  // empty if the problem is not about one tensor
  std::string chunk;       // the chunk's box, "[0:4, 0:8]"; empty if not about one chunk
  std::string file;        // data file name relative to the directory; empty if none
  std::string message;     // one sentence naming all of the above
};

struct VerifyReport {
  std::vector<VerifyProblem> problems;  // in a stable order: manifest, tensors, files
  uint64_t problems_dropped = 0;        // beyond VerifyOptions::max_problems
  uint64_t tensors = 0;  // the manifest's entries, per-rank extras included
  uint64_t extras = 0;   // of those, per-rank extras (SHARD_KIND_EXTRA: objects, RNG state)
  uint64_t chunks = 0;
  uint64_t files = 0;
  uint64_t bytes_verified = 0;          // chunk bytes whose checksums were checked

  bool ok() const { return problems.empty() && problems_dropped == 0; }
};

struct VerifyOptions {
  // Check block checksums (reads every chunk byte). Default: true.
  bool checksums = true;
  // Data files checked concurrently. Default: 4.
  int parallelism = 4;
  // Largest single read, rounded down to whole checksum blocks (at least one). Default: 64 MiB.
  uint64_t max_read_bytes = 64ull << 20;
  // Problems kept in the report; the rest are only counted. Default: 1000.
  size_t max_problems = 1000;
};

// Checks the checkpoint directory `dir` as described in the header comment. Never fails as a
// whole: everything wrong, including an unreadable manifest, is a problem in the report.
VerifyReport VerifyCheckpoint(Storage& storage, const std::string& dir,
                              const VerifyOptions& options = {});

}  // namespace tessera

#endif  // TESSERA_FORMAT_VERIFY_H_
