#include "agent/staging_pool.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "shm/cuda_host.h"
#include "shm/region_names.h"
#include "storage/storage.h"
#include "tessera/v1/types.pb.h"

namespace tessera {

StagingPoolOptions LoadPoolOptions(StagingPoolOptions save) {
  save.kind = StagingPoolOptions::Kind::kLoad;
  save.populate = false;
  save.pin = false;
  return save;
}

namespace {

uint64_t PageSize() {
  const long page = sysconf(_SC_PAGESIZE);
  return page > 0 ? static_cast<uint64_t>(page) : 4096;
}

uint64_t RoundUp(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

}  // namespace

// One shared-memory object, mapped and optionally pinned. Unpins, unmaps and unlinks on
// destruction.
namespace {

// posix_fallocate of bytes [offset, offset + length) of the shared-memory object `name`
// (open as `fd`), its error naming the object and the range.
absl::Status Fallocate(int fd, const std::string& name, uint64_t offset, uint64_t length) {
  const int err = posix_fallocate(fd, static_cast<off_t>(offset), static_cast<off_t>(length));
  if (err == 0) return absl::OkStatus();
  return ErrnoToStatus(err, "posix_fallocate", name,
                       absl::StrCat("(bytes ", offset, "..", offset + length, ")"));
}

// Fallocate of the object `name`, opened for it.
absl::Status FallocateByName(const std::string& name, uint64_t offset, uint64_t length) {
  if (length == 0) return absl::OkStatus();
  const int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) return ErrnoToStatus(errno, "shm_open", name);
  absl::Status status = Fallocate(fd, name, offset, length);
  close(fd);
  return status;
}

}  // namespace

class StagingPool::Region {
 public:
  Region(std::string name, void* data, uint64_t capacity)
      : name_(std::move(name)), data_(data), capacity_(capacity) {}

  ~Region() {
    if (pinned_) (void)UnregisterHost(data_);
    munmap(data_, capacity_);
    shm_unlink(name_.c_str());
  }

  const std::string& name() const { return name_; }
  void* data() const { return data_; }
  uint64_t capacity() const { return capacity_; }
  bool pinned() const { return pinned_; }
  void set_pinned() { pinned_ = true; }
  // Every page allocated (posix_fallocate of the whole object): writes cannot raise SIGBUS.
  bool reserved() const { return reserved_; }
  void set_reserved() { reserved_ = true; }

