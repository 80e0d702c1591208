// MappedStaging: a staging region mapped by another process (the trainer) by name.
//
// The agent creates, owns and unlinks each region (agent/staging_pool.h) and hands its trainer
// the region's name (shm/region_names.h); the trainer maps the same POSIX shared-memory object
// by that name and copies its tensors into it for a save, or reads a load's bytes out of it.
// When asked, and a GPU is present at run time, the mapping is page-locked in this process too
// (shm/cuda_host.h): pinning is per process.
//
// Lifecycle: Map() opens, maps and (optionally) pins the region; destruction unpins and
// unmaps, and never unlinks: the agent owns the name. A mapping stays valid after the agent
// unlinks its region (POSIX shm semantics), until it is destroyed.
//
// Thread-safety: Map() is thread-safe. A MappedStaging's accessors may be called from any
// thread; it is not thread-safe to destroy while its memory is in use.
#ifndef TESSERA_SHM_MAPPED_REGION_H_
#define TESSERA_SHM_MAPPED_REGION_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"

namespace tessera {

// How MappedStaging::Map maps a region.
struct MapStagingOptions {
  // Page-lock the mapping in this process too when a GPU is present (pinning is per process).
  bool pin = false;
  // Map read-only (a trainer reading a load region) instead of read-write.
  bool read_only = false;
  // Fault every page in at map time (MAP_POPULATE): right for a save region mapped once and
  // reused; a one-off load mapping is faster faulted in by the parallel copy that reads it.
  bool populate = true;
};

// A staging region mapped by name; see the top of this file.
class MappedStaging {
 public:
  // Maps the existing region `name`; `size` = 0 maps all of it.
  // Errors: NotFound (+IO_ERROR) if no region has that name; FailedPrecondition if the region
  // is smaller than `size`; InvalidArgument if `name` does not start with '/'; errors of
  // RegisterHost.
  static absl::StatusOr<std::unique_ptr<MappedStaging>> Map(const std::string& name,
                                                             uint64_t size,
                                                             const MapStagingOptions& options);
  // Errors: as the Map above.
  static absl::StatusOr<std::unique_ptr<MappedStaging>> Map(const std::string& name,
                                                             uint64_t size, bool pin = false) {
    MapStagingOptions options;
    options.pin = pin;
    return Map(name, size, options);
  }
  ~MappedStaging();
  MappedStaging(const MappedStaging&) = delete;
  MappedStaging& operator=(const MappedStaging&) = delete;

  void* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& name() const { return name_; }
  bool pinned() const { return pinned_; }

 private:
  MappedStaging(std::string name, void* data, uint64_t size, bool pinned)
      : name_(std::move(name)), data_(data), size_(size), pinned_(pinned) {}

  const std::string name_;
  void* const data_;
  const uint64_t size_;
  const bool pinned_;
};

// Shorthand for MappedStaging::Map, for the client side.
// Errors: as MappedStaging::Map.
inline absl::StatusOr<std::unique_ptr<MappedStaging>> MapStaging(const std::string& name,
                                                                 uint64_t size,
                                                                 bool pin = false) {
  return MappedStaging::Map(name, size, pin);
}

}  // namespace tessera

#endif  // TESSERA_SHM_MAPPED_REGION_H_
