// Receiving one tessera.v1.SliceChunk message into a SliceInbox: its header decoded
// (agent/peer/chunk_codec.h), the chunk admitted by the inbox, its data copied where the inbox
// says, then committed. The receive path of GrpcPeerTransport, in one place, and what
// tests/fuzz:peer_chunk_fuzz_test drives with arbitrary bytes. Every size the sender claims is
// checked before it is used: the data field's length against the message (the codec), the
// slice's size, range and offsets against the slice the inbox expects.
//
// Thread-safety: as the inbox's; `input` is the caller's.
#ifndef TESSERA_AGENT_PEER_SLICE_RECEIVE_H_
#define TESSERA_AGENT_PEER_SLICE_RECEIVE_H_

#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "agent/peer/slice_inbox.h"
#include "google/protobuf/io/zero_copy_stream.h"
#include "tessera/v1/peer.pb.h"

namespace tessera {

struct ReceivedSliceChunk {
  // DecodeChunk's status: InvalidArgument if the message is malformed. When not OK, the
  // admission is the inbox's if the header decoded (a kWrite one already committed as
  // failed), else kRejected with nothing admitted.
  absl::Status decoded;
  SliceInbox::Admission admission;
  v1::SliceChunk header;  // its data field empty
  uint64_t data_len = 0;  // the data field's length
};

// Decodes the message of `total_size` bytes from `input`, admits it into `inbox` (with
// `park_token` and `on_ready`, as SliceInbox::Admit), copies a kWrite chunk's bytes and
// commits it (as written only if the whole message decoded).
ReceivedSliceChunk ReceiveSliceChunk(google::protobuf::io::ZeroCopyInputStream* input,
                                     uint64_t total_size, SliceInbox& inbox,
                                     const void* park_token, std::function<void()> on_ready);

}  // namespace tessera

#endif  // TESSERA_AGENT_PEER_SLICE_RECEIVE_H_
