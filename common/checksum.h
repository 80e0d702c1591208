// XXH3-64 checksums (libxxhash): whole buffers, fixed-size blocks, and a streaming hasher.
//
// Chunks are checksummed per block (kDefaultBlockSize) so a reader that needs only part of a
// chunk verifies only the blocks it reads.
//
// Thread-safety: the free functions are pure; a StreamingHasher is not thread-safe.
#ifndef TESSERA_COMMON_CHECKSUM_H_
#define TESSERA_COMMON_CHECKSUM_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace tessera {

inline constexpr uint32_t kDefaultBlockSize = 4u << 20;  // 4 MiB

// XXH3-64 of data[0, size). Uses XXH3's AVX2 kernels where the CPU has them
// (common/xxh3_avx2.h); the digests are the same everywhere.
uint64_t Xxh3(const void* data, size_t size);

// Bytes [offset, offset + length) of some buffer, and the XXH3-64 they must hash to: a
// checksum block, located, left for its reader to check (format/checkpoint_reader.h
// LocateInMemory, client/verified_copy.h).
struct BlockCheck {
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t xxh3 = 0;
};

// XXH3-64 of each consecutive `block_size` bytes of data[0, size); the last block may be
// short. Zero bytes give no blocks. `block_size` must be > 0.
std::vector<uint64_t> BlockChecksums(const void* data, size_t size, uint32_t block_size);

// The digest replicas are compared by: XXH3-64 of the chunk's block checksums (little-endian
// uint64 each) as BlockChecksums computes them. A writer gets it from the checksums it reports;
// a replica from the same computation over its staged bytes.
uint64_t ChunkDigest(const std::vector<uint64_t>& block_xxh3);

// The most bytes a reader that checks what it receives takes in one receive before it hashes
// them (client/peer_fetch.h FetchVerified; the link it is judged against,
// tests/bench/loopback_link.h): what the kernel just wrote is hashed from the core's cache.
// tests/bench/peer_memory_benchmark (256 MiB over 2 and 4 connections, the 2-core VM, three runs of
// medians of 3, the builds alternating) took 58.2-66.7 and 59.3-65.2 ms receiving fixed 64 KiB
// pieces, 51.8-55.8 and 53.5-55.4 ms with fixed 1 MiB pieces, 52.5-56.2 and 53.3-56.6 ms
// receiving what had arrived up to 1 MiB (plain loopback sockets: 39.4-43.1 and 35.8-44.4
// ms). Smaller caps cost more than they gain in cache (256 KiB: 58.8 and 57.0 ms).
inline constexpr uint64_t kReceiveThenHashBytes = uint64_t{1} << 20;

// Incremental XXH3-64: Update() any split of the bytes gives the same Digest() as Xxh3().
class StreamingHasher {
 public:
  StreamingHasher();
  ~StreamingHasher();
  StreamingHasher(const StreamingHasher&) = delete;
  StreamingHasher& operator=(const StreamingHasher&) = delete;

  void Update(const void* data, size_t size);
  uint64_t Digest() const;
  void Reset();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace tessera

#endif  // TESSERA_COMMON_CHECKSUM_H_
