// The offline commands of the `tessera` CLI, which work on a checkpoint directory without a
// coordinator: verify, inspect and export. Each prints to the injected streams (a human
// report by default, one JSON document with `json`) and returns the process exit code
// (client/cli/exit_codes.h).
//
// Thread-safety: free functions; the Storage must be thread-safe (verify and export read on
// several threads).
#ifndef TESSERA_CLIENT_CLI_OFFLINE_COMMANDS_H_
#define TESSERA_CLIENT_CLI_OFFLINE_COMMANDS_H_

#include <cstddef>
#include <ostream>
#include <string>

#include "storage/storage.h"
#include "client/cli/export.h"
#include "format/verify.h"

namespace tessera {
namespace cli {

struct VerifyCommandOptions {
  // Print the report as JSON. Default: false.
  bool json = false;
  // Problems printed in the human report (the JSON lists all the report kept). Default: 20.
  size_t max_listed = 20;
  // Passed to VerifyCheckpoint. Default: VerifyOptions defaults (checksums on).
  VerifyOptions verify;
};

// `tessera verify DIR`: runs VerifyCheckpoint (format/verify.h) and prints
// "OK: N tensors, M chunks, B bytes verified" or the problems, each naming the tensor, chunk
// and file. Returns kExitOk if the checkpoint verified; kExitFailed if it has problems;
// kExitError if `dir` is not a readable directory.
int VerifyCommand(Storage& storage, const std::string& dir, const VerifyCommandOptions& options,
                  std::ostream& out, std::ostream& err);

struct InspectCommandOptions {
  // Print JSON. Default: false.
  bool json = false;
  // Also list every chunk (box, file, offset, bytes, writer rank). Default: false.
  bool chunks = false;
};

// `tessera inspect DIR`: the manifest summary (job, step, session, layout, committed time,
// totals), one row per tensor (key, kind, dtype, shape, chunks, bytes) and per data file
// (chunks, chunk bytes, size on disk or "missing"). Checks nothing beyond what ReadManifest
// validates; that is verify's job. Returns kExitOk, or kExitError if the manifest cannot be
// read (the message says why).
int InspectCommand(Storage& storage, const std::string& dir, const InspectCommandOptions& options,
                   std::ostream& out, std::ostream& err);

// `tessera export DIR --consolidate --out FILE`: ExportConsolidated (client/cli/export.h),
// then what was written and what was left out (extras, absent optimizer state, optimizer
// state excluded by the filter), saying why. Returns kExitOk, or kExitError if the export
// failed (nothing is left at `out_path`).
int ExportCommand(Storage& storage, const std::string& dir, const std::string& out_path,
                  const ExportOptions& options, bool json, std::ostream& out, std::ostream& err);

}  // namespace cli
}  // namespace tessera

#endif  // TESSERA_CLIENT_CLI_OFFLINE_COMMANDS_H_
