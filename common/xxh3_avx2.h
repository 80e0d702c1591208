// XXH3-64 built for AVX2, for common/checksum.cc to choose at run time when the CPU has it.
//
// Why our own: Debian's libxxhash is compiled for the x86-64 baseline (SSE2), and upstream's
// run-time dispatcher (xxh_x86dispatch.c) is not packaged. On data in cache — a block hashed
// right after it was copied (client/verified_copy.h) — the AVX2 kernel is ~1.4x faster (17 vs
// 24 GB/s on one EPYC core, measured with the library's header in both builds). The digests
// are XXH3's, bit for bit (common/checksum_test.cc compares both with libxxhash).
//
// Internal to common:checksum. Thread-safety: pure functions; a state is the caller's.
#ifndef TESSERA_COMMON_XXH3_AVX2_H_
#define TESSERA_COMMON_XXH3_AVX2_H_

#include <cstddef>
#include <cstdint>

namespace tessera {
namespace checksum_internal {

// True if this build compiled the kernels below for AVX2 (x86-64). Data, not code: whether
// the CPU runs them is asked by common/checksum.cc, compiled for the baseline.
extern const bool kAvx2Built;

// XXH3_64bits and XXH3_64bits_update; call only if kAvx2Built and the CPU has AVX2. `xxh3_state` is an
// XXH3_state_t (the same type in every translation unit including xxhash.h).
uint64_t Avx2Xxh3(const void* data, size_t size);
void Avx2Update(void* xxh3_state, const void* data, size_t size);

}  // namespace checksum_internal
}  // namespace tessera

#endif  // TESSERA_COMMON_XXH3_AVX2_H_
