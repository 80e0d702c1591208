#include "common/checksum.h"

#include <algorithm>

#include "common/xxh3_avx2.h"

#define XXH_INLINE_ALL
#include "xxhash.h"

namespace tessera {
namespace {

// Whether the AVX2 kernels may run: built (x86-64) and the CPU has AVX2. Asked here, in code
// compiled for the baseline.
bool Avx2Available() {
  static const bool available = [] {
#if defined(__x86_64__)
    __builtin_cpu_init();
    return checksum_internal::kAvx2Built && __builtin_cpu_supports("avx2") != 0;
#else
    return false;
#endif
  }();
  return available;
}

}  // namespace

uint64_t Xxh3(const void* data, size_t size) {
  if (Avx2Available()) return checksum_internal::Avx2Xxh3(data, size);
  return XXH3_64bits(data, size);
}

std::vector<uint64_t> BlockChecksums(const void* data, size_t size, uint32_t block_size) {
  std::vector<uint64_t> sums;
  if (block_size == 0) return sums;
  sums.reserve((size + block_size - 1) / block_size);
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t off = 0; off < size; off += block_size) {
    sums.push_back(Xxh3(p + off, std::min<size_t>(block_size, size - off)));
  }
  return sums;
}

uint64_t ChunkDigest(const std::vector<uint64_t>& block_xxh3) {
  static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "digest assumes little-endian");
  return Xxh3(block_xxh3.data(), block_xxh3.size() * sizeof(uint64_t));
}

struct StreamingHasher::State {
  XXH3_state_t xxh;
};

StreamingHasher::StreamingHasher() : state_(std::make_unique<State>()) { Reset(); }
StreamingHasher::~StreamingHasher() = default;

void StreamingHasher::Update(const void* data, size_t size) {
  if (Avx2Available()) {
    checksum_internal::Avx2Update(&state_->xxh, data, size);
    return;
  }
  XXH3_64bits_update(&state_->xxh, data, size);
}

uint64_t StreamingHasher::Digest() const { return XXH3_64bits_digest(&state_->xxh); }

void StreamingHasher::Reset() { XXH3_64bits_reset(&state_->xxh); }

}  // namespace tessera
