#include "tests/bench/command_wire.h"

#include <cstdint>

#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/wire_format_lite.h"

namespace tessera {
namespace {

using google::protobuf::internal::WireFormatLite;

// Copies the fields of `in` to *out, but the length-delimited field `take`, whose bytes go to
// *taken (*found says whether it was there). False if `in` does not parse.
bool SplitField(absl::string_view in, int take, std::string* out, std::string* taken,
                bool* found) {
  google::protobuf::io::CodedInputStream input(reinterpret_cast<const uint8_t*>(in.data()),
                                               static_cast<int>(in.size()));
  google::protobuf::io::StringOutputStream sink(out);
  google::protobuf::io::CodedOutputStream output(&sink);
  *found = false;
  while (const uint32_t tag = input.ReadTag()) {
    if (WireFormatLite::GetTagFieldNumber(tag) == take &&
        WireFormatLite::GetTagWireType(tag) == WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
      uint32_t length = 0;
      if (!input.ReadVarint32(&length) || !input.ReadString(taken, length)) return false;
      *found = true;
      continue;
    }
    if (!WireFormatLite::SkipField(&input, tag, &output)) return false;
  }
  return input.ConsumedEntireMessage() && !output.HadError();
}

}  // namespace

absl::Status ParseCommandKeepingAssignment(absl::string_view wire, v1::Command* command,
                                           std::string* assignment) {
  const absl::Status corrupt = absl::DataLossError("a Command that does not parse");
  std::string rest, pin, pin_rest;
  bool is_pin = false;
  assignment->clear();
  // `rest` is complete once SplitField returns (its output stream is flushed and gone).
  if (!SplitField(wire, v1::Command::kPinFieldNumber, &rest, &pin, &is_pin) ||
      !command->ParseFromString(rest)) {
    return corrupt;
  }
  if (!is_pin) return absl::OkStatus();
  bool has_assignment = false;  // *assignment stays empty without one
  if (!SplitField(pin, v1::PinCommand::kAssignmentFieldNumber, &pin_rest, assignment,
                  &has_assignment) ||
      !command->mutable_pin()->ParseFromString(pin_rest)) {
    return corrupt;
  }
  return absl::OkStatus();
}

}  // namespace tessera
