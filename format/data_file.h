// Data-file layout: where each chunk of a rank's data file goes, and the file's safetensors
// header, computed before a byte is staged so the trainer copies each chunk straight to the
// place the writer will write it from.
//
// File format (safetensors, https://github.com/huggingface/safetensors "Format"):
//
//   [0, 8)                  N, the JSON header's length, unsigned 64-bit little-endian
//   [8, 8 + N)              JSON header, padded with spaces so 8 + N is a multiple of 4 KiB
//   [8 + N, file end)       data section; every chunk body starts 4 KiB-aligned within it
//
// The header maps each entry name to {"dtype", "shape", "data_offsets": [begin, end]} with
// offsets relative to the data section, plus "__metadata__": {"format": "tessera",
// "version": "1"}. Chunk entries are named ChunkName(key, box) ("<key>@<offsets>"), typed
// with DTypeName and shaped by the box's lengths. Safetensors readers require the entries'
// data_offsets to tile the data section without holes, so every alignment gap (before a
// chunk, and at the end up to the next 4 KiB) is declared as a U8 entry named
// "__tessera_pad_<i>__" holding zero bytes. Chunk names always contain '@', so they never
// collide with pad names or "__metadata__".
//
// The staging buffer for a file is laid out exactly as its data section: chunk i lives at
// staging offset items[i].staging_offset = items[i].file_offset - data_start, and the file
// is written straight from staging (format/shard_writer.h).
//
// Thread-safety: free functions, no shared state.
#ifndef TESSERA_FORMAT_DATA_FILE_H_
#define TESSERA_FORMAT_DATA_FILE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "tessera/v1/types.pb.h"

namespace tessera {

// Alignment of the data section's start in the file and of every chunk body within it.
inline constexpr uint64_t kDataAlignment = 4096;

// The safetensors library refuses headers longer than this (its MAX_HEADER_SIZE).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

// Values of "__metadata__".
inline constexpr absl::string_view kMetadataFormat = "tessera";
inline constexpr absl::string_view kMetadataVersion = "1";

// One chunk to lay out: the fields of a RankAssignment WriteItem (coordinator.proto) the
// layout needs. A separate struct so this library does not depend on the gRPC-generated
// coordinator target; ChunkSpecsFromWriteItems converts.
struct ChunkSpec {
  std::string key;  // tensor key
  v1::Box box;      // the chunk's region of the global tensor
  v1::DType dtype = v1::DTYPE_UNSPECIFIED;
  uint64_t nbytes = 0;
};

// ChunkSpecs of a sequence of v1::WriteItem (e.g. RankAssignment::writes()).
template <typename WriteItems>
std::vector<ChunkSpec> ChunkSpecsFromWriteItems(const WriteItems& items) {
  std::vector<ChunkSpec> specs;
  specs.reserve(items.size());
  for (const auto& item : items) {
    specs.push_back(ChunkSpec{item.key(), item.box(), item.dtype(), item.nbytes()});
  }
  return specs;
}

// One chunk's place in a data file.
struct FileLayoutItem {
  std::string key;         // ChunkSpec.key
  v1::Box box;             // ChunkSpec.box
  v1::DType dtype = v1::DTYPE_UNSPECIFIED;
  std::string name;        // safetensors entry name: ChunkName(key, box)
  uint64_t file_offset = 0;     // of the body; a multiple of kDataAlignment
  uint64_t staging_offset = 0;  // file_offset - data_start
  uint64_t nbytes = 0;
};

// A padding entry's bytes, as a range of the data section (= of staging).
struct PaddingRange {
  uint64_t staging_offset = 0;
  uint64_t nbytes = 0;
};

struct FileLayout {
  // The file's bytes [0, data_start): length prefix, JSON and padding spaces.
  std::string header;
  uint64_t data_start = 0;  // header.size(); a multiple of kDataAlignment
  uint64_t data_size = 0;   // the data section; a multiple of kDataAlignment
  std::vector<FileLayoutItem> items;  // in ChunkSpec order, which is also file order
  std::vector<PaddingRange> padding;  // in file order

  uint64_t file_size() const { return data_start + data_size; }
};

// Lays out `chunks` in order (RankAssignment.writes order).
// Errors: InvalidArgument + MALFORMED_SHARD naming the chunk if a dtype is unknown, a box's
// offsets and lengths differ in rank or are negative, nbytes is not the box's volume times
// the dtype size, a key is not valid UTF-8, or two items have the same chunk name;
// InvalidArgument + PLAN_TOO_LARGE if the header would exceed kMaxSafetensorsHeaderBytes.
absl::StatusOr<FileLayout> ComputeFileLayout(absl::Span<const ChunkSpec> chunks);

// Zeroes the padding entries' bytes in `staging` (layout.data_size bytes laid out as the data
// section). Called while preparing staging for a save: a reused region holds the previous
// save's bytes. Cheap: padding is under 4 KiB per chunk.
void ZeroPadding(const FileLayout& layout, void* staging);

// True if every padding byte of `staging` is zero.
bool PaddingIsZero(const FileLayout& layout, const void* staging);

// Appends `s` to `out` as a JSON string literal: quotes, with '"', '\\' and control
// characters (< 0x20, and 0x7f) escaped ("\u00XX"); other bytes are copied (the caller
// guarantees valid UTF-8).
void AppendJsonString(std::string* out, absl::string_view s);

// True if `s` is well-formed UTF-8 (no overlong forms, surrogates or code points above
// U+10FFFF).
bool IsValidUtf8(absl::string_view s);

// --- Reading ---------------------------------------------------------------------------------

struct SafetensorsEntry {
  std::string name;
  std::string dtype;             // as written, e.g. "BF16"
  std::vector<uint64_t> shape;
  uint64_t begin = 0;            // data_offsets, relative to the data section
  uint64_t end = 0;
};

struct SafetensorsHeader {
  uint64_t json_size = 0;   // N
  uint64_t data_start = 0;  // 8 + N
  std::vector<std::pair<std::string, std::string>> metadata;  // in header order
  std::vector<SafetensorsEntry> entries;                      // in header order
};

// N from the file's first 8 bytes (`prefix` may be longer).
// Errors: DataLoss if `prefix` is shorter than 8 bytes or N exceeds
// kMaxSafetensorsHeaderBytes.
absl::StatusOr<uint64_t> ParseSafetensorsHeaderSize(absl::string_view prefix);

// Parses a header from the start of a file: `bytes` must hold at least its first 8 + N bytes
// (more is ignored). A strict parser for the safetensors subset of JSON: one object whose
// values are entry objects with exactly "dtype" (string), "shape" (array of non-negative
// integers) and "data_offsets" (two non-negative integers, begin <= end), or, for
// "__metadata__", an object of strings; only whitespace may follow it. Never reads out of
// bounds, whatever the input. Errors: DataLoss saying what is wrong and at which byte
// (truncated input, invalid UTF-8, bad JSON, unknown or missing fields, duplicate names).
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view bytes);

// Checks what a safetensors reader checks before trusting offsets: every entry's dtype is
// known and its byte size (product of shape times dtype size) equals end - begin, and the
// entries tile [0, file_size - data_start) without holes or overlaps.
// Errors: DataLoss naming the first offending entry.
absl::Status ValidateSafetensorsLayout(const SafetensorsHeader& header, uint64_t file_size);

}  // namespace tessera

#endif  // TESSERA_FORMAT_DATA_FILE_H_
