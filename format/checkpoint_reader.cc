#include "format/checkpoint_reader.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/dtype.h"
#include "common/status.h"
#include "format/chunk_blocks.h"
#include "format/manifest_io.h"

namespace tessera {
namespace {

using format_internal::BlockBegin;
using format_internal::BlockCount;
using format_internal::BlockEnd;
using format_internal::FindBadBlock;
using format_internal::ReadChunkBytes;
using format_internal::ReadSharing;

absl::Status BadRequest(const ReadRequest& request, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("read request for tensor \"", request.key, "\": ", what));
}

std::string ShapeString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Absolute coordinates of element `flat` of `box` flattened row-major.
std::vector<int64_t> Unflatten(const Box& box, int64_t flat) {
  std::vector<int64_t> point(box.rank());
  for (size_t d = box.rank(); d-- > 0;) {
    const int64_t len = std::max<int64_t>(box.lengths[d], 1);
    point[d] = box.offsets[d] + flat % len;
    flat /= len;
  }
  return point;
}

// DataLoss + INCOMPLETE_COVERAGE for element `flat` of the request's box.
absl::Status CoverageError(const std::string& dir, const ReadRequest& request, int64_t flat,
                           absl::string_view problem) {
  const std::vector<int64_t> point = Unflatten(request.box, flat);
  v1::ErrorDetail detail;
  detail.set_code(v1::ERROR_CODE_INCOMPLETE_COVERAGE);
  detail.add_fqns(request.key);
  detail.set_path(dir);
  Box single{point, std::vector<int64_t>(point.size(), 1)};
  *detail.mutable_region() = BoxToProto(single);
  detail.set_message(absl::StrCat("checkpoint ", dir, " cannot serve tensor \"", request.key,
                                  "\" box ", BoxToString(request.box), ": element ",
                                  ShapeString(point), " ", problem));
  return MakeError(absl::StatusCode::kDataLoss, detail);
}

// Accumulated across threads of one Read.
struct AtomicStats {
  std::atomic<uint64_t> bytes_read{0};
  std::atomic<uint64_t> bytes_read_shared{0};
  std::atomic<uint64_t> bytes_copied{0};
  std::atomic<uint64_t> read_calls{0};
  std::atomic<uint64_t> blocks_verified{0};
  std::atomic<uint64_t> bytes_from_memory{0};
  std::atomic<uint64_t> memory_blocks_rejected{0};

  ReadStats Snapshot() const {
    ReadStats out;
    out.bytes_read = bytes_read.load();
    out.bytes_read_shared = bytes_read_shared.load();
    out.bytes_copied = bytes_copied.load();
    out.read_calls = read_calls.load();
    out.blocks_verified = blocks_verified.load();
    out.bytes_from_memory = bytes_from_memory.load();
    out.memory_blocks_rejected = memory_blocks_rejected.load();
    return out;
  }
};

// Runs of one request and one chunk that fall into one read window of the chunk.
struct WorkItem {
  char* dest;
  std::vector<ByteRun> runs;  // by increasing chunk_offset, all within one window
};

// Sorts `blocks` by offset and drops repeats (blocks listed twice, from two requests or two
// entries touching one chunk).
void SortByOffsetOnce(std::vector<BlockCheck>& blocks) {
  std::sort(blocks.begin(), blocks.end(),
            [](const BlockCheck& a, const BlockCheck& b) { return a.offset < b.offset; });
  blocks.erase(std::unique(blocks.begin(), blocks.end(),
                           [](const BlockCheck& a, const BlockCheck& b) {
                             return a.offset == b.offset;
                           }),
               blocks.end());
}

// Where chunk body bytes [begin, end) lie in `resident` (may be null), from its first byte, or
// nullopt if it does not hold all of them. Reads no byte: ResidentBytes::data may be null.
std::optional<uint64_t> ResidentOffset(const ResidentBytes* resident, const v1::ChunkEntry& chunk,
                                       uint64_t begin, uint64_t end) {
  if (resident == nullptr) return std::nullopt;
  const uint64_t from = chunk.offset() + begin;
  if (from < resident->file_offset ||
      from + (end - begin) > resident->file_offset + resident->size) {
    return std::nullopt;
  }
  return from - resident->file_offset;
}

// The resident copy of chunk body bytes [begin, end), or nullptr if `resident` (may be null)
// does not hold all of them.
const char* ResidentAt(const ResidentBytes* resident, const v1::ChunkEntry& chunk, uint64_t begin,
                       uint64_t end) {
  const std::optional<uint64_t> at = ResidentOffset(resident, chunk, begin, end);
  return at.has_value() ? resident->data + *at : nullptr;
}

// Where one work item's bytes come from: its chunk's data file, and the file's resident copy
// if there is one.
struct Source {
  ReadableFile* file = nullptr;  // null for a memory-only checkpoint: it has no file
  const ResidentBytes* resident = nullptr;
  std::string path;  // the file's, or what errors name for a memory-only checkpoint's
};

// A memory-only checkpoint's bytes [begin, end) of `chunk` that no memory copy holds.
absl::Status NotInMemoryError(const v1::TensorEntry& tensor, const v1::ChunkEntry& chunk,
                              uint64_t begin, uint64_t end) {
  return MakeError(absl::StatusCode::kNotFound, v1::ERROR_CODE_MEMORY_COPY_LOST,
                   absl::StrCat(format_internal::DescribeChunk(tensor, chunk), ": body bytes [",
                                begin, ", ", end, ") of ", chunk.file(),
                                " are in no memory copy, and the checkpoint is memory-only: "
                                "there is no file to read them from"));
}

// A reusable scratch buffer, uninitialized, aligned for O_DIRECT (storage/posix_storage.h) so spans
// read through it still bypass the page cache without a second bounce in the storage.
class Bounce {
 public:
  // nullptr if memory is exhausted.
  char* Get(uint64_t size) {
    if (size > capacity_) {
      data_.reset();
      capacity_ = 0;
      void* mem = nullptr;
      if (posix_memalign(&mem, kDirectIoAlignment, size) != 0) return nullptr;
      data_.reset(static_cast<char*>(mem));
      capacity_ = size;
    }
    return data_.get();
  }

