// CheckpointReader: loads regions of a committed checkpoint into caller memory, resharding on
// the way — the layout being loaded into need not be the one that saved (DESIGN.md "Load and
// resharding"). Used by the agent (loading into the trainer's shared-memory slots) and by the
// CLI (export).
//
// A request names a tensor key, the dtype and global shape the caller expects, a box of the
// tensor and optionally a flat range [begin, end) of that box flattened row-major (a
// distributed optimizer's slice); the destination receives exactly those elements, row-major,
// densely packed. For each request the reader intersects the box with every chunk of the
// tensor (common/box.h Intersect), maps the intersection to element runs in the chunk and in
// the request box (RowMajorRuns), pairs them up, clips them to the flat range and so obtains
// byte runs {chunk, offset in chunk, length, destination offset} (Plan).
//
// Reading (Read) touches only the checksum blocks the runs overlap: per chunk, overlapping
// blocks are grouped into spans of consecutive blocks, read with one ReadAt each (at most
// max_read_bytes), verified against the manifest's XXH3 of every block, and only then copied
// to the destination. A span that one run covers entirely is read straight into the
// destination (the common case: whole chunks, row slices); otherwise it goes through a
// page-aligned bounce buffer. `parallelism` threads serve the spans, so that many reads are in
// flight while a thread verifies what it has read. With PosixStorage, large reads bypass the
// page cache (storage/posix_storage.h: O_DIRECT); chunk bodies start 4 KiB-aligned in data
// files, so whole chunks and row slices land in page-aligned destinations (the agent's
// staging) with no copy at all. Cost of verifying: a run that covers part of a block still
// reads the whole block — up to 2 x block_size extra bytes per span (4 MiB blocks by
// default), which matters only for scattered small reads such as a narrow column slice of a
// row-major matrix, where each row touches its own block.
//
// Shared spans: a span holding bytes the request does not want is most likely read whole by
// another rank too — ranks resharding a row-major matrix by columns each read every block of
// it. Such a span is read with ReadSharedAt (PosixStorage: through the page cache, not
// O_DIRECT), so that the ranks of one machine read it from the device once: the second reader
// finds it cached, or waits on the first one's read of the page.
//
// Memory tier (DESIGN.md "Memory tier"): Read may be given copies of data files that are still
// resident in memory (an agent's staging of the last committed save). A span inside such a copy
// is copied from memory instead of read, then verified exactly as a read is — after the copy,
// so bytes that change under it are caught too; every block that does not match is read from
// the file and verified again. Memory is never trusted: a stale, reused or corrupted copy costs
// a read, never a wrong byte.
//
// In place (LocateInMemory): when every request is one contiguous byte run of a single
// resident copy — the same layout that saved it, loading it back — the reader verifies the
// blocks those runs touch where they lie, through the same spans and the same verify loop as a
// read, and returns where each request's bytes are in the copy, so that the caller can hand out
// the copy itself: no copy, no destination, no file opened.
//
// Destinations are host memory (or shared memory mapped by the caller); device copies are the
// caller's next step.
//
// Lifecycle: Open reads and validates the manifest once; the reader then serves any number of
// Plan/Read calls. Data files are opened per Read call. Thread-safety: all methods are const
// and may run concurrently; the Storage must outlive the reader.
#ifndef TESSERA_FORMAT_CHECKPOINT_READER_H_
#define TESSERA_FORMAT_CHECKPOINT_READER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/box.h"
#include "common/checksum.h"
#include "storage/posix_storage.h"
#include "storage/storage.h"
#include "tessera/v1/manifest.pb.h"
#include "tessera/v1/types.pb.h"

namespace tessera {

// One region to load.
struct ReadRequest {
  // Tensor key (common/tensor_key.h TensorKey): fqn, "<fqn>#<state_key>" or "<fqn>#rank<R>".
  std::string key;
  // What the caller expects; must match the checkpoint's.
  v1::DType dtype = v1::DTYPE_UNSPECIFIED;
  std::vector<int64_t> global_shape;
  // Region of the tensor, inside global_shape.
  Box box;
  // If set, only elements [begin, end) of `box` flattened row-major, 0 <= begin <= end <=
  // volume(box).
  std::optional<v1::FlatRange> flat_range;
  // Receives the elements: exactly (number of elements) x dtype size bytes.
  void* dest = nullptr;
  uint64_t dest_size = 0;
};

// A contiguous piece of one chunk's body that lands contiguously in a request's destination.
struct ByteRun {
  const v1::TensorEntry* tensor = nullptr;  // points into the reader's manifest
  const v1::ChunkEntry* chunk = nullptr;    // likewise
  uint64_t chunk_offset = 0;                // bytes from the start of the chunk body
  uint64_t length = 0;
  uint64_t dest_offset = 0;  // bytes from the start of the request's destination

