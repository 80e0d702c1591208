// ReadAsReserved: a load's reads into a region that is still being reserved.
//
// A load region is reserved (posix_fallocate, so that a full /dev/shm is an error and not a
// SIGBUS) in chunks by a RangeReserver while the reads run, instead of all before them. The
// reads go in batches: each is the next request and every one after it whose bytes are
// reserved when the batch starts. So the first batch starts once the first request's bytes
// are reserved, no byte is written before it is, and as the reservation outruns the disk the
// later batches are few and large.
//
// Thread-safety: as CheckpointReader::Read.
#ifndef TESSERA_AGENT_RESERVED_READS_H_
#define TESSERA_AGENT_RESERVED_READS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "agent/range_reserver.h"
#include "format/checkpoint_reader.h"

namespace tessera {

// Reads `reads`, whose destinations lie at `offsets` (non-decreasing, one per read) of the
// region `reserver` reserves from its start, into `stats` (added to). `batches`, if given,
// is incremented for each Read call. Results are in the order of `reads`.
// Errors: the reservation's failure before a request's bytes (nothing of that request or
// later ones is read); Read's.
absl::StatusOr<std::vector<ReadResult>> ReadAsReserved(const CheckpointReader& reader,
                                                       absl::Span<const ReadRequest> reads,
                                                       absl::Span<const uint64_t> offsets,
                                                       RangeReserver& reserver, ReadStats& stats,
                                                       const ResidentFiles* resident,
                                                       int* batches = nullptr);

}  // namespace tessera

#endif  // TESSERA_AGENT_RESERVED_READS_H_
