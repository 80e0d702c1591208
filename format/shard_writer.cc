#include "format/shard_writer.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status.h"
#include "tessera/v1/types.pb.h"

namespace tessera {
namespace {

// A heap buffer aligned for O_DIRECT.
struct AlignedFree {
  void operator()(void* p) const { free(p); }
};
using AlignedBuffer = std::unique_ptr<char, AlignedFree>;

AlignedBuffer AllocateAligned(size_t size) {
  void* p = nullptr;
  if (posix_memalign(&p, kDirectIoAlignment, std::max<size_t>(size, 1)) != 0) return nullptr;
  return AlignedBuffer(static_cast<char*>(p));
}

absl::Status ValidateFileName(const std::string& name) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
      name.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("data file name \"", name, "\" is not a plain file name"));
  }
  return absl::OkStatus();
}

// Makes sure an error from a Storage implementation carries IO_ERROR and the path, whatever
// the implementation put in it.
absl::Status EnsureIoError(const absl::Status& status, const std::string& path) {
  std::optional<v1::ErrorDetail> detail = GetErrorDetail(status);
  if (detail.has_value() && detail->code() == v1::ERROR_CODE_IO_ERROR && !detail->path().empty()) {
    return status;
  }
  v1::ErrorDetail fixed = detail.value_or(v1::ErrorDetail());
  fixed.set_code(v1::ERROR_CODE_IO_ERROR);
  if (fixed.path().empty()) fixed.set_path(path);
  fixed.set_message(std::string(status.message()));
  return MakeError(status.code(), fixed);
}

// Per-item block checksums of the staging bytes; stops early when `cancel` is set.
void ComputeChecksums(const FileLayout& layout, const char* staging, uint32_t block_size,
                      const std::atomic<bool>& cancel, std::vector<std::vector<uint64_t>>* sums) {
  for (size_t i = 0; i < layout.items.size(); ++i) {
    const FileLayoutItem& item = layout.items[i];
    std::vector<uint64_t>& out = (*sums)[i];
    out.reserve((item.nbytes + block_size - 1) / block_size);
    for (uint64_t off = 0; off < item.nbytes; off += block_size) {
      if (cancel.load(std::memory_order_relaxed)) return;
      out.push_back(Xxh3(staging + item.staging_offset + off,
                         std::min<uint64_t>(block_size, item.nbytes - off)));
    }
  }
}

// One ChunkEntry per layout item of `file_name`, with its block checksums `sums`.
std::vector<v1::ChunkEntry> DescribeChunks(const FileLayout& layout, const std::string& file_name,
                                           const std::vector<std::vector<uint64_t>>& sums,
                                           const ShardWriterOptions& options) {
  std::vector<v1::ChunkEntry> chunks;
  chunks.reserve(layout.items.size());
  for (size_t i = 0; i < layout.items.size(); ++i) {
    const FileLayoutItem& item = layout.items[i];
    v1::ChunkEntry& entry = chunks.emplace_back();
    *entry.mutable_box() = item.box;
    entry.set_file(file_name);
    entry.set_offset(item.file_offset);
    entry.set_nbytes(item.nbytes);
    entry.set_block_size(options.block_size);
    for (uint64_t sum : sums[i]) entry.add_block_xxh3(sum);
    entry.set_writer_rank(options.writer_rank);
  }
  return chunks;
}

// The staging a file's chunks are read from: present if there is data, its padding zero.
// `name` names the file in the error.
absl::Status CheckStaging(const FileLayout& layout, const char* data, const std::string& name) {
  if (data == nullptr && layout.data_size > 0) {
    return absl::InvalidArgumentError("no staging buffer for a non-empty data section");
  }
  if (data != nullptr && !PaddingIsZero(layout, data)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "staging for ", name, " has non-zero padding bytes (call ZeroPadding when staging)"));
  }
  return absl::OkStatus();
}

// Writes the data section in write_size pieces, writes_in_flight at once: each thread takes
// the next piece in file order until none is left or a write failed; the first failure (in
// time) is returned.
absl::Status WriteDataSection(WritableFile& file, const FileLayout& layout, const char* staging,
                              const ShardWriterOptions& options) {
  const uint64_t step = (options.write_size + kDirectIoAlignment - 1) / kDirectIoAlignment *
                        kDirectIoAlignment;
  const uint64_t pieces = (layout.data_size + step - 1) / step;
  std::atomic<uint64_t> next{0};
  std::atomic<bool> failed{false};
  absl::Mutex mu;
  absl::Status first_error;
  auto writer = [&] {
    for (uint64_t i = next.fetch_add(1); i < pieces && !failed.load(std::memory_order_relaxed);
         i = next.fetch_add(1)) {
      const uint64_t off = i * step;
      const uint64_t n = std::min<uint64_t>(step, layout.data_size - off);
      absl::Status written = file.WriteAt(layout.data_start + off, staging + off, n);
      if (!written.ok()) {
        absl::MutexLock lock(&mu);
        if (first_error.ok()) first_error = std::move(written);
        failed.store(true, std::memory_order_relaxed);
        return;
      }
    }
  };
  const uint64_t threads =
      std::min<uint64_t>(pieces, static_cast<uint64_t>(std::max(options.writes_in_flight, 1)));
  std::vector<std::thread> others;
  for (uint64_t t = 1; t < threads; ++t) others.emplace_back(writer);
  writer();
  for (std::thread& t : others) t.join();
  absl::MutexLock lock(&mu);
  return first_error;
}