 private:
  struct Free {
    void operator()(char* p) const { free(p); }
  };
  std::unique_ptr<char, Free> data_;
  uint64_t capacity_ = 0;
};

// Walks one work item's runs (one chunk, by increasing chunk_offset) in spans of consecutive
// checksum blocks: a span runs from the block of the first byte not yet served through the
// last block of every following run that starts in or right after the blocks so far. Calls
// serve(r, pos, first_block, last_block) for each span, where `pos` is the span's first byte
// not yet served and run r holds it; stops at serve's first error. Reads and in-place
// verification both walk this way, so they touch the same blocks.
template <typename Serve>
absl::Status ForEachSpan(const std::vector<ByteRun>& runs, Serve&& serve) {
  const v1::ChunkEntry& chunk = *runs.front().chunk;
  const uint64_t bs = chunk.block_size();
  auto run_end = [&](size_t q) { return runs[q].chunk_offset + runs[q].length; };
  size_t r = 0;
  uint64_t pos = runs[0].chunk_offset;  // first byte of run r not yet served
  while (r < runs.size()) {
    if (pos >= run_end(r)) {
      if (++r < runs.size()) pos = std::max(pos, runs[r].chunk_offset);
      continue;
    }
    const uint64_t first_block = pos / bs;
    uint64_t last_block = (run_end(r) - 1) / bs;
    for (size_t q = r + 1; q < runs.size() && runs[q].chunk_offset / bs <= last_block + 1; ++q) {
      last_block = std::max(last_block, (run_end(q) - 1) / bs);
    }
    RETURN_IF_ERROR(serve(r, pos, first_block, last_block));
    pos = BlockEnd(chunk, last_block);
  }
  return absl::OkStatus();
}

// Verifies blocks [first, last] of `chunk`, whose body bytes from BlockBegin(first) are at
// `data`, against the manifest's XXH3. For each block that does not match calls
// on_bad(block), which returns OK once it has put good bytes in the block's place, and stops
// at its first error. The one verify loop of the reader: reads and in-place verification
// both check through it.
template <typename OnBad>
absl::Status VerifySpan(const v1::ChunkEntry& chunk, uint64_t first, uint64_t last,
                        const char* data, OnBad&& on_bad) {
  const uint64_t begin = BlockBegin(chunk, first);
  for (uint64_t b = first; b <= last;) {
    const std::optional<uint64_t> bad =
        FindBadBlock(chunk, b, last - b + 1, data + (BlockBegin(chunk, b) - begin));
    if (!bad) break;
    RETURN_IF_ERROR(on_bad(*bad));
    b = *bad + 1;
  }
  return absl::OkStatus();
}

// A resident block that does not match: block `bad` of `chunk` read from `file` into
// `block_target` (its place in the copy being served), checked, and counted as read instead.
absl::Status ReplaceResidentBlock(ReadableFile& file, const std::string& path,
                                  const v1::TensorEntry& tensor, const v1::ChunkEntry& chunk,
                                  uint64_t bad, char* block_target, AtomicStats& stats) {
  const uint64_t block_begin = BlockBegin(chunk, bad);
  const uint64_t block_size = BlockEnd(chunk, bad) - block_begin;
  RETURN_IF_ERROR(ReadChunkBytes(file, tensor, chunk, block_begin, block_target, block_size));
  stats.read_calls.fetch_add(1, std::memory_order_relaxed);
  stats.bytes_read.fetch_add(block_size, std::memory_order_relaxed);
  stats.bytes_from_memory.fetch_sub(block_size, std::memory_order_relaxed);
  stats.memory_blocks_rejected.fetch_add(1, std::memory_order_relaxed);
  if (FindBadBlock(chunk, bad, 1, block_target)) {
    return format_internal::ChecksumMismatchError(tensor, chunk, path, bad);
  }
  return absl::OkStatus();
}

// Whether runs[r..] leave some of the chunk body's bytes [begin, end) unwanted: a span read
// whole for its checksums of which this request needs only part, the rest most likely another
// rank's (a column slice of a row-major tensor, or a flat range's edge).
bool SpanHasOthersBytes(const std::vector<ByteRun>& runs, size_t r, uint64_t begin,
                        uint64_t end) {
  uint64_t wanted = 0;
  for (size_t q = r; q < runs.size() && runs[q].chunk_offset < end; ++q) {
    const uint64_t from = std::max(runs[q].chunk_offset, begin);
    const uint64_t to = std::min(runs[q].chunk_offset + runs[q].length, end);
    if (from < to) wanted += to - from;
  }
  return wanted < end - begin;
}

// Reads, verifies and copies one work item: every block its runs touch, span by span.
absl::Status ServeWorkItem(const WorkItem& item, const Source& source, Bounce& bounce,
                           AtomicStats& stats) {
  ReadableFile* const file = source.file;
  const std::string& path = source.path;
  const std::vector<ByteRun>& runs = item.runs;
  const v1::TensorEntry& tensor = *runs.front().tensor;
  const v1::ChunkEntry& chunk = *runs.front().chunk;
  auto run_end = [&](size_t q) { return runs[q].chunk_offset + runs[q].length; };

  return ForEachSpan(
      runs, [&](size_t r, uint64_t pos, uint64_t first_block, uint64_t last_block) -> absl::Status {
        const uint64_t begin = BlockBegin(chunk, first_block);
        const uint64_t end = BlockEnd(chunk, last_block);
        // One run covering the whole span: read in place, no copy.
        const bool direct = pos == begin && run_end(r) >= end;
        char* target = direct ? item.dest + runs[r].dest_offset + (begin - runs[r].chunk_offset)
                              : bounce.Get(end - begin);
        if (target == nullptr) {
          return absl::ResourceExhaustedError(
              absl::StrCat("no memory for a ", end - begin, "-byte read buffer (", path, ")"));
        }
        // Fill the span from memory if it is resident there, else from the file; then verify
        // what landed (memory may change under us, so the copy is what is checked).
        const char* memory = ResidentAt(source.resident, chunk, begin, end);
        if (memory != nullptr) {
          memcpy(target, memory, end - begin);
          stats.bytes_from_memory.fetch_add(end - begin, std::memory_order_relaxed);
        } else if (file == nullptr) {
          return NotInMemoryError(tensor, chunk, begin, end);
        } else {
          // Bytes another rank reads too go through the storage's shared cache, so that the
          // machine reads them from the device once.
          const bool shared = !direct && SpanHasOthersBytes(runs, r, begin, end);
          RETURN_IF_ERROR(ReadChunkBytes(*file, tensor, chunk, begin, target, end - begin,
                                         shared ? ReadSharing::kShared : ReadSharing::kPrivate));
          stats.read_calls.fetch_add(1, std::memory_order_relaxed);
          stats.bytes_read.fetch_add(end - begin, std::memory_order_relaxed);
          if (shared) stats.bytes_read_shared.fetch_add(end - begin, std::memory_order_relaxed);
        }
        RETURN_IF_ERROR(
            VerifySpan(chunk, first_block, last_block, target, [&](uint64_t bad) -> absl::Status {
              if (memory == nullptr || file == nullptr) {
                // Read from the file and wrong, or in memory and wrong with no file behind it.
                return format_internal::ChecksumMismatchError(tensor, chunk, path, bad);
              }
              // A resident block that does not match: this block from the file instead.
              return ReplaceResidentBlock(*file, path, tensor, chunk, bad,
                                          target + (BlockBegin(chunk, bad) - begin), stats);
            }));
        stats.blocks_verified.fetch_add(last_block - first_block + 1, std::memory_order_relaxed);

        if (direct) {
          stats.bytes_copied.fetch_add(end - begin, std::memory_order_relaxed);
        } else {
          for (size_t q = r; q < runs.size() && runs[q].chunk_offset < end; ++q) {
            const uint64_t from = std::max(q == r ? pos : runs[q].chunk_offset, begin);
            const uint64_t to = std::min(run_end(q), end);
            if (from >= to) continue;
            memcpy(item.dest + runs[q].dest_offset + (from - runs[q].chunk_offset),
                   target + (from - begin), to - from);
            stats.bytes_copied.fetch_add(to - from, std::memory_order_relaxed);
          }
        }
        return absl::OkStatus();
      });
}

// What repairs a resident copy in place (RepairInMemory): the file to read bad blocks from,
// and the copy's bytes, writable.
struct Repair {
  ReadableFile* file;
  const std::string* path;
  char* data;  // = ResidentBytes::data
};

// Verifies one work item in place: every block its runs touch (the spans a read takes), where
// it lies in `resident`. Copies nothing and, unless `repair` reads a bad block from its file
// over the copy, reads no file.
// Errors: FailedPrecondition if a span is not resident whole or a block does not match (it
// is counted in memory_blocks_rejected) and there is no `repair`; ReplaceResidentBlock's.
absl::Status VerifyWorkItemInPlace(const WorkItem& item, const ResidentBytes& resident,
                                   AtomicStats& stats, std::vector<BlockCheck>* unverified,
                                   const Repair* repair = nullptr) {
  const v1::TensorEntry& tensor = *item.runs.front().tensor;
  const v1::ChunkEntry& chunk = *item.runs.front().chunk;
  return ForEachSpan(
      item.runs, [&](size_t, uint64_t, uint64_t first_block, uint64_t last_block) -> absl::Status {
        const uint64_t begin = BlockBegin(chunk, first_block);
        const uint64_t end = BlockEnd(chunk, last_block);
        const std::optional<uint64_t> offset = ResidentOffset(&resident, chunk, begin, end);
        if (!offset.has_value()) {
          return absl::FailedPreconditionError(
              absl::StrCat(format_internal::DescribeChunk(tensor, chunk), ": body bytes [", begin,
                           ", ", end, ") are not all resident"));
        }
        if (unverified != nullptr) {
          // Listing only: `resident.data` is not read (it may be null).
          for (uint64_t b = first_block; b <= last_block; ++b) {
            const uint64_t at = *offset + (BlockBegin(chunk, b) - begin);
            unverified->push_back(BlockCheck{at, BlockEnd(chunk, b) - BlockBegin(chunk, b),
                                             chunk.block_xxh3(static_cast<int>(b))});
          }
        } else {
          const char* memory = resident.data + *offset;
          stats.bytes_from_memory.fetch_add(end - begin, std::memory_order_relaxed);
          RETURN_IF_ERROR(VerifySpan(chunk, first_block, last_block, memory, [&](uint64_t bad) {
            if (repair != nullptr) {
              char* block = repair->data + *offset + (BlockBegin(chunk, bad) - begin);
              return ReplaceResidentBlock(*repair->file, *repair->path, tensor, chunk, bad, block,
                                          stats);
            }
            stats.memory_blocks_rejected.fetch_add(1, std::memory_order_relaxed);
            return absl::FailedPreconditionError(
                absl::StrCat(format_internal::DescribeChunk(tensor, chunk), ": block ", bad,
                             " does not match the manifest in memory"));
          }));
          stats.blocks_verified.fetch_add(last_block - first_block + 1, std::memory_order_relaxed);
          return absl::OkStatus();
        }
        stats.bytes_from_memory.fetch_add(end - begin, std::memory_order_relaxed);
        return absl::OkStatus();
      });
}

// Cuts the plans' runs into work items: one per request, chunk and read window
// (`max_read_bytes` rounded down to whole blocks), so that several threads serve a large
// chunk, each in large reads. Items point at the requests' destinations.
std::vector<WorkItem> CutWork(absl::Span<const ReadRequest> requests,
                              const std::vector<RequestPlan>& plans, uint64_t max_read_bytes) {
  std::vector<WorkItem> work;
  for (size_t i = 0; i < plans.size(); ++i) {
    char* dest = static_cast<char*>(requests[i].dest);
    const v1::ChunkEntry* current_chunk = nullptr;
    uint64_t current_window = 0;
    for (const ByteRun& run : plans[i].runs) {
      const uint64_t bs = run.chunk->block_size();
      const uint64_t window = std::max<uint64_t>(1, max_read_bytes / bs) * bs;
      for (uint64_t off = 0; off < run.length;) {
        const uint64_t at = run.chunk_offset + off;
        const uint64_t w = at / window;
        const uint64_t len = std::min(run.length - off, (w + 1) * window - at);
        if (work.empty() || run.chunk != current_chunk || w != current_window) {
          work.push_back(WorkItem{dest, {}});
          current_chunk = run.chunk;
          current_window = w;
        }
        work.back().runs.push_back(ByteRun{run.tensor, run.chunk, at, len, run.dest_offset + off});
        off += len;
      }
    }
  }
  return work;
}

// Runs serve(w, bounce) for every item w in [0, n) on up to `parallelism` threads, this one
// included, each with its own bounce buffer. Stops handing out items at the first error and
// returns it.
absl::Status ServeParallel(size_t n, int parallelism,
                           const std::function<absl::Status(size_t, Bounce&)>& serve) {
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  absl::Mutex mu;
  absl::Status first_error;
  auto worker = [&] {
    Bounce bounce;
    for (size_t w = next.fetch_add(1); w < n && !failed.load(); w = next.fetch_add(1)) {
      absl::Status s = serve(w, bounce);
      if (!s.ok()) {
        absl::MutexLock lock(&mu);
        if (first_error.ok()) first_error = s;
        failed.store(true);
      }
    }
  };
  const size_t threads = std::min<size_t>(n, static_cast<size_t>(parallelism));
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (std::thread& t : pool) t.join();
  return first_error;
}

}  // namespace

