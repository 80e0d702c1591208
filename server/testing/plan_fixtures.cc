#include "server/testing/plan_fixtures.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/checksum.h"

namespace tessera {

v1::ShardDesc Param(const std::string& fqn, std::vector<int64_t> shape,
                    std::vector<int64_t> offsets, std::vector<int64_t> lengths,
                    std::vector<std::string> replicated_over) {
  v1::ShardDesc s;
  s.set_fqn(fqn);
  s.set_kind(v1::SHARD_KIND_PARAM);
  s.set_dtype(v1::DTYPE_F32);
  s.mutable_global_shape()->Add(shape.begin(), shape.end());
  s.mutable_box()->mutable_offsets()->Add(offsets.begin(), offsets.end());
  s.mutable_box()->mutable_lengths()->Add(lengths.begin(), lengths.end());
  for (std::string& dim : replicated_over) s.add_replicated_over(std::move(dim));
  s.set_nbytes(BoxBytes(s.box()));
  return s;
}

v1::ShardDesc Whole(const std::string& fqn, std::vector<int64_t> shape,
                    std::vector<std::string> replicated_over) {
  std::vector<int64_t> zeros(shape.size(), 0);
  return Param(fqn, shape, zeros, shape, std::move(replicated_over));
}

uint64_t BoxBytes(const v1::Box& box) {
  uint64_t elements = 1;
  for (int64_t l : box.lengths()) elements *= l;
  return elements * 4;
}

std::string ChunkBytes(const std::string& key, const v1::Box& box, uint32_t salt) {
  const std::string seed = absl::StrCat(key, "|", absl::StrJoin(box.offsets(), ","), "|",
                                        absl::StrJoin(box.lengths(), ","), "|", salt);
  uint64_t x = Xxh3(seed.data(), seed.size());
  std::string bytes(BoxBytes(box), '\0');
  for (char& b : bytes) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    b = static_cast<char>(x >> 56);
  }
  return bytes;
}

std::vector<uint64_t> Blocks(const std::string& bytes, uint32_t block_size) {
  return BlockChecksums(bytes.data(), bytes.size(), block_size);
}

}  // namespace tessera
