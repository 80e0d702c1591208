#include "format/verify.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "format/data_file.h"
#include "common/box.h"
#include "common/dtype.h"
#include "common/status.h"
#include "common/tensor_key.h"
#include "format/chunk_blocks.h"
#include "format/manifest_io.h"
#include "tessera/v1/manifest.pb.h"

namespace tessera {
namespace {

using format_internal::BlockCount;
using format_internal::BlockEnd;
using format_internal::DescribeChunk;
using format_internal::FindBadBlock;

// Largest compressed grid FindMissingRegion builds to locate a gap.
constexpr uint64_t kMaxGridCells = 1u << 22;

// Problems of one unit of work, capped.
class Problems {
 public:
  explicit Problems(size_t cap) : cap_(cap) {}

  void Add(ProblemKind kind, v1::ErrorCode code, std::string key, std::string chunk,
           std::string file, std::string message) {
    if (list_.size() >= cap_) {
      ++dropped_;
      return;
    }
    list_.push_back(VerifyProblem{kind, code, std::move(key), std::move(chunk), std::move(file),
                                  std::move(message)});
  }
  void AddChunk(ProblemKind kind, v1::ErrorCode code, const v1::TensorEntry& tensor,
                const v1::ChunkEntry& chunk, std::string message) {
    Add(kind, code, tensor.key(), BoxToString(BoxFromProto(chunk.box())), chunk.file(),
        std::move(message));
  }

  void MergeInto(VerifyReport& report, size_t cap) {
    for (VerifyProblem& p : list_) {
      if (report.problems.size() < cap) {
        report.problems.push_back(std::move(p));
      } else {
        ++report.problems_dropped;
      }
    }
    report.problems_dropped += dropped_;
  }

 private:
  size_t cap_;
  std::vector<VerifyProblem> list_;
  uint64_t dropped_ = 0;
};

// Two nonempty boxes (indices into `boxes`) that share an element, or nullopt. Sweeps along
// the axis with the most distinct offsets and compares a box only with those still open
// there.
std::optional<std::pair<size_t, size_t>> FindOverlap(const std::vector<Box>& boxes,
                                                     const std::vector<size_t>& live) {
  if (live.size() < 2) return std::nullopt;
  const size_t rank = boxes[live[0]].rank();
  if (rank == 0) return std::make_pair(live[0], live[1]);  // two 0-d chunks: same element
  size_t axis = 0, best = 0;
  for (size_t d = 0; d < rank; ++d) {
    std::vector<int64_t> offsets;
    offsets.reserve(live.size());
    for (size_t i : live) offsets.push_back(boxes[i].offsets[d]);
    std::sort(offsets.begin(), offsets.end());
    const size_t distinct = std::unique(offsets.begin(), offsets.end()) - offsets.begin();
    if (distinct > best) best = distinct, axis = d;
  }
  std::vector<size_t> order = live;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return boxes[a].offsets[axis] < boxes[b].offsets[axis];
  });
  std::vector<size_t> open;
  for (size_t i : order) {
    const int64_t start = boxes[i].offsets[axis];
    open.erase(std::remove_if(open.begin(), open.end(),
                              [&](size_t j) {
                                return boxes[j].offsets[axis] + boxes[j].lengths[axis] <= start;
                              }),
               open.end());
    for (size_t j : open) {
      if (Intersect(boxes[i], boxes[j]).has_value()) {
        return std::make_pair(std::min(i, j), std::max(i, j));
      }
    }
    open.push_back(i);
  }
  return std::nullopt;
}

