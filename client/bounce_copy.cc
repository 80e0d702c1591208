#include "client/bounce_copy.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "client/device_copy.h"
#include "client/on_device.h"
#include "cuda_runtime_api.h"
#include "shm/cuda_host.h"

namespace tessera {

absl::StatusOr<std::unique_ptr<BounceCopier>> BounceCopier::Create(size_t buffer_bytes) {
  if (buffer_bytes == 0) {
    return absl::InvalidArgumentError("BounceCopier needs buffers of > 0 bytes");
  }
  std::unique_ptr<BounceCopier> copier(new BounceCopier(buffer_bytes));
  for (void*& buffer : copier->buffers_) {
    const cudaError_t err = cudaHostAlloc(&buffer, buffer_bytes, cudaHostAllocPortable);
    if (err != cudaSuccess) {
      buffer = nullptr;
      (void)cudaGetLastError();
      return absl::ResourceExhaustedError(
          absl::StrCat("cudaHostAlloc of ", buffer_bytes, " bytes: ", cudaGetErrorString(err)));
    }
  }
  return copier;
}

namespace {

// Destroys a device queue's events and stream (null handles are skipped).
void Destroy(const std::array<void*, 2>& events, void* stream) {
  for (void* event : events) {
    if (event != nullptr) (void)cudaEventDestroy(static_cast<cudaEvent_t>(event));
  }
  if (stream != nullptr) (void)cudaStreamDestroy(static_cast<cudaStream_t>(stream));
}

}  // namespace

BounceCopier::~BounceCopier() {
  (void)Finish();
  for (auto& on : devices_) Destroy(on->done, on->stream);
  for (void* buffer : buffers_) {
    if (buffer != nullptr) (void)cudaFreeHost(buffer);
  }
}

absl::StatusOr<BounceCopier::DeviceQueue*> BounceCopier::For(int device) {
  for (auto& on : devices_) {
    if (on->device == device) return on.get();
  }
  auto on = std::make_unique<DeviceQueue>();
  on->device = device;
  const cudaError_t err = OnDevice(device, [&] {
    cudaStream_t stream = nullptr;
    cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    on->stream = stream;
    for (void*& event : on->done) {
      if (e != cudaSuccess) break;
      cudaEvent_t made = nullptr;
      e = cudaEventCreateWithFlags(&made, cudaEventDisableTiming);
      event = made;
    }
    return e;
  });
  if (err != cudaSuccess) {  // not kept: a later call tries again
    Destroy(on->done, on->stream);
    return CudaStatus(err, "creating a stream and events");
  }
  devices_.push_back(std::move(on));
  return devices_.back().get();
}

absl::Status BounceCopier::ToDevice(void* device_dst, const void* host_src, size_t size) {
  if (size == 0) return absl::OkStatus();
  absl::StatusOr<int> device = DeviceCopier::DeviceOf(device_dst);
  if (!device.ok()) return device.status();
  absl::StatusOr<DeviceQueue*> on = For(*device);
  if (!on.ok()) return on.status();
  auto* stream = static_cast<cudaStream_t>((*on)->stream);
  for (size_t done = 0; done < size;) {
    const size_t n = std::min(buffer_bytes_, size - done);
    const int b = next_;
    next_ = 1 - next_;
    // The buffer's last copy (on whichever device) must have read it before it is refilled.
    if (last_use_[b] != nullptr) {
      const cudaError_t err = cudaEventSynchronize(static_cast<cudaEvent_t>(last_use_[b]));
      if (err != cudaSuccess) return CudaStatus(err, "cudaEventSynchronize");
    }
    std::memcpy(buffers_[b], static_cast<const char*>(host_src) + done, n);
    cudaError_t err = cudaMemcpyAsync(static_cast<char*>(device_dst) + done, buffers_[b], n,
                                      cudaMemcpyHostToDevice, stream);
    if (err != cudaSuccess) return CudaStatus(err, "cudaMemcpyAsync(HostToDevice)");
    auto* event = static_cast<cudaEvent_t>((*on)->done[b]);
    if ((err = cudaEventRecord(event, stream)) != cudaSuccess) {
      return CudaStatus(err, "cudaEventRecord");
    }
    last_use_[b] = event;
    done += n;
  }
  return absl::OkStatus();
}

absl::Status BounceCopier::Finish() {
  absl::Status status;
  for (auto& on : devices_) {
    if (on->stream == nullptr) continue;
    const cudaError_t err = cudaStreamSynchronize(static_cast<cudaStream_t>(on->stream));
    if (err != cudaSuccess && status.ok()) status = CudaStatus(err, "cudaStreamSynchronize");
  }
  return status;
}

}  // namespace tessera
