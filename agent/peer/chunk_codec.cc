#include "agent/peer/chunk_codec.h"

#include <climits>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/wire_format_lite.h"

namespace tessera {
namespace {

using google::protobuf::internal::WireFormatLite;
using google::protobuf::io::CodedInputStream;
using google::protobuf::io::CodedOutputStream;
using google::protobuf::io::StringOutputStream;

absl::Status Place(const std::function<DataPlacement(uint64_t)>& place, uint64_t data_len,
                   DataPlacement* placement) {
  *placement = place(data_len);
  if (placement->consume &&
      (placement->skip > data_len || placement->write > data_len - placement->skip)) {
    return absl::InvalidArgumentError(absl::StrCat("chunk placement (skip ", placement->skip,
                                                   ", write ", placement->write, ") exceeds its ",
                                                   data_len, " data bytes"));
  }
  return absl::OkStatus();
}

}  // namespace

std::string EncodeChunkPrefix(const google::protobuf::MessageLite& header, int data_field,
                              uint64_t data_len) {
  std::string out = header.SerializeAsString();
  {
    StringOutputStream stream(&out);
    CodedOutputStream coded(&stream);
    coded.WriteTag(WireFormatLite::MakeTag(data_field, WireFormatLite::WIRETYPE_LENGTH_DELIMITED));
    coded.WriteVarint64(data_len);
  }
  return out;
}

absl::Status DecodeChunk(google::protobuf::io::ZeroCopyInputStream* input, uint64_t total_size,
                         int data_field, google::protobuf::MessageLite* header,
                         const std::function<DataPlacement(uint64_t data_len)>& place) {
  // Errors name the message type: "tessera.v1.SliceChunk: truncated data".
  const std::string type = header->GetTypeName();
  auto invalid = [&type](auto&&... what) {
    return absl::InvalidArgumentError(absl::StrCat(type, ": ", what...));
  };
  if (total_size > INT_MAX) return invalid(total_size, " bytes");
  CodedInputStream in(input);
  in.SetTotalBytesLimit(INT_MAX);
  std::string header_bytes;  // the header fields, re-emitted as they are parsed
  std::string buffered;      // `data`, if it was not the last field
  int64_t direct_len = -1;   // `data`'s length, if it is the last field (left unread in `in`)
  {
    StringOutputStream header_stream(&header_bytes);
    CodedOutputStream header_out(&header_stream);
    while (const uint32_t tag = in.ReadTag()) {
      if (WireFormatLite::GetTagFieldNumber(tag) != data_field) {
        if (!WireFormatLite::SkipField(&in, tag, &header_out)) {
          return invalid("malformed header");
        }
        continue;
      }
      if (WireFormatLite::GetTagWireType(tag) != WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
        return invalid("data has the wrong wire type");
      }
      uint32_t len = 0;
      if (!in.ReadVarint32(&len) || len > INT_MAX) {
        return invalid("malformed data length");
      }
      // The length comes from the peer: checked against what is left of the message before
      // anything is sized by it.
      const uint64_t position = static_cast<uint64_t>(in.CurrentPosition());
      const uint64_t left = position <= total_size ? total_size - position : 0;
      if (len > left) {
        return invalid("data of ", len, " bytes exceeds the ", left, " bytes left in the message");
      }
      if (len == left) {
        direct_len = len;
        break;
      }
      buffered.resize(len);
      if (len > 0 && !in.ReadRaw(&buffered[0], static_cast<int>(len))) {
        return invalid("truncated data");
      }
    }
  }  // header_out is flushed into header_bytes here
  if (direct_len < 0 && static_cast<uint64_t>(in.CurrentPosition()) != total_size) {
    return invalid("malformed message");
  }
  if (!header->ParseFromString(header_bytes)) {
    return invalid("malformed header");
  }
  const uint64_t data_len = direct_len >= 0 ? static_cast<uint64_t>(direct_len) : buffered.size();
  DataPlacement placement;
  RETURN_IF_ERROR(Place(place, data_len, &placement));
  if (!placement.consume || placement.write == 0) return absl::OkStatus();
  if (direct_len < 0) {
    std::memcpy(placement.dest, buffered.data() + placement.skip, placement.write);
    return absl::OkStatus();
  }
  if (!in.Skip(static_cast<int>(placement.skip)) ||
      !in.ReadRaw(placement.dest, static_cast<int>(placement.write))) {
    return invalid("truncated data");
  }
  return absl::OkStatus();
}

}  // namespace tessera
