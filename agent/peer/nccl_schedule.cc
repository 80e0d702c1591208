#include "agent/peer/nccl_schedule.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "absl/strings/str_cat.h"

namespace tessera {
namespace {

// A slice of one pair, in canonical order.
struct PairSlice {
  const std::string* key;
  const Box* box;
  int64_t begin;
  int64_t end;
  char* host;
  uint64_t nbytes;

  bool operator<(const PairSlice& o) const {
    return std::tie(*key, box->offsets, box->lengths, begin) <
           std::tie(*o.key, o.box->offsets, o.box->lengths, o.begin);
  }
};

constexpr uint64_t kFnvOffset = 14695981039346656037ull;
constexpr uint64_t kFnvPrime = 1099511628211ull;

void Mix(uint64_t* h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    *h ^= p[i];
    *h *= kFnvPrime;
  }
}

void MixInt(uint64_t* h, int64_t v) { Mix(h, &v, sizeof(v)); }

PairHeader Summarise(std::vector<PairSlice>* slices) {
  std::sort(slices->begin(), slices->end());
  PairHeader header;
  header.fingerprint = kFnvOffset;
  for (const PairSlice& s : *slices) {
    ++header.count;
    header.bytes += s.nbytes;
    MixInt(&header.fingerprint, static_cast<int64_t>(s.key->size()));
    Mix(&header.fingerprint, s.key->data(), s.key->size());
    MixInt(&header.fingerprint, static_cast<int64_t>(s.box->rank()));
    for (int64_t v : s.box->offsets) MixInt(&header.fingerprint, v);
    for (int64_t v : s.box->lengths) MixInt(&header.fingerprint, v);
    MixInt(&header.fingerprint, s.begin);
    MixInt(&header.fingerprint, s.end);
    MixInt(&header.fingerprint, static_cast<int64_t>(s.nbytes));
  }
  return header;
}

// Cuts a pair's slices into pieces of at most chunk_bytes, in order.
std::vector<std::pair<char*, uint64_t>> Pieces(const std::vector<PairSlice>& slices,
                                               uint64_t chunk_bytes) {
  std::vector<std::pair<char*, uint64_t>> pieces;
  for (const PairSlice& s : slices) {
    for (uint64_t off = 0; off < s.nbytes; off += chunk_bytes) {
      pieces.emplace_back(s.host + off, std::min(chunk_bytes, s.nbytes - off));
    }
  }
  return pieces;
}

uint64_t AlignUp(uint64_t v) {
  return (v + kNcclBounceAlignment - 1) / kNcclBounceAlignment * kNcclBounceAlignment;
}

}  // namespace

absl::StatusOr<NcclSchedule> BuildNcclSchedule(uint32_t self_rank,
                                               absl::Span<const uint32_t> member_ranks,
                                               absl::Span<const SliceSend> sends,
                                               absl::Span<const SliceRecv> recvs,
                                               uint64_t chunk_bytes) {
  if (chunk_bytes == 0) return absl::InvalidArgumentError("NCCL chunk_bytes must be > 0");
  std::map<uint32_t, int> comm_rank;
  for (size_t i = 0; i < member_ranks.size(); ++i) {
    if (!comm_rank.emplace(member_ranks[i], static_cast<int>(i)).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", member_ranks[i], " appears twice in the gather group"));
    }
  }
  auto find = [&comm_rank](uint32_t rank, const char* role) -> absl::StatusOr<int> {
    auto it = comm_rank.find(rank);
    if (it == comm_rank.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(role, " rank ", rank, " is not in the gather group"));
    }
    return it->second;
  };

  NcclSchedule schedule;
  schedule.size = static_cast<int>(member_ranks.size());
  absl::StatusOr<int> self = find(self_rank, "this");
  if (!self.ok()) return self.status();
  schedule.self = *self;

  std::vector<std::vector<PairSlice>> to(schedule.size), from(schedule.size);
  for (const SliceSend& s : sends) {
    absl::StatusOr<int> peer = find(s.leader_rank, "leader");
    if (!peer.ok()) return peer.status();
    if (s.nbytes == 0) continue;
    to[*peer].push_back(PairSlice{&s.key, &s.box, s.begin, s.end,
                                  const_cast<char*>(static_cast<const char*>(s.data)), s.nbytes});
  }
  for (const SliceRecv& r : recvs) {
    absl::StatusOr<int> peer = find(r.from_rank, "sender");
    if (!peer.ok()) return peer.status();
    if (r.nbytes == 0) continue;
    from[*peer].push_back(
        PairSlice{&r.key, &r.box, r.begin, r.end, static_cast<char*>(r.dest), r.nbytes});
  }

  std::vector<std::vector<std::pair<char*, uint64_t>>> send_pieces(schedule.size),
      recv_pieces(schedule.size);
  size_t nrounds = 0;
  for (int peer = 0; peer < schedule.size; ++peer) {
    schedule.send_headers.push_back(Summarise(&to[peer]));
    schedule.recv_headers.push_back(Summarise(&from[peer]));
    send_pieces[peer] = Pieces(to[peer], chunk_bytes);
    recv_pieces[peer] = Pieces(from[peer], chunk_bytes);
    nrounds = std::max({nrounds, send_pieces[peer].size(), recv_pieces[peer].size()});
  }
  schedule.rounds.resize(nrounds);
  for (size_t r = 0; r < nrounds; ++r) {
    NcclRound& round = schedule.rounds[r];
    uint64_t send_off = 0, recv_off = 0;
    for (int peer = 0; peer < schedule.size; ++peer) {
      if (r < send_pieces[peer].size()) {
        const auto& [host, n] = send_pieces[peer][r];
        round.ops.push_back(NcclOp{true, peer, host, n, send_off});
        send_off = AlignUp(send_off + n);
      }
      if (r < recv_pieces[peer].size()) {
        const auto& [host, n] = recv_pieces[peer][r];
        round.ops.push_back(NcclOp{false, peer, host, n, recv_off});
        recv_off = AlignUp(recv_off + n);
      }
    }
    schedule.send_bounce_bytes = std::max(schedule.send_bounce_bytes, send_off);
    schedule.recv_bounce_bytes = std::max(schedule.recv_bounce_bytes, recv_off);
  }
  return schedule;
}

}  // namespace tessera
