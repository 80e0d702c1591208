// MemoryStateStore: a StateStore held in memory, for unit tests of the code that persists
// through a StateStore (session state machine, registry, agent table). Nothing survives the
// object; a "coordinator restart" in a test is a new state machine over the same store.
//
// It keeps the contract of StateStore (atomic batches, ordered scans over a snapshot) and
// adds fault injection, so tests can check that a failed commit is never acknowledged:
//
//   store.FailNextCommit(absl::UnavailableError("disk full"));
//   EXPECT_EQ(machine.Commit(...).code(), absl::StatusCode::kUnavailable);
//
// Thread-safety: safe for concurrent use; one mutex guards all tables, and Scan calls its
// callback without holding it.
#ifndef TESSERA_SERVER_STORE_MEMORY_STATE_STORE_H_
#define TESSERA_SERVER_STORE_MEMORY_STATE_STORE_H_

#include <array>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "server/store/state_store.h"

namespace tessera {

class MemoryStateStore : public StateStore {
 public:
  MemoryStateStore() = default;
  MemoryStateStore(const MemoryStateStore&) = delete;
  MemoryStateStore& operator=(const MemoryStateStore&) = delete;

  // Errors: InvalidArgument if batch.Validate() fails; otherwise only what FailNextCommit
  // injected (the batch is then not applied).
  absl::Status Commit(const StoreBatch& batch) override;
  // Errors: none.
  absl::StatusOr<std::optional<std::string>> Get(Table table,
                                                 absl::string_view key) const override;
  // Errors: none.
  absl::Status Scan(Table table, absl::string_view prefix, const ScanFn& fn) const override;

  // The next Commit (of a valid batch, empty ones included) returns `status` and applies
  // nothing. Calls queue up: the second failure is for the commit after that. An OK `status`
  // is ignored.
  void FailNextCommit(absl::Status status);

  // Commits that returned OK (empty batches included) since construction.
  int64_t successful_commits() const;

  // Records in `table`: for tests that check pruning.
  size_t TableSize(Table table) const;

 protected:
  // Errors: none.
  absl::Status ScanKeyRange(Table table, absl::string_view begin, absl::string_view end,
                            const ScanFn& fn) const override;

 private:
  using TableMap = std::map<std::string, std::string>;

  mutable absl::Mutex mu_;
  std::array<TableMap, kAllTables.size()> tables_ ABSL_GUARDED_BY(mu_);
  std::deque<absl::Status> injected_commit_failures_ ABSL_GUARDED_BY(mu_);
  int64_t successful_commits_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_STORE_MEMORY_STATE_STORE_H_
