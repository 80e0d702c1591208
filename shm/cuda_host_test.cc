// GpuAvailable() is checked against the machine, found without CUDA, so that a wrong probe
// fails here instead of silently sending a GPU machine down the CPU path (or the reverse).
// The registration cases run on the branch the machine allows; the other is skipped, naming
// why, and never counts as passed.
#include "shm/cuda_host.h"

#include <stdlib.h>
#include <unistd.h>

#include <cstring>

#include "cuda_runtime_api.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

// Whether this machine has a usable NVIDIA GPU, decided without the code under test:
// TESSERA_EXPECT_GPU=1 or 0 if set (tests/gpu/run.sh sets it from nvidia-smi), else whether
// the driver's first device node exists.
bool MachineHasGpu() {
  if (const char* expect = getenv("TESSERA_EXPECT_GPU"); expect != nullptr && *expect != '\0') {
    return strcmp(expect, "0") != 0;
  }
  return access("/dev/nvidia0", F_OK) == 0;
}

class PageBuffer {
 public:
  explicit PageBuffer(size_t size) : size_(size) {
    if (posix_memalign(&data_, 4096, size) != 0) data_ = nullptr;
  }
  ~PageBuffer() { free(data_); }
  void* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void* data_ = nullptr;
  size_t size_;
};

TEST(CudaHost, GpuAvailable_MatchesTheMachine) {
  EXPECT_EQ(GpuAvailable(), MachineHasGpu())
      << "TESSERA_EXPECT_GPU=" << (getenv("TESSERA_EXPECT_GPU") ? getenv("TESSERA_EXPECT_GPU") : "")
      << ", /dev/nvidia0 " << (access("/dev/nvidia0", F_OK) == 0 ? "exists" : "absent");
}

TEST(CudaHost, RegisterHost_WithGpu_PinsThenUnpins) {
  if (!MachineHasGpu()) GTEST_SKIP() << "no GPU on this machine: pinning cannot be checked";
  PageBuffer buffer(1 << 20);
  ASSERT_NE(buffer.data(), nullptr);
  absl::Status registered = RegisterHost(buffer.data(), buffer.size());
  ASSERT_TRUE(registered.ok()) << registered;
  // The driver now knows the range as page-locked host memory, to its last byte.
  cudaPointerAttributes attributes;
  ASSERT_EQ(cudaPointerGetAttributes(&attributes, static_cast<char*>(buffer.data()) +
                                                      buffer.size() - 1),
            cudaSuccess);
  EXPECT_EQ(attributes.type, cudaMemoryTypeHost);
  ASSERT_TRUE(UnregisterHost(buffer.data()).ok());
  ASSERT_EQ(cudaPointerGetAttributes(&attributes, buffer.data()), cudaSuccess);
  EXPECT_EQ(attributes.type, cudaMemoryTypeUnregistered);
  // Unregistering twice is CUDA's error, reported as Internal with its name, not a crash.
  absl::Status again = UnregisterHost(buffer.data());
  EXPECT_EQ(again.code(), absl::StatusCode::kInternal) << again;
  EXPECT_NE(again.message().find("cudaHostUnregister"), absl::string_view::npos) << again;
}

TEST(CudaHost, RegisterHost_WithoutGpu_FailedPrecondition) {
  if (MachineHasGpu()) GTEST_SKIP() << "a GPU is present: the no-GPU path cannot be checked";
  PageBuffer buffer(1 << 20);
  ASSERT_NE(buffer.data(), nullptr);
  EXPECT_EQ(RegisterHost(buffer.data(), buffer.size()).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(UnregisterHost(buffer.data()).code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace tessera
