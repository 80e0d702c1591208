#include "agent/memory_tier.h"

#include <utility>

namespace tessera {

void MemoryTier::Publish(ResidentCheckpoint checkpoint) {
  {
    absl::MutexLock lock(&mu_);
    current_ = std::move(checkpoint);
  }
  if (on_publish_) on_publish_();
}

void MemoryTier::Clear() {
  absl::MutexLock lock(&mu_);
  current_.reset();
}

ResidentView MemoryTier::Find(int64_t step, absl::string_view session_id) const {
  absl::MutexLock lock(&mu_);
  ResidentView view;
  if (!current_.has_value() || current_->step != step || current_->session_id != session_id) {
    return view;
  }
  std::shared_ptr<const void> hold = current_->region.hold.lock();
  if (hold == nullptr) return view;  // dropped to make room for a save
  view.files[current_->file] =
      ResidentBytes{current_->file_offset, current_->region.data, current_->nbytes};
  view.holds.push_back(std::move(hold));
  view.bytes = current_->nbytes;
  return view;
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
        view.files.contains(copy.file())) {
      continue;
    }
    MapStagingOptions options;
    options.read_only = true;
    options.populate = false;  // the reader's copy faults in what it reads, in parallel
    absl::StatusOr<std::unique_ptr<MappedStaging>> mapped =
        MappedStaging::Map(copy.region(), copy.nbytes(), options);
    if (!mapped.ok()) continue;  // dropped, or replaced by a save that needed the room
    std::shared_ptr<const MappedStaging> hold = *std::move(mapped);
    view.files[copy.file()] = ResidentBytes{copy.file_offset(),
                                            static_cast<const char*>(hold->data()), copy.nbytes()};
    view.holds.push_back(std::move(hold));
    view.bytes += copy.nbytes();
    ++added;
  }
  return added;
}

}  // namespace tessera
