// RocksDbStateStore: the coordinator's StateStore on RocksDB (DESIGN.md "RocksDB").
//
// One column family per Table, named by TableName ("agents", "jobs", ...), created on open
// when missing; column families it does not know (written by a newer version) are opened and
// left alone. Commit writes one rocksdb::WriteBatch with WriteOptions::sync, so a returned OK
// means the batch is in the fsynced write-ahead log and survives a process or machine crash;
// a batch is recovered whole or not at all.
//
// Lifecycle: Open() takes RocksDB's lock file in the directory, so one process (and one
// RocksDbStateStore within it) owns a path at a time. The destructor closes the database:
// background flushes and compactions stop, column family handles are released before the DB.
// There is nothing to flush on close: every acknowledged commit is already in the log.
//
// Thread-safety: safe for concurrent use from many threads (RocksDB's DB is). Concurrent
// Commits are grouped into shared log writes and fsyncs by RocksDB.
#ifndef TESSERA_SERVER_STORE_ROCKSDB_STATE_STORE_H_
#define TESSERA_SERVER_STORE_ROCKSDB_STATE_STORE_H_

#include <array>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "server/store/state_store.h"

namespace rocksdb {
class ColumnFamilyHandle;
class DB;
}  // namespace rocksdb

namespace tessera {

struct RocksDbStoreOptions {
  // Directory of the database. Required.
  std::string path;

  // Create the directory (with its parents), the database and its column families when they
  // do not exist. When false, Open fails on a path that holds no database.
  // Default: true.
  bool create_if_missing = true;

  // fsync the write-ahead log before Commit returns. Turning it off keeps commits across a
  // process crash but can lose acknowledged ones in a machine crash or power loss: for
  // benchmarks and throwaway stores only, never for a coordinator.
  // Default: true.
  bool sync = true;

  // LRU cache of uncompressed blocks shared by all tables.
  // Default: 64 MiB.
  size_t block_cache_bytes = size_t{64} << 20;

  // Memtable size of each table before it is flushed to a file.
  // Default: 16 MiB.
  size_t write_buffer_bytes = size_t{16} << 20;

  // Background threads for flushes and compactions.
  // Default: 2.
  int max_background_jobs = 2;

  // RocksDB informational LOG files kept in the directory (older ones are deleted).
  // Default: 5.
  size_t keep_log_files = 5;
};

class RocksDbStateStore : public StateStore {
 public:
  // Opens (and, with create_if_missing, creates) the store at options.path.
  // Errors: InvalidArgument if options.path is empty, or write_buffer_bytes,
  // max_background_jobs or keep_log_files is not positive;
  // FailedPrecondition if the path is not a directory, if the database is locked (open in
  // another process, or already in this one), or if RocksDB rejects the options for the
  // existing database; NotFound if the path holds no database and create_if_missing is
  // false; DataLoss if the database is corrupt; Unavailable for an I/O error. Every message
  // names the path.
  static absl::StatusOr<std::unique_ptr<RocksDbStateStore>> Open(
      const RocksDbStoreOptions& options);

  RocksDbStateStore(const RocksDbStateStore&) = delete;
  RocksDbStateStore& operator=(const RocksDbStateStore&) = delete;
  ~RocksDbStateStore() override;

  // Errors: as StateStore::Commit.
  absl::Status Commit(const StoreBatch& batch) override;
  // Errors: as StateStore::Get.
  absl::StatusOr<std::optional<std::string>> Get(Table table,
                                                 absl::string_view key) const override;
  // Errors: as StateStore::Scan.
  absl::Status Scan(Table table, absl::string_view prefix, const ScanFn& fn) const override;

  const std::string& path() const { return options_.path; }

 protected:
  // Errors: as StateStore::Scan.
  absl::Status ScanKeyRange(Table table, absl::string_view begin, absl::string_view end,
                            const ScanFn& fn) const override;

 private:
  RocksDbStateStore(const RocksDbStoreOptions& options, std::unique_ptr<rocksdb::DB> db,
                    std::vector<rocksdb::ColumnFamilyHandle*> handles);

  rocksdb::ColumnFamilyHandle* Handle(Table table) const;
  // Iterates [begin, end) of `table`; an empty end means to the end of the table.
  absl::Status Iterate(Table table, absl::string_view begin, const std::string& end,
                       const ScanFn& fn) const;
  // Builds the rocksdb::WriteBatch of a validated, non-empty batch and writes it.
  absl::Status WriteLocked(const StoreBatch& batch)
      ABSL_SHARED_LOCKS_REQUIRED(unbounded_delete_mu_);
  // The largest key of `table` that is >= `prefix`, if any.
  absl::StatusOr<std::optional<std::string>> LastKeyFrom(Table table,
                                                         absl::string_view prefix) const;

  const RocksDbStoreOptions options_;
  // Destruction order matters: the handles are released (in the destructor) before db_.
  std::unique_ptr<rocksdb::DB> db_;
  // Every handle Open returned, ours and unknown ones alike, to release on close.
  std::vector<rocksdb::ColumnFamilyHandle*> handles_;
  // handles_ entries by Table.
  std::array<rocksdb::ColumnFamilyHandle*, kAllTables.size()> table_handles_{};
  // A DeletePrefix with no finite end (an empty or all-0xFF prefix) becomes a DeleteRange up
  // to the table's current last key, which must not change until the batch is written: such
  // commits hold this exclusively, all others shared (so they still group their fsyncs).
  // It guards no field, only that ordering.
  mutable absl::Mutex unbounded_delete_mu_;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_STORE_ROCKSDB_STATE_STORE_H_
