#include "shm/ownership.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "shm/region_names.h"
#include "storage/storage.h"

namespace tessera {

absl::StatusOr<std::unique_ptr<StagingOwnership>> StagingOwnership::Acquire(
    absl::string_view job_id, uint32_t rank) {
  const std::string name = StagingOwnerName(job_id, rank);
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoToStatus(errno, "shm_open", name);
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char pid[32] = {0};
    const ssize_t n = pread(fd, pid, sizeof(pid) - 1, 0);
    close(fd);
    if (err == EWOULDBLOCK) {
      return absl::AlreadyExistsError(absl::StrCat(
          "another agent (pid ", n > 0 ? absl::StripAsciiWhitespace(pid) : "unknown",
          ") serves job ", job_id, " rank ", rank, " on this host (it holds /dev/shm", name,
          "); stop it first, or give this job a distinct --job"));
    }
    return ErrnoToStatus(err, "flock", name);
  }
  const std::string pid = absl::StrCat(getpid(), "\n");
  if (ftruncate(fd, 0) != 0 || pwrite(fd, pid.data(), pid.size(), 0) < 0) {
    const int err = errno;
    close(fd);
    return ErrnoToStatus(err, "write", name);
  }
  return std::unique_ptr<StagingOwnership>(new StagingOwnership(fd, name));
}

StagingOwnership::~StagingOwnership() {
  // Unlink while still holding the lock: an agent starting now either fails on the lock or
  // creates a fresh object. (One that opened the old object just before and locks it after
  // this close would share ownership with a third agent creating the new object: three
  // agents of one rank racing; not worth a second lock.)
  shm_unlink(name_.c_str());
  close(fd_);
}

}  // namespace tessera