  uint64_t file_offset() const { return chunk->offset() + chunk_offset; }
};

// How one request will be served.
struct RequestPlan {
  // True if the checkpoint records this optimizer state as absent (no rank had state when it
  // was saved). There are no runs and the destination is left untouched.
  bool state_absent = false;
  // Grouped by chunk (in manifest order); within a chunk, by increasing chunk_offset.
  // Together they fill the destination exactly once.
  std::vector<ByteRun> runs;
};

// Per-request outcome of Read and LocateInMemory.
struct ReadResult {
  bool state_absent = false;  // as RequestPlan::state_absent; the destination is untouched
  // LocateInMemory: where the request's bytes lie, from ResidentBytes::data (0 if none).
  uint64_t resident_offset = 0;
};

// What a Read did, for tests, metrics and benchmarks.
struct ReadStats {
  uint64_t bytes_read = 0;       // from data files, including whole blocks read for checksums
  // Of bytes_read: spans read whole of which the request wanted only part, read through the
  // storage's shared cache (ReadableFile::ReadSharedAt) for the ranks that want the rest.
  uint64_t bytes_read_shared = 0;
  uint64_t bytes_copied = 0;     // into destinations (direct reads included)
  uint64_t read_calls = 0;       // ReadAt calls
  uint64_t blocks_verified = 0;  // checksum blocks hashed (a rejected block counts once)
  // Memory tier: bytes taken from resident copies and verified (whole blocks, like
  // bytes_read), and blocks of resident copies that did not match and were read instead.
  uint64_t bytes_from_memory = 0;
  uint64_t memory_blocks_rejected = 0;

  // Adds `other`'s counts to these (a Read in several calls).
  ReadStats& operator+=(const ReadStats& other) {
    bytes_read += other.bytes_read;
    bytes_read_shared += other.bytes_read_shared;
    bytes_copied += other.bytes_copied;
    read_calls += other.read_calls;
    blocks_verified += other.blocks_verified;
    bytes_from_memory += other.bytes_from_memory;
    memory_blocks_rejected += other.memory_blocks_rejected;
    return *this;
  }
};

// Bytes [file_offset, file_offset + size) of a data file, resident in memory at `data`. The
// memory must stay mapped for the Read; its contents may change meanwhile (they are verified).
struct ResidentBytes {
  uint64_t file_offset = 0;
  const char* data = nullptr;
  uint64_t size = 0;
};

// Resident copies by data file name (ChunkEntry.file).
using ResidentFiles = absl::flat_hash_map<std::string, ResidentBytes>;

struct CheckpointReaderOptions {
  // Largest single ReadAt, rounded down to whole checksum blocks (at least one block). Large
  // enough for the device to stream (fio reaches full sequential bandwidth from 4 MiB
  // requests), small enough that `parallelism` reads stay in flight while a thread verifies
  // the span it has just read, and that the last span's checksum, verified after the I/O
  // ends, is short. Default: 8 MiB.
  uint64_t max_read_bytes = 8ull << 20;

  // Read windows served concurrently by one Read call: the reads in flight (each thread
  // holds one bounce buffer of up to max_read_bytes). Default: 4.
  int parallelism = 4;
};

class CheckpointReader {
 public:
  // Reads and validates dir/manifest.pb (format/manifest_io.h ReadManifest).
  // Errors: InvalidArgument if options are invalid (max_read_bytes or parallelism < 1);
  // as ReadManifest (NotFound + CHECKPOINT_NOT_FOUND, DataLoss).
  static absl::StatusOr<std::unique_ptr<CheckpointReader>> Open(
      Storage* storage, std::string dir, CheckpointReaderOptions options = {});

