// Where the GPU benchmark's tensors live, and the physical limit it compares against.
//
// ChooseMemory("auto") takes CUDA device memory when cudaGetDeviceCount finds a GPU and host
// memory otherwise: the same run-time choice the agent and the client make (shm/cuda_host.h),
// so a machine without a GPU runs the same binary on its CPU fallback. "cuda" insists on a GPU
// (a GPU run must never fall back silently); "host" never touches CUDA.
//
// Thread-safety: Buffer is not thread-safe; the free functions are.
#ifndef TESSERA_TESTS_GPU_BENCH_MEMORY_H_
#define TESSERA_TESTS_GPU_BENCH_MEMORY_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace tessera::gpubench {

enum class Where { kHost, kCuda };

const char* WhereName(Where where);  // "host" or "cuda"

// Errors: InvalidArgument for a flag other than auto, cuda, host; FailedPrecondition for
// "cuda" where no GPU is usable.
absl::StatusOr<Where> ChooseMemory(const std::string& flag);

// "NVIDIA H100 80GB HBM3" (device 0), or "" without a GPU.
std::string GpuName();

// A tensor's memory: host pages (mmap, faulted in at allocation, as a resumed model's are) or
// device memory (cudaMalloc on the current device).
class Buffer {
 public:
  // Errors: ResourceExhausted if the memory cannot be had; Internal for other CUDA errors.
  static absl::StatusOr<std::unique_ptr<Buffer>> Allocate(Where where, size_t size);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  size_t size() const { return size_; }
  Where where() const { return where_; }

  // Copies `n` bytes of host memory to data() + offset / from data() + offset (synchronous).
  // Errors: OutOfRange past size(); Internal for CUDA errors.
  absl::Status Write(size_t offset, const void* src, size_t n);
  absl::Status Read(size_t offset, void* dst, size_t n) const;

 private:
  Buffer(Where where, void* data, size_t size) : where_(where), data_(data), size_(size) {}
  const Where where_;
  void* const data_;
  const size_t size_;
};

// The copy limit of `buffers`' bytes, in seconds per repetition: each repetition copies every
// buffer, one after another as the client does. CUDA buffers: cudaMemcpyAsync on one stream
// into (to_host) and then back out of (to_device) one cudaHostAlloc buffer of their total
// size, each timed from the first enqueue to the stream's completion: the pinned device->host
// and host->device limits of these bytes. The contents are unchanged (the same bytes go back).
// Host buffers: a one-thread memcpy into pre-faulted memory (to_host only). `before_each`, if
// set, runs before each timed pass (the ranks' barrier: every rank copies at once).
struct CopyLimit {
  std::vector<double> to_host_s;
  std::vector<double> to_device_s;  // empty for host buffers
};
// Errors: ResourceExhausted if the pinned buffer cannot be had; Internal for CUDA errors.
absl::StatusOr<CopyLimit> MeasureCopyLimit(absl::Span<Buffer* const> buffers, int repeats,
                                           const std::function<void()>& before_each);

}  // namespace tessera::gpubench

#endif  // TESSERA_TESTS_GPU_BENCH_MEMORY_H_
