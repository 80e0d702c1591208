#include "agent/peer/peer_transport.h"

#include <set>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tessera {

std::string DescribeSlice(const std::string& key, const Box& box, int64_t begin, int64_t end,
                          uint32_t rank) {
  return absl::StrCat(key, "@", BoxToString(box), "[", begin, ",", end, ") rank ", rank);
}

absl::Status ValidateExchange(uint32_t self_rank, absl::Span<const SliceSend> sends,
                              absl::Span<const SliceRecv> recvs) {
  for (const SliceSend& s : sends) {
    const std::string what = DescribeSlice(s.key, s.box, s.begin, s.end, s.leader_rank);
    if (s.begin < 0 || s.begin > s.end) {
      return absl::InvalidArgumentError(absl::StrCat("send ", what, ": bad element range"));
    }
    if (s.nbytes > 0 && s.data == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("send ", what, ": null data"));
    }
    if (s.leader_rank == self_rank) {
      return absl::InvalidArgumentError(absl::StrCat("send ", what, ": leader is this rank"));
    }
  }
  std::set<std::tuple<std::string, std::vector<int64_t>, std::vector<int64_t>, uint32_t, int64_t>>
      seen;
  for (const SliceRecv& r : recvs) {
    const std::string what = DescribeSlice(r.key, r.box, r.begin, r.end, r.from_rank);
    if (r.begin < 0 || r.begin > r.end) {
      return absl::InvalidArgumentError(absl::StrCat("recv ", what, ": bad element range"));
    }
    if (r.nbytes > 0 && r.dest == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("recv ", what, ": null dest"));
    }
    if (r.from_rank == self_rank) {
      return absl::InvalidArgumentError(absl::StrCat("recv ", what, ": sender is this rank"));
    }
    if (!seen.emplace(r.key, r.box.offsets, r.box.lengths, r.from_rank, r.begin).second) {
      return absl::InvalidArgumentError(absl::StrCat("recv ", what, ": expected twice"));
    }
  }
  return absl::OkStatus();
}

}  // namespace tessera
