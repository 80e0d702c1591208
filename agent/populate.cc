#include "agent/populate.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14 (asm-generic/mman-common.h)
#endif

namespace tessera {
namespace {

// 0, or the errno of madvise over [begin, begin + n).
int PopulateRun(char* begin, size_t n) {
  if (n == 0) return 0;
  return madvise(begin, n, MADV_POPULATE_WRITE) == 0 ? 0 : errno;
}

}  // namespace

absl::Status PopulateForWrite(void* data, size_t size, int threads) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  if (data == nullptr || reinterpret_cast<uintptr_t>(data) % page != 0 || threads < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PopulateForWrite needs a page-aligned mapping and threads >= 1, not address ",
        reinterpret_cast<uintptr_t>(data), " and ", threads, " threads"));
  }
  if (size == 0) return absl::OkStatus();
  const size_t pages = (size + page - 1) / page;
  const size_t runs = std::min<size_t>(static_cast<size_t>(threads), pages);
  const size_t run_pages = (pages + runs - 1) / runs;
  char* const base = static_cast<char*>(data);
  std::vector<int> errors(runs, 0);
  auto populate = [&](size_t i) {
    const size_t first = i * run_pages;
    const size_t end = std::min(pages, first + run_pages);
    if (first < end) errors[i] = PopulateRun(base + first * page, (end - first) * page);
  };
  std::vector<std::thread> workers;
  workers.reserve(runs - 1);
  for (size_t i = 1; i < runs; ++i) workers.emplace_back(populate, i);
  populate(0);
  for (std::thread& worker : workers) worker.join();

  for (int err : errors) {
    if (err == 0) continue;
    const std::string what = absl::StrCat("madvise(MADV_POPULATE_WRITE) of ", size, " bytes: ",
                                          std::strerror(err));
    if (err == EINVAL) return absl::UnimplementedError(what);
    if (err == EFAULT || err == ENOMEM) return absl::ResourceExhaustedError(what);
    return absl::InternalError(what);
  }
  return absl::OkStatus();
}

int ReserveThreads(int usable_cpus, int agents_per_node) {
  const int share = usable_cpus / std::max(agents_per_node, 1);
  return std::clamp(share, 1, kMaxReserveThreads);
}

}  // namespace tessera
