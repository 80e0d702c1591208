#include "tests/gpu/bench_memory.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>

#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "cuda_runtime_api.h"
#include "shm/cuda_host.h"

namespace tessera::gpubench {
namespace {

absl::Status CudaError(cudaError_t err, absl::string_view op) {
  (void)cudaGetLastError();
  const std::string message =
      absl::StrCat(op, ": ", cudaGetErrorName(err), ": ", cudaGetErrorString(err));
  if (err == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

#define BENCH_CUDA(call)                                      \
  do {                                                        \
    const cudaError_t bench_err_ = (call);                    \
    if (bench_err_ != cudaSuccess) return CudaError(bench_err_, #call); \
  } while (0)

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

void* MapPopulated(size_t size) {
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE,
                 -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

}  // namespace

const char* WhereName(Where where) { return where == Where::kCuda ? "cuda" : "host"; }

absl::StatusOr<Where> ChooseMemory(const std::string& flag) {
  if (flag == "host") return Where::kHost;
  if (flag == "auto") return GpuAvailable() ? Where::kCuda : Where::kHost;
  if (flag == "cuda") {
    if (!GpuAvailable()) {
      return absl::FailedPreconditionError(
          "--memory=cuda, but cudaGetDeviceCount finds no usable GPU");
    }
    return Where::kCuda;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--memory must be auto, cuda or host, not \"", flag, "\""));
}

std::string GpuName() {
  if (!GpuAvailable()) return "";
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    (void)cudaGetLastError();
    return "";
  }
  return prop.name;
}

absl::StatusOr<std::unique_ptr<Buffer>> Buffer::Allocate(Where where, size_t size) {
  if (where == Where::kCuda) {
    void* p = nullptr;
    BENCH_CUDA(cudaMalloc(&p, size));
    return std::unique_ptr<Buffer>(new Buffer(where, p, size));
  }
  void* p = MapPopulated(size);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("mmap ", size, " bytes: ", strerror(errno)));
  }
  return std::unique_ptr<Buffer>(new Buffer(where, p, size));
}

Buffer::~Buffer() {
  if (where_ == Where::kCuda) {
    (void)cudaFree(data_);
  } else {
    munmap(data_, size_);
  }
}

absl::Status Buffer::Write(size_t offset, const void* src, size_t n) {
  if (offset > size_ || n > size_ - offset) return absl::OutOfRangeError("write past the buffer");
  char* dst = static_cast<char*>(data_) + offset;
  if (where_ == Where::kHost) {
    std::memcpy(dst, src, n);
    return absl::OkStatus();
  }
  BENCH_CUDA(cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice));
  return absl::OkStatus();
}

absl::Status Buffer::Read(size_t offset, void* dst, size_t n) const {
  if (offset > size_ || n > size_ - offset) return absl::OutOfRangeError("read past the buffer");
  const char* src = static_cast<const char*>(data_) + offset;
  if (where_ == Where::kHost) {
    std::memcpy(dst, src, n);
    return absl::OkStatus();
  }
  BENCH_CUDA(cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost));
  return absl::OkStatus();
}

absl::StatusOr<CopyLimit> MeasureCopyLimit(absl::Span<Buffer* const> buffers, int repeats,
                                           const std::function<void()>& before_each) {
  size_t total = 0;
  bool cuda = false;
  for (const Buffer* b : buffers) {
    total += b->size();
    cuda = cuda || b->where() == Where::kCuda;
  }
  CopyLimit limit;
  if (!cuda) {
    char* dst = static_cast<char*>(MapPopulated(total));
    if (dst == nullptr) return absl::ResourceExhaustedError("mmap for the memcpy baseline");
    for (int r = 0; r < repeats; ++r) {
      if (before_each) before_each();
      const auto start = std::chrono::steady_clock::now();
      size_t off = 0;
      for (const Buffer* b : buffers) {
        std::memcpy(dst + off, b->data(), b->size());
        off += b->size();
      }
      limit.to_host_s.push_back(Seconds(start));
    }
    munmap(dst, total);
    return limit;
  }
  char* pinned = nullptr;
  BENCH_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&pinned), total, cudaHostAllocDefault));
  cudaStream_t stream = nullptr;
  absl::Status status = [&]() -> absl::Status {
    BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    for (int r = 0; r < repeats; ++r) {
      for (const bool to_host : {true, false}) {
        if (before_each) before_each();
        const auto start = std::chrono::steady_clock::now();
        size_t off = 0;
        for (const Buffer* b : buffers) {
          if (to_host) {
            BENCH_CUDA(cudaMemcpyAsync(pinned + off, b->data(), b->size(),
                                       cudaMemcpyDeviceToHost, stream));
          } else {
            BENCH_CUDA(cudaMemcpyAsync(b->data(), pinned + off, b->size(),
                                       cudaMemcpyHostToDevice, stream));
          }
          off += b->size();
        }
        BENCH_CUDA(cudaStreamSynchronize(stream));
        (to_host ? limit.to_host_s : limit.to_device_s).push_back(Seconds(start));
      }
    }
    return absl::OkStatus();
  }();
  if (stream != nullptr) (void)cudaStreamDestroy(stream);
  (void)cudaFreeHost(pinned);
  if (!status.ok()) return status;
  return limit;
}

}  // namespace tessera::gpubench
