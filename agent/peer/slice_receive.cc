#include "agent/peer/slice_receive.h"

#include <utility>

#include "agent/peer/chunk_codec.h"
#include "common/box.h"

namespace tessera {

ReceivedSliceChunk ReceiveSliceChunk(google::protobuf::io::ZeroCopyInputStream* input,
                                     uint64_t total_size, SliceInbox& inbox,
                                     const void* park_token, std::function<void()> on_ready) {
  ReceivedSliceChunk r;
  bool admitted = false;
  r.decoded = DecodeChunk<v1::SliceChunk>(
      input, total_size, [&](const v1::SliceChunk& h, uint64_t len) {
        r.header = h;
        r.data_len = len;
        IncomingChunk chunk;
        chunk.session_id = h.session_id();
        chunk.key = h.key();
        chunk.box = BoxFromProto(h.box());
        chunk.from_rank = h.from_rank();
        chunk.begin = h.range().begin();
        chunk.end = h.range().end();
        chunk.slice_nbytes = h.slice_nbytes();
        chunk.offset = h.offset();
        chunk.length = len;
        r.admission = inbox.Admit(chunk, park_token, std::move(on_ready));
        DataPlacement placement;
        if (r.admission.kind == SliceInbox::Admission::Kind::kWrite) {
          admitted = true;
          placement.consume = true;
          placement.dest = r.admission.dest;
          placement.skip = r.admission.skip_bytes;
          placement.write = r.admission.write_bytes;
        }
        return placement;
      });
  if (admitted) inbox.Commit(r.admission, r.decoded.ok());
  return r;
}

}  // namespace tessera
