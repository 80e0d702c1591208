#include "server/plan/plan_wire.h"

#include <algorithm>
#include <optional>

#include "absl/status/status.h"
#include "tessera/v1/coordinator.pb.h"

namespace tessera {
namespace {

// Reads fields of one encoded message in order. Any malformation ends the reader (ok() false).
class WireReader {
 public:
  explicit WireReader(absl::string_view bytes) : p_(bytes.data()), end_(p_ + bytes.size()) {}

  // The next field: its number and wire type, and for a varint its value, for a
  // length-delimited field its bytes. False at the end or on a malformed encoding.
  bool Next(int* field, int* wire_type, uint64_t* varint, absl::string_view* bytes) {
    if (p_ == end_ || !ok_) return false;
    std::optional<uint64_t> tag = ReadVarint();
    if (!tag.has_value() || (*tag >> 3) == 0 || (*tag >> 3) > (uint64_t{1} << 29)) {
      return Fail();
    }
    *field = static_cast<int>(*tag >> 3);
    *wire_type = static_cast<int>(*tag & 7);
    switch (*wire_type) {
      case 0: {
        std::optional<uint64_t> v = ReadVarint();
        if (!v.has_value()) return Fail();
        *varint = *v;
        return true;
      }
      case 1:
        return Skip(8);
      case 2: {
        std::optional<uint64_t> length = ReadVarint();
        if (!length.has_value() || *length > static_cast<uint64_t>(end_ - p_)) return Fail();
        *bytes = absl::string_view(p_, *length);
        p_ += *length;
        return true;
      }
      case 5:
        return Skip(4);
      default:  // groups are not used by tessera's protos
        return Fail();
    }
  }

  bool ok() const { return ok_; }

 private:
  std::optional<uint64_t> ReadVarint() {
    uint64_t value = 0;
    for (int shift = 0; shift < 64 && p_ < end_; shift += 7) {
      const uint8_t byte = static_cast<uint8_t>(*p_++);
      value |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) return value;
    }
    return std::nullopt;
  }
  bool Skip(size_t n) {
    if (n > static_cast<size_t>(end_ - p_)) return Fail();
    p_ += n;
    return true;
  }
  bool Fail() {
    ok_ = false;
    return false;
  }

  const char* p_;
  const char* const end_;
  bool ok_ = true;
};

// The value of varint field `number` of an encoded message (proto3: 0 when absent); nullopt
// if the message does not parse.
std::optional<uint64_t> VarintField(absl::string_view message, int number) {
  WireReader reader(message);
  int field, wire_type;
  uint64_t varint = 0, value = 0;
  absl::string_view bytes;
  while (reader.Next(&field, &wire_type, &varint, &bytes)) {
    if (field == number && wire_type == 0) value = varint;
  }
  if (!reader.ok()) return std::nullopt;
  return value;
}

}  // namespace

void WireWriter::PackedInt64(int field, absl::Span<const int64_t> values) {
  if (values.empty()) return;
  std::string body;
  for (int64_t v : values) {
    WireBuffer b;
    b.RawVarint(static_cast<uint64_t>(v));
    body.append(b.view().data(), b.size());
  }
  Message(field, body);
}

std::string EncodeBox(const v1::Box& box) {
  std::string out;
  WireWriter w(&out);
  w.PackedInt64(v1::Box::kOffsetsFieldNumber,
                absl::MakeConstSpan(box.offsets().data(), box.offsets_size()));
  w.PackedInt64(v1::Box::kLengthsFieldNumber,
                absl::MakeConstSpan(box.lengths().data(), box.lengths_size()));
  return out;
}

absl::StatusOr<std::vector<uint32_t>> AssignmentPeers(absl::string_view assignment,
                                                      uint32_t self) {
  std::vector<uint32_t> peers;
  auto add = [&](std::optional<uint64_t> rank) {
    if (!rank.has_value()) return false;
    if (*rank != self) peers.push_back(static_cast<uint32_t>(*rank));
    return true;
  };
  const absl::Status corrupt = absl::DataLossError("a rank assignment does not parse");
  WireReader reader(assignment);
  int field, wire_type;
  uint64_t varint;
  absl::string_view bytes;
  while (reader.Next(&field, &wire_type, &varint, &bytes)) {
    if (wire_type != 2) continue;
    if (field == v1::RankAssignment::kSendsFieldNumber) {
      if (!add(VarintField(bytes, v1::GatherSend::kLeaderRankFieldNumber))) return corrupt;
    } else if (field == v1::RankAssignment::kWritesFieldNumber) {
      WireReader write(bytes);
      absl::string_view source;
      while (write.Next(&field, &wire_type, &varint, &source)) {
        if (wire_type == 2 && field == v1::WriteItem::kSourcesFieldNumber &&
            !add(VarintField(source, v1::ChunkSource::kRankFieldNumber))) {
          return corrupt;
        }
      }
      if (!write.ok()) return corrupt;
    }
  }
  if (!reader.ok()) return corrupt;
  std::sort(peers.begin(), peers.end());
  peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
  return peers;
}

}  // namespace tessera