CheckpointReader::CheckpointReader(Storage* storage, std::string dir,
                                   CheckpointReaderOptions options, v1::Manifest manifest)
    : storage_(storage), dir_(std::move(dir)), options_(options), manifest_(std::move(manifest)) {
  index_.reserve(manifest_.tensors_size());
  chunk_boxes_.resize(manifest_.tensors_size());
  for (int t = 0; t < manifest_.tensors_size(); ++t) {
    const v1::TensorEntry& tensor = manifest_.tensors(t);
    index_.emplace(tensor.key(), t);
    chunk_boxes_[t].reserve(tensor.chunks_size());
    for (const v1::ChunkEntry& chunk : tensor.chunks()) {
      chunk_boxes_[t].push_back(BoxFromProto(chunk.box()));
    }
  }
}

absl::StatusOr<std::unique_ptr<CheckpointReader>> CheckpointReader::Open(
    Storage* storage, std::string dir, CheckpointReaderOptions options) {
  if (storage == nullptr) return absl::InvalidArgumentError("no storage");
  if (options.max_read_bytes < 1 || options.parallelism < 1) {
    return absl::InvalidArgumentError("max_read_bytes and parallelism must be at least 1");
  }
  ASSIGN_OR_RETURN(v1::Manifest manifest, ReadManifest(*storage, dir));
  std::string data_dir = DataDirOf(*storage, dir, manifest);
  return std::unique_ptr<CheckpointReader>(
      new CheckpointReader(storage, std::move(data_dir), options, std::move(manifest)));
}