// A region of `shape` that no box covers (boxes pairwise disjoint and inside the shape),
// found on the grid of all box boundaries; nullopt if there is none or the grid is too big.
std::optional<Box> FindMissingRegion(absl::Span<const int64_t> shape,
                                     const std::vector<Box>& boxes,
                                     const std::vector<size_t>& live) {
  const size_t rank = shape.size();
  if (rank == 0) return live.empty() ? std::optional<Box>(Box{}) : std::nullopt;
  std::vector<std::vector<int64_t>> cuts(rank);
  uint64_t cells = 1;
  for (size_t d = 0; d < rank; ++d) {
    cuts[d] = {0, shape[d]};
    for (size_t i : live) {
      cuts[d].push_back(boxes[i].offsets[d]);
      cuts[d].push_back(boxes[i].offsets[d] + boxes[i].lengths[d]);
    }
    std::sort(cuts[d].begin(), cuts[d].end());
    cuts[d].erase(std::unique(cuts[d].begin(), cuts[d].end()), cuts[d].end());
    cells *= cuts[d].size() - 1;
    if (cells > kMaxGridCells) return std::nullopt;
  }
  // Row-major over the grid; strides in cells.
  std::vector<uint64_t> stride(rank, 1);
  for (size_t d = rank - 1; d > 0; --d) stride[d - 1] = stride[d] * (cuts[d].size() - 1);
  std::vector<bool> covered(cells, false);
  for (size_t i : live) {
    std::vector<size_t> lo(rank), hi(rank);
    for (size_t d = 0; d < rank; ++d) {
      lo[d] = std::lower_bound(cuts[d].begin(), cuts[d].end(), boxes[i].offsets[d]) -
              cuts[d].begin();
      hi[d] = std::lower_bound(cuts[d].begin(), cuts[d].end(),
                               boxes[i].offsets[d] + boxes[i].lengths[d]) -
              cuts[d].begin();
    }
    // Odometer over the box's cells; a nonempty box spans at least one cell per axis.
    std::vector<size_t> idx = lo;
    for (bool more = true; more;) {
      uint64_t cell = 0;
      for (size_t d = 0; d < rank; ++d) cell += idx[d] * stride[d];
      covered[cell] = true;
      more = false;
      for (size_t d = rank; d-- > 0;) {
        if (++idx[d] < hi[d]) {
          more = true;
          break;
        }
        idx[d] = lo[d];
      }
    }
  }
  for (uint64_t cell = 0; cell < cells; ++cell) {
    if (covered[cell]) continue;
    Box missing;
    uint64_t rest = cell;
    for (size_t d = 0; d < rank; ++d) {
      const size_t k = rest / stride[d];
      rest %= stride[d];
      missing.offsets.push_back(cuts[d][k]);
      missing.lengths.push_back(cuts[d][k + 1] - cuts[d][k]);
    }
    return missing;
  }
  return std::nullopt;
}

void CheckTiling(const v1::TensorEntry& tensor, Problems& problems) {
  if (tensor.state_absent()) return;
  std::vector<Box> boxes;
  boxes.reserve(tensor.chunks_size());
  std::vector<size_t> live;  // chunks holding at least one element
  unsigned __int128 covered = 0;
  for (const v1::ChunkEntry& chunk : tensor.chunks()) {
    boxes.push_back(BoxFromProto(chunk.box()));
    if (IsEmpty(boxes.back())) continue;
    live.push_back(boxes.size() - 1);
    covered += static_cast<uint64_t>(*Volume(boxes.back()));  // inside a valid shape
  }
  if (std::optional<std::pair<size_t, size_t>> pair = FindOverlap(boxes, live)) {
    const v1::ChunkEntry& a = tensor.chunks(pair->first);
    const v1::ChunkEntry& b = tensor.chunks(pair->second);
    problems.Add(ProblemKind::kOverlappingChunks, v1::ERROR_CODE_OVERLAPPING_SHARDS, tensor.key(),
                 BoxToString(boxes[pair->first]), a.file(),
                 absl::StrCat("tensor \"", tensor.key(), "\": chunk ",
                              BoxToString(boxes[pair->first]), " (file ", a.file(),
                              ") overlaps chunk ", BoxToString(boxes[pair->second]), " (file ",
                              b.file(), ")"));
    return;
  }
  const uint64_t total = static_cast<uint64_t>(*CheckedVolume(tensor.global_shape()));
  if (covered == total) return;
  std::string where;
  if (std::optional<Box> missing = FindMissingRegion(tensor.global_shape(), boxes, live)) {
    where = absl::StrCat("; region ", BoxToString(*missing), " is in no chunk");
  }
  problems.Add(ProblemKind::kIncompleteCoverage, v1::ERROR_CODE_INCOMPLETE_COVERAGE, tensor.key(),
               "", "",
               absl::StrCat("tensor \"", tensor.key(), "\" of shape [",
                            absl::StrJoin(tensor.global_shape(), ", "), "]: its ",
                            tensor.chunks_size(), " chunks cover ", static_cast<uint64_t>(covered),
                            " of ", total, " elements", where));
}

