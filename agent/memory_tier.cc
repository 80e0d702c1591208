#include "agent/memory_tier.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "shm/mapped_region.h"

namespace tessera {

void MemoryTier::Publish(ResidentCheckpoint checkpoint) {
  {
    absl::MutexLock lock(&mu_);
    current_ = std::move(checkpoint);
  }
  if (on_publish_) on_publish_();
}

ResidentView MemoryTier::Find(int64_t step, absl::string_view session_id) const {
  ResidentView view;
  std::optional<HeldCheckpoint> held = Hold(step, session_id);
  if (!held.has_value()) return view;
  const ResidentCheckpoint& c = held->checkpoint;
  view.Add(c.file, c.file_offset, c.region.data, c.nbytes, std::move(held->hold));
  return view;
}

std::optional<HeldCheckpoint> MemoryTier::Hold(int64_t step, absl::string_view session_id) const {
  absl::MutexLock lock(&mu_);
  if (!current_.has_value() || current_->step != step || current_->session_id != session_id) {
    return std::nullopt;
  }
  std::shared_ptr<const void> hold = current_->region.hold.lock();
  if (hold == nullptr) return std::nullopt;  // dropped to make room for a save
  return HeldCheckpoint{*current_, std::move(hold)};
}

std::optional<ResidentCheckpoint> MemoryTier::Current() const {
  absl::MutexLock lock(&mu_);
  if (!current_.has_value() || current_->region.hold.expired()) return std::nullopt;
  return current_;
}

std::optional<v1::MemoryCopy> MemoryTier::CurrentCopy() const {
  std::optional<ResidentCheckpoint> current = Current();
  if (!current.has_value()) return std::nullopt;
  v1::MemoryCopy copy;
  copy.set_step(current->step);
  copy.set_session_id(current->session_id);
  copy.set_file(current->file);
  copy.set_file_offset(current->file_offset);
  copy.set_nbytes(current->nbytes);
  copy.set_region(current->region.name);
  return copy;
}

int AddNodeCopies(const std::vector<v1::MemoryCopy>& copies, uint32_t self_rank,
                  absl::string_view node_id, ResidentView& view) {
  int added = 0;
  for (const v1::MemoryCopy& copy : copies) {
    if (copy.rank() == self_rank || copy.node_id() != node_id || copy.nbytes() == 0 ||
        copy.region().empty() || view.files.contains(copy.file())) {
      continue;
    }
    MapStagingOptions options;
    options.read_only = true;
    options.populate = false;  // the reader's copy faults in what it reads, in parallel
    absl::StatusOr<std::unique_ptr<MappedStaging>> mapped =
        MappedStaging::Map(copy.region(), copy.nbytes(), options);
    if (!mapped.ok()) continue;  // dropped, or replaced by a save that needed the room
    std::shared_ptr<const MappedStaging> hold = *std::move(mapped);
    const char* data = static_cast<const char*>(hold->data());  // before `hold` moves
    view.Add(copy.file(), copy.file_offset(), data, copy.nbytes(), std::move(hold));
    ++added;
  }
  return added;
}

int AddHeldCopies(const std::vector<v1::MemoryCopy>& copies, uint32_t self_rank,
                  const BuddyStore& store, ResidentView& view) {
  int added = 0;
  for (const v1::MemoryCopy& copy : copies) {
    if (copy.rank() != self_rank || view.files.contains(copy.file())) continue;
    std::optional<HeldCopy> held = store.Find(copy.step(), copy.session_id(), copy.file());
    if (!held.has_value()) continue;
    view.Add(copy.file(), held->copy.file_offset(), held->bytes->data(), held->bytes->size(),
             held->bytes);
    ++added;
  }
  return added;
}

absl::Status CheckRemoteCopySize(const v1::MemoryCopy& copy, uint64_t file_size,
                                 uint64_t max_bytes) {
  if (copy.nbytes() > file_size || copy.file_offset() > file_size - copy.nbytes() ||
      copy.nbytes() > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(copy.nbytes(), " bytes at ", copy.file_offset(),
                                                   " (the file has ", file_size, "; ", max_bytes,
                                                   " may still be read)"));
  }
  return absl::OkStatus();
}

absl::Status ReadRemoteCopy(const v1::MemoryCopy& copy, uint64_t file_size, uint64_t max_bytes,
                            const CopyDestination& destination, const FetchMemoryCopy& fetch) {
  absl::Status status = CheckRemoteCopySize(copy, file_size, max_bytes);
  if (status.ok()) {
    absl::StatusOr<char*> dest = destination(copy.nbytes());
    status = dest.ok() ? fetch(copy, *dest) : dest.status();
  }
  if (!status.ok()) {
    LogWarning("memory copy of ", copy.file(), " held by rank ", copy.rank(), " on ",
               copy.node_id(), " not read: ", status.ToString());
  }
  return status;
}

uint64_t AddRemoteCopies(const std::vector<v1::MemoryCopy>& copies, uint32_t self_rank,
                         const absl::flat_hash_map<std::string, uint64_t>& needed,
                         uint64_t max_bytes, const FetchMemoryCopy& fetch, ResidentView& view) {
  uint64_t fetched = 0;
  for (const v1::MemoryCopy& copy : copies) {
    auto file = needed.find(copy.file());
    if (file == needed.end() || view.files.contains(copy.file()) || copy.rank() == self_rank ||
        copy.peer_address().empty()) {
      continue;
    }
    std::shared_ptr<MemoryBuffer> bytes;
    auto in_heap = [&bytes](uint64_t nbytes) -> absl::StatusOr<char*> {
      absl::StatusOr<std::shared_ptr<MemoryBuffer>> made = MemoryBuffer::Make(nbytes);
      if (!made.ok()) return made.status();
      bytes = *std::move(made);
      return bytes->data();
    };
    if (!ReadRemoteCopy(copy, file->second, max_bytes - fetched, in_heap, fetch).ok()) continue;
    const char* data = bytes->data();  // before `bytes` moves
    view.Add(copy.file(), copy.file_offset(), data, copy.nbytes(), std::move(bytes));
    fetched += copy.nbytes();
  }
  return fetched;
}

}  // namespace tessera
