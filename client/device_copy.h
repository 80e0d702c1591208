// DeviceCopier: asynchronous copies between CUDA device memory and host memory, one stream per
// device, for the client's snapshot (device -> staging) and load (staging -> device).
//
// Compiled always (libcudart is linked into every binary); only used when a TensorRef says
// Memory::kCuda, so a CPU-only trainer never initialises CUDA. Copies into or out of host
// memory run at full bandwidth only if that memory is page-locked in this process (the client
// pins its staging mapping, see ClientOptions::pin_staging).
//
// Lifecycle: streams are created on first use per device and destroyed with the copier.
// Thread-safety: not thread-safe; the client serialises its use.
#ifndef TESSERA_CLIENT_DEVICE_COPY_H_
#define TESSERA_CLIENT_DEVICE_COPY_H_

#include <cstddef>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tessera {

class DeviceCopier {
 public:
  DeviceCopier() = default;
  ~DeviceCopier();
  DeviceCopier(const DeviceCopier&) = delete;
  DeviceCopier& operator=(const DeviceCopier&) = delete;

  // The device that owns `ptr`. Errors: FailedPrecondition if no GPU is available;
  // InvalidArgument if `ptr` is not device (or managed) memory; Internal for CUDA errors.
  static absl::StatusOr<int> DeviceOf(const void* ptr);

  // Enqueues a copy of `size` bytes from device memory to host memory on the stream of the
  // device that owns `device_src`. Errors: as DeviceOf; Internal if the copy cannot be queued.
  absl::Status ToHost(void* host_dst, const void* device_src, size_t size);

  // Enqueues a copy of `size` bytes from host memory to device memory. Errors: as ToHost.
  absl::Status ToDevice(void* device_dst, const void* host_src, size_t size);

  // Waits for every copy enqueued since the last Synchronize(). Errors: Internal with CUDA's
  // error string if a copy failed (the destination is then undefined).
  absl::Status Synchronize();

  // Waits until all work queued on `device` (any stream) has finished: the copier's streams
  // do not otherwise order after the trainer's kernels. Errors: Internal for CUDA errors
  // (including an earlier kernel's failure).
  static absl::Status WaitForDevice(int device);

  // An event recorded now on `stream` (a cudaStream_t; null: the legacy default stream), for
  // an overlapped save: its copies must follow the work queued there so far, not the work the
  // trainer queues after. Destroy it with DestroyEvent. Errors: Internal for CUDA errors.
  static absl::StatusOr<void*> RecordEvent(void* stream);
  static void DestroyEvent(void* event);

  // Until Synchronize, every stream this copier queues a copy on first waits for `event`
  // (null: none). Not owned.
  void set_wait_event(void* event) { wait_event_ = event; }

 private:
  // The stream of `device`, created on first use.
  absl::StatusOr<void*> StreamFor(int device);
  // Notes `stream` as pending; the first time since Synchronize it waits for wait_event_.
  absl::Status AddPending(void* stream);

  std::vector<std::pair<int, void*>> streams_;  // (device, cudaStream_t)
  std::vector<void*> pending_;                  // streams with copies since Synchronize()
  void* wait_event_ = nullptr;                  // cudaEvent_t the pending streams wait for
};

}  // namespace tessera

#endif  // TESSERA_CLIENT_DEVICE_COPY_H_
