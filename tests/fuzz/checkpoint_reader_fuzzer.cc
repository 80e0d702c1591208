// Fuzzes the checkpoint reader's offsets (format/checkpoint_reader.h): a manifest as a
// coordinator hands it to an agent for a memory-only load (CheckpointReader::FromManifest,
// agent/loader.cc) and a resident copy of its data files, both from the input. Every tensor
// of at most kMaxTensorBytes is planned and read whole from the copy, then a contiguous run is
// located in place. Whatever offsets, sizes, boxes and block sums the manifest claims, the
// reader must refuse them or read inside the copy and the destination.
//
// Input: u32 little-endian length N, N bytes of a serialized tessera.v1.Manifest, then the
// bytes of the resident copy (every data file the manifest names is given the same bytes).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/box.h"
#include "common/dtype.h"
#include "format/checkpoint_reader.h"
#include "tessera/v1/manifest.pb.h"

namespace {

constexpr uint64_t kMaxTensorBytes = 1 << 20;
constexpr int kMaxRequests = 8;

// The whole of `tensor` as a request into `dest`, or false if it is too large to read here.
bool WholeTensor(const tessera::v1::TensorEntry& tensor, std::string* dest,
                 tessera::ReadRequest* request) {
  uint64_t elements = 1;
  for (int64_t dim : tensor.global_shape()) {
    if (dim < 0 || (dim > 0 && elements > kMaxTensorBytes / static_cast<uint64_t>(dim))) {
      return false;
    }
    elements *= static_cast<uint64_t>(dim);
  }
  const uint64_t nbytes = elements * tessera::DTypeSize(tensor.dtype());
  if (nbytes > kMaxTensorBytes) return false;
  dest->assign(nbytes, '\0');
  request->key = tensor.key();
  request->dtype = tensor.dtype();
  request->global_shape.assign(tensor.global_shape().begin(), tensor.global_shape().end());
  request->box = tessera::FullBox(request->global_shape);
  request->dest = dest->data();
  request->dest_size = nbytes;
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  const uint32_t n = data[0] | data[1] << 8 | data[2] << 16 | uint32_t{data[3]} << 24;
  if (n > size - 4) return 0;
  tessera::v1::Manifest manifest;
  if (!manifest.ParseFromArray(data + 4, static_cast<int>(n))) return 0;
  const std::string copy(reinterpret_cast<const char*>(data) + 4 + n, size - 4 - n);

  tessera::CheckpointReaderOptions options;
  options.parallelism = 1;  // one thread: the fuzzer's, so a finding replays exactly
  options.max_read_bytes = 256;
  absl::StatusOr<std::unique_ptr<tessera::CheckpointReader>> reader =
      tessera::CheckpointReader::FromManifest(manifest, "fuzz", options);
  if (!reader.ok()) return 0;

  std::vector<std::string> dests;
  std::vector<tessera::ReadRequest> requests;
  dests.reserve(kMaxRequests);
  for (const tessera::v1::TensorEntry& tensor : (*reader)->manifest().tensors()) {
    if (requests.size() == kMaxRequests) break;
    tessera::ReadRequest request;
    dests.emplace_back();
    if (WholeTensor(tensor, &dests.back(), &request)) {
      requests.push_back(std::move(request));
    } else {
      dests.pop_back();
    }
  }
  std::set<std::string> files;
  for (const tessera::v1::TensorEntry& tensor : (*reader)->manifest().tensors()) {
    for (const tessera::v1::ChunkEntry& chunk : tensor.chunks()) files.insert(chunk.file());
  }
  tessera::ResidentFiles resident;
  const tessera::ResidentBytes bytes{0, copy.data(), copy.size()};
  for (const std::string& file : files) resident[file] = bytes;

  (*reader)->DataFiles(requests).IgnoreError();
  (*reader)->Read(requests, nullptr, &resident).IgnoreError();
  absl::StatusOr<std::string> file = (*reader)->ContiguousFile(requests);
  if (file.ok()) {
    (*reader)->LocateInMemory(requests, *file, bytes).IgnoreError();
    std::vector<tessera::BlockCheck> unverified;
    (*reader)->LocateInMemory(requests, *file, bytes, nullptr, &unverified).IgnoreError();
    (*reader)->ResidentBlocks(*file, bytes);
  }
  return 0;
}