using ChunkRef = std::pair<const v1::TensorEntry*, const v1::ChunkEntry*>;

struct FileTask {
  std::string name;
  std::vector<ChunkRef> chunks;  // manifest order
};

// Checks the header entry of every chunk against the manifest.
void CheckHeader(const FileTask& task, const std::string& path, ReadableFile& file,
                 uint64_t size, Problems& problems) {
  auto invalid = [&](absl::string_view why) {
    problems.Add(ProblemKind::kHeaderInvalid, v1::ERROR_CODE_UNSPECIFIED, "", "", task.name,
                 absl::StrCat("data file ", path, " has an invalid safetensors header: ", why));
  };
  std::string prefix(std::min<uint64_t>(size, 8), '\0');
  if (absl::Status s = file.ReadAt(0, prefix.data(), prefix.size()); !s.ok()) {
    return invalid(s.message());
  }
  absl::StatusOr<uint64_t> json_size = ParseSafetensorsHeaderSize(prefix);
  if (!json_size.ok()) return invalid(json_size.status().message());
  if (8 + *json_size > size) {
    return invalid(absl::StrCat("its length prefix says ", *json_size,
                                " header bytes but the file holds ", size));
  }
  std::string bytes(8 + *json_size, '\0');
  if (absl::Status s = file.ReadAt(0, bytes.data(), bytes.size()); !s.ok()) {
    return invalid(s.message());
  }
  absl::StatusOr<SafetensorsHeader> header = ParseSafetensorsHeader(bytes);
  if (!header.ok()) return invalid(header.status().message());
  if (absl::Status s = ValidateSafetensorsLayout(*header, size); !s.ok()) invalid(s.message());

  absl::flat_hash_map<absl::string_view, const SafetensorsEntry*> entries;
  for (const SafetensorsEntry& entry : header->entries) entries.emplace(entry.name, &entry);
  for (const auto& [tensor, chunk] : task.chunks) {
    const Box box = BoxFromProto(chunk->box());
    const std::string name = ChunkName(tensor->key(), box);
    auto it = entries.find(name);
    if (it == entries.end()) {
      problems.AddChunk(ProblemKind::kHeaderMismatch, v1::ERROR_CODE_UNSPECIFIED, *tensor, *chunk,
                        absl::StrCat(DescribeChunk(*tensor, *chunk),
                                     ": the safetensors header has no entry \"", name, "\""));
      continue;
    }
    const SafetensorsEntry& entry = *it->second;
    std::vector<std::string> wrong;
    if (entry.dtype != DTypeName(tensor->dtype())) {
      wrong.push_back(absl::StrCat("dtype ", entry.dtype, " (manifest: ",
                                   DTypeName(tensor->dtype()), ")"));
    }
    if (!std::equal(entry.shape.begin(), entry.shape.end(), box.lengths.begin(),
                    box.lengths.end())) {
      wrong.push_back(absl::StrCat("shape [", absl::StrJoin(entry.shape, ", "),
                                   "] (manifest: [", absl::StrJoin(box.lengths, ", "), "])"));
    }
    if (header->data_start + entry.begin != chunk->offset() ||
        entry.end - entry.begin != chunk->nbytes()) {
      wrong.push_back(absl::StrCat("bytes ", header->data_start + entry.begin, "..",
                                   header->data_start + entry.end, " (manifest: ",
                                   chunk->offset(), "..", chunk->offset() + chunk->nbytes(), ")"));
    }
    if (!wrong.empty()) {
      problems.AddChunk(ProblemKind::kHeaderMismatch, v1::ERROR_CODE_UNSPECIFIED, *tensor, *chunk,
                        absl::StrCat(DescribeChunk(*tensor, *chunk), ": safetensors entry \"",
                                     name, "\" has ", absl::StrJoin(wrong, ", ")));
    }
  }
}

