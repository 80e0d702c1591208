// ExportConsolidated: turns a Tessera checkpoint directory into one plain safetensors file
// holding every tensor whole, for tools that know nothing of Tessera's chunks (`tessera
// export --consolidate`).
//
// Output format (https://github.com/huggingface/safetensors "Format"): 8-byte little-endian
// header length N, N bytes of JSON (padded with spaces so the data starts 8-byte aligned),
// then the tensors' bytes back to back with no gaps and no padding entries. Each tensor is
// named by its tensor key (the fqn for parameters, "<fqn>#<state_key>" for optimizer state),
// typed with its safetensors dtype and shaped by its global shape. "__metadata__" holds
// {"format": "pt", "tessera_job", "tessera_step", "tessera_session"}. Tensors are ordered by
// element size, largest first, then in manifest order, so each starts aligned to its element
// size (what the reference writer does too).
//
// Memory: each tensor is read through CheckpointReader (checksums verified, resharding from
// whatever chunks it was saved in) in pieces of at most ExportOptions::max_buffer_bytes and
// written at its place in the file; one buffer is reused, so memory stays bounded whatever
// the model size.
//
// Extras (per-rank opaque bytes) are never exported, nor optimizer state recorded as absent;
// present optimizer state is exported only with ExportFilter::kAll. The report lists what was
// left out, so the CLI can say so.
//
// The file is written under a temporary name next to `out_path`, fsynced and renamed into
// place, so `out_path` is either the complete export or untouched.
//
// Thread-safety: a free function; concurrent exports to different paths are safe.
#ifndef TESSERA_CLIENT_CLI_EXPORT_H_
#define TESSERA_CLIENT_CLI_EXPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "storage/storage.h"
#include "format/checkpoint_reader.h"

namespace tessera {
namespace cli {

enum class ExportFilter {
  kParams,  // parameters only
  kAll,     // parameters and (present) optimizer state
};

// "params" -> kParams, "all" -> kAll. Errors: InvalidArgument naming the value and the
// accepted ones.
absl::StatusOr<ExportFilter> ParseExportFilter(absl::string_view name);

struct ExportOptions {
  // Which tensors to export. Default: parameters only.
  ExportFilter filter = ExportFilter::kParams;
  // Largest piece of a tensor held in memory at once (rounded down to whole elements, at
  // least one). Default: 256 MiB.
  uint64_t max_buffer_bytes = 256ull << 20;
  // How the checkpoint is read. Default: CheckpointReaderOptions defaults.
  CheckpointReaderOptions reader;
};

struct ExportReport {
  std::string out_path;
  uint64_t tensors = 0;     // tensors written
  uint64_t data_bytes = 0;  // their bytes
  uint64_t file_bytes = 0;  // size of the written file
  // Tensor keys left out, by reason, in manifest order.
  std::vector<std::string> skipped_extras;
  std::vector<std::string> skipped_absent_optimizer;  // recorded as absent: nothing to export
  std::vector<std::string> skipped_optimizer;         // present, but the filter is kParams
};

// Exports the checkpoint in `checkpoint_dir` to `out_path` as described above.
// Errors: InvalidArgument if max_buffer_bytes is 0 or the reader options are invalid; as
// CheckpointReader::Open (NotFound + CHECKPOINT_NOT_FOUND if there is no manifest, DataLoss
// if it is malformed) and Read (DataLoss + CHECKSUM_MISMATCH / INCOMPLETE_COVERAGE naming the
// tensor, IO_ERROR for missing data files); storage errors writing `out_path` (NotFound if
// its directory does not exist, ResourceExhausted when the disk is full). On error nothing
// is left at `out_path` that was not there before, and the temporary file is removed (best
// effort).
absl::StatusOr<ExportReport> ExportConsolidated(Storage& storage, const std::string& checkpoint_dir,
                                                const std::string& out_path,
                                                const ExportOptions& options = {});

}  // namespace cli
}  // namespace tessera

#endif  // TESSERA_CLIENT_CLI_EXPORT_H_
