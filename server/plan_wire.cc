#include "server/plan_wire.h"

namespace tessera {

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

}  // namespace tessera
