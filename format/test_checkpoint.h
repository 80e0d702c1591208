// Test support: builds small checkpoints from whole tensors held in memory, using the real
// data-file layout (format/data_file.h) and shard writer (format/shard_writer.h), and extracts
// reference regions from the whole tensors element by element (deliberately not through
// common/box.h RowMajorRuns, so it can catch a bug there or in the reader).
//
// Thread-safety: free functions.
#ifndef TESSERA_FORMAT_TEST_CHECKPOINT_H_
#define TESSERA_FORMAT_TEST_CHECKPOINT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "storage/storage.h"
#include "common/box.h"
#include "tessera/v1/manifest.pb.h"
#include "tessera/v1/types.pb.h"

namespace tessera {
namespace testing_checkpoint {

struct TestChunk {
  Box box;
  int file = 0;  // written to "data-<file>.safetensors"
};

struct TestTensor {
  v1::ShardKind kind = v1::SHARD_KIND_PARAM;
  std::string fqn;
  std::string state_key;  // SHARD_KIND_OPTIMIZER
  uint32_t rank = 0;      // SHARD_KIND_EXTRA
  v1::DType dtype = v1::DTYPE_F32;
  std::vector<int64_t> shape;
  std::string data;  // the whole tensor, row-major; empty if state_absent
  std::vector<TestChunk> chunks;
  bool state_absent = false;

  std::string key() const;
};

struct TestCheckpointOptions {
  std::string job_id = "job";
  int64_t step = 100;
  std::string session_id = "s100-00000000000000aa";
  // Small blocks so tests cross block boundaries. Default: 64.
  uint32_t block_size = 64;
};

// "data-<file>.safetensors".
std::string DataFileName(int file);

// `n` bytes from a fixed-seed generator.
std::string RandomBytes(size_t n, uint64_t seed);

// A tensor of `shape` with random contents and no chunks.
TestTensor RandomTensor(std::string fqn, v1::DType dtype, std::vector<int64_t> shape,
                        uint64_t seed);

// `box` cut into a grid of `parts[d]` nearly equal pieces along each axis, all in `file`
// unless `files_round_robin` (then piece i goes to file i % files_round_robin).
std::vector<TestChunk> GridChunks(const std::vector<int64_t>& shape,
                                  const std::vector<int64_t>& parts, int files_round_robin);

// Writes the data files for `tensors` into `dir` (which must exist) and returns the manifest
// describing them (not written). Manifest chunks are in TestTensor::chunks order.
absl::StatusOr<v1::Manifest> WriteTestData(Storage& storage, const std::string& dir,
                                           const std::vector<TestTensor>& tensors,
                                           const TestCheckpointOptions& options = {});

// WriteTestData plus WriteManifest: a complete checkpoint directory (not renamed).
absl::StatusOr<v1::Manifest> WriteTestCheckpoint(Storage& storage, const std::string& dir,
                                                 const std::vector<TestTensor>& tensors,
                                                 const TestCheckpointOptions& options = {});

// Elements of `box` (optionally only [begin, end) of it flattened row-major) of `tensor`,
// row-major, computed element by element.
std::string Reference(const TestTensor& tensor, const Box& box,
                      std::optional<v1::FlatRange> flat_range = std::nullopt);

}  // namespace testing_checkpoint
}  // namespace tessera

#endif  // TESSERA_FORMAT_TEST_CHECKPOINT_H_