 private:
  const std::string name_;
  void* const data_;
  const uint64_t capacity_;
  bool pinned_ = false;
  bool reserved_ = false;
};

absl::StatusOr<std::unique_ptr<StagingPool>> StagingPool::Create(StagingPoolOptions options) {
  const uint64_t budget = options.budget_bytes;
  if (budget < PageSize()) {
    return absl::InvalidArgumentError(absl::StrCat("staging budget of ", budget,
                                                   " bytes is smaller than one page"));
  }
  return std::unique_ptr<StagingPool>(new StagingPool(std::move(options), budget));
}

StagingPool::StagingPool(StagingPoolOptions options, uint64_t budget_bytes)
    : options_(std::move(options)), budget_bytes_(budget_bytes), page_size_(PageSize()) {}

StagingPool::~StagingPool() { ReleaseAll(); }

std::string StagingPool::RegionName(uint64_t n) const {
  return StagingRegionName(options_.job_id, options_.rank, options_.incarnation,
                           options_.kind == StagingPoolOptions::Kind::kLoad ? kLoadRegionTag : "",
                           n);
}

absl::StatusOr<std::unique_ptr<StagingPool::Region>> StagingPool::CreateRegionLocked(
    uint64_t capacity, bool reserve) {
  const std::string name = RegionName(next_region_++);
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoToStatus(errno, "shm_open", name);
  // On any failure below the object must not outlive this call.
  auto fail = [&](int err, absl::string_view op) {
    close(fd);
    shm_unlink(name.c_str());
    return ErrnoToStatus(err, op, name, absl::StrCat("(", capacity, " bytes)"));
  };
  if (ftruncate(fd, static_cast<off_t>(capacity)) != 0) return fail(errno, "ftruncate");
  if (reserve) {
    if (absl::Status reserved = Fallocate(fd, name, 0, capacity); !reserved.ok()) {
      close(fd);
      shm_unlink(name.c_str());
      return reserved;
    }
  }
  // MAP_POPULATE faults every page in now, when the region is created (once per pool), instead
  // of during a save's first copy: a gigabyte of 4 KiB faults costs seconds.
  void* data = mmap(nullptr, capacity, PROT_READ | PROT_WRITE,
                    MAP_SHARED | (options_.populate ? MAP_POPULATE : 0), fd, 0);
  if (data == MAP_FAILED) return fail(errno, "mmap");
  close(fd);  // the mapping keeps the object alive
  auto region = std::make_unique<Region>(name, data, capacity);
  if (reserve) region->set_reserved();
  if (options_.pin && GpuAvailable()) {
    absl::Status pinned = RegisterHost(data, capacity);
    if (!pinned.ok()) {
      return absl::Status(pinned.code(),
                          absl::StrCat("pinning staging region ", name, ": ", pinned.message()));
    }
    region->set_pinned();
  }
  return region;
}

uint64_t StagingPool::ResidentBytesLocked() const {
  uint64_t total = 0;
  for (const auto& region : resident_) total += region->capacity();
  return total;
}

uint64_t StagingPool::SpareBytesLocked() const {
  uint64_t total = 0;
  for (const auto& region : spare_) total += region->capacity();
  return total;
}

absl::StatusOr<std::vector<StagingSlot>> StagingPool::Acquire(const std::vector<uint64_t>& sizes,
                                                              Reservation reservation) {
  absl::MutexLock lock(&mu_);
  return FillLocked(sizes, /*prepare=*/false, reservation);
}

absl::Status StagingPool::ReserveBytes(const StagingSlot& slot, uint64_t offset, uint64_t length) {
  return FallocateByName(slot.name, offset, length);
}

bool StagingPool::NextSetEmptyLocked() const {
  for (const auto& region : regions_) {
    if (region != nullptr) return false;
  }
  return true;
}

bool StagingPool::Prepare(const std::vector<uint64_t>& sizes) {
  absl::MutexLock lock(&mu_);
  if (!NextSetEmptyLocked()) {  // never replaced: say whether it will do
    if (regions_.size() < sizes.size()) return false;
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (regions_[i] == nullptr || regions_[i]->capacity() < sizes[i]) return false;
    }
    return true;
  }
  absl::StatusOr<std::vector<StagingSlot>> slots = FillLocked(sizes, /*prepare=*/true);
  return slots.ok() && !slots->empty();
}

absl::StatusOr<std::vector<StagingSlot>> StagingPool::Reserve(uint64_t bytes, int sets) {
  if (bytes == 0 || sets < 1 || sets > 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a staging reservation needs bytes > 0 and 1 or 2 sets, not ", bytes, " and ", sets));
  }
  absl::MutexLock lock(&mu_);
  if (NextSetEmptyLocked()) {
    // As Prepare: admitted beside the sets kept, none of them dropped.
    ASSIGN_OR_RETURN(std::vector<StagingSlot> next, FillLocked({bytes}, /*prepare=*/true));
    if (next.empty()) {
      return MakeError(absl::StatusCode::kResourceExhausted, v1::ERROR_CODE_ADMISSION_DENIED,
                       absl::StrCat("reserving staging of ", bytes, " bytes beside the ",
                                    MappedBytesLocked(), " mapped exceeds ", budget_bytes_,
                                    ", the host-RAM budget of rank ", options_.rank,
                                    " (a save would drop a memory copy to make room; a "
                                    "reservation does not)"));
    }
  }
  // The spare only where it fits (else the memory tier cannot keep a save beside the next one
  // anyway), and not beside a resident set: that is the save after next's already.
  // Sized for the declared bytes, or the next set's region if that is larger.
  const uint64_t rounded = RoundUp(bytes, page_size_);
  if (rounded < bytes) {
    return MakeError(absl::StatusCode::kResourceExhausted, v1::ERROR_CODE_ADMISSION_DENIED,
                     absl::StrCat("a staging reservation of ", bytes, " bytes is too large"));
  }
  const uint64_t capacity =
      regions_[0] != nullptr ? std::max(regions_[0]->capacity(), rounded) : rounded;
  const uint64_t mapped = MappedBytesLocked();
  if (sets == 2 && resident_.empty() && spare_.empty() && mapped <= budget_bytes_ &&
      capacity <= budget_bytes_ - mapped) {
    ASSIGN_OR_RETURN(std::shared_ptr<Region> spare, CreateRegionLocked(capacity, options_.reserve));
    spare_.assign(1, std::move(spare));
  }
  std::vector<StagingSlot> out;
  for (const auto* set : {&regions_, &spare_, &resident_}) {
    for (const auto& region : *set) {
      out.push_back(StagingSlot{region->name(), region->data(), 0, region->capacity(),
                                region->pinned(), 0});
    }
  }
  return out;
}