  // A memory-only checkpoint (DESIGN.md "Memory-only saves"): `manifest` as its coordinator
  // kept it, no storage, `name` in place of a directory (errors name it). Read serves only
  // from the resident copies it is given: a span in none fails NotFound + MEMORY_COPY_LOST
  // naming the tensor, chunk and file; a block that does not match fails DataLoss +
  // CHECKSUM_MISMATCH (there is no file to read it from instead).
  // Errors: InvalidArgument if options are invalid; DataLoss naming `name` and what is wrong
  // if ValidateManifest (format/manifest_io.h) rejects `manifest`: its offsets and sizes are
  // trusted only after that.
  static absl::StatusOr<std::unique_ptr<CheckpointReader>> FromManifest(
      v1::Manifest manifest, std::string name, CheckpointReaderOptions options = {});
  // False for a FromManifest reader.
  bool on_disk() const { return storage_ != nullptr; }

  const v1::Manifest& manifest() const { return manifest_; }
  // The directory of its data files (manifest_io.h DataDirOf: the checkpoint's own, or on an
  // object store its session's); the name given for a FromManifest reader.
  const std::string& dir() const { return dir_; }

  // The manifest entry of `key`, or nullptr.
  const v1::TensorEntry* FindTensor(absl::string_view key) const;

  // The byte runs that serve each request (one plan per request, in order). Reads nothing.
  // Errors: InvalidArgument naming the request's key if it is malformed (unknown dtype, box
  // not inside global_shape, bad flat range, dest_size not the element count x dtype size,
  // null dest with a non-zero size), if the key is not in the checkpoint, or (with
  // SHAPE_MISMATCH) if the checkpoint's dtype or global shape differs — one error naming every
  // such request (fqns: the first 64; the first 4 described in full); DataLoss +
  // INCOMPLETE_COVERAGE naming the key and a missing element if the chunks do not cover the
  // requested region, or if chunks overlap within it.
  absl::StatusOr<std::vector<RequestPlan>> Plan(absl::Span<const ReadRequest> requests) const;

  // Plans, reads, verifies and copies every request. `stats`, if given, is filled in. Spans
  // that `resident` (if given) holds whole are copied from memory instead of read.
  // Errors: as Plan; DataLoss + CHECKSUM_MISMATCH naming the tensor key, chunk box, file and
  // block; DataLoss + IO_ERROR naming the file if a data file is missing or shorter than the
  // manifest says; other I/O errors from the storage (storage/storage.h). On error,
  // destinations hold unspecified bytes (possibly unverified ones).
  absl::StatusOr<std::vector<ReadResult>> Read(absl::Span<const ReadRequest> requests,
                                               ReadStats* stats = nullptr,
                                               const ResidentFiles* resident = nullptr) const;

  // Memory tier, in place: where each request's bytes lie in `resident`, the copy of data
  // file `file` (ReadResult::resident_offset) — verified there, so that the caller may hand
  // out the copy itself instead of copying it. Served only if every request with bytes is one
  // contiguous byte run of `file` (its runs continue one another in the file in the
  // destination's order), the checksum blocks those runs touch are all inside `resident`, and
  // each matches the manifest: checked by reading `resident` where it lies, on `parallelism`
  // threads. Copies nothing, opens no file, ignores `dest` (it may be null; dest_size must
  // still be right). `stats`, if given, is filled in (bytes_from_memory: whole blocks
  // verified). The bytes are right as verified: the caller keeps `resident` mapped and
  // unwritten for as long as it hands it out.
  // With `unverified`, nothing is hashed: it receives every block those runs touch, once, by
  // increasing offset from ResidentBytes::data, with the manifest's XXH3 — for a reader that
  // checks them as it copies them out (client/verified_copy.h) or as it receives them from
  // the copy's holder (client/peer_fetch.h); bytes_from_memory counts each listed block once,
  // blocks_verified none. No byte of `resident` is read then: ResidentBytes::data may be null
  // (a copy not at hand, located by its file offset and size alone).
  // Errors: as Plan (bar the null destination); FailedPrecondition, naming the tensor or
  // chunk, if a request is not one contiguous run of `file`, a block it touches is not
  // resident, or (verifying here) a block does not match (counted in
  // stats->memory_blocks_rejected) — Read then serves the requests, taking bad blocks from the
  // file.
  absl::StatusOr<std::vector<ReadResult>> LocateInMemory(
      absl::Span<const ReadRequest> requests, absl::string_view file,
      const ResidentBytes& resident, ReadStats* stats = nullptr,
      std::vector<BlockCheck>* unverified = nullptr) const;

