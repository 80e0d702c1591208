// Fuzzes the peer wire codec (agent/peer/chunk_codec.h DecodeChunk) the way a leader receives
// DP slices over gRPC (agent/peer/slice_receive.h, GrpcPeerTransport's receive path): each
// message's header is decoded, admitted by a real SliceInbox expecting one 32-byte slice, and
// its data copied where the inbox says. MemoryCopyChunks (agent/peer_memory.cc PutMemoryCopy)
// go through the same codec, their data copied into a buffer of the length the codec found
// (checked against the message) from the offset the header claims.
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
#include "agent/peer/slice_receive.h"
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
    tessera::ReceiveSliceChunk(&input, n, inbox, &inbox, [] {});
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
