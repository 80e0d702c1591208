#include "shm/cuda_host.h"

#include <mutex>

#include "absl/strings/str_cat.h"
#include "cuda_runtime_api.h"

namespace tessera {
namespace {

absl::Status NoGpu(absl::string_view op) {
  return absl::FailedPreconditionError(absl::StrCat(op, ": no CUDA device is available"));
}

}  // namespace

absl::Status CudaStatus(int cuda_error, absl::string_view op) {
  const auto err = static_cast<cudaError_t>(cuda_error);
  const std::string message =
      absl::StrCat(op, ": ", cudaGetErrorName(err), ": ", cudaGetErrorString(err));
  if (err == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

bool GpuAvailable() {
  static std::once_flag once;
  static bool available = false;
  std::call_once(once, [] {
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    available = err == cudaSuccess && count > 0;
    // A failed probe leaves a sticky "last error"; clear it so later CUDA users start clean.
    if (err != cudaSuccess) (void)cudaGetLastError();
  });
  return available;
}

absl::Status RegisterHost(void* ptr, size_t size) {
  if (!GpuAvailable()) return NoGpu("cudaHostRegister");
  const cudaError_t err = cudaHostRegister(ptr, size, cudaHostRegisterPortable);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return CudaStatus(err, absl::StrCat("cudaHostRegister(", size, " bytes)"));
  }
  return absl::OkStatus();
}

absl::Status UnregisterHost(void* ptr) {
  if (!GpuAvailable()) return NoGpu("cudaHostUnregister");
  const cudaError_t err = cudaHostUnregister(ptr);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return CudaStatus(err, "cudaHostUnregister");
  }
  return absl::OkStatus();
}

}  // namespace tessera
