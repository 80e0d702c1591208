#include "tests/gpu/process_barrier.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"

namespace tessera::gpubench {
namespace {

absl::Status Errno(const std::string& what, int err) {
  return absl::InternalError(absl::StrCat(what, ": ", strerror(err)));
}

}  // namespace

absl::Status ProcessBarrier::Create(const std::string& name, int parties) {
  if (name.size() < 2 || name[0] != '/' || parties < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("barrier name must be \"/...\" and parties >= 1: ", name, ", ", parties));
  }
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) {
    if (errno == EEXIST) return absl::AlreadyExistsError(absl::StrCat(name, " exists"));
    return Errno(absl::StrCat("shm_open(", name, ")"), errno);
  }
  absl::Status status;
  void* p = MAP_FAILED;
  if (ftruncate(fd, sizeof(pthread_barrier_t)) != 0) {
    status = Errno("ftruncate", errno);
  } else if ((p = mmap(nullptr, sizeof(pthread_barrier_t), PROT_READ | PROT_WRITE, MAP_SHARED,
                       fd, 0)) == MAP_FAILED) {
    status = Errno("mmap", errno);
  } else {
    pthread_barrierattr_t attr;
    pthread_barrierattr_init(&attr);
    pthread_barrierattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    const int err = pthread_barrier_init(static_cast<pthread_barrier_t*>(p), &attr,
                                         static_cast<unsigned>(parties));
    pthread_barrierattr_destroy(&attr);
    if (err != 0) status = Errno("pthread_barrier_init", err);
    munmap(p, sizeof(pthread_barrier_t));
  }
  close(fd);
  if (!status.ok()) shm_unlink(name.c_str());
  return status;
}

absl::StatusOr<std::unique_ptr<ProcessBarrier>> ProcessBarrier::Open(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat("no barrier ", name));
    return Errno(absl::StrCat("shm_open(", name, ")"), errno);
  }
  void* p = mmap(nullptr, sizeof(pthread_barrier_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  close(fd);
  if (p == MAP_FAILED) return Errno("mmap", err);
  return std::unique_ptr<ProcessBarrier>(new ProcessBarrier(static_cast<pthread_barrier_t*>(p)));
}

ProcessBarrier::~ProcessBarrier() { munmap(barrier_, sizeof(pthread_barrier_t)); }

void ProcessBarrier::Wait() { pthread_barrier_wait(barrier_); }

}  // namespace tessera::gpubench