void CheckChecksums(const FileTask& task, const std::string& path, ReadableFile& file,
                    uint64_t size, const VerifyOptions& options, Problems& problems,
                    uint64_t& bytes_verified) {
  // Page-aligned, so reads land in it in place with O_DIRECT (storage/posix_storage.h).
  std::unique_ptr<char, decltype(&free)> buffer(nullptr, &free);
  uint64_t capacity = 0;
  for (const auto& [tensor, chunk] : task.chunks) {
    if (chunk->offset() + chunk->nbytes() > size) continue;  // reported as too short
    const uint64_t blocks = BlockCount(*chunk);
    const uint64_t per_read =
        std::max<uint64_t>(1, options.max_read_bytes / chunk->block_size());
    for (uint64_t first = 0; first < blocks; first += per_read) {
      const uint64_t count = std::min(per_read, blocks - first);
      const uint64_t begin = format_internal::BlockBegin(*chunk, first);
      const uint64_t len = BlockEnd(*chunk, first + count - 1) - begin;
      if (len > capacity) {
        buffer.reset();
        capacity = 0;
        void* mem = nullptr;
        if (posix_memalign(&mem, kDirectIoAlignment, len) != 0) {
          problems.AddChunk(ProblemKind::kFileUnreadable, v1::ERROR_CODE_IO_ERROR, *tensor,
                            *chunk, absl::StrCat("no memory for a ", len, "-byte read buffer"));
          break;
        }
        buffer.reset(static_cast<char*>(mem));
        capacity = len;
      }
      absl::Status s =
          format_internal::ReadChunkBytes(file, *tensor, *chunk, begin, buffer.get(), len);
      if (!s.ok()) {
        problems.AddChunk(ProblemKind::kFileUnreadable, v1::ERROR_CODE_IO_ERROR, *tensor, *chunk,
                          std::string(s.message()));
        break;
      }
      for (uint64_t b = first; b < first + count; ++b) {
        const char* data = buffer.get() + (format_internal::BlockBegin(*chunk, b) - begin);
        if (FindBadBlock(*chunk, b, 1, data).has_value()) {
          absl::Status mismatch = format_internal::ChecksumMismatchError(*tensor, *chunk, path, b);
          problems.AddChunk(ProblemKind::kChecksumMismatch, v1::ERROR_CODE_CHECKSUM_MISMATCH,
                            *tensor, *chunk, std::string(mismatch.message()));
        }
      }
      bytes_verified += len;
    }
  }
}

void VerifyFile(Storage& storage, const std::string& dir, const FileTask& task,
                const VerifyOptions& options, Problems& problems, uint64_t& bytes_verified) {
  const std::string path = JoinPath(dir, task.name);
  absl::StatusOr<std::unique_ptr<ReadableFile>> file = storage.OpenForRead(path);
  absl::StatusOr<uint64_t> size =
      file.ok() ? (*file)->Size() : absl::StatusOr<uint64_t>(file.status());
  if (!size.ok()) {
    const bool missing = absl::IsNotFound(size.status());
    const ChunkRef& first = task.chunks.front();
    problems.Add(missing ? ProblemKind::kFileMissing : ProblemKind::kFileUnreadable,
                 v1::ERROR_CODE_IO_ERROR, "", "", task.name,
                 absl::StrCat("data file ", path, missing ? " is missing" : " is unreadable",
                              " (", size.status().message(), "); it holds ", task.chunks.size(),
                              " chunks, the first ", DescribeChunk(*first.first, *first.second)));
    return;
  }
  for (const auto& [tensor, chunk] : task.chunks) {
    if (chunk->offset() + chunk->nbytes() > *size) {
      problems.AddChunk(ProblemKind::kFileTooShort, v1::ERROR_CODE_IO_ERROR, *tensor, *chunk,
                        absl::StrCat("data file ", path, " holds ", *size, " bytes but ",
                                     DescribeChunk(*tensor, *chunk), " ends at byte ",
                                     chunk->offset() + chunk->nbytes()));
    }
  }
  CheckHeader(task, path, **file, *size, problems);
  if (options.checksums) {
    CheckChecksums(task, path, **file, *size, options, problems, bytes_verified);
  }
}

}  // namespace

