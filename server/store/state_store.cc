#include "server/store/state_store.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/escaping.h"

namespace tessera {

absl::string_view TableName(Table table) {
  switch (table) {
    case Table::kAgents:
      return "agents";
    case Table::kJobs:
      return "jobs";
    case Table::kSessions:
      return "sessions";
    case Table::kPlans:
      return "plans";
    case Table::kRegistry:
      return "registry";
    case Table::kChunks:
      return "chunks";
    case Table::kCheckpoints:
      return "checkpoints";
    case Table::kMeta:
      return "meta";
    case Table::kMemoryCheckpoints:
      return "memory_checkpoints";
  }
  return "unknown";
}

std::optional<Table> TableFromName(absl::string_view name) {
  for (Table table : kAllTables) {
    if (TableName(table) == name) return table;
  }
  return std::nullopt;
}

StoreBatch& StoreBatch::Put(Table table, absl::string_view key, absl::string_view value) {
  ops_.push_back(Op{OpKind::kPut, table, std::string(key), std::string(value), std::string()});
  byte_size_ += key.size() + value.size();
  return *this;
}

StoreBatch& StoreBatch::Delete(Table table, absl::string_view key) {
  ops_.push_back(Op{OpKind::kDelete, table, std::string(key), std::string(), std::string()});
  byte_size_ += key.size();
  return *this;
}

StoreBatch& StoreBatch::DeleteRange(Table table, absl::string_view begin, absl::string_view end) {
  ops_.push_back(
      Op{OpKind::kDeleteRange, table, std::string(begin), std::string(), std::string(end)});
  byte_size_ += begin.size() + end.size();
  return *this;
}

StoreBatch& StoreBatch::Append(StoreBatch other) {
  if (ops_.empty()) {
    ops_ = std::move(other.ops_);
  } else {
    ops_.insert(ops_.end(), std::make_move_iterator(other.ops_.begin()),
                std::make_move_iterator(other.ops_.end()));
  }
  byte_size_ += other.byte_size_;
  return *this;
}

StoreBatch& StoreBatch::DeletePrefix(Table table, absl::string_view prefix) {
  ops_.push_back(
      Op{OpKind::kDeletePrefix, table, std::string(prefix), std::string(), std::string()});
  byte_size_ += prefix.size();
  return *this;
}

void StoreBatch::Clear() {
  ops_.clear();
  byte_size_ = 0;
}

absl::Status StateStore::ScanRange(Table table, absl::string_view begin, absl::string_view end,
                                   const ScanFn& fn) const {
  if (begin > end) {
    return absl::InvalidArgumentError(absl::StrCat("ScanRange on table ", TableName(table),
                                                   ": begin \"", absl::CEscape(begin),
                                                   "\" is after end \"", absl::CEscape(end),
                                                   "\""));
  }
  if (begin == end) return absl::OkStatus();
  return ScanKeyRange(table, begin, end, fn);
}

absl::Status StoreBatch::Validate() const {
  for (size_t i = 0; i < ops_.size(); ++i) {
    const Op& op = ops_[i];
    if (!TableFromName(TableName(op.table)).has_value()) {
      return absl::InvalidArgumentError(absl::StrCat("batch operation ", i, " names table #",
                                                     static_cast<int>(op.table),
                                                     ", which does not exist"));
    }
    if (op.kind == OpKind::kDeleteRange && op.key > op.end) {
      return absl::InvalidArgumentError(absl::StrCat(
          "batch operation ", i, ": DeleteRange on table ", TableName(op.table), " has begin \"",
          absl::CEscape(op.key), "\" after end \"", absl::CEscape(op.end), "\""));
    }
  }
  return absl::OkStatus();
}

}  // namespace tessera
