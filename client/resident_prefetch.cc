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
                                                          uint64_t bytes,
                                                          ResidentPrefetchOptions options) {
  options.chunk_bytes = std::max<uint64_t>(options.chunk_bytes, 1);
  std::unique_ptr<ResidentPrefetch> prefetch(
      new ResidentPrefetch(std::move(name), size, std::min(bytes, size), std::move(options)));
  prefetch->thread_ = std::thread([p = prefetch.get()] { p->Run(); });
  return prefetch;
}

ResidentPrefetch::ResidentPrefetch(std::string name, uint64_t size, uint64_t bytes,
                                   ResidentPrefetchOptions options)
    : name_(std::move(name)),
      size_(size),
      bytes_(bytes),
      options_(std::move(options)),
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
    const uint64_t n = std::min(options_.chunk_bytes, bytes_ - off);
    status = PopulateRead(data + off, n);
    if (!status.ok()) break;
    off += n;
    absl::MutexLock lock(&mu_);
    populated_ = off;
  }
  if (status.ok() && options_.list_blocks && !stop_.load(std::memory_order_relaxed)) Check(data);
  Finish(std::move(status));
}

void ResidentPrefetch::Check(const char* data) {
  absl::StatusOr<std::vector<BlockCheck>> blocks = options_.list_blocks();
  if (!blocks.ok()) {
    absl::MutexLock lock(&mu_);
    check_status_ = blocks.status();
    return;
  }
  for (const BlockCheck& block : *blocks) {
    if (stop_.load(std::memory_order_relaxed)) return;
    if (block.offset > bytes_ || block.length > bytes_ - block.offset) continue;
    const bool match = Xxh3(data + block.offset, block.length) == block.xxh3;
    absl::MutexLock lock(&mu_);
    if (match) {
      checked_.push_back(block);
      checked_bytes_ += block.length;
    } else {
      ++mismatched_;
    }
  }
}

void ResidentPrefetch::Finish(absl::Status status) {
  absl::MutexLock lock(&mu_);
  done_ = true;
  elapsed_ = absl::Now() - start_;
  status_ = std::move(status);
}

ResidentPrefetch::Taken ResidentPrefetch::Take() {
  Stop();
  absl::MutexLock lock(&mu_);
  Taken taken;
  taken.mapping = std::move(mapping_);
  // Checks of a mapping already handed over are not handed over again.
  if (taken.mapping != nullptr) taken.checked = std::move(checked_);
  checked_.clear();
  return taken;
}

ResidentPrefetch::Progress ResidentPrefetch::progress() const {
  absl::MutexLock lock(&mu_);
  Progress p;
  p.bytes = bytes_;
  p.populated_bytes = populated_;
  p.checked_bytes = checked_bytes_;
  p.mismatched_blocks = mismatched_;
  p.done = done_;
  p.elapsed = done_ ? elapsed_ : absl::Now() - start_;
  p.status = status_;
  p.check_status = check_status_;
  return p;
}

bool ResidentPrefetch::Wait(absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(&done_), timeout);
}

}  // namespace tessera