absl::StatusOr<std::vector<StagingSlot>> StagingPool::FillLocked(const std::vector<uint64_t>& sizes,
                                                                 bool prepare,
                                                                 Reservation reservation) {
  // Admission first, so a refused save leaves the pool as it was (the resident set aside: a
  // save that does not fit beside it drops it, below).
  std::vector<uint64_t> capacities(sizes.size());
  uint64_t total = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const uint64_t needed = std::max<uint64_t>(RoundUp(sizes[i], page_size_), page_size_);
    if (needed < sizes[i]) {  // overflow
      return MakeError(absl::StatusCode::kResourceExhausted, v1::ERROR_CODE_ADMISSION_DENIED,
                       absl::StrCat("staging slot ", i, " of ", sizes[i], " bytes is too large"));
    }
    // A region a load still reads (memory tier: it was resident) is not written under it:
    // the pool lets go of it (the reader frees it) and stages in a new one.
    if (i < regions_.size() && regions_[i] != nullptr && regions_[i].use_count() > 1) {
      regions_[i].reset();
    }
    const bool reuse = i < regions_.size() && regions_[i] != nullptr &&
                       regions_[i]->capacity() >= sizes[i];
    capacities[i] = reuse ? regions_[i]->capacity() : needed;
    total += capacities[i];
    if (total < capacities[i] || total > budget_bytes_) {
      return MakeError(
          absl::StatusCode::kResourceExhausted, v1::ERROR_CODE_ADMISSION_DENIED,
          absl::StrCat("staging of ", sizes.size(), " slots needs more than ", budget_bytes_,
                       " bytes, the host-RAM budget of rank ", options_.rank,
                       " (exceeded at slot ", i, ")"));
    }
  }

  // A spare set smaller than this save is no use to the next one (a DP leader outgrew the
  // reservation): let it go, so the next set is made at this size after the commit (Prepare).
  if (!prepare && !spare_.empty()) {
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (i >= spare_.size() || spare_[i]->capacity() < sizes[i]) {
        spare_.clear();
        break;
      }
    }
  }
  // Room beside the sets kept ahead: the spare set goes first, then the resident one.
  if (!spare_.empty() && total + ResidentBytesLocked() + SpareBytesLocked() > budget_bytes_) {
    if (prepare) return std::vector<StagingSlot>();
    spare_.clear();
  }
  // The dropped set's regions that no load reads are this save's where they fit (below): the
  // trainer has them mapped and pinned already, and no region is made on its time. With a
  // budget of one set, saves then stage in the same region, and the memory tier holds the last
  // commit until the next save starts.
  std::vector<std::shared_ptr<Region>> dropped;
  if (!resident_.empty() && total + ResidentBytesLocked() > budget_bytes_) {
    if (prepare) return std::vector<StagingSlot>();  // only a save may drop the resident set
    dropped.swap(resident_);
    residency_.clear();  // every hold expires; a load still reading keeps its token alive
    ++evictions_;
  }
  regions_.resize(sizes.size());  // releases regions beyond the request
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (regions_[i] != nullptr && regions_[i]->capacity() >= sizes[i]) continue;
    // Free the old region before creating its replacement so the two never both count.
    regions_[i].reset();
    for (std::shared_ptr<Region>& d : dropped) {
      if (d == nullptr || d.use_count() > 1 || d->capacity() < sizes[i] ||
          total - capacities[i] + d->capacity() > budget_bytes_) {
        continue;
      }
      total = total - capacities[i] + d->capacity();
      capacities[i] = d->capacity();
      regions_[i] = std::move(d);
      break;
    }
  }
  dropped.clear();  // the rest is unmapped (or left to the loads reading it) before any creation
  if (!prepare) ++acquisitions_;
  std::vector<StagingSlot> slots(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    const bool reserve_now = options_.reserve && reservation == Reservation::kNow;
    if (regions_[i] == nullptr) {
      ASSIGN_OR_RETURN(regions_[i], CreateRegionLocked(capacities[i], reserve_now));
    } else if (reserve_now && !regions_[i]->reserved()) {
      // Made for a caller that reserves (kByCaller), who may have reserved only part of it.
      RETURN_IF_ERROR(FallocateByName(regions_[i]->name(), 0, regions_[i]->capacity()));
      regions_[i]->set_reserved();
    }
    const Region& region = *regions_[i];
    slots[i] = StagingSlot{region.name(), region.data(), sizes[i], region.capacity(),
                           region.pinned(), prepare ? 0 : acquisitions_};
  }
  return slots;
}

