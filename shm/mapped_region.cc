#include "shm/mapped_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "shm/cuda_host.h"
#include "storage/storage.h"

namespace tessera {

absl::StatusOr<std::unique_ptr<MappedStaging>> MappedStaging::Map(
    const std::string& name, uint64_t size, const MapStagingOptions& options) {
  if (name.empty() || name[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("staging region name \"", name, "\" must start with '/'"));
  }
  const int fd = shm_open(name.c_str(), (options.read_only ? O_RDONLY : O_RDWR) | O_CLOEXEC, 0);
  if (fd < 0) return ErrnoToStatus(errno, "shm_open", name);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return ErrnoToStatus(err, "fstat", name);
  }
  const uint64_t region_size = static_cast<uint64_t>(st.st_size);
  if (region_size < size || region_size == 0) {
    close(fd);
    return absl::FailedPreconditionError(absl::StrCat("staging region ", name, " holds ",
                                                      region_size, " bytes, ", size,
                                                      " are needed"));
  }
  const uint64_t map_size = size == 0 ? region_size : size;
  void* data = mmap(nullptr, map_size, options.read_only ? PROT_READ : PROT_READ | PROT_WRITE,
                    MAP_SHARED | (options.populate ? MAP_POPULATE : 0), fd, 0);
  const int err = errno;
  close(fd);
  if (data == MAP_FAILED) return ErrnoToStatus(err, "mmap", name);
  bool pinned = false;
  if (options.pin && GpuAvailable()) {
    absl::Status status = RegisterHost(data, map_size);
    if (!status.ok()) {
      munmap(data, map_size);
      return status;
    }
    pinned = true;
  }
  return std::unique_ptr<MappedStaging>(new MappedStaging(name, data, map_size, pinned));
}

MappedStaging::~MappedStaging() {
  if (pinned_) (void)UnregisterHost(data_);
  munmap(data_, size_);
}

}  // namespace tessera