absl::string_view ProblemKindName(ProblemKind kind) {
  switch (kind) {
    case ProblemKind::kManifest:
      return "MANIFEST";
    case ProblemKind::kOverlappingChunks:
      return "OVERLAPPING_CHUNKS";
    case ProblemKind::kIncompleteCoverage:
      return "INCOMPLETE_COVERAGE";
    case ProblemKind::kFileMissing:
      return "FILE_MISSING";
    case ProblemKind::kFileTooShort:
      return "FILE_TOO_SHORT";
    case ProblemKind::kFileUnreadable:
      return "FILE_UNREADABLE";
    case ProblemKind::kHeaderInvalid:
      return "HEADER_INVALID";
    case ProblemKind::kHeaderMismatch:
      return "HEADER_MISMATCH";
    case ProblemKind::kChecksumMismatch:
      return "CHECKSUM_MISMATCH";
  }
  return "UNKNOWN";
}

VerifyReport VerifyCheckpoint(Storage& storage, const std::string& dir,
                              const VerifyOptions& options) {
  VerifyReport report;
  const size_t cap = options.max_problems;
  absl::StatusOr<v1::Manifest> manifest = ReadManifest(storage, dir);
  if (!manifest.ok()) {
    Problems problems(cap);
    problems.Add(ProblemKind::kManifest, GetErrorCode(manifest.status()), "", "", "",
                 std::string(manifest.status().message()));
    problems.MergeInto(report, cap);
    return report;
  }

  report.tensors = manifest->tensors_size();
  for (const v1::TensorEntry& t : manifest->tensors()) {
    report.extras += t.kind() == v1::SHARD_KIND_EXTRA;
  }
  const std::string data_dir = DataDirOf(storage, dir, *manifest);
  std::map<std::string, FileTask> by_file;  // sorted: a stable report order
  {
    Problems problems(cap);
    for (const v1::TensorEntry& tensor : manifest->tensors()) {
      CheckTiling(tensor, problems);
      for (const v1::ChunkEntry& chunk : tensor.chunks()) {
        ++report.chunks;
        FileTask& task = by_file[chunk.file()];
        task.name = chunk.file();
        task.chunks.emplace_back(&tensor, &chunk);
      }
    }
    problems.MergeInto(report, cap);
  }
  report.files = by_file.size();

  std::vector<FileTask*> tasks;
  for (auto& [name, task] : by_file) tasks.push_back(&task);
  std::vector<Problems> file_problems(tasks.size(), Problems(cap));
  std::vector<uint64_t> verified(tasks.size(), 0);
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i = next.fetch_add(1); i < tasks.size(); i = next.fetch_add(1)) {
      VerifyFile(storage, data_dir, *tasks[i], options, file_problems[i], verified[i]);
    }
  };
  const size_t threads =
      std::min<size_t>(tasks.size(), static_cast<size_t>(std::max(options.parallelism, 1)));
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (std::thread& t : pool) t.join();
  for (size_t i = 0; i < tasks.size(); ++i) {
    file_problems[i].MergeInto(report, cap);
    report.bytes_verified += verified[i];
  }
  return report;
}

}  // namespace tessera
