// ShardWriter: writes a rank's data file straight from staging and describes its chunks for
// the manifest.
//
// WriteFile() writes layout.header, then the data section from the staging buffer in large
// sequential writes, several in flight (O_DIRECT where the storage supports it: the header is copied to an
// aligned buffer, staging is page-aligned, and the layout makes every offset and the file
// size multiples of 4 KiB), fsyncs the file and its directory, and returns one ChunkEntry per
// layout item. Block checksums (XXH3 per block_size bytes) are computed from the staging
// bytes on a second thread while the main thread writes, so hashing is hidden behind I/O.
//
// Failure is never silent: any error returns a Status and no entries, and the partial file is
// removed (best effort) so it cannot be mistaken for a written one; every I/O error carries
// ErrorDetail IO_ERROR with the file's path (see storage/storage.h for the errno mapping, e.g.
// ENOSPC -> ResourceExhausted).
//
// Thread-safety: stateless; WriteFile may run concurrently for different files, on one
// Storage. The staging buffer must not change while it is being written.
#ifndef TESSERA_FORMAT_SHARD_WRITER_H_
#define TESSERA_FORMAT_SHARD_WRITER_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "format/data_file.h"
#include "storage/storage.h"
#include "common/checksum.h"
#include "tessera/v1/manifest.pb.h"

namespace tessera {

struct ShardWriterOptions {
  // Bytes per write call; rounded up to a multiple of 4 KiB. Default: 8 MiB.
  size_t write_size = 8u << 20;

  // Data-section writes in flight at once (1 to kMostWritesInFlight), each on its own thread,
  // started for the file, taking the next write_size piece in file order (O_DIRECT has no
  // page cache to queue in: the device sees this depth).
  // Default: 1 — on the reference VM's disk more in flight was slower (0.96 of plain
  // O_DIRECT writes at 1; 0.92, 0.88, 0.88 at 2, 4, 8: format/shard_writer_benchmark.cc).
  int writes_in_flight = 1;
  static constexpr int kMostWritesInFlight = 64;

  // Checksum block size recorded in each ChunkEntry. Default: kDefaultBlockSize (4 MiB).
  uint32_t block_size = kDefaultBlockSize;

  // Compute checksums on a second thread while writing. Default: true.
  bool overlap_checksums = true;

  // fsync the file and its directory before returning. Default: true (only benchmarks that
  // measure raw write speed turn it off).
  bool sync = true;

  // Recorded as ChunkEntry.writer_rank. Default: 0.
  uint32_t writer_rank = 0;

  // Errors: InvalidArgument naming what is out of range (a zero block_size or write_size,
  // writes_in_flight outside 1 .. kMostWritesInFlight). WriteFile checks it; so does the
  // agent at start, for its flags.
  absl::Status Check() const;
};

// What WriteFile wrote.
struct WrittenFile {
  std::string path;                    // dir/file_name
  uint64_t bytes = 0;                  // file size
  std::vector<v1::ChunkEntry> chunks;  // one per layout item, in layout order
};

// One file for WriteFiles.
struct FileWrite {
  std::string dir;
  std::string file_name;
  const FileLayout* layout = nullptr;
  const void* staging = nullptr;  // layout->data_size bytes
};

class ShardWriter {
 public:
  // Writes `layout` with the data section taken from `staging` (layout.data_size bytes, laid
  // out as the data section, padding zeroed: ZeroPadding) to dir/file_name, replacing any
  // file of that name. `dir` must exist.
  // Errors: InvalidArgument if `file_name` is empty, ".", "..", or contains '/' or NUL, or
  // the options are invalid; FailedPrecondition if staging's padding is not zero (the file
  // would hold garbage a reader cannot verify); I/O errors from `storage` with IO_ERROR and
  // the path (ResourceExhausted for ENOSPC, FailedPrecondition for a read-only file system,
  // DataLoss for EIO, ...).
  static absl::StatusOr<WrittenFile> WriteFile(Storage& storage, const std::string& dir,
                                               const std::string& file_name,
                                               const FileLayout& layout, const void* staging,
                                               const ShardWriterOptions& options = {});

  // What WriteFile would return as chunks, computed from `staging` alone: nothing is written
  // (a memory-only save, DESIGN.md "Memory-only saves"). Checksums on this thread.
  // Errors: InvalidArgument and FailedPrecondition as WriteFile's (no I/O errors).
  static absl::StatusOr<std::vector<v1::ChunkEntry>> Describe(
      const std::string& file_name, const FileLayout& layout, const void* staging,
      const ShardWriterOptions& options = {});

  // Writes several files, at most `parallelism` at a time (>= 1), each as WriteFile.
  // Returns one result per input, in order; one file failing does not stop the others.
  static std::vector<absl::StatusOr<WrittenFile>> WriteFiles(
      Storage& storage, absl::Span<const FileWrite> files, int parallelism,
      const ShardWriterOptions& options = {});
};

}  // namespace tessera

#endif  // TESSERA_FORMAT_SHARD_WRITER_H_
