#include "common/plan_fingerprint.h"

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/checksum.h"

namespace tessera {
namespace {

using Int64s = google::protobuf::RepeatedField<int64_t>;

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the canonical plan encoding writes integers in host order");

// Encodes a shard into a buffer that is hashed in large pieces: one bounds check per shard
// and one hash update per kBufferBytes, not one call per field.
class CanonicalEncoder {
 public:
  explicit CanonicalEncoder(StreamingHasher* hasher) : hasher_(hasher), buffer_(kBufferBytes) {}

  void Str(absl::string_view s) {
    Reserve(4 + s.size());
    PutStr(s);
  }
  void U32(uint32_t v) {
    Reserve(4);
    Put(&v, 4);
  }
  void U64(uint64_t v) {
    Reserve(8);
    Put(&v, 8);
  }
  void Shard(const v1::ShardDesc& s) {
    size_t need = 64 + s.fqn().size() + s.state_key().size() +
                  8 * (s.global_shape_size() + s.box().offsets_size() + s.box().lengths_size());
    for (const std::string& dim : s.replicated_over()) need += 4 + dim.size();
    Reserve(need);
    PutStr(s.fqn());
    const uint8_t flags = static_cast<uint8_t>(s.has_flat_range() | (s.state_absent() << 1));
    Put(&flags, 1);
    const uint32_t kind = s.kind(), dtype = s.dtype();
    Put(&kind, 4);
    Put(&dtype, 4);
    PutInts(s.global_shape());
    PutInts(s.box().offsets());
    PutInts(s.box().lengths());
    if (s.has_flat_range()) {
      const int64_t range[2] = {s.flat_range().begin(), s.flat_range().end()};
      Put(range, 16);
    }
    const uint32_t dims = s.replicated_over_size();
    Put(&dims, 4);
    for (const std::string& dim : s.replicated_over()) PutStr(dim);
    PutStr(s.state_key());
    const uint64_t nbytes = s.nbytes();
    Put(&nbytes, 8);
  }
  uint64_t Finish() {
    Flush();
    return hasher_->Digest();
  }

 private:
  static constexpr size_t kBufferBytes = 1 << 16;

  // Makes room for `size` more bytes.
  void Reserve(size_t size) {
    if (used_ + size <= buffer_.size()) return;
    Flush();
    if (size > buffer_.size()) buffer_.resize(size);
  }
  void Put(const void* data, size_t size) {
    if (size == 0) return;  // `data` may be null (an empty repeated field)
    std::memcpy(buffer_.data() + used_, data, size);
    used_ += size;
  }
  void PutStr(absl::string_view s) {
    const uint32_t size = static_cast<uint32_t>(s.size());
    Put(&size, 4);
    Put(s.data(), s.size());
  }
  void PutInts(const Int64s& values) {
    const uint32_t size = values.size();
    Put(&size, 4);
    Put(values.data(), values.size() * sizeof(int64_t));
  }
  void Flush() {
    hasher_->Update(buffer_.data(), used_);
    used_ = 0;
  }

  StreamingHasher* hasher_;
  std::vector<char> buffer_;
  size_t used_ = 0;
};

}  // namespace

class LocalPlanHasher::Encoder {
 public:
  Encoder() : out(&hasher) {}
  StreamingHasher hasher;
  CanonicalEncoder out;
};

LocalPlanHasher::LocalPlanHasher(uint32_t rank, size_t shards)
    : encoder_(std::make_unique<Encoder>()) {
  encoder_->out.Str("tessera.local_plan.v1");
  encoder_->out.U32(rank);
  encoder_->out.U32(static_cast<uint32_t>(shards));
}

LocalPlanHasher::~LocalPlanHasher() = default;

void LocalPlanHasher::Add(const v1::ShardDesc& shard) { encoder_->out.Shard(shard); }

uint64_t LocalPlanHasher::Finish() { return encoder_->out.Finish(); }

uint64_t CombineFingerprints(const MeshLayout& layout, absl::Span<const uint64_t> per_rank) {
  StreamingHasher hasher;
  CanonicalEncoder out(&hasher);
  out.Str("tessera.plan.v1");
  out.U32(static_cast<uint32_t>(layout.dim_count()));
  for (size_t i = 0; i < layout.dim_count(); ++i) {
    out.Str(layout.dim_name(i));
    out.U32(layout.degree(i));
  }
  out.U32(static_cast<uint32_t>(per_rank.size()));
  for (uint64_t fp : per_rank) out.U64(fp);
  return out.Finish();
}

}  // namespace tessera
