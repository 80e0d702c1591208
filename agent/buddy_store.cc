#include "agent/buddy_store.h"

#include <new>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status.h"

namespace tessera {

absl::StatusOr<std::shared_ptr<MemoryBuffer>> MemoryBuffer::Make(uint64_t size) {
  std::unique_ptr<char[]> data(new (std::nothrow) char[size]);  // untouched until written
  if (data == nullptr && size > 0) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", size, " bytes"));
  }
  return std::shared_ptr<MemoryBuffer>(new MemoryBuffer(std::move(data), size));
}

absl::StatusOr<std::shared_ptr<MemoryBuffer>> BuddyStore::Reserve(const v1::MemoryCopy& copy) {
  const uint32_t writer = copy.writer_rank();
  auto refused = [&](const std::string& why) {
    return MakeError(absl::StatusCode::kResourceExhausted, v1::ERROR_CODE_ADMISSION_DENIED,
                     absl::StrCat("a memory copy of ", copy.nbytes(), " bytes for rank ", writer,
                                  " is refused: ", why));
  };
  // The size comes from the sender: checked against the whole budget before anything is
  // allocated (the allocation is made outside the lock).
  if (copy.nbytes() > budget_bytes_) {
    return refused(absl::StrCat("the buddy budget is ", budget_bytes_, " bytes"));
  }
  absl::StatusOr<std::shared_ptr<MemoryBuffer>> made = MemoryBuffer::Make(copy.nbytes());
  if (!made.ok()) return refused(std::string(made.status().message()));
  std::shared_ptr<MemoryBuffer> buffer = *std::move(made);
  absl::MutexLock lock(&mu_);
  uint64_t others = 0;
  for (const auto& [w, held] : copies_) others += w == writer ? 0 : held.held.copy.nbytes();
  for (const auto& [buffer, arriving] : incoming_) others += arriving.bytes;
  if (others > budget_bytes_ - copy.nbytes()) {
    return refused(absl::StrCat("it does not fit the buddy budget of ", budget_bytes_,
                                " bytes beside ", others, " held or being received"));
  }
  // The copy being replaced stays readable while its successor arrives if both fit; else it
  // is let go now, so what this store holds stays within its budget (a read in progress
  // keeps the bytes until it ends).
  auto held = copies_.find(writer);
  if (held != copies_.end() &&
      held->second.held.copy.nbytes() > budget_bytes_ - copy.nbytes() - others) {
    LogInfo("the buddy copy of step ", held->second.held.copy.step(), " for rank ", writer,
            " is let go for step ", copy.step(), "'s: both do not fit the buddy budget of ",
            budget_bytes_, " bytes");
    copies_.erase(held);
  }
  incoming_[buffer.get()] = Arriving{copy.nbytes(), ++reservations_};
  return buffer;
}

void BuddyStore::Keep(v1::MemoryCopy copy, std::shared_ptr<const MemoryBuffer> bytes) {
  absl::MutexLock lock(&mu_);
  uint64_t reserved = ++reservations_;  // a buffer never reserved counts as the newest
  if (auto arriving = incoming_.find(bytes.get()); arriving != incoming_.end()) {
    reserved = arriving->second.reserved;
    incoming_.erase(arriving);
  }
  const uint32_t writer = copy.writer_rank();
  auto held = copies_.find(writer);
  if (held != copies_.end() && held->second.reserved > reserved) {
    LogInfo("the buddy copy of step ", copy.step(), " for rank ", writer,
            " arrived after the copy of step ", held->second.held.copy.step(),
            " the sender sent after it: not kept");
    return;
  }
  copy.clear_region();
  copies_[writer] = Held{HeldCopy{std::move(copy), std::move(bytes)}, reserved};
}

void BuddyStore::Abandon(const MemoryBuffer* buffer) {
  absl::MutexLock lock(&mu_);
  incoming_.erase(buffer);
}

std::optional<HeldCopy> BuddyStore::Find(int64_t step, absl::string_view session_id,
                                         absl::string_view file) const {
  absl::MutexLock lock(&mu_);
  for (const auto& [writer, held] : copies_) {
    const v1::MemoryCopy& copy = held.held.copy;
    if (copy.step() == step && copy.session_id() == session_id && copy.file() == file) {
      return held.held;
    }
  }
  return std::nullopt;
}

std::vector<v1::MemoryCopy> BuddyStore::Copies() const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::MemoryCopy> out;
  for (const auto& [writer, held] : copies_) out.push_back(held.held.copy);
  return out;
}
}  // namespace tessera
