// Page-locking host memory for the GPU, chosen at run time.
//
// Every Tessera binary links libcudart; whether a GPU is usable is decided when the process
// runs: without a GPU (or driver) cudaGetDeviceCount() fails and everything here reports "no
// GPU", so the same binary takes the CPU path. Nothing here initialises a CUDA context unless a
// GPU is present.
//
// Part of the shared-memory contract (shm/): the agent page-locks its staging regions with it,
// the trainer its own mappings of them (pinning is per process) and its device copies.
// Lifecycle: the probe runs once per process; a registration lasts until UnregisterHost.
//
// Thread-safety: all functions are thread-safe.
#ifndef TESSERA_SHM_CUDA_HOST_H_
#define TESSERA_SHM_CUDA_HOST_H_

#include <cstddef>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace tessera {

// True if at least one CUDA device is usable. Probed once per process (the first call may
// take a while on a GPU machine as it loads the driver), then cached.
bool GpuAvailable();

// Page-locks [ptr, ptr + size) for DMA (cudaHostRegister, portable across contexts), so
// cudaMemcpyAsync and NCCL run at full bandwidth from or into it.
// Errors: FailedPrecondition if no GPU is available; ResourceExhausted if the driver cannot
// lock the memory (RLIMIT_MEMLOCK, out of pinnable memory); Internal for other CUDA errors.
// The message carries CUDA's error string.
absl::Status RegisterHost(void* ptr, size_t size);

// Undoes RegisterHost(ptr). Must be called before the memory is unmapped.
// Errors: FailedPrecondition if no GPU is available; Internal for CUDA errors (e.g. `ptr`
// was not registered).
absl::Status UnregisterHost(void* ptr);

// The status of CUDA error `cuda_error` (a cudaError_t, not cudaSuccess) returned by `op`:
// ResourceExhausted for cudaErrorMemoryAllocation, Internal otherwise; the message is
// "<op>: <CUDA's error name>: <its error string>". The one place CUDA errors become statuses.
absl::Status CudaStatus(int cuda_error, absl::string_view op);

}  // namespace tessera

#endif  // TESSERA_SHM_CUDA_HOST_H_
