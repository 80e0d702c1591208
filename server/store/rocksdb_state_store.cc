#include "server/store/rocksdb_state_store.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "rocksdb/cache.h"
#include "rocksdb/db.h"
#include "rocksdb/iterator.h"
#include "rocksdb/options.h"
#include "rocksdb/slice.h"
#include "rocksdb/table.h"
#include "rocksdb/write_batch.h"
#include "server/store/keys.h"
#include "tessera/v1/types.pb.h"

namespace tessera {
namespace {

// A store error with the path in its message and in an IO_ERROR payload, so that a caller
// several layers up can still say which directory failed.
absl::Status StoreError(absl::StatusCode code, const std::string& path,
                        absl::string_view message) {
  v1::ErrorDetail detail;
  detail.set_code(v1::ERROR_CODE_IO_ERROR);
  detail.set_message(absl::StrCat("state store ", path, ": ", message));
  detail.set_path(path);
  return MakeError(code, detail);
}

// Maps a RocksDB status by who should retry (STYLE.md 3).
absl::Status FromRocks(const rocksdb::Status& s, const std::string& path,
                       absl::string_view operation) {
  if (s.ok()) return absl::OkStatus();
  absl::StatusCode code = absl::StatusCode::kInternal;
  if (s.IsCorruption()) {
    code = absl::StatusCode::kDataLoss;
  } else if (s.IsIOError() || s.IsBusy() || s.IsTimedOut() || s.IsTryAgain() ||
             s.IsShutdownInProgress()) {
    code = absl::StatusCode::kUnavailable;
  }
  return StoreError(code, path, absl::StrCat(operation, " failed: ", s.ToString()));
}

// RocksDB reports its LOCK file held with an IOError; these are its two phrasings (another
// process: "While lock file: ...", this process: "lock hold by current process").
bool IsLockError(const rocksdb::Status& s) {
  if (!s.IsIOError()) return false;
  const std::string text = s.ToString();
  return absl::StrContains(text, "While lock file") ||
         absl::StrContains(text, "lock hold by current process");
}

absl::Status ValidateOptions(const RocksDbStoreOptions& options) {
  if (options.path.empty()) {
    return absl::InvalidArgumentError("RocksDbStoreOptions.path is empty");
  }
  if (options.write_buffer_bytes == 0 || options.max_background_jobs <= 0 ||
      options.keep_log_files == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "state store ", options.path,
        ": write_buffer_bytes, max_background_jobs and keep_log_files must be positive"));
  }
  return absl::OkStatus();
}

// Checks the directory and creates it when allowed. Returns whether it holds a database.
absl::StatusOr<bool> PrepareDirectory(const RocksDbStoreOptions& options) {
  const std::string& path = options.path;
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) {
      return StoreError(absl::StatusCode::kFailedPrecondition, path,
                        "the path exists and is not a directory");
    }
    const std::string current = path + "/CURRENT";
    return ::stat(current.c_str(), &st) == 0;
  }
  const int stat_errno = errno;
  if (stat_errno != ENOENT) {
    return StoreError(absl::StatusCode::kFailedPrecondition, path,
                      absl::StrCat("cannot stat the path: ", std::strerror(stat_errno)));
  }
  if (!options.create_if_missing) {
    return StoreError(absl::StatusCode::kNotFound, path,
                      "no database there, and create_if_missing is false");
  }
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) {
    return StoreError(absl::StatusCode::kFailedPrecondition, path,
                      absl::StrCat("cannot create the directory: ", ec.message()));
  }
  return false;
}

}  // namespace

