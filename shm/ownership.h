// StagingOwnership: one process's exclusive claim on the staging of (job_id, rank) on this
// host.
//
// The claim is an flock(2) on the shared-memory object "/tessera-<job>-r<rank>.owner"
// (shm/region_names.h), which holds the owner's pid as text. The kernel releases it when the
// process ends, however it ends, so a crashed agent never blocks its successor.
//
// Lifecycle: an agent takes it at start, before StagingPool::RemoveStaleRegions
// (agent/staging_pool.h), and keeps it for its lifetime: a second agent for the same rank and
// job on the host is refused instead of deleting the staging the first one is using.
// Destruction releases the claim and removes the object.
//
// Thread-safety: Acquire() may be called from any thread; a second claim from this process is
// refused exactly as another process's would be (flock locks belong to the open file
// description). A claim has nothing to call: only its destruction releases it.
#ifndef TESSERA_SHM_OWNERSHIP_H_
#define TESSERA_SHM_OWNERSHIP_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tessera {

// The claim on the staging of (job_id, rank) on this host; see the top of this file.
class StagingOwnership {
 public:
  // Errors: AlreadyExists if another live process holds it (the message names its pid and
  // the object); Internal (with errno) if the object cannot be opened or locked.
  static absl::StatusOr<std::unique_ptr<StagingOwnership>> Acquire(absl::string_view job_id,
                                                                   uint32_t rank);
  ~StagingOwnership();  // releases the claim and removes the object
  StagingOwnership(const StagingOwnership&) = delete;
  StagingOwnership& operator=(const StagingOwnership&) = delete;

 private:
  StagingOwnership(int fd, std::string name) : fd_(fd), name_(std::move(name)) {}
  int fd_;
  std::string name_;
};

}  // namespace tessera

#endif  // TESSERA_SHM_OWNERSHIP_H_
