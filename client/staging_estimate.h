// What a trainer declares in ReserveStaging (DESIGN.md "The first save"): the bytes its own
// tensors stage, and room for the optimizer slices it may receive as a DP leader.
//
// A distributed optimizer gives each DP rank a flat range of every box; at the save the
// coordinator makes one rank of the group each box's leader, and the leader stages its peers'
// ranges of that box beside its own. Which boxes a rank will lead only the plan says, but the
// planner spreads leaders to balance bytes, so a rank holding the fraction s/E of a box leads
// it about that often. The estimate for such a piece is twice that share of the box's other
// ranges, capped at all of them (the most a leader can receive):
//
//   min(E - s, 2 * (E - s) * s / E) elements,   E = the box's elements, s = the slice's
//
// With two DP ranks that is the cap (E - s), so every leader's staging fits; with more it
// covers twice the balanced share. A save that needs more still makes a larger region (the
// reservation is advisory).
//
// Thread-safety: pure functions.
#ifndef TESSERA_CLIENT_STAGING_ESTIMATE_H_
#define TESSERA_CLIENT_STAGING_ESTIMATE_H_

#include <cstdint>

#include "absl/types/span.h"
#include "client/describe.h"

namespace tessera {

struct StagingDeclaration {
  uint64_t bytes = 0;         // the tensors' own bytes (absent optimizer state excluded)
  uint32_t tensors = 0;       // how many of them hold bytes
  uint64_t gather_bytes = 0;  // the estimate above, summed over the distributed-optimizer slices
};

// The declaration for `tensors`. A piece whose box or range is malformed adds nothing to
// gather_bytes (DescribeShards refuses it at the save). Saturates at UINT64_MAX.
StagingDeclaration DeclareStaging(absl::Span<const TensorRef> tensors);

}  // namespace tessera

#endif  // TESSERA_CLIENT_STAGING_ESTIMATE_H_
