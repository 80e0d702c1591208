// BounceCopier: host -> device copies from memory that is not page-locked in this process
// (a load region), through two page-locked buffers of its own.
//
// From pageable memory CUDA copies on the calling thread, through the driver's staging, one
// copy at a time in the process: on the H100 machine a load's copies ran at 4.7-5.1 GB/s
// whether one thread or four issued them (docs/benchmarks/reference-h100-x1.md), against
// 51 GB/s from page-locked memory. A BounceCopier copies each part into one of its buffers
// with memcpy while the device's DMA engine takes the other (double buffering), so several
// copiers on several threads run their memcpys in parallel and the transfers at the link's
// speed.
//
// Lifecycle: buffers are allocated (cudaHostAlloc) at Create and freed by the destructor,
// which first waits for the copies that read them. Thread-safety: one thread at a time.
#ifndef TESSERA_CLIENT_BOUNCE_COPY_H_
#define TESSERA_CLIENT_BOUNCE_COPY_H_

#include <array>
#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tessera {

class BounceCopier {
 public:
  // Two page-locked buffers of `buffer_bytes` (> 0) each. Errors: InvalidArgument for 0;
  // ResourceExhausted if page-locked memory cannot be had (the caller may copy without);
  // Internal for other CUDA errors.
  static absl::StatusOr<std::unique_ptr<BounceCopier>> Create(size_t buffer_bytes);
  ~BounceCopier();
  BounceCopier(const BounceCopier&) = delete;
  BounceCopier& operator=(const BounceCopier&) = delete;

  // Copies `size` bytes of host memory at `host_src` to `device_dst` (device memory of any
  // device). Returns once every part has been copied into a buffer and queued; the source may
  // then be reused, the destination only after Finish(). Errors: as DeviceCopier::DeviceOf;
  // Internal for CUDA errors (the destination is then undefined).
  absl::Status ToDevice(void* device_dst, const void* host_src, size_t size);

  // Waits for every copy queued since the last Finish(). Errors: Internal for a failed copy.
  absl::Status Finish();

 private:
  explicit BounceCopier(size_t buffer_bytes) : buffer_bytes_(buffer_bytes) {}
  struct DeviceQueue {
    int device = 0;
    void* stream = nullptr;              // cudaStream_t
    std::array<void*, 2> done{};         // cudaEvent_t: buffer i's last copy on this device
  };
  // The stream and events of `device`, created on first use.
  absl::StatusOr<DeviceQueue*> For(int device);

  const size_t buffer_bytes_;
  std::array<void*, 2> buffers_{};       // page-locked
  std::array<void*, 2> last_use_{};      // cudaEvent_t recorded after buffer i's last copy
  std::vector<std::unique_ptr<DeviceQueue>> devices_;
  int next_ = 0;                         // the buffer the next part goes into
};

}  // namespace tessera

#endif  // TESSERA_CLIENT_BOUNCE_COPY_H_