absl::StatusOr<std::unique_ptr<CheckpointReader>> CheckpointReader::FromManifest(
    v1::Manifest manifest, std::string name, CheckpointReaderOptions options) {
  if (options.max_read_bytes < 1 || options.parallelism < 1) {
    return absl::InvalidArgumentError("max_read_bytes and parallelism must be at least 1");
  }
  // The manifest comes from the coordinator, not from storage: validated as ReadManifest
  // validates one, before the reader trusts an offset, size or block size in it.
  if (absl::Status s = ValidateManifest(manifest); !s.ok()) {
    return absl::DataLossError(absl::StrCat("the manifest of ", name, " is malformed: ",
                                            s.message()));
  }
  return std::unique_ptr<CheckpointReader>(
      new CheckpointReader(nullptr, std::move(name), options, std::move(manifest)));
}

const v1::TensorEntry* CheckpointReader::FindTensor(absl::string_view key) const {
  auto it = index_.find(key);
  return it == index_.end() ? nullptr : &manifest_.tensors(it->second);
}

absl::StatusOr<RequestPlan> CheckpointReader::PlanOne(const ReadRequest& request,
                                                      bool need_dest) const {
  if (!IsKnownDType(request.dtype)) return BadRequest(request, "dtype is unknown");
  if (absl::Status s = ValidateBoxInShape(request.box, request.global_shape); !s.ok()) {
    return BadRequest(request, absl::StrCat("box ", BoxToString(request.box), " is not inside ",
                                            ShapeString(request.global_shape), ": ", s.message()));
  }
  absl::StatusOr<int64_t> volume = Volume(request.box);
  if (!volume.ok()) return BadRequest(request, volume.status().message());
  int64_t begin = 0, end = *volume;
  if (request.flat_range.has_value()) {
    begin = request.flat_range->begin();
    end = request.flat_range->end();
    if (begin < 0 || begin > end || end > *volume) {
      return BadRequest(request, absl::StrCat("flat range [", begin, ", ", end,
                                              ") is not within the box's ", *volume, " elements"));
    }
  }
  const uint64_t esize = DTypeSize(request.dtype);
  unsigned __int128 need = static_cast<unsigned __int128>(end - begin) * esize;
  if (need != request.dest_size) {
    return BadRequest(
        request, absl::StrCat("destination holds ", request.dest_size, " bytes; the region needs ",
                              static_cast<uint64_t>(need)));
  }
  if (need_dest && need > 0 && request.dest == nullptr) {
    return BadRequest(request, "destination is null");
  }

  auto it = index_.find(request.key);
  if (it == index_.end()) {
    return BadRequest(request, absl::StrCat("no such tensor in checkpoint ", dir_));
  }
  const v1::TensorEntry& tensor = manifest_.tensors(it->second);
  const std::vector<Box>& boxes = chunk_boxes_[it->second];
  if (tensor.dtype() != request.dtype ||
      !std::equal(tensor.global_shape().begin(), tensor.global_shape().end(),
                  request.global_shape.begin(), request.global_shape.end())) {
    v1::ErrorDetail detail;
    detail.set_code(v1::ERROR_CODE_SHAPE_MISMATCH);
    detail.add_fqns(request.key);
    detail.set_message(absl::StrCat(
        "read request for tensor \"", request.key, "\" expects ", DTypeName(request.dtype), " ",
        ShapeString(request.global_shape), " but checkpoint ", dir_, " holds ",
        DTypeName(tensor.dtype()), " ", ShapeString(tensor.global_shape())));
    return MakeError(absl::StatusCode::kInvalidArgument, detail);
  }

  RequestPlan plan;
  plan.state_absent = tensor.state_absent();
  if (plan.state_absent || begin == end) return plan;

  for (int c = 0; c < tensor.chunks_size(); ++c) {
    std::optional<Box> common = Intersect(boxes[c], request.box);
    if (!common.has_value()) continue;
    ASSIGN_OR_RETURN(std::vector<ElementRun> src, RowMajorRuns(boxes[c], *common));
    ASSIGN_OR_RETURN(std::vector<ElementRun> dst, RowMajorRuns(request.box, *common));
    // Both lists walk `common` in row-major order but merge differently: split into pieces
    // contiguous in both, then clip each to the flat range.
    size_t i = 0, j = 0;
    int64_t si = 0, dj = 0;  // elements consumed of src[i] and dst[j]
    const size_t first_run = plan.runs.size();
    while (i < src.size() && j < dst.size()) {
      const int64_t n = std::min(src[i].count - si, dst[j].count - dj);
      const int64_t s = src[i].start + si;
      const int64_t d = dst[j].start + dj;
      if (d >= end) break;  // dst positions only grow
      const int64_t lo = std::max(d, begin);
      const int64_t hi = std::min(d + n, end);
      if (lo < hi) {
        const uint64_t chunk_offset = static_cast<uint64_t>(s + (lo - d)) * esize;
        const uint64_t dest_offset = static_cast<uint64_t>(lo - begin) * esize;
        const uint64_t length = static_cast<uint64_t>(hi - lo) * esize;
        ByteRun* last = plan.runs.size() > first_run ? &plan.runs.back() : nullptr;
        if (last != nullptr && last->chunk_offset + last->length == chunk_offset &&
            last->dest_offset + last->length == dest_offset) {
          last->length += length;
        } else {
          plan.runs.push_back(
              ByteRun{&tensor, &tensor.chunks(c), chunk_offset, length, dest_offset});
        }
      }
      si += n;
      dj += n;
      if (si == src[i].count) ++i, si = 0;
      if (dj == dst[j].count) ++j, dj = 0;
    }
  }

  // The runs must fill the destination exactly once.
  std::vector<std::pair<uint64_t, uint64_t>> spans;  // dest [begin, end)
  spans.reserve(plan.runs.size());
  for (const ByteRun& run : plan.runs) {
    spans.emplace_back(run.dest_offset, run.dest_offset + run.length);
  }
  std::sort(spans.begin(), spans.end());
  uint64_t filled = 0;
  for (const auto& [from, to] : spans) {
    if (from > filled) {
      return CoverageError(dir_, request, begin + static_cast<int64_t>(filled / esize),
                           "is in no chunk");
    }
    if (from < filled) {
      return CoverageError(dir_, request, begin + static_cast<int64_t>(from / esize),
                           "is in more than one chunk");
    }
    filled = to;
  }
  if (filled != request.dest_size) {
    return CoverageError(dir_, request, begin + static_cast<int64_t>(filled / esize),
                         "is in no chunk");
  }
  return plan;
}