absl::StatusOr<std::unique_ptr<RocksDbStateStore>> RocksDbStateStore::Open(
    const RocksDbStoreOptions& options) {
  RETURN_IF_ERROR(ValidateOptions(options));
  ASSIGN_OR_RETURN(const bool exists, PrepareDirectory(options));
  const std::string& path = options.path;

  rocksdb::DBOptions db_options;
  db_options.create_if_missing = options.create_if_missing;
  // A version that adds a table opens an older database: missing tables are created always.
  db_options.create_missing_column_families = true;
  db_options.max_background_jobs = options.max_background_jobs;
  db_options.keep_log_file_num = options.keep_log_files;
  db_options.paranoid_checks = true;

  rocksdb::BlockBasedTableOptions table_options;
  table_options.block_cache = rocksdb::NewLRUCache(options.block_cache_bytes);
  rocksdb::ColumnFamilyOptions cf_options;
  cf_options.write_buffer_size = options.write_buffer_bytes;
  cf_options.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table_options));

  // Every column family on disk must be opened, not only ours.
  std::vector<std::string> names = {rocksdb::kDefaultColumnFamilyName};
  if (exists) {
    names.clear();
    rocksdb::Status listed = rocksdb::DB::ListColumnFamilies(db_options, path, &names);
    if (!listed.ok()) return FromRocks(listed, path, "listing column families");
  }
  for (Table table : kAllTables) {
    const std::string name(TableName(table));
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  }
  std::vector<rocksdb::ColumnFamilyDescriptor> descriptors;
  descriptors.reserve(names.size());
  for (const std::string& name : names) descriptors.emplace_back(name, cf_options);

  rocksdb::DB* raw_db = nullptr;
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::Status opened = rocksdb::DB::Open(db_options, path, descriptors, &handles, &raw_db);
  if (!opened.ok()) {
    if (IsLockError(opened)) {
      return StoreError(absl::StatusCode::kFailedPrecondition, path,
                        absl::StrCat("the database is locked: another process (or another "
                                     "store in this one) has it open: ",
                                     opened.ToString()));
    }
    if (opened.IsInvalidArgument() || opened.IsNotSupported()) {
      return StoreError(absl::StatusCode::kFailedPrecondition, path,
                        absl::StrCat("RocksDB refused to open it: ", opened.ToString()));
    }
    return FromRocks(opened, path, "opening the database");
  }
  return std::unique_ptr<RocksDbStateStore>(
      new RocksDbStateStore(options, std::unique_ptr<rocksdb::DB>(raw_db), std::move(handles)));
}

RocksDbStateStore::RocksDbStateStore(const RocksDbStoreOptions& options,
                                     std::unique_ptr<rocksdb::DB> db,
                                     std::vector<rocksdb::ColumnFamilyHandle*> handles)
    : options_(options), db_(std::move(db)), handles_(std::move(handles)) {
  for (rocksdb::ColumnFamilyHandle* handle : handles_) {
    if (std::optional<Table> table = TableFromName(handle->GetName()); table.has_value()) {
      table_handles_[static_cast<size_t>(*table)] = handle;
    }
  }
}

RocksDbStateStore::~RocksDbStateStore() {
  for (rocksdb::ColumnFamilyHandle* handle : handles_) {
    // Cannot fail for a handle this DB returned; nothing to report from a destructor anyway.
    db_->DestroyColumnFamilyHandle(handle).PermitUncheckedError();
  }
  handles_.clear();
  // Waits for background work; every acknowledged commit is already in the synced log.
  db_->Close().PermitUncheckedError();
  db_.reset();
}

rocksdb::ColumnFamilyHandle* RocksDbStateStore::Handle(Table table) const {
  return table_handles_[static_cast<size_t>(table)];
}

absl::StatusOr<std::optional<std::string>> RocksDbStateStore::LastKeyFrom(
    Table table, absl::string_view prefix) const {
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), Handle(table)));
  it->SeekToLast();
  std::optional<std::string> last;
  if (it->Valid() && it->key().compare(rocksdb::Slice(prefix.data(), prefix.size())) >= 0) {
    last = it->key().ToString();
  }
  RETURN_IF_ERROR(FromRocks(it->status(), options_.path,
                            absl::StrCat("finding the last key of table ", TableName(table))));
  return last;
}

absl::Status RocksDbStateStore::Commit(const StoreBatch& batch) {
  RETURN_IF_ERROR(batch.Validate());
  if (batch.empty()) return absl::OkStatus();

  bool has_unbounded_delete = false;
  for (const StoreBatch::Op& op : batch.ops()) {
    if (op.kind == StoreBatch::OpKind::kDeletePrefix && PrefixSuccessor(op.key).empty()) {
      has_unbounded_delete = true;
    }
  }
  // Exclusive only when a table's last key must stay put until the write (see the header).
  if (has_unbounded_delete) {
    absl::MutexLock lock(&unbounded_delete_mu_);
    return WriteLocked(batch);
  }
  absl::ReaderMutexLock lock(&unbounded_delete_mu_);
  return WriteLocked(batch);
}