  // Every checksum block of data file `file` that lies whole in `resident`, once each, by
  // increasing offset from ResidentBytes::data, with the manifest's XXH3: what a load served
  // from `resident` in place may list for its trainer to check (LocateInMemory's
  // `unverified`), listed before any load, for a trainer that checks its agent's resident copy
  // ahead of loading it (client/resident_prefetch.h). Reads no byte: ResidentBytes::data may
  // be null.
  std::vector<BlockCheck> ResidentBlocks(absl::string_view file,
                                         const ResidentBytes& resident) const;

  // LocateInMemory, verifying, for a copy the caller may write (one it fetched from another
  // node and hands out only afterwards): a block that does not match is read from `file` over
  // it, checked again and counted (stats->memory_blocks_rejected, bytes_read; bytes_from_memory
  // counts the blocks that matched), instead of refusing the copy. So a copy with a few bad
  // blocks is still served in place, and is not fetched again to be copied. Verified on
  // `parallelism` threads; only if a block does not match, verified and repaired again on one
  // (two requests may share a block).
  // Errors: as LocateInMemory for the layout and for blocks not resident; for a memory-only
  // checkpoint (no file) a block that does not match is FailedPrecondition, as there; the
  // file's errors as Read's (DataLoss if it is missing, or if its block does not match
  // either).
  absl::StatusOr<std::vector<ReadResult>> RepairInMemory(absl::Span<const ReadRequest> requests,
                                                         absl::string_view file, char* data,
                                                         uint64_t file_offset, uint64_t size,
                                                         ReadStats* stats = nullptr) const;

  // The data files the requests' bytes lie in, sorted, each once: what a load reads, known
  // before its destinations are (it asks where copies of them are first). Pure: reads nothing.
  // Errors: as Plan (bar the null destination).
  absl::StatusOr<std::vector<std::string>> DataFiles(
      absl::Span<const ReadRequest> requests) const;

  // The data file that every request with bytes lies in as one contiguous byte run —
  // LocateInMemory's condition on the layout, checked before any byte is at hand (a load that
  // fetches the file from another agent first). Pure: reads nothing.
  // Errors: as Plan (bar the null destination); FailedPrecondition naming the tensor if a
  // request is not one contiguous run, or lies in another file than the first, or if no
  // request has bytes.
  absl::StatusOr<std::string> ContiguousFile(absl::Span<const ReadRequest> requests) const;

 private:
  // Where one request's bytes lie when they are one contiguous run of one file.
  struct FileRun {
    const std::string* file = nullptr;  // null: the request has no bytes
    uint64_t offset = 0;                // in the file
    uint64_t length = 0;
  };
  // Each request's FileRun, planned; FailedPrecondition naming the first request whose runs do
  // not continue one another in one file, or lie in another file than `file` (if given).
  absl::StatusOr<std::vector<FileRun>> ContiguousRuns(absl::Span<const ReadRequest> requests,
                                                      const std::vector<RequestPlan>& plans,
                                                      const std::string* file) const;

  CheckpointReader(Storage* storage, std::string dir, CheckpointReaderOptions options,
                   v1::Manifest manifest);

  // LocateInMemory and RepairInMemory: `writable` (resident.data, writable) repairs.
  absl::StatusOr<std::vector<ReadResult>> Locate(absl::Span<const ReadRequest> requests,
                                                 absl::string_view file,
                                                 const ResidentBytes& resident, char* writable,
                                                 ReadStats* stats,
                                                 std::vector<BlockCheck>* unverified) const;

  // Opens data file `name` of the checkpoint: DataLoss naming it if it is missing.
  absl::StatusOr<std::unique_ptr<ReadableFile>> OpenDataFile(const std::string& name) const;

  // Plan, checking that each request with bytes has a destination if `need_dest`.
  absl::StatusOr<std::vector<RequestPlan>> PlanAll(absl::Span<const ReadRequest> requests,
                                                   bool need_dest) const;
  absl::StatusOr<RequestPlan> PlanOne(const ReadRequest& request, bool need_dest) const;

  Storage* const storage_;
  const std::string dir_;
  const CheckpointReaderOptions options_;
  const v1::Manifest manifest_;
  // Index into manifest_.tensors() by key; chunk boxes converted once, parallel to it.
  absl::flat_hash_map<std::string, int> index_;
  std::vector<std::vector<Box>> chunk_boxes_;
};

}  // namespace tessera

#endif  // TESSERA_FORMAT_CHECKPOINT_READER_H_