absl::StatusOr<std::vector<RequestPlan>> CheckpointReader::Plan(
    absl::Span<const ReadRequest> requests) const {
  return PlanAll(requests, /*need_dest=*/true);
}

absl::StatusOr<std::vector<std::string>> CheckpointReader::DataFiles(
    absl::Span<const ReadRequest> requests) const {
  ASSIGN_OR_RETURN(std::vector<RequestPlan> plans, PlanAll(requests, /*need_dest=*/false));
  std::vector<std::string> files;
  for (const RequestPlan& plan : plans) {
    for (const ByteRun& run : plan.runs) files.push_back(run.chunk->file());
  }
  std::sort(files.begin(), files.end());
  files.erase(std::unique(files.begin(), files.end()), files.end());
  return files;
}

namespace {

// Of a load whose destinations differ from the checkpoint in several tensors, the whole list
// is what the user needs (a model built with another config differs in many): the first
// kMaxMismatchMessages said in full, the names of the first kMaxMismatchNames listed.
constexpr size_t kMaxMismatchMessages = 4;
constexpr size_t kMaxMismatchNames = 64;

// One SHAPE_MISMATCH error naming every mismatch of `details` (at least one).
absl::Status ShapeMismatches(const std::vector<v1::ErrorDetail>& details) {
  if (details.size() == 1) return ErrorFromDetail(details[0]);
  v1::ErrorDetail all;
  all.set_code(v1::ERROR_CODE_SHAPE_MISMATCH);
  std::vector<std::string> messages;
  for (size_t i = 0; i < details.size(); ++i) {
    if (i < kMaxMismatchNames) all.add_fqns(details[i].fqns(0));
    if (i < kMaxMismatchMessages) messages.push_back(details[i].message());
  }
  std::string message = absl::StrCat(details.size(), " tensors differ from the checkpoint in "
                                     "dtype or shape: ", absl::StrJoin(messages, "; "));
  if (details.size() > kMaxMismatchMessages) {
    std::vector<std::string> rest;
    for (size_t i = kMaxMismatchMessages; i < std::min(details.size(), kMaxMismatchNames); ++i) {
      rest.push_back(absl::StrCat("\"", details[i].fqns(0), "\""));
    }
    absl::StrAppend(&message, "; and ", absl::StrJoin(rest, ", "),
                    details.size() > kMaxMismatchNames
                        ? absl::StrCat(" and ", details.size() - kMaxMismatchNames, " more")
                        : "");
  }
  all.set_message(message);
  return ErrorFromDetail(all);
}

}  // namespace

