#include "client/device_copy.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "client/on_device.h"
#include "cuda_runtime_api.h"
#include "shm/cuda_host.h"

namespace tessera {
namespace {

cudaStream_t AsStream(void* stream) { return static_cast<cudaStream_t>(stream); }

}  // namespace

DeviceCopier::~DeviceCopier() {
  for (const auto& [device, stream] : streams_) (void)cudaStreamDestroy(AsStream(stream));
}

absl::StatusOr<int> DeviceCopier::DeviceOf(const void* ptr) {
  if (!GpuAvailable()) {
    return absl::FailedPreconditionError("a tensor is in CUDA memory but no GPU is available");
  }
  cudaPointerAttributes attributes;
  cudaError_t err = cudaPointerGetAttributes(&attributes, ptr);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // this error is not sticky: clear it so later calls succeed
    return CudaStatus(err, "cudaPointerGetAttributes");
  }
  if (attributes.type != cudaMemoryTypeDevice && attributes.type != cudaMemoryTypeManaged) {
    return absl::InvalidArgumentError("the pointer is not CUDA device memory");
  }
  return attributes.device;
}

absl::StatusOr<void*> DeviceCopier::StreamFor(int device) {
  for (const auto& [d, stream] : streams_) {
    if (d == device) return stream;
  }
  // A stream belongs to the device current at its creation.
  cudaStream_t stream = nullptr;
  cudaError_t err =
      OnDevice(device, [&] { return cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking); });
  if (err != cudaSuccess) return CudaStatus(err, "cudaStreamCreateWithFlags");
  streams_.emplace_back(device, stream);
  return static_cast<void*>(stream);
}

absl::Status DeviceCopier::WaitForDevice(int device) {
  cudaError_t err = OnDevice(device, [] { return cudaDeviceSynchronize(); });
  if (err != cudaSuccess) return CudaStatus(err, "cudaDeviceSynchronize");
  return absl::OkStatus();
}

absl::Status DeviceCopier::ToHost(void* host_dst, const void* device_src, size_t size) {
  if (size == 0) return absl::OkStatus();
  absl::StatusOr<int> device = DeviceOf(device_src);
  if (!device.ok()) return device.status();
  absl::StatusOr<void*> stream = StreamFor(*device);
  if (!stream.ok()) return stream.status();
  if (absl::Status added = AddPending(*stream); !added.ok()) return added;
  // A copy on a stream of another device than the current one is allowed (unified addressing).
  cudaError_t err =
      cudaMemcpyAsync(host_dst, device_src, size, cudaMemcpyDeviceToHost, AsStream(*stream));
  if (err != cudaSuccess) return CudaStatus(err, "cudaMemcpyAsync(DeviceToHost)");
  return absl::OkStatus();
}

absl::Status DeviceCopier::ToDevice(void* device_dst, const void* host_src, size_t size) {
  if (size == 0) return absl::OkStatus();
  absl::StatusOr<int> device = DeviceOf(device_dst);
  if (!device.ok()) return device.status();
  absl::StatusOr<void*> stream = StreamFor(*device);
  if (!stream.ok()) return stream.status();
  if (absl::Status added = AddPending(*stream); !added.ok()) return added;
  cudaError_t err =
      cudaMemcpyAsync(device_dst, host_src, size, cudaMemcpyHostToDevice, AsStream(*stream));
  if (err != cudaSuccess) return CudaStatus(err, "cudaMemcpyAsync(HostToDevice)");
  return absl::OkStatus();
}

absl::Status DeviceCopier::AddPending(void* stream) {
  if (std::find(pending_.begin(), pending_.end(), stream) != pending_.end()) {
    return absl::OkStatus();
  }
  pending_.push_back(stream);
  if (wait_event_ == nullptr) return absl::OkStatus();
  cudaError_t err =
      cudaStreamWaitEvent(AsStream(stream), static_cast<cudaEvent_t>(wait_event_), 0);
  if (err != cudaSuccess) return CudaStatus(err, "cudaStreamWaitEvent");
  return absl::OkStatus();
}

absl::StatusOr<void*> DeviceCopier::RecordEvent(void* stream) {
  cudaEvent_t event = nullptr;
  cudaError_t err = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
  if (err != cudaSuccess) return CudaStatus(err, "cudaEventCreateWithFlags");
  err = cudaEventRecord(event, AsStream(stream));
  if (err != cudaSuccess) {
    (void)cudaEventDestroy(event);
    return CudaStatus(err, "cudaEventRecord");
  }
  return static_cast<void*>(event);
}

void DeviceCopier::DestroyEvent(void* event) {
  if (event != nullptr) (void)cudaEventDestroy(static_cast<cudaEvent_t>(event));
}

absl::Status DeviceCopier::Synchronize() {
  absl::Status status;
  for (void* stream : pending_) {
    cudaError_t err = cudaStreamSynchronize(AsStream(stream));
    if (err != cudaSuccess && status.ok()) status = CudaStatus(err, "cudaStreamSynchronize");
  }
  pending_.clear();
  return status;
}

}  // namespace tessera
