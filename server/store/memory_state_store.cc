#include "server/store/memory_state_store.h"

#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "server/store/keys.h"

namespace tessera {
namespace {

size_t Index(Table table) { return static_cast<size_t>(table); }

// Copies the records of [begin, end) ("" end: to the end of the table) so that the
// callback runs on a snapshot and without the lock, as it may call back into the store.
std::vector<std::pair<std::string, std::string>> CopyRange(
    const std::map<std::string, std::string>& table, const std::string& begin,
    const std::string& end) {
  std::vector<std::pair<std::string, std::string>> records;
  auto it = table.lower_bound(begin);
  auto stop = end.empty() ? table.end() : table.lower_bound(end);
  for (; it != stop; ++it) records.emplace_back(it->first, it->second);
  return records;
}

absl::Status RunScan(const std::vector<std::pair<std::string, std::string>>& records,
                     const ScanFn& fn) {
  for (const auto& [key, value] : records) {
    if (!fn(key, value)) break;
  }
  return absl::OkStatus();
}

void ApplyOp(const StoreBatch::Op& op, std::map<std::string, std::string>& table) {
  switch (op.kind) {
    case StoreBatch::OpKind::kPut:
      table[op.key] = op.value;
      return;
    case StoreBatch::OpKind::kDelete:
      table.erase(op.key);
      return;
    case StoreBatch::OpKind::kDeleteRange:
      table.erase(table.lower_bound(op.key), table.lower_bound(op.end));
      return;
    case StoreBatch::OpKind::kDeletePrefix: {
      const std::string end = PrefixSuccessor(op.key);
      table.erase(table.lower_bound(op.key),
                  end.empty() ? table.end() : table.lower_bound(end));
      return;
    }
  }
}

}  // namespace

absl::Status MemoryStateStore::Commit(const StoreBatch& batch) {
  if (absl::Status valid = batch.Validate(); !valid.ok()) return valid;
  absl::MutexLock lock(&mu_);
  if (!injected_commit_failures_.empty()) {
    absl::Status failure = std::move(injected_commit_failures_.front());
    injected_commit_failures_.pop_front();
    return failure;
  }
  // Validation is the only way a batch can fail, so applying in place is atomic.
  for (const StoreBatch::Op& op : batch.ops()) ApplyOp(op, tables_[Index(op.table)]);
  ++successful_commits_;
  return absl::OkStatus();
}

absl::StatusOr<std::optional<std::string>> MemoryStateStore::Get(Table table,
                                                                 absl::string_view key) const {
  absl::MutexLock lock(&mu_);
  const TableMap& map = tables_[Index(table)];
  auto it = map.find(std::string(key));
  if (it == map.end()) return std::optional<std::string>();
  return std::optional<std::string>(it->second);
}

absl::Status MemoryStateStore::Scan(Table table, absl::string_view prefix,
                                    const ScanFn& fn) const {
  std::vector<std::pair<std::string, std::string>> records;
  {
    absl::MutexLock lock(&mu_);
    records = CopyRange(tables_[Index(table)], std::string(prefix), PrefixSuccessor(prefix));
  }
  return RunScan(records, fn);
}

absl::Status MemoryStateStore::ScanKeyRange(Table table, absl::string_view begin,
                                            absl::string_view end, const ScanFn& fn) const {
  std::vector<std::pair<std::string, std::string>> records;
  {
    absl::MutexLock lock(&mu_);
    records = CopyRange(tables_[Index(table)], std::string(begin), std::string(end));
  }
  return RunScan(records, fn);
}

void MemoryStateStore::FailNextCommit(absl::Status status) {
  if (status.ok()) return;
  absl::MutexLock lock(&mu_);
  injected_commit_failures_.push_back(std::move(status));
}

int64_t MemoryStateStore::successful_commits() const {
  absl::MutexLock lock(&mu_);
  return successful_commits_;
}

size_t MemoryStateStore::TableSize(Table table) const {
  absl::MutexLock lock(&mu_);
  return tables_[Index(table)].size();
}

}  // namespace tessera