absl::StatusOr<std::vector<RequestPlan>> CheckpointReader::PlanAll(
    absl::Span<const ReadRequest> requests, bool need_dest) const {
  std::vector<RequestPlan> plans;
  plans.reserve(requests.size());
  std::vector<v1::ErrorDetail> mismatches;
  for (const ReadRequest& request : requests) {
    absl::StatusOr<RequestPlan> plan = PlanOne(request, need_dest);
    if (!plan.ok()) {
      std::optional<v1::ErrorDetail> detail = GetErrorDetail(plan.status());
      if (detail.has_value() && detail->code() == v1::ERROR_CODE_SHAPE_MISMATCH &&
          detail->fqns_size() == 1) {
        mismatches.push_back(*std::move(detail));
        continue;
      }
      return plan.status();
    }
    plans.push_back(*std::move(plan));
  }
  if (!mismatches.empty()) return ShapeMismatches(mismatches);
  return plans;
}

absl::StatusOr<std::vector<ReadResult>> CheckpointReader::Read(
    absl::Span<const ReadRequest> requests, ReadStats* stats, const ResidentFiles* resident) const {
  ASSIGN_OR_RETURN(std::vector<RequestPlan> plans, PlanAll(requests, /*need_dest=*/true));
  std::vector<ReadResult> results(plans.size());
  for (size_t i = 0; i < plans.size(); ++i) results[i].state_absent = plans[i].state_absent;
  const std::vector<WorkItem> work = CutWork(requests, plans, options_.max_read_bytes);

  absl::flat_hash_map<std::string, std::unique_ptr<ReadableFile>> files;
  for (const WorkItem& item : work) files.try_emplace(item.runs.front().chunk->file());
  for (auto& [name, file] : files) {
    if (storage_ == nullptr) break;  // memory-only: no file to open
    ASSIGN_OR_RETURN(file, OpenDataFile(name));
  }

  AtomicStats counters;
  const absl::Status status =
      ServeParallel(work.size(), options_.parallelism, [&](size_t w, Bounce& bounce) {
        const std::string& name = work[w].runs.front().chunk->file();
        Source source{
            files.at(name).get(), nullptr,
            storage_ == nullptr ? absl::StrCat("the memory copy of ", name) : JoinPath(dir_, name)};
        if (resident != nullptr) {
          if (auto it = resident->find(name); it != resident->end()) source.resident = &it->second;
        }
        return ServeWorkItem(work[w], source, bounce, counters);
      });
  if (stats != nullptr) *stats = counters.Snapshot();
  RETURN_IF_ERROR(status);
  return results;
}

