#include "client/resident_prefetch.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22  // Linux 5.14; older C library headers lack it
#endif

namespace tessera {

absl::Status PopulateRead(const char* data, uint64_t len) {
  if (len == 0) return absl::OkStatus();
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  // madvise takes a page-aligned start.
  const uintptr_t start = reinterpret_cast<uintptr_t>(data) & ~(page - 1);
  const uint64_t span = reinterpret_cast<uintptr_t>(data) + len - start;
  if (madvise(reinterpret_cast<void*>(start), span, MADV_POPULATE_READ) == 0) {
    return absl::OkStatus();
  }
  if (errno != EINVAL) {
    return absl::InternalError(absl::StrCat("madvise(MADV_POPULATE_READ) of ", span,
                                            " bytes: ", std::strerror(errno)));
  }
  // A kernel without MADV_POPULATE_READ: one read per page faults it in (and, through the
  // kernel's fault-around, its neighbours).
  volatile char sink = 0;
  for (uint64_t off = 0; off < span; off += page) {
    sink = sink + reinterpret_cast<const volatile char*>(start)[off];
  }
  return absl::OkStatus();
}

std::unique_ptr<ResidentPrefetch> ResidentPrefetch::Start(std::string name, uint64_t size,
                                                          uint64_t bytes, uint64_t chunk_bytes) {
  std::unique_ptr<ResidentPrefetch> prefetch(new ResidentPrefetch(
      std::move(name), size, std::min(bytes, size), std::max<uint64_t>(chunk_bytes, 1)));
  prefetch->thread_ = std::thread([p = prefetch.get()] { p->Run(); });
  return prefetch;
}

ResidentPrefetch::ResidentPrefetch(std::string name, uint64_t size, uint64_t bytes,
                                   uint64_t chunk_bytes)
    : name_(std::move(name)),
      size_(size),
      bytes_(bytes),
      chunk_bytes_(chunk_bytes),
      start_(absl::Now()) {}

ResidentPrefetch::~ResidentPrefetch() { Stop(); }

void ResidentPrefetch::Stop() {
  stop_.store(true, std::memory_order_relaxed);
  if (thread_.joinable()) thread_.join();
}

void ResidentPrefetch::Run() {
  MapStagingOptions options;
  options.read_only = true;
  options.populate = false;  // chunk by chunk below, so that Take can stop it
  absl::StatusOr<std::unique_ptr<MappedStaging>> mapped =
      MappedStaging::Map(name_, size_, options);
  if (!mapped.ok()) {
    Finish(mapped.status());
    return;
  }
  const char* data = static_cast<const char*>((*mapped)->data());
  {
    absl::MutexLock lock(&mu_);
    mapping_ = std::move(*mapped);  // Take joins this thread before touching it
  }
  absl::Status status;
  for (uint64_t off = 0; off < bytes_ && !stop_.load(std::memory_order_relaxed);) {
    const uint64_t n = std::min(chunk_bytes_, bytes_ - off);
    status = PopulateRead(data + off, n);
    if (!status.ok()) break;
    off += n;
    absl::MutexLock lock(&mu_);
    populated_ = off;
  }
  Finish(std::move(status));
}

void ResidentPrefetch::Finish(absl::Status status) {
  absl::MutexLock lock(&mu_);
  done_ = true;
  elapsed_ = absl::Now() - start_;
  status_ = std::move(status);
}

std::unique_ptr<MappedStaging> ResidentPrefetch::Take(const std::string& name, uint64_t size) {
  Stop();
  std::unique_ptr<MappedStaging> mapping;
  {
    absl::MutexLock lock(&mu_);
    mapping = std::move(mapping_);
  }
  // Region names start with '/': End's empty name matches none.
  if (mapping == nullptr || mapping->name() != name || mapping->size() < size) return nullptr;
  return mapping;
}

ResidentPrefetch::Progress ResidentPrefetch::progress() const {
  absl::MutexLock lock(&mu_);
  Progress p;
  p.region = name_;
  p.bytes = bytes_;
  p.populated_bytes = populated_;
  p.done = done_;
  p.elapsed = done_ ? elapsed_ : absl::Now() - start_;
  p.status = status_;
  return p;
}

bool ResidentPrefetch::Wait(absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(&done_), timeout);
}

}  // namespace tessera
