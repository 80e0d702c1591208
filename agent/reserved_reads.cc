#include "agent/reserved_reads.h"

#include <utility>

#include "common/status.h"

namespace tessera {

absl::StatusOr<std::vector<ReadResult>> ReadAsReserved(const CheckpointReader& reader,
                                                       absl::Span<const ReadRequest> reads,
                                                       absl::Span<const uint64_t> offsets,
                                                       RangeReserver& reserver, ReadStats& stats,
                                                       const ResidentFiles* resident,
                                                       int* batches) {
  std::vector<ReadResult> results;
  results.reserve(reads.size());
  size_t next = 0;
  while (next < reads.size()) {
    RETURN_IF_ERROR(reserver.WaitFor(offsets[next] + reads[next].dest_size));
    const uint64_t reserved = reserver.reserved();
    size_t end = next + 1;
    while (end < reads.size() && offsets[end] + reads[end].dest_size <= reserved) ++end;
    ReadStats batch_stats;
    ASSIGN_OR_RETURN(std::vector<ReadResult> batch,
                     reader.Read(reads.subspan(next, end - next), &batch_stats, resident));
    stats += batch_stats;
    for (ReadResult& r : batch) results.push_back(std::move(r));
    if (batches != nullptr) ++*batches;
    next = end;
  }
  return results;
}

}  // namespace tessera
