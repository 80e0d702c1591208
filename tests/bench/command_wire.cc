#include "tests/bench/command_wire.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/wire_format_lite.h"

namespace tessera {
namespace {

using google::protobuf::internal::WireFormatLite;

// Copies the fields of `in` to *out, but the length-delimited field `take`, whose bytes are
// appended to *taken: a message field that occurs more than once on the wire is merged, and
// the concatenation of its occurrences parses as that merge. Returns whether `in` parses;
// *found (if not null) says whether `take` occurred.
bool SplitField(absl::string_view in, int take, std::string* out, std::string* taken,
                bool* found = nullptr) {
  google::protobuf::io::CodedInputStream input(reinterpret_cast<const uint8_t*>(in.data()),
                                               static_cast<int>(in.size()));
  google::protobuf::io::StringOutputStream sink(out);
  google::protobuf::io::CodedOutputStream output(&sink);
  if (found != nullptr) *found = false;
  std::string occurrence;
  while (const uint32_t tag = input.ReadTag()) {
    if (WireFormatLite::GetTagFieldNumber(tag) == take &&
        WireFormatLite::GetTagWireType(tag) == WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
      uint32_t length = 0;
      if (!input.ReadVarint32(&length) || !input.ReadString(&occurrence, length)) return false;
      taken->append(occurrence);
      if (found != nullptr) *found = true;
      continue;
    }
    if (!WireFormatLite::SkipField(&input, tag, &output)) return false;
  }
  return input.ConsumedEntireMessage() && !output.HadError();
}

absl::Status Corrupt(absl::string_view why) {
  return absl::DataLossError(absl::StrCat("a Command that does not parse: ", why));
}

}  // namespace

absl::Status ParseCommandKeepingAssignment(absl::string_view wire, v1::Command* command,
                                           std::string* assignment) {
  std::string rest, pin, pin_rest;
  bool is_pin = false;
  assignment->clear();
  // `rest` is complete once SplitField returns (its output stream is flushed and gone).
  if (!SplitField(wire, v1::Command::kPinFieldNumber, &rest, &pin, &is_pin) ||
      !command->ParseFromString(rest)) {
    return Corrupt("malformed");
  }
  if (!is_pin) return absl::OkStatus();
  // Which member of the oneof came last on the wire is lost once the PIN is taken out; the
  // coordinator never sends two.
  if (command->body_case() != v1::Command::BODY_NOT_SET) {
    return Corrupt("a PIN beside another command of the oneof");
  }
  // *assignment stays empty if the PIN has none.
  if (!SplitField(pin, v1::PinCommand::kAssignmentFieldNumber, &pin_rest, assignment) ||
      !command->mutable_pin()->ParseFromString(pin_rest)) {
    return Corrupt("malformed PIN");
  }
  return absl::OkStatus();
}

}  // namespace tessera
