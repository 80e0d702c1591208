// Region names: what the agent and its trainer call the shared-memory objects they share.
//
// A staging region is the POSIX shared-memory object
// "/tessera-<job>-r<rank>-<incarnation as 16 hex digits>-<tag><n>". The agent's pool names,
// creates, owns and unlinks it (agent/staging_pool.h); the trainer maps it by that name, which
// the agent hands it (shm/mapped_region.h). The incarnation keeps a restarted agent's regions
// apart from its previous life's (it never collides with or maps them); the tag keeps a load
// pool's regions apart from a save pool's. The claim on the staging of (job, rank) on a host is
// the object "/tessera-<job>-r<rank>.owner" (shm/ownership.h).
//
// In every name the job id is sanitised: characters outside [A-Za-z0-9._-] become '_', and
// only the first 64 are kept (ids may have 128).
//
// Pure: these functions only build and read strings; they touch no object. Thread-safe. No
// function here can fail.
#ifndef TESSERA_SHM_REGION_NAMES_H_
#define TESSERA_SHM_REGION_NAMES_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace tessera {

// Between a region name's "<incarnation>-" and its number in a load pool's regions (a save
// pool's have no tag): names keep only the first 64 characters of the job id, so the two
// pools of one agent are told apart by more than the job id.
inline constexpr absl::string_view kLoadRegionTag = "load";

// "tessera-<job>-r<rank>-" (no leading '/'): the prefix of every region of (job_id, rank), of
// every incarnation and both pools.
std::string StagingRegionPrefix(absl::string_view job_id, uint32_t rank);

// "tessera-<job>-r<rank>-<incarnation as 16 hex digits>-" (no leading '/'): the prefix of
// every region of one incarnation of (job_id, rank).
std::string StagingIncarnationPrefix(absl::string_view job_id, uint32_t rank, uint64_t incarnation);

// "/tessera-<job>-r<rank>-<incarnation as 16 hex digits>-<tag><n>": region number `n` of a
// pool; `tag` is "" for a save pool's regions, kLoadRegionTag for a load pool's.
std::string StagingRegionName(absl::string_view job_id, uint32_t rank, uint64_t incarnation,
                              absl::string_view tag, uint64_t n);

// Whether `rest`, what follows StagingRegionPrefix in an object's name, is a region's:
// "<16 hex digits>-<n>" or "<16 hex digits>-load<n>". So an object of a job named like another
// job's prefix is never taken for one of its regions.
bool IsStagingRegionRest(absl::string_view rest);

// "/tessera-<job>-r<rank>.owner": the object whose lock is the claim on the staging of
// (job_id, rank) on this host (StagingOwnership).
std::string StagingOwnerName(absl::string_view job_id, uint32_t rank);

}  // namespace tessera

#endif  // TESSERA_SHM_REGION_NAMES_H_
