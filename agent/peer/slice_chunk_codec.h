// Wire encoding of tessera.v1.SliceChunk without copying its data field.
//
// Generated code would copy a chunk's data twice on each side (staging -> proto string ->
// wire, and wire -> proto string -> staging). Instead the sender writes the header fields
// with generated code and appends the `data` field's tag and length, followed by the data
// bytes themselves (see GrpcPeerTransport, which passes them to gRPC as an external slice);
// the receiver parses the header, asks where the data goes, and copies the data straight from
// the received buffers into staging: one copy. The bytes on the wire are a valid SliceChunk.
//
// Thread-safety: free functions, no shared state.
#ifndef TESSERA_AGENT_PEER_SLICE_CHUNK_CODEC_H_
#define TESSERA_AGENT_PEER_SLICE_CHUNK_CODEC_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "google/protobuf/io/zero_copy_stream.h"
#include "tessera/v1/peer.pb.h"

namespace tessera {

// The bytes of `header` (whose `data` must be empty) followed by the tag and length prefix of
// a `data` field of `data_len` bytes: append exactly `data_len` data bytes to get a complete
// SliceChunk message.
std::string EncodeSliceChunkPrefix(const v1::SliceChunk& header, uint64_t data_len);

// Where a decoded chunk's data goes: skip `skip` bytes, copy the next `write` bytes to
// `dest`, ignore the rest. consume = false stops without reading the data at all.
struct DataPlacement {
  bool consume = false;
  char* dest = nullptr;
  uint64_t skip = 0;
  uint64_t write = 0;
};

// Called once per message with the header fields (data left empty) and the data's length.
using PlaceData = std::function<DataPlacement(const v1::SliceChunk& header, uint64_t data_len)>;

// Decodes one SliceChunk of `total_size` bytes from `input`, calling `place` once and then
// copying the data where it says. When `data` is the message's last field (as
// EncodeSliceChunkPrefix and every field-order encoder write it) the data is copied straight
// from `input` to dest; otherwise it is buffered first.
// Errors: InvalidArgument if the message does not parse, `data` has the wrong wire type or a
// length beyond the rest of the message (checked before anything is allocated for it), or the
// placement does not fit the data (skip + write > data_len).
absl::Status DecodeSliceChunk(google::protobuf::io::ZeroCopyInputStream* input,
                              uint64_t total_size, const PlaceData& place);

}  // namespace tessera

#endif  // TESSERA_AGENT_PEER_SLICE_CHUNK_CODEC_H_
