// Internal to format/: block arithmetic and checksum checks of chunk bodies, and the errors
// they produce, shared by the checkpoint reader and the verifier so both name a corrupt block
// the same way.
//
// A chunk body of nbytes bytes is checksummed in blocks of block_size bytes (the last one may
// be short): block b covers body bytes [b * block_size, min((b + 1) * block_size, nbytes)).
// Callers pass chunks of a validated manifest (format/manifest_io.h), so block_size > 0 and
// the number of checksums matches.
//
// Thread-safety: free functions.
#ifndef TESSERA_FORMAT_CHUNK_BLOCKS_H_
#define TESSERA_FORMAT_CHUNK_BLOCKS_H_

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "storage/storage.h"
#include "tessera/v1/manifest.pb.h"

namespace tessera {
namespace format_internal {

inline uint64_t BlockCount(const v1::ChunkEntry& chunk) {
  return static_cast<uint64_t>(chunk.block_xxh3_size());
}
inline uint64_t BlockBegin(const v1::ChunkEntry& chunk, uint64_t block) {
  return block * chunk.block_size();
}
inline uint64_t BlockEnd(const v1::ChunkEntry& chunk, uint64_t block) {
  return std::min<uint64_t>((block + 1) * chunk.block_size(), chunk.nbytes());
}

// The first block of [first, first + count) whose XXH3 differs from the manifest's, or
// nullopt if all match. `data` holds body bytes [BlockBegin(first), BlockEnd(first + count - 1)).
std::optional<uint64_t> FindBadBlock(const v1::ChunkEntry& chunk, uint64_t first, uint64_t count,
                                     const char* data);

// "tensor \"k\" chunk [0:4, 0:8] (file data-0.safetensors)" for messages.
std::string DescribeChunk(const v1::TensorEntry& tensor, const v1::ChunkEntry& chunk);

// DataLoss + CHECKSUM_MISMATCH naming the tensor key (ErrorDetail.fqns), the chunk box
// (ErrorDetail.region), the file (ErrorDetail.path) and the block index.
absl::Status ChecksumMismatchError(const v1::TensorEntry& tensor, const v1::ChunkEntry& chunk,
                                   const std::string& path, uint64_t block);

// Whether a read's bytes are this reader's alone, or likely to be read by another reader of
// the file too (ReadableFile::ReadSharedAt).
enum class ReadSharing { kPrivate, kShared };

// file->ReadAt (ReadSharedAt if `sharing` is kShared), with a file that ends too early
// reported as DataLoss + IO_ERROR naming the path and the chunk (the manifest promised those
// bytes) instead of ReadAt's OutOfRange.
absl::Status ReadChunkBytes(ReadableFile& file, const v1::TensorEntry& tensor,
                            const v1::ChunkEntry& chunk, uint64_t body_offset, char* out,
                            uint64_t size, ReadSharing sharing = ReadSharing::kPrivate);

}  // namespace format_internal
}  // namespace tessera

#endif  // TESSERA_FORMAT_CHUNK_BLOCKS_H_