absl::Status RocksDbStateStore::WriteLocked(const StoreBatch& batch) {
  rocksdb::WriteBatch write_batch;
  const std::vector<StoreBatch::Op>& ops = batch.ops();
  for (size_t i = 0; i < ops.size(); ++i) {
    const StoreBatch::Op& op = ops[i];
    rocksdb::ColumnFamilyHandle* cf = Handle(op.table);
    rocksdb::Status added;
    switch (op.kind) {
      case StoreBatch::OpKind::kPut:
        added = write_batch.Put(cf, op.key, op.value);
        break;
      case StoreBatch::OpKind::kDelete:
        added = write_batch.Delete(cf, op.key);
        break;
      case StoreBatch::OpKind::kDeleteRange:
        if (op.key != op.end) added = write_batch.DeleteRange(cf, op.key, op.end);
        break;
      case StoreBatch::OpKind::kDeletePrefix: {
        std::string end = PrefixSuccessor(op.key);
        if (end.empty()) {
          // No finite successor: delete up to and including the last key, which is the
          // database's or one this batch put before this operation.
          ASSIGN_OR_RETURN(std::optional<std::string> last, LastKeyFrom(op.table, op.key));
          for (size_t j = 0; j < i; ++j) {
            const StoreBatch::Op& earlier = ops[j];
            if (earlier.kind == StoreBatch::OpKind::kPut && earlier.table == op.table &&
                earlier.key >= op.key && (!last.has_value() || earlier.key > *last)) {
              last = earlier.key;
            }
          }
          if (!last.has_value()) break;
          end = *last + kKeySeparator;  // the smallest key after *last
        }
        added = write_batch.DeleteRange(cf, op.key, end);
        break;
      }
    }
    if (!added.ok()) {
      return FromRocks(added, options_.path, "building the write batch");
    }
  }

  rocksdb::WriteOptions write_options;
  write_options.sync = options_.sync;
  return FromRocks(db_->Write(write_options, &write_batch), options_.path, "commit");
}

absl::StatusOr<std::optional<std::string>> RocksDbStateStore::Get(Table table,
                                                                  absl::string_view key) const {
  rocksdb::PinnableSlice value;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), Handle(table),
                               rocksdb::Slice(key.data(), key.size()), &value);
  if (s.IsNotFound()) return std::optional<std::string>();
  RETURN_IF_ERROR(FromRocks(
      s, options_.path, absl::StrCat("reading \"", absl::CEscape(key), "\" of table ",
                                     TableName(table))));
  return std::optional<std::string>(value.ToString());
}

absl::Status RocksDbStateStore::Iterate(Table table, absl::string_view begin,
                                        const std::string& end, const ScanFn& fn) const {
  rocksdb::ReadOptions read_options;
  // Must outlive the iterator.
  const rocksdb::Slice upper_bound(end);
  if (!end.empty()) read_options.iterate_upper_bound = &upper_bound;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(read_options, Handle(table)));
  for (it->Seek(rocksdb::Slice(begin.data(), begin.size())); it->Valid(); it->Next()) {
    const rocksdb::Slice key = it->key();
    const rocksdb::Slice value = it->value();
    if (!fn(absl::string_view(key.data(), key.size()),
            absl::string_view(value.data(), value.size()))) {
      break;
    }
  }
  return FromRocks(it->status(), options_.path,
                   absl::StrCat("scanning table ", TableName(table)));
}

absl::Status RocksDbStateStore::Scan(Table table, absl::string_view prefix,
                                     const ScanFn& fn) const {
  return Iterate(table, prefix, PrefixSuccessor(prefix), fn);
}

absl::Status RocksDbStateStore::ScanKeyRange(Table table, absl::string_view begin,
                                             absl::string_view end, const ScanFn& fn) const {
  return Iterate(table, begin, std::string(end), fn);
}

}  // namespace tessera
