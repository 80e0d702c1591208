// Fuzzes the peer wire codec (agent/peer/chunk_codec.h DecodeChunk) the way a leader receives
// DP slices over gRPC (agent/peer/grpc_peer_transport.cc): each message's header is decoded,
// admitted by a real SliceInbox expecting one 32-byte slice, and its data copied where the inbox
// says. A MemoryCopyChunk stream (agent/peer_memory.cc PutMemoryCopy) is decoded the same way
// into a buffer of the size the header claims, allocated only after the codec checked the claim
// against the bytes that arrived.
//
// Input: one mode byte (even: SliceChunks, odd: MemoryCopyChunks), one byte for the input
// stream's block size, then messages as u16 little-endian length + bytes. Contract checked: no
// crash, out-of-bounds write or undefined behaviour; no byte written outside the slice.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "agent/peer/chunk_codec.h"
#include "agent/peer/peer_transport.h"
#include "agent/peer/slice_inbox.h"
#include "common/box.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "tessera/v1/peer.pb.h"

namespace {

constexpr size_t kSliceBytes = 32;
constexpr uint64_t kMaxCopyBytes = 1 << 16;

void ReceiveSlices(const uint8_t* data, size_t size, int block) {
  // The slice lives inside guard bytes that must stay as they are.
  char buffer[kSliceBytes + 16];
  std::memset(buffer, 0x5a, sizeof(buffer));
  tessera::SliceInbox inbox;
  tessera::SliceRecv recv;
  recv.key = "w";
  recv.box = tessera::Box{{0}, {8}};
  recv.from_rank = 1;
  recv.begin = 0;
  recv.end = 8;
  recv.dest = buffer + 8;
  recv.nbytes = kSliceBytes;
  if (!inbox.Expect("s", {&recv, 1}).ok()) std::abort();
  while (size >= 2) {
    const size_t n = std::min<size_t>(data[0] | data[1] << 8, size - 2);
    google::protobuf::io::ArrayInputStream input(data + 2, static_cast<int>(n), block);
    tessera::SliceInbox::Admission admission;
    bool admitted = false;
    const absl::Status status = tessera::DecodeChunk<tessera::v1::SliceChunk>(
        &input, n, [&](const tessera::v1::SliceChunk& h, uint64_t len) {
          tessera::IncomingChunk chunk;
          chunk.session_id = h.session_id();
          chunk.key = h.key();
          chunk.box = tessera::BoxFromProto(h.box());
          chunk.from_rank = h.from_rank();
          chunk.begin = h.range().begin();
          chunk.end = h.range().end();
          chunk.slice_nbytes = h.slice_nbytes();
          chunk.offset = h.offset();
          chunk.length = len;
          admission = inbox.Admit(chunk, &inbox, [] {});
          tessera::DataPlacement placement;
          if (admission.kind == tessera::SliceInbox::Admission::Kind::kWrite) {
            admitted = true;
            placement.consume = true;
            placement.dest = admission.dest;
            placement.skip = admission.skip_bytes;
            placement.write = admission.write_bytes;
          }
          return placement;
        });
    if (admitted) inbox.Commit(admission, status.ok());
    data += 2 + n;
    size -= 2 + n;
  }
  inbox.Wait("s", absl::InfinitePast()).IgnoreError();
  for (size_t i = 0; i < 8; ++i) {
    if (buffer[i] != 0x5a || buffer[sizeof(buffer) - 1 - i] != 0x5a) std::abort();
  }
}

void ReceiveCopy(const uint8_t* data, size_t size, int block) {
  while (size >= 2) {
    const size_t n = std::min<size_t>(data[0] | data[1] << 8, size - 2);
    google::protobuf::io::ArrayInputStream input(data + 2, static_cast<int>(n), block);
    std::string dest;
    tessera::DecodeChunk<tessera::v1::MemoryCopyChunk>(
        &input, n, [&](const tessera::v1::MemoryCopyChunk& h, uint64_t len) {
          tessera::DataPlacement placement;
          if (len > kMaxCopyBytes || h.offset() > len) return placement;
          dest.assign(len, '\0');
          placement.consume = true;
          placement.dest = dest.data();
          placement.skip = h.offset();
          placement.write = len - h.offset();
          return placement;
        })
        .IgnoreError();
    data += 2 + n;
    size -= 2 + n;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const int block = 1 + data[1] % 64;
  if (data[0] % 2 == 0) {
    ReceiveSlices(data + 2, size - 2, block);
  } else {
    ReceiveCopy(data + 2, size - 2, block);
  }
  return 0;
}