void StagingPool::ReleaseAll() {
  absl::MutexLock lock(&mu_);
  regions_.clear();
  resident_.clear();
  residency_.clear();
  spare_.clear();
  ++acquisitions_;  // what was handed out is gone: nothing of it can be retained
}

std::vector<ResidentRegion> StagingPool::Retain(uint64_t acquisition) {
  absl::MutexLock lock(&mu_);
  if (acquisition != acquisitions_ || regions_.empty()) return {};
  for (const auto& region : regions_) {
    if (region == nullptr) return {};
  }
  // The set resident until now becomes the next save's (its regions stay mapped for reuse);
  // its holds expire.
  resident_.swap(regions_);
  residency_.clear();
  // The first retain of a reserved pool: the spare set is the next save's.
  if (regions_.empty()) regions_.swap(spare_);
  ++acquisitions_;  // the retained regions are no longer the last Acquire's
  std::vector<ResidentRegion> out;
  for (const std::shared_ptr<Region>& region : resident_) {
    // Its own control block, whose deleter lets go of the region when the last strong
    // reference goes (a weak_ptr keeps the control block, and so the lambda, alive).
    std::shared_ptr<const void> token(region.get(),
                                      [keep = region](const void*) mutable { keep.reset(); });
    out.push_back(ResidentRegion{region->name(), static_cast<const char*>(region->data()),
                                 region->capacity(), std::weak_ptr<const void>(token)});
    residency_.push_back(std::move(token));
  }
  return out;
}

uint64_t StagingPool::MappedBytesLocked() const {
  uint64_t total = ResidentBytesLocked() + SpareBytesLocked();
  for (const auto& region : regions_) {
    if (region != nullptr) total += region->capacity();
  }
  return total;
}

uint64_t StagingPool::mapped_bytes() const {
  absl::MutexLock lock(&mu_);
  return MappedBytesLocked();
}

uint64_t StagingPool::resident_bytes() const {
  absl::MutexLock lock(&mu_);
  return ResidentBytesLocked();
}

uint64_t StagingPool::resident_evictions() const {
  absl::MutexLock lock(&mu_);
  return evictions_;
}

uint64_t StagingPool::regions_created() const {
  absl::MutexLock lock(&mu_);
  return next_region_;
}

absl::StatusOr<int> StagingPool::RemoveStaleRegions(absl::string_view job_id, uint32_t rank,
                                                    uint64_t keep_incarnation) {
  const std::string prefix = StagingRegionPrefix(job_id, rank);
  const std::string keep = StagingIncarnationPrefix(job_id, rank, keep_incarnation);
  // glibc implements shm_open on /dev/shm; listing it is the only way to enumerate objects.
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) {
    return absl::InternalError(absl::StrCat("opendir /dev/shm: ", strerror(errno)));
  }
  int removed = 0;
  while (struct dirent* entry = readdir(dir)) {
    const absl::string_view name = entry->d_name;
    if (!absl::StartsWith(name, prefix) || absl::StartsWith(name, keep)) continue;
    if (!IsStagingRegionRest(name.substr(prefix.size()))) continue;
    if (shm_unlink(absl::StrCat("/", name).c_str()) == 0) ++removed;
  }
  closedir(dir);
  return removed;
}

}  // namespace tessera
