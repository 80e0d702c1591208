// Wire encoding of the data-carrying peer messages (tessera.v1.SliceChunk, MemoryCopyChunk)
// without copying their data field.
//
// Generated code would copy a chunk's data twice on each side (memory -> proto string ->
// wire, and wire -> proto string -> destination). Instead the sender writes the header fields
// with generated code and appends the `data` field's tag and length, followed by the data
// bytes themselves (passed to gRPC as an external slice: GrpcPeerTransport, PeerMemory); the
// receiver parses the header, asks where the data goes, and copies the data straight from the
// received buffers to its destination: one copy. The bytes on the wire are a valid message.
//
// A chunk type is any message whose `data` bytes field is numbered Chunk::kDataFieldNumber
// (both are field 15, the highest, so encoders write it last).
//
// Thread-safety: free functions, no shared state.
#ifndef TESSERA_AGENT_PEER_CHUNK_CODEC_H_
#define TESSERA_AGENT_PEER_CHUNK_CODEC_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "google/protobuf/io/zero_copy_stream.h"
#include "google/protobuf/message_lite.h"
#include "tessera/v1/peer.pb.h"

namespace tessera {

// Where a decoded chunk's data goes: skip `skip` bytes, copy the next `write` bytes to
// `dest`, ignore the rest. consume = false stops without reading the data at all.
struct DataPlacement {
  bool consume = false;
  char* dest = nullptr;
  uint64_t skip = 0;
  uint64_t write = 0;
};

// The bytes of `header` (whose data field `data_field` must be empty) followed by the tag and
// length prefix of that field for `data_len` bytes: append exactly `data_len` data bytes to
// get a complete message.
std::string EncodeChunkPrefix(const google::protobuf::MessageLite& header, int data_field,
                              uint64_t data_len);

// Decodes one message of `total_size` bytes from `input` into `header` (its data left empty),
// calls `place` once with the data's length, then copies the data where it says. When the
// data field is the message's last field (as EncodeChunkPrefix and every field-order encoder
// write it) the data is copied straight from `input` to dest; otherwise it is buffered first.
// Errors: InvalidArgument if the message does not parse, the data field has the wrong wire
// type or a length beyond the rest of the message (checked before anything is allocated for
// it), or the placement does not fit the data (skip + write > data_len).
absl::Status DecodeChunk(google::protobuf::io::ZeroCopyInputStream* input, uint64_t total_size,
                         int data_field, google::protobuf::MessageLite* header,
                         const std::function<DataPlacement(uint64_t data_len)>& place);

// The same for a chunk type (SliceChunk, MemoryCopyChunk).
template <typename Chunk>
std::string EncodeChunkPrefix(const Chunk& header, uint64_t data_len) {
  return EncodeChunkPrefix(header, Chunk::kDataFieldNumber, data_len);
}

// `place` gets the header fields (data left empty) and the data's length.
template <typename Chunk>
absl::Status DecodeChunk(
    google::protobuf::io::ZeroCopyInputStream* input, uint64_t total_size,
    const std::function<DataPlacement(const Chunk& header, uint64_t data_len)>& place) {
  Chunk header;
  return DecodeChunk(input, total_size, Chunk::kDataFieldNumber, &header,
                     [&](uint64_t data_len) { return place(header, data_len); });
}

}  // namespace tessera

#endif  // TESSERA_AGENT_PEER_CHUNK_CODEC_H_
