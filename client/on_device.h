// OnDevice: runs CUDA calls with a given device current, then restores the caller's.
//
// Streams and events belong to the device current when they are made; the trainer's thread
// may have another one current, which must be left as it was. Internal to the client's
// CUDA copiers (client/device_copy.h, client/bounce_copy.h).
//
// Thread-safety: per thread (the current device is the calling thread's).
#ifndef TESSERA_CLIENT_ON_DEVICE_H_
#define TESSERA_CLIENT_ON_DEVICE_H_

#include "cuda_runtime_api.h"

namespace tessera {

// Runs `call` (returning cudaError_t) with `device` current and returns its error, or the
// error of switching to `device`.
template <typename Call>
cudaError_t OnDevice(int device, Call call) {
  int previous = 0;
  cudaError_t err = cudaGetDevice(&previous);
  if (err != cudaSuccess) return err;
  if (previous != device && (err = cudaSetDevice(device)) != cudaSuccess) return err;
  err = call();
  if (previous != device) (void)cudaSetDevice(previous);
  return err;
}

}  // namespace tessera

#endif  // TESSERA_CLIENT_ON_DEVICE_H_
