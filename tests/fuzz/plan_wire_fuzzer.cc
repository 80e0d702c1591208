// Fuzzes the plan wire decoder (server/plan/plan_wire.h AssignmentPeers), which reads an
// encoded RankAssignment field by field without protobuf's parser. Contract checked: no crash,
// out-of-bounds read or undefined behaviour, and the peers it returns are sorted, distinct and
// exclude `self`.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/plan/plan_wire.h"
#include "tessera/v1/coordinator.pb.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint32_t self = data[0];
  const absl::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  absl::StatusOr<std::vector<uint32_t>> peers = tessera::AssignmentPeers(bytes, self);
  if (!peers.ok()) return 0;
  for (size_t i = 0; i < peers->size(); ++i) {
    if ((*peers)[i] == self || (i > 0 && (*peers)[i - 1] >= (*peers)[i])) std::abort();
  }
  return 0;
}
