#include "format/test_checkpoint.h"

#include <stdlib.h>

#include <cstring>
#include <map>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "format/data_file.h"
#include "format/shard_writer.h"
#include "common/dtype.h"
#include "common/status.h"
#include "common/tensor_key.h"
#include "format/manifest_io.h"

namespace tessera {
namespace testing_checkpoint {
namespace {

// Row-major flat index of absolute `point` in a tensor of `shape`.
int64_t GlobalIndex(const std::vector<int64_t>& shape, const std::vector<int64_t>& point) {
  int64_t index = 0;
  for (size_t d = 0; d < shape.size(); ++d) index = index * shape[d] + point[d];
  return index;
}

// Calls f(point) for every point of `box` in row-major order.
template <typename F>
void ForEachPoint(const Box& box, F f) {
  for (int64_t len : box.lengths) {
    if (len == 0) return;
  }
  std::vector<int64_t> point = box.offsets;
  while (true) {
    f(point);
    size_t d = box.rank();
    while (true) {
      if (d == 0) return;
      --d;
      if (++point[d] < box.offsets[d] + box.lengths[d]) break;
      point[d] = box.offsets[d];
    }
  }
}

struct AlignedFree {
  void operator()(void* p) const { free(p); }
};

}  // namespace

std::string TestTensor::key() const { return TensorKey(kind, fqn, state_key, rank); }

std::string DataFileName(int file) { return absl::StrCat("data-", file, ".safetensors"); }

std::string RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::string out(n, '\0');
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<char>(gen() & 0xff);
  return out;
}

TestTensor RandomTensor(std::string fqn, v1::DType dtype, std::vector<int64_t> shape,
                        uint64_t seed) {
  TestTensor t;
  t.fqn = std::move(fqn);
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.data = RandomBytes(static_cast<size_t>(*CheckedVolume(t.shape)) * DTypeSize(dtype), seed);
  return t;
}

std::vector<TestChunk> GridChunks(const std::vector<int64_t>& shape,
                                  const std::vector<int64_t>& parts, int files_round_robin) {
  std::vector<std::vector<std::pair<int64_t, int64_t>>> axis(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    for (int64_t p = 0; p < parts[d]; ++p) {
      const int64_t begin = shape[d] * p / parts[d];
      const int64_t end = shape[d] * (p + 1) / parts[d];
      axis[d].emplace_back(begin, end - begin);
    }
  }
  std::vector<TestChunk> chunks;
  Box index_box{std::vector<int64_t>(shape.size(), 0), parts};
  int i = 0;
  ForEachPoint(index_box, [&](const std::vector<int64_t>& idx) {
    TestChunk chunk;
    for (size_t d = 0; d < shape.size(); ++d) {
      chunk.box.offsets.push_back(axis[d][idx[d]].first);
      chunk.box.lengths.push_back(axis[d][idx[d]].second);
    }
    chunk.file = files_round_robin > 0 ? i % files_round_robin : 0;
    ++i;
    chunks.push_back(std::move(chunk));
  });
  if (shape.empty()) chunks.push_back(TestChunk{Box{}, 0});
  return chunks;
}

std::string Reference(const TestTensor& tensor, const Box& box,
                      std::optional<v1::FlatRange> flat_range) {
  const size_t esize = DTypeSize(tensor.dtype);
  std::string out;
  int64_t flat = 0;
  ForEachPoint(box, [&](const std::vector<int64_t>& point) {
    const bool keep = !flat_range.has_value() ||
                      (flat >= flat_range->begin() && flat < flat_range->end());
    if (keep) out.append(tensor.data, GlobalIndex(tensor.shape, point) * esize, esize);
    ++flat;
  });
  return out;
}

absl::StatusOr<v1::Manifest> WriteTestData(Storage& storage, const std::string& dir,
                                           const std::vector<TestTensor>& tensors,
                                           const TestCheckpointOptions& options) {
  v1::Manifest manifest;
  manifest.set_format_version(kManifestFormatVersion);
  manifest.set_job_id(options.job_id);
  manifest.set_step(options.step);
  manifest.set_session_id(options.session_id);
  manifest.set_committed_unix_ms(1700000000000);
  v1::MeshDim* dim = manifest.mutable_layout()->add_dims();
  dim->set_name("tp");
  dim->set_degree(2);

  // Per file, the (tensor, chunk) pairs it holds, in order.
  std::map<int, std::vector<std::pair<size_t, size_t>>> files;
  for (size_t t = 0; t < tensors.size(); ++t) {
    const TestTensor& tensor = tensors[t];
    v1::TensorEntry* entry = manifest.add_tensors();
    entry->set_key(tensor.key());
    entry->set_fqn(tensor.fqn);
    entry->set_kind(tensor.kind);
    entry->set_state_key(tensor.state_key);
    entry->set_rank(tensor.rank);
    entry->set_dtype(tensor.dtype);
    entry->mutable_global_shape()->Add(tensor.shape.begin(), tensor.shape.end());
    entry->set_state_absent(tensor.state_absent);
    for (size_t c = 0; c < tensor.chunks.size(); ++c) {
      entry->add_chunks();
      files[tensor.chunks[c].file].emplace_back(t, c);
    }
  }

  uint64_t total = 0;
  for (const auto& [file, refs] : files) {
    std::vector<ChunkSpec> specs;
    for (const auto& [t, c] : refs) {
      const TestTensor& tensor = tensors[t];
      const Box& box = tensor.chunks[c].box;
      specs.push_back(ChunkSpec{tensor.key(), BoxToProto(box), tensor.dtype,
                                static_cast<uint64_t>(*Volume(box)) * DTypeSize(tensor.dtype)});
    }
    ASSIGN_OR_RETURN(FileLayout layout, ComputeFileLayout(specs));
    void* raw = nullptr;
    if (posix_memalign(&raw, kDirectIoAlignment, std::max<uint64_t>(layout.data_size, 1)) != 0) {
      return absl::ResourceExhaustedError("posix_memalign");
    }
    std::unique_ptr<char, AlignedFree> staging(static_cast<char*>(raw));
    memset(staging.get(), 0, layout.data_size);
    for (size_t i = 0; i < refs.size(); ++i) {
      const TestTensor& tensor = tensors[refs[i].first];
      const std::string bytes = Reference(tensor, tensor.chunks[refs[i].second].box);
      memcpy(staging.get() + layout.items[i].staging_offset, bytes.data(), bytes.size());
    }
    ShardWriterOptions writer_options;
    writer_options.block_size = options.block_size;
    writer_options.writer_rank = static_cast<uint32_t>(file);
    writer_options.sync = false;
    ASSIGN_OR_RETURN(WrittenFile written, ShardWriter::WriteFile(storage, dir, DataFileName(file),
                                                                 layout, staging.get(),
                                                                 writer_options));
    for (size_t i = 0; i < refs.size(); ++i) {
      *manifest.mutable_tensors(refs[i].first)->mutable_chunks(refs[i].second) =
          written.chunks[i];
      total += written.chunks[i].nbytes();
    }
  }
  manifest.set_total_bytes(total);
  return manifest;
}

absl::StatusOr<v1::Manifest> WriteTestCheckpoint(Storage& storage, const std::string& dir,
                                                 const std::vector<TestTensor>& tensors,
                                                 const TestCheckpointOptions& options) {
  ASSIGN_OR_RETURN(v1::Manifest manifest, WriteTestData(storage, dir, tensors, options));
  RETURN_IF_ERROR(WriteManifest(storage, dir, manifest));
  return manifest;
}

}  // namespace testing_checkpoint
}  // namespace tessera