// Writes header and data section, syncs and closes. The file is closed on return.
absl::Status WriteBytes(Storage& storage, const std::string& dir, const std::string& path,
                        const FileLayout& layout, const char* staging,
                        const ShardWriterOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, storage.OpenForWrite(path));
  {
    // Staging is page-aligned; the header string is not. Copying it (a few KiB) keeps the
    // whole file on the O_DIRECT path.
    AlignedBuffer header = AllocateAligned(layout.data_start);
    if (header == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot allocate ", layout.data_start, " bytes for the header of ", path));
    }
    memcpy(header.get(), layout.header.data(), layout.data_start);
    RETURN_IF_ERROR(file->WriteAt(0, header.get(), layout.data_start));
  }
  RETURN_IF_ERROR(WriteDataSection(*file, layout, staging, options));
  if (options.sync) RETURN_IF_ERROR(file->Sync());
  RETURN_IF_ERROR(file->Close());
  if (options.sync) RETURN_IF_ERROR(storage.SyncDir(dir));
  // A storage that dropped or added bytes without an error must not pass as written.
  ASSIGN_OR_RETURN(uint64_t size, storage.FileSize(path));
  if (size != layout.file_size()) {
    v1::ErrorDetail detail;
    detail.set_code(v1::ERROR_CODE_IO_ERROR);
    detail.set_path(path);
    detail.set_message(absl::StrCat("wrote ", path, " but it holds ", size, " bytes, not ",
                                    layout.file_size()));
    return MakeError(absl::StatusCode::kDataLoss, detail);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ShardWriterOptions::Check() const {
  if (block_size == 0 || write_size == 0) {
    return absl::InvalidArgumentError("block_size and write_size must be positive");
  }
  if (writes_in_flight < 1 || writes_in_flight > kMostWritesInFlight) {
    return absl::InvalidArgumentError(absl::StrCat("writes_in_flight is ", writes_in_flight,
                                                   ": it must be 1 to ", kMostWritesInFlight));
  }
  return absl::OkStatus();
}

absl::StatusOr<WrittenFile> ShardWriter::WriteFile(Storage& storage, const std::string& dir,
                                                   const std::string& file_name,
                                                   const FileLayout& layout,
                                                   const void* staging,
                                                   const ShardWriterOptions& options) {
  RETURN_IF_ERROR(ValidateFileName(file_name));
  RETURN_IF_ERROR(options.Check());
  if (layout.header.size() != layout.data_start || layout.data_start % kDataAlignment != 0) {
    return absl::InvalidArgumentError("the layout's header does not match its data_start");
  }
  const char* data = static_cast<const char*>(staging);
  const std::string path = JoinPath(dir, file_name);
  RETURN_IF_ERROR(CheckStaging(layout, data, path));

  std::vector<std::vector<uint64_t>> sums(layout.items.size());
  std::atomic<bool> cancel{false};
  std::thread hasher;
  if (options.overlap_checksums && !layout.items.empty()) {
    hasher = std::thread(ComputeChecksums, std::cref(layout), data, options.block_size,
                         std::cref(cancel), &sums);
  } else {
    ComputeChecksums(layout, data, options.block_size, cancel, &sums);
  }
  absl::Status status = WriteBytes(storage, dir, path, layout, data, options);
  if (hasher.joinable()) {
    if (!status.ok()) cancel.store(true, std::memory_order_relaxed);
    hasher.join();
  }
  if (!status.ok()) {
    // Best effort: free the space (it may be ENOSPC) and leave nothing that looks written.
    (void)storage.RemoveTree(path);
    return EnsureIoError(status, path);
  }

  WrittenFile written;
  written.path = path;
  written.bytes = layout.file_size();
  written.chunks = DescribeChunks(layout, file_name, sums, options);
  return written;
}

absl::StatusOr<std::vector<v1::ChunkEntry>> ShardWriter::Describe(
    const std::string& file_name, const FileLayout& layout, const void* staging,
    const ShardWriterOptions& options) {
  RETURN_IF_ERROR(ValidateFileName(file_name));
  if (options.block_size == 0) return absl::InvalidArgumentError("block_size must be positive");
  const char* data = static_cast<const char*>(staging);
  RETURN_IF_ERROR(CheckStaging(layout, data, file_name));
  std::vector<std::vector<uint64_t>> sums(layout.items.size());
  std::atomic<bool> cancel{false};
  ComputeChecksums(layout, data, options.block_size, cancel, &sums);
  return DescribeChunks(layout, file_name, sums, options);
}

std::vector<absl::StatusOr<WrittenFile>> ShardWriter::WriteFiles(
    Storage& storage, absl::Span<const FileWrite> files, int parallelism,
    const ShardWriterOptions& options) {
  std::vector<absl::StatusOr<WrittenFile>> results(
      files.size(), absl::StatusOr<WrittenFile>(absl::InternalError("not written")));
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i = next.fetch_add(1); i < files.size(); i = next.fetch_add(1)) {
      const FileWrite& f = files[i];
      if (f.layout == nullptr) {
        results[i] = absl::InvalidArgumentError(absl::StrCat("file ", i, " has no layout"));
        continue;
      }
      results[i] = WriteFile(storage, f.dir, f.file_name, *f.layout, f.staging, options);
    }
  };
  const size_t threads =
      std::min<size_t>(files.size(), static_cast<size_t>(std::max(parallelism, 1)));
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (std::thread& t : pool) t.join();
  return results;
}

}  // namespace tessera
