#include "agent/buddy_store.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status.h"

namespace tessera {

absl::StatusOr<std::shared_ptr<MemoryBuffer>> BuddyStore::Reserve(const v1::MemoryCopy& copy) {
  auto buffer = std::make_shared<MemoryBuffer>(copy.nbytes());  // untouched until received
  absl::MutexLock lock(&mu_);
  const uint32_t writer = copy.writer_rank();
  uint64_t others = 0;
  for (const auto& [w, held] : copies_) others += w == writer ? 0 : held.copy.nbytes();
  for (const auto& [arriving, bytes] : incoming_) others += bytes;
  if (copy.nbytes() > budget_bytes_ || others > budget_bytes_ - copy.nbytes()) {
    return MakeError(absl::StatusCode::kResourceExhausted, v1::ERROR_CODE_ADMISSION_DENIED,
                     absl::StrCat("a memory copy of ", copy.nbytes(), " bytes for rank ", writer,
                                  " does not fit the buddy budget of ", budget_bytes_,
                                  " bytes beside ", others, " held or being received"));
  }
  // The copy being replaced stays readable while its successor arrives if both fit; else it
  // is let go now, so what this store holds stays within its budget (a read in progress
  // keeps the bytes until it ends).
  auto held = copies_.find(writer);
  if (held != copies_.end() &&
      held->second.copy.nbytes() > budget_bytes_ - copy.nbytes() - others) {
    LogInfo("the buddy copy of step ", held->second.copy.step(), " for rank ", writer,
            " is let go for step ", copy.step(), "'s: both do not fit the buddy budget of ",
            budget_bytes_, " bytes");
    copies_.erase(held);
  }
  incoming_[buffer.get()] = copy.nbytes();
  return buffer;
}

void BuddyStore::Keep(v1::MemoryCopy copy, std::shared_ptr<const MemoryBuffer> bytes) {
  absl::MutexLock lock(&mu_);
  incoming_.erase(bytes.get());
  const uint32_t writer = copy.writer_rank();
  auto held = copies_.find(writer);
  if (held != copies_.end() && held->second.copy.step() > copy.step()) {
    LogInfo("the buddy copy of step ", copy.step(), " for rank ", writer, " arrived after step ",
            held->second.copy.step(), "'s: not kept");
    return;
  }
  copy.clear_region();
  copies_[writer] = HeldCopy{std::move(copy), std::move(bytes)};
}

void BuddyStore::Abandon(const MemoryBuffer* buffer) {
  absl::MutexLock lock(&mu_);
  incoming_.erase(buffer);
}

std::optional<HeldCopy> BuddyStore::Find(int64_t step, absl::string_view session_id,
                                         absl::string_view file) const {
  absl::MutexLock lock(&mu_);
  for (const auto& [writer, held] : copies_) {
    if (held.copy.step() == step && held.copy.session_id() == session_id &&
        held.copy.file() == file) {
      return held;
    }
  }
  return std::nullopt;
}

std::vector<v1::MemoryCopy> BuddyStore::Copies() const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::MemoryCopy> out;
  for (const auto& [writer, held] : copies_) out.push_back(held.copy);
  return out;
}
}  // namespace tessera
