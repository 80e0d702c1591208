// StateStore: the coordinator's durable state (DESIGN.md "RocksDB"), behind an interface so
// that the session state machine, the registry and the agent table are plain C++ testable
// against MemoryStateStore (STYLE.md 7), and run against RocksDbStateStore in production.
//
// The store is type-agnostic: a table maps byte-string keys to byte-string values (callers
// store serialized protos and build keys with server/store/keys.h). Keys within a table are
// ordered bytewise (unsigned), as RocksDB's default comparator orders them.
//
// Persist, then acknowledge (STYLE.md 9): every state transition is one StoreBatch passed to
// one Commit, which returns only once the batch is durable; only then does the caller reply.
//
// Thread-safety: every StateStore implementation is safe for concurrent use from many threads
// without external synchronization. StoreBatch is a plain value: build it on one thread.
#ifndef TESSERA_SERVER_STORE_STATE_STORE_H_
#define TESSERA_SERVER_STORE_STATE_STORE_H_

#include <array>
#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tessera {

// One table per kind of record; each is its own RocksDB column family.
enum class Table {
  kAgents,       // registered agents: incarnation, lease
  kJobs,         // jobs: layout, last validated plan fingerprint, latest checkpoint
  kSessions,     // save sessions and their state
  kPlans,        // validated global plans
  kRegistry,     // the key registry (fqn -> chunks) of committed checkpoints
  kChunks,       // per-chunk progress of sessions in flight (pruned on commit)
  kCheckpoints,  // manifest summaries of committed checkpoints
  kMeta,         // store-wide records (schema version, ...)
  kMemoryCheckpoints,  // memory-only commits (DESIGN.md "Memory-only saves")
};

inline constexpr std::array<Table, 9> kAllTables = {
    Table::kAgents,   Table::kJobs,   Table::kSessions,    Table::kPlans,
    Table::kRegistry, Table::kChunks, Table::kCheckpoints, Table::kMeta,
    Table::kMemoryCheckpoints,
};

// "agents", "jobs", "sessions", "plans", "registry", "chunks", "checkpoints", "meta",
// "memory_checkpoints": the column family names on disk, so they never change. "unknown" for a value outside the enum.
absl::string_view TableName(Table table);

// The table named `name` by TableName, if any.
std::optional<Table> TableFromName(absl::string_view name);

// An ordered list of writes that Commit applies atomically. Later operations see the effect
// of earlier ones: Put then DeletePrefix covering the key leaves no key; DeletePrefix then
// Put leaves the key.
class StoreBatch {
 public:
  enum class OpKind { kPut, kDelete, kDeleteRange, kDeletePrefix };

  struct Op {
    OpKind kind;
    Table table;
    // kPut, kDelete: the key. kDeleteRange: the first key deleted. kDeletePrefix: the prefix.
    std::string key;
    // kPut: the value (may be empty). Empty for the other kinds.
    std::string value;
    // kDeleteRange: the exclusive end. Empty for the other kinds.
    std::string end;
  };

  // Sets `key` to `value`, replacing any value it had.
  StoreBatch& Put(Table table, absl::string_view key, absl::string_view value);
  // Removes `key`; removing an absent key is not an error.
  StoreBatch& Delete(Table table, absl::string_view key);
  // Removes every key k with begin <= k < end. begin == end removes nothing; begin > end
  // makes Commit fail with InvalidArgument.
  StoreBatch& DeleteRange(Table table, absl::string_view begin, absl::string_view end);
  // Removes every key that starts with `prefix`. An empty prefix empties the table.
  StoreBatch& DeletePrefix(Table table, absl::string_view prefix);
  // Appends `other`'s operations after these, in order.
  StoreBatch& Append(StoreBatch other);

  const std::vector<Op>& ops() const { return ops_; }
  bool empty() const { return ops_.empty(); }
  size_t size() const { return ops_.size(); }
  // Sum of the sizes of all keys, values and range ends: what the batch costs to write.
  size_t ByteSize() const { return byte_size_; }
  void Clear();

  // OK if Commit can apply the batch.
  // Errors: InvalidArgument for a DeleteRange with begin > end, or a table outside the enum.
  absl::Status Validate() const;

 private:
  std::vector<Op> ops_;
  size_t byte_size_ = 0;
};

// Called by Scan for each record, in key order; returns false to stop the scan.
using ScanFn = std::function<bool(absl::string_view key, absl::string_view value)>;

class StateStore {
 public:
  virtual ~StateStore() = default;

  // Applies every operation of `batch`, in order, as one atomic write: readers (and a store
  // reopened after a crash) see all of it or none of it. Returns OK only once the batch is
  // durable. An empty batch is a no-op that returns OK.
  // On an error other than InvalidArgument the batch is not visible now, but may reappear
  // after a restart if the failure came after its bytes reached the disk: a caller that
  // recovers from a restart re-reads its state rather than assuming the commit failed.
  // Errors: InvalidArgument if batch.Validate() fails (nothing is applied);
  // Unavailable for an I/O error (disk full, EIO, the store is read-only after an earlier
  // write error) — retry later; DataLoss if the store found corrupt data;
  // Internal for any other failure of the storage engine. Messages name the store's path.
  virtual absl::Status Commit(const StoreBatch& batch) = 0;

  // The value of `key` in `table`, or nullopt if it has none.
  // Errors: Unavailable for an I/O error; DataLoss for corrupt data; Internal otherwise.
  virtual absl::StatusOr<std::optional<std::string>> Get(Table table,
                                                         absl::string_view key) const = 0;

  // Calls fn(key, value) for every record of `table` whose key starts with `prefix`, in
  // ascending key order, until fn returns false. The scan reads one consistent snapshot taken
  // when it starts: commits made meanwhile (also by fn, which may call any method of this
  // store) are not seen by it. An empty prefix scans the whole table.
  // Errors: Unavailable for an I/O error; DataLoss for corrupt data; Internal otherwise.
  // Records already passed to fn stay passed: a scan that fails midway has been partial.
  virtual absl::Status Scan(Table table, absl::string_view prefix, const ScanFn& fn) const = 0;

  // As Scan, for the keys k with begin <= k < end. Checks the range, then ScanKeyRange.
  // Errors: InvalidArgument if begin > end; otherwise as Scan.
  absl::Status ScanRange(Table table, absl::string_view begin, absl::string_view end,
                         const ScanFn& fn) const;

 protected:
  // ScanRange's scan, for begin < end (ScanRange checked it). Errors: as Scan.
  virtual absl::Status ScanKeyRange(Table table, absl::string_view begin, absl::string_view end,
                                    const ScanFn& fn) const = 0;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_STORE_STATE_STORE_H_
