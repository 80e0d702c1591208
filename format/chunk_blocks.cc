#include "format/chunk_blocks.h"

#include "absl/strings/str_cat.h"
#include "common/box.h"
#include "common/checksum.h"
#include "common/status.h"

namespace tessera {
namespace format_internal {

std::optional<uint64_t> FindBadBlock(const v1::ChunkEntry& chunk, uint64_t first, uint64_t count,
                                     const char* data) {
  const uint64_t base = BlockBegin(chunk, first);
  for (uint64_t b = first; b < first + count; ++b) {
    const uint64_t begin = BlockBegin(chunk, b);
    if (Xxh3(data + (begin - base), BlockEnd(chunk, b) - begin) != chunk.block_xxh3(b)) return b;
  }
  return std::nullopt;
}

std::string DescribeChunk(const v1::TensorEntry& tensor, const v1::ChunkEntry& chunk) {
  return absl::StrCat("tensor \"", tensor.key(), "\" chunk ", BoxToString(BoxFromProto(chunk.box())),
                      " (file ", chunk.file(), ")");
}

absl::Status ChecksumMismatchError(const v1::TensorEntry& tensor, const v1::ChunkEntry& chunk,
                                   const std::string& path, uint64_t block) {
  v1::ErrorDetail detail;
  detail.set_code(v1::ERROR_CODE_CHECKSUM_MISMATCH);
  detail.add_fqns(tensor.key());
  if (!tensor.state_key().empty()) detail.set_state_key(tensor.state_key());
  *detail.mutable_region() = chunk.box();
  detail.set_path(path);
  detail.set_message(absl::StrCat(
      "checksum mismatch in ", DescribeChunk(tensor, chunk), ": block ", block, " (bytes ",
      chunk.offset() + BlockBegin(chunk, block), "..", chunk.offset() + BlockEnd(chunk, block),
      " of ", path, ") does not match the manifest; the checkpoint is corrupt"));
  return MakeError(absl::StatusCode::kDataLoss, detail);
}

absl::Status ReadChunkBytes(ReadableFile& file, const v1::TensorEntry& tensor,
                            const v1::ChunkEntry& chunk, uint64_t body_offset, char* out,
                            uint64_t size, ReadSharing sharing) {
  const uint64_t offset = chunk.offset() + body_offset;
  absl::Status s = sharing == ReadSharing::kShared ? file.ReadSharedAt(offset, out, size)
                                                   : file.ReadAt(offset, out, size);
  if (!absl::IsOutOfRange(s)) return s;
  v1::ErrorDetail detail;
  detail.set_code(v1::ERROR_CODE_IO_ERROR);
  detail.add_fqns(tensor.key());
  *detail.mutable_region() = chunk.box();
  detail.set_path(file.path());
  detail.set_message(absl::StrCat(file.path(), " is shorter than the manifest says: ",
                                  DescribeChunk(tensor, chunk), " ends at byte ",
                                  chunk.offset() + chunk.nbytes(), " (", s.message(), ")"));
  return MakeError(absl::StatusCode::kDataLoss, detail);
}

}  // namespace format_internal
}  // namespace tessera