absl::StatusOr<std::unique_ptr<ReadableFile>> CheckpointReader::OpenDataFile(
    const std::string& name) const {
  const std::string path = JoinPath(dir_, name);
  absl::StatusOr<std::unique_ptr<ReadableFile>> opened = storage_->OpenForRead(path);
  if (absl::IsNotFound(opened.status())) {
    v1::ErrorDetail detail;
    detail.set_code(v1::ERROR_CODE_IO_ERROR);
    detail.set_path(path);
    detail.set_message(absl::StrCat("data file ", path, " named by the manifest is missing"));
    return MakeError(absl::StatusCode::kDataLoss, detail);
  }
  return opened;
}

absl::StatusOr<std::vector<CheckpointReader::FileRun>> CheckpointReader::ContiguousRuns(
    absl::Span<const ReadRequest> requests, const std::vector<RequestPlan>& plans,
    const std::string* file) const {
  // Each request's runs, in the destination's order, must continue one another in one file.
  std::vector<FileRun> located(plans.size());
  for (size_t i = 0; i < plans.size(); ++i) {
    const std::vector<ByteRun>& runs = plans[i].runs;
    if (runs.empty()) continue;
    const std::string& in = file != nullptr ? *file : runs.front().chunk->file();
    const uint64_t first = runs.front().file_offset();
    uint64_t length = 0;
    for (const ByteRun& run : runs) {
      if (run.chunk->file() != in || run.dest_offset != length ||
          run.file_offset() != first + length) {
        return absl::FailedPreconditionError(absl::StrCat(
            "tensor \"", requests[i].key, "\" is not one contiguous byte run of ", in));
      }
      length += run.length;
    }
    located[i] = FileRun{&in, first, length};
  }
  return located;
}

