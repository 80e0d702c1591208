// Compiled with -mavx2 on x86-64 (common/BUILD.bazel): xxhash.h then selects its AVX2
// kernels. Every xxhash function is inlined here with internal linkage (XXH_INLINE_ALL), so
// nothing clashes with the baseline build in checksum.cc; nothing here runs before the CPU
// was asked (checksum.cc Avx2Available), not even a static initializer.
#include "common/xxh3_avx2.h"

#define XXH_INLINE_ALL
#include "xxhash.h"

namespace tessera {
namespace checksum_internal {

#if defined(__x86_64__) && defined(__AVX2__)

const bool kAvx2Built = true;

uint64_t Avx2Xxh3(const void* data, size_t size) { return XXH3_64bits(data, size); }

void Avx2Update(void* xxh3_state, const void* data, size_t size) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(xxh3_state), data, size);
}

#else  // no AVX2 build on this architecture: the baseline serves

const bool kAvx2Built = false;
uint64_t Avx2Xxh3(const void*, size_t) { return 0; }
void Avx2Update(void*, const void*, size_t) {}

#endif

}  // namespace checksum_internal
}  // namespace tessera
