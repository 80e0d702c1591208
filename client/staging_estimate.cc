#include "client/staging_estimate.h"

#include <algorithm>
#include <limits>

#include "absl/numeric/int128.h"
#include "common/box.h"

namespace tessera {
namespace {

uint64_t SaturatingAdd(uint64_t a, uint64_t b) {
  return a > std::numeric_limits<uint64_t>::max() - b ? std::numeric_limits<uint64_t>::max()
                                                      : a + b;
}

// The estimate for one distributed-optimizer slice, in bytes (the header's formula).
uint64_t GatherEstimate(const TensorRef& t) {
  if (!t.flat_range.has_value() || t.state_absent || t.nbytes == 0) return 0;
  const auto [first, second] = *t.flat_range;
  const int64_t slice = second - first;
  if (first < 0 || slice <= 0) return 0;
  absl::StatusOr<int64_t> box = Volume(BoxOf(t));
  if (!box.ok() || *box < second || t.nbytes % static_cast<uint64_t>(slice) != 0) return 0;
  const absl::uint128 itemsize = t.nbytes / static_cast<uint64_t>(slice);
  const absl::uint128 others = static_cast<uint64_t>(*box - slice);  // elements of the peers
  const absl::uint128 share = 2 * others * static_cast<uint64_t>(slice) /
                              static_cast<uint64_t>(*box);
  const absl::uint128 bytes = std::min(others, share) * itemsize;
  return bytes > std::numeric_limits<uint64_t>::max() ? std::numeric_limits<uint64_t>::max()
                                                       : absl::Uint128Low64(bytes);
}

}  // namespace

StagingDeclaration DeclareStaging(absl::Span<const TensorRef> tensors) {
  StagingDeclaration d;
  for (const TensorRef& t : tensors) {
    if (t.state_absent || t.nbytes == 0) continue;
    d.bytes = SaturatingAdd(d.bytes, t.nbytes);
    ++d.tensors;
    d.gather_bytes = SaturatingAdd(d.gather_bytes, GatherEstimate(t));
  }
  return d;
}

}  // namespace tessera