absl::StatusOr<std::string> CheckpointReader::ContiguousFile(
    absl::Span<const ReadRequest> requests) const {
  ASSIGN_OR_RETURN(std::vector<RequestPlan> plans, PlanAll(requests, /*need_dest=*/false));
  const std::string* file = nullptr;
  for (const RequestPlan& plan : plans) {
    if (!plan.runs.empty()) {
      file = &plan.runs.front().chunk->file();
      break;
    }
  }
  if (file == nullptr) return absl::FailedPreconditionError("no requested tensor has bytes");
  RETURN_IF_ERROR(ContiguousRuns(requests, plans, file).status());
  return *file;
}

std::vector<BlockCheck> CheckpointReader::ResidentBlocks(absl::string_view file,
                                                        const ResidentBytes& resident) const {
  std::vector<BlockCheck> blocks;
  for (const v1::TensorEntry& tensor : manifest_.tensors()) {
    for (const v1::ChunkEntry& chunk : tensor.chunks()) {
      if (chunk.file() != file) continue;
      for (uint64_t b = 0; b < BlockCount(chunk); ++b) {
        const uint64_t begin = BlockBegin(chunk, b);
        const uint64_t end = BlockEnd(chunk, b);
        const std::optional<uint64_t> at = ResidentOffset(&resident, chunk, begin, end);
        if (at.has_value()) {
          blocks.push_back(BlockCheck{*at, end - begin, chunk.block_xxh3(static_cast<int>(b))});
        }
      }
    }
  }
  // Chunks are in tensor order, not file order.
  SortByOffsetOnce(blocks);
  return blocks;
}

absl::StatusOr<std::vector<ReadResult>> CheckpointReader::LocateInMemory(
    absl::Span<const ReadRequest> requests, absl::string_view file, const ResidentBytes& resident,
    ReadStats* stats, std::vector<BlockCheck>* unverified) const {
  return Locate(requests, file, resident, /*writable=*/nullptr, stats, unverified);
}

absl::StatusOr<std::vector<ReadResult>> CheckpointReader::RepairInMemory(
    absl::Span<const ReadRequest> requests, absl::string_view file, char* data,
    uint64_t file_offset, uint64_t size, ReadStats* stats) const {
  return Locate(requests, file, ResidentBytes{file_offset, data, size}, data, stats, nullptr);
}

absl::StatusOr<std::vector<ReadResult>> CheckpointReader::Locate(
    absl::Span<const ReadRequest> requests, absl::string_view file, const ResidentBytes& resident,
    char* writable, ReadStats* stats, std::vector<BlockCheck>* unverified) const {
  ASSIGN_OR_RETURN(std::vector<RequestPlan> plans, PlanAll(requests, /*need_dest=*/false));
  const std::string file_name(file);
  ASSIGN_OR_RETURN(std::vector<FileRun> located, ContiguousRuns(requests, plans, &file_name));
  std::vector<ReadResult> results(plans.size());
  for (size_t i = 0; i < plans.size(); ++i) {
    results[i].state_absent = plans[i].state_absent;
    if (located[i].file == nullptr) continue;
    const uint64_t first = located[i].offset;
    const uint64_t length = located[i].length;
    if (first < resident.file_offset || first - resident.file_offset > resident.size ||
        length > resident.size - (first - resident.file_offset)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "tensor \"", requests[i].key, "\" lies outside the resident copy of ", file));
    }
    results[i].resident_offset = first - resident.file_offset;
  }
  const std::vector<WorkItem> work = CutWork(requests, plans, options_.max_read_bytes);
  AtomicStats counters;
  absl::Status status;
  if (unverified != nullptr) {
    // Listing reads no byte: one thread, then in region order, each block once (two requests
    // may touch one block).
    unverified->clear();
    for (size_t w = 0; w < work.size() && status.ok(); ++w) {
      status = VerifyWorkItemInPlace(work[w], resident, counters, unverified);
    }
    SortByOffsetOnce(*unverified);
    uint64_t listed = 0;
    for (const BlockCheck& block : *unverified) listed += block.length;
    counters.bytes_from_memory.store(listed);
  } else {
    status = ServeParallel(work.size(), options_.parallelism, [&](size_t w, Bounce&) {
      return VerifyWorkItemInPlace(work[w], resident, counters, nullptr);
    });
  }
  if (!status.ok() && writable != nullptr && storage_ != nullptr &&
      counters.memory_blocks_rejected.load() > 0) {
    // Repairing: again, on one thread (two work items may share a block, and a repair writes
    // it), reading each block that does not match from the data file over the copy.
    ASSIGN_OR_RETURN(std::unique_ptr<ReadableFile> data_file, OpenDataFile(file_name));
    const std::string path = JoinPath(dir_, file_name);
    const Repair repair{data_file.get(), &path, writable};
    AtomicStats repaired;
    status = absl::OkStatus();
    for (size_t w = 0; w < work.size() && status.ok(); ++w) {
      status = VerifyWorkItemInPlace(work[w], resident, repaired, nullptr, &repair);
    }
    if (stats != nullptr) *stats = repaired.Snapshot();
    RETURN_IF_ERROR(status);
    return results;
  }
  if (stats != nullptr) *stats = counters.Snapshot();
  RETURN_IF_ERROR(status);
  return results;
}

}  // namespace tessera
