// Protobuf wire-format encoding for the planner's output, written field by field.
//
// A million-piece plan has a million HashItems and GatherSends. Building a message per item
// and serializing it costs more than the whole validation; writing each item's few numbers
// straight into the wire format (and the writer's WriteItem, encoded once per chunk) costs a
// few stores. The encoding is protobuf's canonical proto3 encoding (zero scalars and empty strings
// omitted, sub-messages length-delimited, repeated scalars packed, fields in number order
// when the caller appends them so), so the bytes equal SerializeAsString() of the parsed
// message; planner_test checks that.
//
// Thread-safety: writers are not thread-safe; the free functions are pure.
#ifndef TESSERA_SERVER_PLAN_PLAN_WIRE_H_
#define TESSERA_SERVER_PLAN_PLAN_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "tessera/v1/types.pb.h"

namespace tessera {

// Encodes fields into a fixed buffer of kCapacity bytes on the stack: the few small fields
// around an item's shared bytes. The caller keeps within the capacity (a varint field takes
// at most 11 bytes for field numbers below 16).
class WireBuffer {
 public:
  static constexpr size_t kCapacity = 96;

  // A varint field (uint32/64, int32/64, enum, bool); omitted if zero. Negative int32 and
  // int64 values take ten bytes, as in protobuf.
  void Varint(int field, uint64_t value) {
    if (value == 0) return;
    RawVarint(static_cast<uint64_t>(field) << 3);
    RawVarint(value);
  }
  // The tag and length of a length-delimited field whose `length` bytes the caller appends.
  void LengthDelimited(int field, size_t length) {
    RawVarint((static_cast<uint64_t>(field) << 3) | 2);
    RawVarint(length);
  }
  // A sub-message or string field with its bytes (which must fit).
  void Message(int field, absl::string_view bytes) {
    LengthDelimited(field, bytes.size());
    if (bytes.empty()) return;
    std::memcpy(data_ + size_, bytes.data(), bytes.size());
    size_ += bytes.size();
  }
  void RawVarint(uint64_t value) {
    while (value >= 0x80) {
      data_[size_++] = static_cast<char>(value | 0x80);
      value >>= 7;
    }
    data_[size_++] = static_cast<char>(value);
  }

  absl::string_view view() const { return absl::string_view(data_, size_); }
  size_t size() const { return size_; }
  void clear() { size_ = 0; }

 private:
  char data_[kCapacity];
  size_t size_ = 0;
};

// Appends fields of any size to a string.
class WireWriter {
 public:
  explicit WireWriter(std::string* out) : out_(out) {}

  void Varint(int field, uint64_t value) {
    WireBuffer b;
    b.Varint(field, value);
    out_->append(b.view().data(), b.size());
  }
  // A string field; omitted if empty.
  void String(int field, absl::string_view value) {
    if (!value.empty()) Message(field, value);
  }
  // A sub-message (already encoded) or bytes; present even if empty.
  void Message(int field, absl::string_view encoded) {
    WireBuffer b;
    b.LengthDelimited(field, encoded.size());
    out_->append(b.view().data(), b.size());
    out_->append(encoded.data(), encoded.size());
  }
  // A packed repeated int64 field; omitted if empty.
  void PackedInt64(int field, absl::Span<const int64_t> values);

 private:
  std::string* out_;
};

// The encoded body of a v1::Box.
std::string EncodeBox(const v1::Box& box);

// The ranks an encoded v1::RankAssignment exchanges DP slices with: the leaders of its
// GatherSends and the peers its WriteItems' ChunkSources name, sorted and distinct, without
// `self`. Reads the wire format directly (nothing is parsed into messages), so that a
// coordinator can tell every rank of a million-piece plan whom it talks to in one pass over
// the bytes. Errors: DataLoss if `assignment` is not a valid encoding.
absl::StatusOr<std::vector<uint32_t>> AssignmentPeers(absl::string_view assignment,
                                                      uint32_t self);

}  // namespace tessera

#endif  // TESSERA_SERVER_PLAN_PLAN_WIRE_H_
