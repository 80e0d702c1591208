#include "agent/cuda_host.h"

#include <stdlib.h>

#include "gtest/gtest.h"

namespace tessera {
namespace {

// This test runs on machines with and without a GPU; each branch checks what must hold there.
TEST(CudaHost, RegisterHost_MatchesGpuAvailability) {
  const bool gpu = GpuAvailable();
  EXPECT_EQ(GpuAvailable(), gpu);  // cached, stable
  void* p = nullptr;
  ASSERT_EQ(posix_memalign(&p, 4096, 1 << 20), 0);
  absl::Status registered = RegisterHost(p, 1 << 20);
  if (gpu) {
    EXPECT_TRUE(registered.ok()) << registered;
    EXPECT_TRUE(UnregisterHost(p).ok());
    // Unregistering twice is a CUDA error, reported, not a crash.
    EXPECT_FALSE(UnregisterHost(p).ok());
  } else {
    EXPECT_EQ(registered.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(UnregisterHost(p).code(), absl::StatusCode::kFailedPrecondition);
  }
  free(p);
}

}  // namespace
}  // namespace tessera
