// Fuzzes the bulk port's wire (common/bulk_wire.h) as both of its ends decode it: frames of a
// u32 length and a body, the length checked before the body is allocated; a holder's side
// parses a BulkRequest and, for a put, reserves room for the copy whose size the sender claims
// in a real BuddyStore (agent/memory_bulk.cc ServePut); a reader's side parses a BulkStatus.
// Contract checked: no crash, undefined behaviour or allocation beyond the frame limit and the
// store's budget, whatever the sender claims.
//
// Input: frames as they arrive on the socket (a frame cut short ends the input).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "agent/buddy_store.h"
#include "common/bulk_wire.h"
#include "tessera/v1/peer.pb.h"

namespace {

constexpr uint64_t kBudgetBytes = 1 << 20;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tessera::BuddyStore store(kBudgetBytes);
  while (size >= 4) {
    absl::StatusOr<uint32_t> n = tessera::DecodeBulkFrameLength(data, "frame", "fuzz");
    if (!n.ok() || *n > size - 4) return 0;
    const absl::string_view body(reinterpret_cast<const char*>(data) + 4, *n);
    data += 4 + *n;
    size -= 4 + *n;

    tessera::v1::BulkRequest request;
    if (tessera::DecodeBulkFrameBody(body, &request, "fuzz").ok() && request.has_put()) {
      // ReserveBuddyCopy (agent/peer_memory.h) less its check of the job's name.
      absl::StatusOr<std::shared_ptr<tessera::MemoryBuffer>> room =
          store.Reserve(request.put().copy());
      if (room.ok()) store.Keep(request.put().copy(), *std::move(room));
    }
    tessera::v1::BulkStatus status;
    if (tessera::DecodeBulkFrameBody(body, &status, "fuzz").ok()) {
      tessera::BulkStatusResult(status, "fuzz").status().IgnoreError();
    }
  }
  return 0;
}
