// Test fixtures shared by the coordinator's tests (session manager, gRPC protocol): F32 shard
// descriptions and the deterministic bytes fake agents stage for them.
//
// Thread-safety: pure functions.
#ifndef TESSERA_SERVER_TESTING_PLAN_FIXTURES_H_
#define TESSERA_SERVER_TESTING_PLAN_FIXTURES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "tessera/v1/types.pb.h"

namespace tessera {

// An F32 piece of `fqn`: `lengths` at `offsets` of a tensor of `shape`.
v1::ShardDesc Param(const std::string& fqn, std::vector<int64_t> shape,
                    std::vector<int64_t> offsets, std::vector<int64_t> lengths,
                    std::vector<std::string> replicated_over);

// The whole F32 tensor `fqn` of `shape`.
v1::ShardDesc Whole(const std::string& fqn, std::vector<int64_t> shape,
                    std::vector<std::string> replicated_over);

// Bytes of an F32 box.
uint64_t BoxBytes(const v1::Box& box);

// The bytes every holder of (key, box) stages: a pseudo-random pattern seeded by the piece, so
// replicas agree and distinct pieces differ. A non-zero `salt` gives other bytes (a diverged
// replica).
std::string ChunkBytes(const std::string& key, const v1::Box& box, uint32_t salt = 0);

// BlockChecksums of `bytes` with `block_size`.
std::vector<uint64_t> Blocks(const std::string& bytes, uint32_t block_size);

}  // namespace tessera

#endif  // TESSERA_SERVER_TESTING_PLAN_FIXTURES_H_
