// The StateStore contract, run against MemoryStateStore and RocksDbStateStore alike, then the
// properties only the RocksDB store has: durability across reopen and crash, the lock, and
// its column families.
#include "server/store/state_store.h"

#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdlib>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rocksdb/db.h"
#include "rocksdb/options.h"
#include "server/store/keys.h"
#include "server/store/memory_state_store.h"
#include "server/store/rocksdb_state_store.h"
#include "storage/testing.h"

namespace tessera {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsSupersetOf;
using ::testing::Pair;

using Records = std::vector<std::pair<std::string, std::string>>;

std::string Bytes(const char* data, size_t size) { return std::string(data, size); }

// Owns a temporary directory for the lifetime of a test.
class TempDir {
 public:
  TempDir() : path_(MakeTempDir("state_store")) {}
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

struct MemoryStore {
  std::unique_ptr<StateStore> Make() { return std::make_unique<MemoryStateStore>(); }
};

struct RocksDbStore {
  TempDir dir;
  std::unique_ptr<StateStore> Make() {
    RocksDbStoreOptions options;
    options.path = dir.path() + "/db";
    absl::StatusOr<std::unique_ptr<RocksDbStateStore>> store = RocksDbStateStore::Open(options);
    EXPECT_TRUE(store.ok()) << store.status();
    if (!store.ok()) return nullptr;
    return std::move(*store);
  }
};

template <typename Factory>
class StateStoreContractTest : public ::testing::Test {
 protected:
  void SetUp() override {
    store_ = factory_.Make();
    ASSERT_NE(store_, nullptr);
  }

  void MustCommit(const StoreBatch& batch) { ASSERT_TRUE(store_->Commit(batch).ok()); }

  std::optional<std::string> MustGet(Table table, absl::string_view key) {
    absl::StatusOr<std::optional<std::string>> value = store_->Get(table, key);
    EXPECT_TRUE(value.ok()) << value.status();
    return value.ok() ? *value : std::nullopt;
  }

  Records MustScan(Table table, absl::string_view prefix) {
    Records records;
    absl::Status status = store_->Scan(table, prefix, [&](absl::string_view k, absl::string_view v) {
      records.emplace_back(std::string(k), std::string(v));
      return true;
    });
    EXPECT_TRUE(status.ok()) << status;
    return records;
  }

  Records MustScanRange(Table table, absl::string_view begin, absl::string_view end) {
    Records records;
    absl::Status status =
        store_->ScanRange(table, begin, end, [&](absl::string_view k, absl::string_view v) {
          records.emplace_back(std::string(k), std::string(v));
          return true;
        });
    EXPECT_TRUE(status.ok()) << status;
    return records;
  }

  // Declared before store_: the RocksDB store closes before its directory is removed.
  Factory factory_;
  std::unique_ptr<StateStore> store_;
};

class StoreNames {
 public:
  template <typename T>
  static std::string GetName(int) {
    if (std::is_same<T, MemoryStore>::value) return "Memory";
    return "RocksDb";
  }
};

using StoreTypes = ::testing::Types<MemoryStore, RocksDbStore>;
TYPED_TEST_SUITE(StateStoreContractTest, StoreTypes, StoreNames);

TYPED_TEST(StateStoreContractTest, Get_MissingKey_ReturnsNullopt) {
  EXPECT_EQ(this->MustGet(Table::kJobs, "nope"), std::nullopt);
}

TYPED_TEST(StateStoreContractTest, Commit_Put_GetReturnsValue) {
  this->MustCommit(StoreBatch().Put(Table::kJobs, "job-a", "v1"));
  EXPECT_EQ(this->MustGet(Table::kJobs, "job-a"), "v1");
}

TYPED_TEST(StateStoreContractTest, Commit_PutExistingKey_LastValueWins) {
  this->MustCommit(StoreBatch().Put(Table::kJobs, "k", "v1"));
  this->MustCommit(StoreBatch().Put(Table::kJobs, "k", "v2"));
  EXPECT_EQ(this->MustGet(Table::kJobs, "k"), "v2");
  this->MustCommit(StoreBatch().Put(Table::kJobs, "k", "v3").Put(Table::kJobs, "k", "v4"));
  EXPECT_EQ(this->MustGet(Table::kJobs, "k"), "v4");
}

TYPED_TEST(StateStoreContractTest, Commit_Delete_RemovesKeyAndAbsentKeyIsNoError) {
  this->MustCommit(StoreBatch().Put(Table::kAgents, "a", "1").Put(Table::kAgents, "b", "2"));
  this->MustCommit(StoreBatch().Delete(Table::kAgents, "a").Delete(Table::kAgents, "never"));
  EXPECT_EQ(this->MustGet(Table::kAgents, "a"), std::nullopt);
  EXPECT_EQ(this->MustGet(Table::kAgents, "b"), "2");
}

TYPED_TEST(StateStoreContractTest, Tables_SameKey_AreIndependent) {
  StoreBatch batch;
  for (Table table : kAllTables) batch.Put(table, "k", std::string(TableName(table)));
  this->MustCommit(batch);
  this->MustCommit(StoreBatch().Delete(Table::kChunks, "k"));
  for (Table table : kAllTables) {
    if (table == Table::kChunks) {
      EXPECT_EQ(this->MustGet(table, "k"), std::nullopt);
    } else {
      EXPECT_EQ(this->MustGet(table, "k"), std::string(TableName(table)));
    }
  }
}

TYPED_TEST(StateStoreContractTest, Commit_OpsOfOneBatch_ApplyInOrder) {
  this->MustCommit(StoreBatch()
                       .Put(Table::kSessions, "a", "1")
                       .Delete(Table::kSessions, "a")
                       .Put(Table::kSessions, "b", "1")
                       .Put(Table::kSessions, "p/1", "x")
                       .DeletePrefix(Table::kSessions, "p/")
                       .Put(Table::kSessions, "p/2", "y")
                       .Put(Table::kSessions, "r3", "z")
                       .DeleteRange(Table::kSessions, "r", "s")
                       .Put(Table::kSessions, "r5", "w"));
  EXPECT_THAT(this->MustScan(Table::kSessions, ""),
              ElementsAre(Pair("b", "1"), Pair("p/2", "y"), Pair("r5", "w")));
}

TYPED_TEST(StateStoreContractTest, Commit_InvalidDeleteRange_RejectedAndNothingApplied) {
  this->MustCommit(StoreBatch().Put(Table::kPlans, "keep", "1"));
  absl::Status status = this->store_->Commit(StoreBatch()
                                                 .Put(Table::kPlans, "new", "2")
                                                 .Delete(Table::kPlans, "keep")
                                                 .DeleteRange(Table::kPlans, "z", "a"));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("DeleteRange"));
  EXPECT_EQ(this->MustGet(Table::kPlans, "new"), std::nullopt);
  EXPECT_EQ(this->MustGet(Table::kPlans, "keep"), "1");
}

TYPED_TEST(StateStoreContractTest, Commit_EmptyBatch_Ok) {
  EXPECT_TRUE(this->store_->Commit(StoreBatch()).ok());
  EXPECT_THAT(this->MustScan(Table::kJobs, ""), ElementsAre());
}

TYPED_TEST(StateStoreContractTest, Commit_ManyTablesInOneBatch_AllVisible) {
  this->MustCommit(StoreBatch()
                       .Put(Table::kSessions, "s1", "COMMITTING")
                       .Put(Table::kCheckpoints, "job/1", "manifest")
                       .DeletePrefix(Table::kChunks, "s1/")
                       .Put(Table::kJobs, "job", "latest=1"));
  EXPECT_EQ(this->MustGet(Table::kSessions, "s1"), "COMMITTING");
  EXPECT_EQ(this->MustGet(Table::kCheckpoints, "job/1"), "manifest");
  EXPECT_EQ(this->MustGet(Table::kJobs, "job"), "latest=1");
}

TYPED_TEST(StateStoreContractTest, Scan_UnsignedBytewiseOrder) {
  const std::vector<std::string> keys = {"b", "a", "\xff", "\x80", Bytes("\0", 1), "ab", "",
                                         Bytes("a\0", 2), "\x7f", "\xff\xff"};
  StoreBatch batch;
  for (const std::string& key : keys) batch.Put(Table::kRegistry, key, "v");
  this->MustCommit(batch);
  std::vector<std::string> expected = keys;
  std::sort(expected.begin(), expected.end());
  std::vector<std::string> scanned;
  for (const auto& [key, value] : this->MustScan(Table::kRegistry, "")) scanned.push_back(key);
  EXPECT_EQ(scanned, expected);
  EXPECT_EQ(scanned.front(), "");
  EXPECT_EQ(scanned.back(), "\xff\xff");
}

TYPED_TEST(StateStoreContractTest, Scan_Prefix_ReturnsExactlyKeysWithIt) {
  StoreBatch batch;
  for (const char* key : {"a", "ab", "abc", "ab\xff", "ac", "b", "aa\xff"}) {
    batch.Put(Table::kChunks, key, key);
  }
  batch.Put(Table::kPlans, "abz", "other table");
  this->MustCommit(batch);
  EXPECT_THAT(this->MustScan(Table::kChunks, "ab"),
              ElementsAre(Pair("ab", "ab"), Pair("abc", "abc"), Pair("ab\xff", "ab\xff")));
  EXPECT_THAT(this->MustScan(Table::kChunks, "abcd"), ElementsAre());
}

TYPED_TEST(StateStoreContractTest, Scan_AllFFPrefix_RunsToEndOfTable) {
  this->MustCommit(StoreBatch()
                       .Put(Table::kChunks, "\xfe", "1")
                       .Put(Table::kChunks, "\xff", "2")
                       .Put(Table::kChunks, Bytes("\xff\0", 2), "3")
                       .Put(Table::kChunks, "\xff\xff\xff", "4"));
  EXPECT_THAT(this->MustScan(Table::kChunks, "\xff"),
              ElementsAre(Pair("\xff", "2"), Pair(Bytes("\xff\0", 2), "3"),
                          Pair("\xff\xff\xff", "4")));
}

TYPED_TEST(StateStoreContractTest, Scan_CompositeKeyPrefix_DoesNotMatchLongerComponent) {
  StoreBatch batch;
  for (int64_t step : {3, -1, 200, 1}) {
    batch.Put(Table::kSessions, KeyJoin({"job", "s12", EncodeOrderedInt64(step)}),
              absl::StrCat(step));
  }
  batch.Put(Table::kSessions, KeyJoin({"job", "s123", EncodeOrderedInt64(0)}), "other");
  this->MustCommit(batch);
  std::vector<std::string> values;
  for (const auto& [key, value] : this->MustScan(Table::kSessions, KeyPrefix({"job", "s12"}))) {
    values.push_back(value);
  }
  EXPECT_THAT(values, ElementsAre("-1", "1", "3", "200"));
}

TYPED_TEST(StateStoreContractTest, Scan_FnReturnsFalse_Stops) {
  this->MustCommit(
      StoreBatch().Put(Table::kJobs, "a", "").Put(Table::kJobs, "b", "").Put(Table::kJobs, "c", ""));
  std::vector<std::string> seen;
  ASSERT_TRUE(this->store_
                  ->Scan(Table::kJobs, "",
                         [&](absl::string_view key, absl::string_view) {
                           seen.emplace_back(key);
                           return seen.size() < 2;
                         })
                  .ok());
  EXPECT_THAT(seen, ElementsAre("a", "b"));
}

TYPED_TEST(StateStoreContractTest, Scan_CommitDuringScan_NotSeenButApplied) {
  this->MustCommit(StoreBatch().Put(Table::kJobs, "a", "1").Put(Table::kJobs, "c", "3"));
  std::vector<std::string> seen;
  absl::Status commit_status;
  ASSERT_TRUE(this->store_
                  ->Scan(Table::kJobs, "",
                         [&](absl::string_view key, absl::string_view) {
                           seen.emplace_back(key);
                           if (key == "a") {
                             commit_status = this->store_->Commit(StoreBatch()
                                                                      .Put(Table::kJobs, "b", "2")
                                                                      .Delete(Table::kJobs, "c"));
                           }
                           return true;
                         })
                  .ok());
  ASSERT_TRUE(commit_status.ok()) << commit_status;
  EXPECT_THAT(seen, ElementsAre("a", "c"));
  EXPECT_THAT(this->MustScan(Table::kJobs, ""), ElementsAre(Pair("a", "1"), Pair("b", "2")));
}

TYPED_TEST(StateStoreContractTest, ScanRange_HalfOpen) {
  this->MustCommit(StoreBatch()
                       .Put(Table::kPlans, "a", "")
                       .Put(Table::kPlans, "b", "")
                       .Put(Table::kPlans, "bz", "")
                       .Put(Table::kPlans, "c", "")
                       .Put(Table::kPlans, "d", ""));
  std::vector<std::string> keys;
  for (const auto& [key, value] : this->MustScanRange(Table::kPlans, "b", "d")) {
    keys.push_back(key);
  }
  EXPECT_THAT(keys, ElementsAre("b", "bz", "c"));
  EXPECT_THAT(this->MustScanRange(Table::kPlans, "c", "c"), ElementsAre());
  EXPECT_THAT(this->MustScanRange(Table::kPlans, "", ""), ElementsAre());
}

TYPED_TEST(StateStoreContractTest, ScanRange_BeginAfterEnd_InvalidArgument) {
  absl::Status status = this->store_->ScanRange(
      Table::kPlans, "z", "a", [](absl::string_view, absl::string_view) { return true; });
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
}

TYPED_TEST(StateStoreContractTest, DeleteRange_HalfOpen_KeepsEnd) {
  this->MustCommit(StoreBatch()
                       .Put(Table::kChunks, "a", "")
                       .Put(Table::kChunks, "b", "")
                       .Put(Table::kChunks, "b\x01", "")
                       .Put(Table::kChunks, "c", ""));
  this->MustCommit(StoreBatch().DeleteRange(Table::kChunks, "b", "c").DeleteRange(
      Table::kChunks, "a", "a"));
  EXPECT_THAT(this->MustScan(Table::kChunks, ""), ElementsAre(Pair("a", ""), Pair("c", "")));
}

TYPED_TEST(StateStoreContractTest, DeletePrefix_PrunesOneSessionsChunksOnly) {
  StoreBatch batch;
  for (int rank = 0; rank < 5; ++rank) {
    batch.Put(Table::kChunks, KeyJoin({"s12", EncodeOrderedInt64(rank)}), "progress");
    batch.Put(Table::kChunks, KeyJoin({"s123", EncodeOrderedInt64(rank)}), "progress");
  }
  batch.Put(Table::kSessions, KeyJoin({"s12"}), "COMMITTING");
  this->MustCommit(batch);
  this->MustCommit(StoreBatch()
                       .DeletePrefix(Table::kChunks, KeyPrefix({"s12"}))
                       .Put(Table::kSessions, KeyJoin({"s12"}), "COMMITTED"));
  EXPECT_THAT(this->MustScan(Table::kChunks, KeyPrefix({"s12"})), ElementsAre());
  EXPECT_EQ(this->MustScan(Table::kChunks, KeyPrefix({"s123"})).size(), 5u);
  EXPECT_EQ(this->MustGet(Table::kSessions, KeyJoin({"s12"})), "COMMITTED");
}

TYPED_TEST(StateStoreContractTest, DeletePrefix_Empty_ClearsOnlyThatTable) {
  this->MustCommit(StoreBatch()
                       .Put(Table::kAgents, "", "empty key")
                       .Put(Table::kAgents, "a", "")
                       .Put(Table::kAgents, "\xff\xff", "")
                       .Put(Table::kJobs, "a", "kept"));
  this->MustCommit(StoreBatch().DeletePrefix(Table::kAgents, ""));
  EXPECT_THAT(this->MustScan(Table::kAgents, ""), ElementsAre());
  EXPECT_EQ(this->MustGet(Table::kJobs, "a"), "kept");
}

TYPED_TEST(StateStoreContractTest, DeletePrefix_AllFF_CoversKeysPutEarlierInTheBatch) {
  this->MustCommit(StoreBatch().Put(Table::kMeta, "\xfe", "kept").Put(Table::kMeta, "\xff", ""));
  this->MustCommit(StoreBatch()
                       .Put(Table::kMeta, "\xff\xff\xff\x01", "put before, deleted")
                       .DeletePrefix(Table::kMeta, "\xff")
                       .Put(Table::kMeta, "\xff\x02", "put after, kept"));
  EXPECT_THAT(this->MustScan(Table::kMeta, ""),
              ElementsAre(Pair("\xfe", "kept"), Pair("\xff\x02", "put after, kept")));
  // Nothing under the prefix at all: still a valid no-op.
  this->MustCommit(StoreBatch().DeletePrefix(Table::kPlans, "\xff"));
}

TYPED_TEST(StateStoreContractTest, BinaryKeysAndValues_WithNulBytes_RoundTrip) {
  std::string all_bytes;
  for (int b = 0; b < 256; ++b) all_bytes.push_back(static_cast<char>(b));
  const std::string key = Bytes("a\0b\0", 4);
  this->MustCommit(StoreBatch()
                       .Put(Table::kRegistry, key, all_bytes)
                       .Put(Table::kRegistry, "a", "shorter")
                       .Put(Table::kRegistry, Bytes("a\0", 2), Bytes("\0\0", 2)));
  EXPECT_EQ(this->MustGet(Table::kRegistry, key), all_bytes);
  EXPECT_EQ(this->MustGet(Table::kRegistry, Bytes("a\0", 2)), Bytes("\0\0", 2));
  EXPECT_EQ(this->MustGet(Table::kRegistry, "a"), "shorter");
  EXPECT_EQ(this->MustGet(Table::kRegistry, Bytes("a\0b", 3)), std::nullopt);
  EXPECT_THAT(this->MustScan(Table::kRegistry, Bytes("a\0", 2)),
              ElementsAre(Pair(Bytes("a\0", 2), Bytes("\0\0", 2)), Pair(key, all_bytes)));
}

TYPED_TEST(StateStoreContractTest, EmptyValue_IsPresentNotMissing) {
  this->MustCommit(StoreBatch().Put(Table::kCheckpoints, "k", "").Put(Table::kCheckpoints, "", ""));
  EXPECT_EQ(this->MustGet(Table::kCheckpoints, "k"), std::string());
  EXPECT_EQ(this->MustGet(Table::kCheckpoints, ""), std::string());
  EXPECT_EQ(this->MustScan(Table::kCheckpoints, "").size(), 2u);
}

TYPED_TEST(StateStoreContractTest, LargeValue_RoundTrips) {
  std::string large(8 << 20, '\0');
  for (size_t i = 0; i < large.size(); ++i) large[i] = static_cast<char>((i * 131) >> 3);
  this->MustCommit(StoreBatch().Put(Table::kPlans, "big", large));
  std::optional<std::string> read = this->MustGet(Table::kPlans, "big");
  ASSERT_TRUE(read.has_value());
  EXPECT_TRUE(*read == large) << "8 MiB value differs after a round trip";
}

TYPED_TEST(StateStoreContractTest, ConcurrentCommitsAndReads_AllApplied) {
  constexpr int kThreads = 4;
  constexpr int kCommitsPerThread = 25;
  std::vector<std::thread> threads;
  std::vector<absl::Status> failures[kThreads];
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([this, t, &failures] {
      for (int i = 0; i < kCommitsPerThread; ++i) {
        const std::string key = KeyJoin({absl::StrCat("t", t), EncodeOrderedInt64(i)});
        absl::Status s = this->store_->Commit(
            StoreBatch().Put(Table::kAgents, key, "x").Put(Table::kJobs, key, "y"));
        if (!s.ok()) failures[t].push_back(s);
        absl::StatusOr<std::optional<std::string>> read = this->store_->Get(Table::kAgents, key);
        if (!read.ok() || *read != "x") failures[t].push_back(absl::InternalError("lost write"));
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_THAT(failures[t], ElementsAre()) << "thread " << t;
  EXPECT_EQ(this->MustScan(Table::kAgents, "").size(), size_t{kThreads * kCommitsPerThread});
  EXPECT_EQ(this->MustScan(Table::kJobs, "").size(), size_t{kThreads * kCommitsPerThread});
}

TEST(StoreBatch, Builders_RecordOpsInOrderWithByteSize) {
  StoreBatch batch;
  batch.Put(Table::kJobs, "k", "vv").Delete(Table::kAgents, "d").DeleteRange(Table::kPlans, "a",
                                                                              "b");
  batch.DeletePrefix(Table::kChunks, "p");
  ASSERT_EQ(batch.size(), 4u);
  EXPECT_EQ(batch.ops()[0].kind, StoreBatch::OpKind::kPut);
  EXPECT_EQ(batch.ops()[2].end, "b");
  EXPECT_EQ(batch.ops()[3].table, Table::kChunks);
  EXPECT_EQ(batch.ByteSize(), 3u + 1u + 2u + 1u);
  EXPECT_TRUE(batch.Validate().ok());
  batch.Clear();
  EXPECT_TRUE(batch.empty());
  EXPECT_EQ(batch.ByteSize(), 0u);
}

TEST(StoreBatch, TableOutsideEnum_InvalidArgument) {
  StoreBatch batch;
  batch.Put(static_cast<Table>(42), "k", "v");
  EXPECT_EQ(batch.Validate().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TableName, EveryTable_DistinctNameThatRoundTrips) {
  std::vector<std::string> names;
  for (Table table : kAllTables) {
    names.emplace_back(TableName(table));
    EXPECT_EQ(TableFromName(TableName(table)), table);
  }
  EXPECT_THAT(names, ElementsAre("agents", "jobs", "sessions", "plans", "registry", "chunks",
                                 "checkpoints", "meta", "memory_checkpoints"));
  EXPECT_EQ(TableFromName("default"), std::nullopt);
}

// ---- MemoryStateStore fault injection ------------------------------------------------------

TEST(MemoryStateStore, FailNextCommit_ReturnsStatusAndAppliesNothingOnce) {
  MemoryStateStore store;
  store.FailNextCommit(absl::UnavailableError("disk full"));
  absl::Status failed = store.Commit(StoreBatch().Put(Table::kSessions, "s", "PINNING"));
  EXPECT_EQ(failed.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(failed.message(), "disk full");
  EXPECT_EQ(*store.Get(Table::kSessions, "s"), std::nullopt);
  EXPECT_EQ(store.successful_commits(), 0);

  EXPECT_TRUE(store.Commit(StoreBatch().Put(Table::kSessions, "s", "PINNING")).ok());
  EXPECT_EQ(*store.Get(Table::kSessions, "s"), "PINNING");
  EXPECT_EQ(store.successful_commits(), 1);
}

TEST(MemoryStateStore, FailNextCommit_Queued_FailsCommitsInTurn) {
  MemoryStateStore store;
  store.FailNextCommit(absl::UnavailableError("first"));
  store.FailNextCommit(absl::DataLossError("second"));
  store.FailNextCommit(absl::OkStatus());  // ignored
  EXPECT_EQ(store.Commit(StoreBatch()).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(store.Commit(StoreBatch().Put(Table::kJobs, "j", "")).code(),
            absl::StatusCode::kDataLoss);
  EXPECT_TRUE(store.Commit(StoreBatch().Put(Table::kJobs, "j", "")).ok());
  EXPECT_EQ(store.TableSize(Table::kJobs), 1u);
  EXPECT_EQ(store.successful_commits(), 1);
}

TEST(MemoryStateStore, FailNextCommit_InvalidBatch_RejectedWithoutConsumingTheFault) {
  MemoryStateStore store;
  store.FailNextCommit(absl::UnavailableError("injected"));
  EXPECT_EQ(store.Commit(StoreBatch().DeleteRange(Table::kJobs, "b", "a")).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.Commit(StoreBatch()).code(), absl::StatusCode::kUnavailable);
}

// ---- RocksDbStateStore ---------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<RocksDbStateStore>> OpenAt(const std::string& path) {
  RocksDbStoreOptions options;
  options.path = path;
  return RocksDbStateStore::Open(options);
}

std::vector<std::string> ColumnFamiliesOnDisk(const std::string& path) {
  std::vector<std::string> names;
  rocksdb::Status s = rocksdb::DB::ListColumnFamilies(rocksdb::DBOptions(), path, &names);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return names;
}

TEST(RocksDbStateStore, CloseAndReopen_CommittedStateSurvives) {
  TempDir dir;
  const std::string path = dir.path() + "/db";
  {
    auto store = OpenAt(path);
    ASSERT_TRUE(store.ok()) << store.status();
    StoreBatch batch;
    for (int i = 0; i < 100; ++i) {
      batch.Put(Table::kChunks, KeyJoin({"s1", EncodeOrderedInt64(i)}), "done");
    }
    batch.Put(Table::kSessions, "s1", "PERSISTING").Put(Table::kAgents, "gone", "x");
    ASSERT_TRUE((*store)->Commit(batch).ok());
    ASSERT_TRUE((*store)
                    ->Commit(StoreBatch()
                                 .DeletePrefix(Table::kChunks, KeyPrefix({"s1"}))
                                 .Put(Table::kSessions, "s1", "COMMITTED")
                                 .Put(Table::kCheckpoints, "job/1", Bytes("m\0f", 3))
                                 .Delete(Table::kAgents, "gone"))
                    .ok());
  }
  auto reopened = OpenAt(path);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  EXPECT_EQ(*(*reopened)->Get(Table::kSessions, "s1"), "COMMITTED");
  EXPECT_EQ(*(*reopened)->Get(Table::kCheckpoints, "job/1"), Bytes("m\0f", 3));
  EXPECT_EQ(*(*reopened)->Get(Table::kAgents, "gone"), std::nullopt);
  int chunks = 0;
  ASSERT_TRUE((*reopened)
                  ->Scan(Table::kChunks, "",
                         [&](absl::string_view, absl::string_view) {
                           ++chunks;
                           return true;
                         })
                  .ok());
  EXPECT_EQ(chunks, 0);
}

TEST(RocksDbStateStore, ProcessKilledWithoutClose_CommittedStateRecovered) {
  // The child is this test binary run again ("threadsafe" death tests), so it holds no RocksDB
  // threads from earlier tests. It runs this body from the top too: the directory is handed
  // to it in the environment, which it inherits.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  constexpr char kDirEnv[] = "TESSERA_STORE_TEST_KILLED_DB_DIR";
  const char* inherited = std::getenv(kDirEnv);
  const std::string dir =
      inherited != nullptr ? std::string(inherited) : MakeTempDir("state_store");
  ASSERT_FALSE(dir.empty());
  ASSERT_EQ(::setenv(kDirEnv, dir.c_str(), /*overwrite=*/1), 0);
  const std::string path = dir + "/db";
  EXPECT_EXIT(
      {
        auto store = OpenAt(path);
        if (!store.ok()) ::_exit(1);
        absl::Status s = (*store)->Commit(StoreBatch()
                                              .Put(Table::kSessions, "s9", "COMMITTED")
                                              .Put(Table::kCheckpoints, "job/9", "manifest"));
        if (!s.ok()) ::_exit(2);
        // Acknowledged: now die without closing anything.
        ::raise(SIGKILL);
      },
      ::testing::KilledBySignal(SIGKILL), "");
  ::unsetenv(kDirEnv);
  {
    auto recovered = OpenAt(path);
    ASSERT_TRUE(recovered.ok()) << recovered.status();
    EXPECT_EQ(*(*recovered)->Get(Table::kSessions, "s9"), "COMMITTED");
    EXPECT_EQ(*(*recovered)->Get(Table::kCheckpoints, "job/9"), "manifest");
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
}

TEST(RocksDbStateStore, SecondOpenOfSamePath_FailedPreconditionNamingPath) {
  TempDir dir;
  const std::string path = dir.path() + "/db";
  auto first = OpenAt(path);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = OpenAt(path);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(second.status().message(), HasSubstr(path));
  EXPECT_THAT(second.status().message(), HasSubstr("locked"));
  std::optional<v1::ErrorDetail> detail = GetErrorDetail(second.status());
  ASSERT_TRUE(detail.has_value());
  EXPECT_EQ(detail->path(), path);

  // The first store is untouched, and once it is closed the path opens again.
  EXPECT_TRUE((*first)->Commit(StoreBatch().Put(Table::kMeta, "k", "v")).ok());
  first->reset();
  auto third = OpenAt(path);
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(*(*third)->Get(Table::kMeta, "k"), "v");
}

TEST(RocksDbStateStore, PathIsRegularFile_FailedPrecondition) {
  TempDir dir;
  const std::string path = dir.path() + "/file";
  std::ofstream(path) << "not a database";
  auto store = OpenAt(path);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(store.status().message(), HasSubstr(path));
  EXPECT_THAT(store.status().message(), HasSubstr("not a directory"));
}

TEST(RocksDbStateStore, MissingPathWithoutCreate_NotFound) {
  TempDir dir;
  RocksDbStoreOptions options;
  options.path = dir.path() + "/absent";
  options.create_if_missing = false;
  auto store = RocksDbStateStore::Open(options);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(std::filesystem::exists(options.path));
}

TEST(RocksDbStateStore, EmptyDirectoryWithoutCreate_FailedPrecondition) {
  TempDir dir;
  RocksDbStoreOptions options;
  options.path = dir.path();
  options.create_if_missing = false;
  auto store = RocksDbStateStore::Open(options);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(store.status().message(), HasSubstr(dir.path()));
}

TEST(RocksDbStateStore, BadOptions_InvalidArgument) {
  EXPECT_EQ(RocksDbStateStore::Open(RocksDbStoreOptions()).status().code(),
            absl::StatusCode::kInvalidArgument);
  TempDir dir;
  RocksDbStoreOptions options;
  options.path = dir.path() + "/db";
  options.max_background_jobs = 0;
  EXPECT_EQ(RocksDbStateStore::Open(options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(RocksDbStateStore, NestedMissingPath_CreatedWithParents) {
  TempDir dir;
  const std::string path = dir.path() + "/a/b/db";
  auto store = OpenAt(path);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->path(), path);
  EXPECT_TRUE(std::filesystem::exists(path + "/CURRENT"));
}

TEST(RocksDbStateStore, Reopen_EveryTableIsAColumnFamily) {
  TempDir dir;
  const std::string path = dir.path() + "/db";
  ASSERT_TRUE(OpenAt(path).ok());
  ASSERT_TRUE(OpenAt(path).ok());  // reopen after the first closed
  std::vector<std::string> expected = {"default"};
  for (Table table : kAllTables) expected.emplace_back(TableName(table));
  std::vector<std::string> on_disk = ColumnFamiliesOnDisk(path);
  EXPECT_THAT(on_disk, ::testing::UnorderedElementsAreArray(expected));
}

TEST(RocksDbStateStore, UnknownColumnFamilyOnDisk_OpenedAndKept) {
  TempDir dir;
  const std::string path = dir.path() + "/db";
  {
    // A database written by a version with an extra table.
    rocksdb::Options options;
    options.create_if_missing = true;
    rocksdb::DB* db = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(options, path, &db).ok());
    rocksdb::ColumnFamilyHandle* handle = nullptr;
    ASSERT_TRUE(db->CreateColumnFamily(rocksdb::ColumnFamilyOptions(), "future", &handle).ok());
    ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), handle, "k", "v").ok());
    ASSERT_TRUE(db->DestroyColumnFamilyHandle(handle).ok());
    ASSERT_TRUE(db->Close().ok());
    delete db;
  }
  {
    auto store = OpenAt(path);
    ASSERT_TRUE(store.ok()) << store.status();
    EXPECT_TRUE((*store)->Commit(StoreBatch().Put(Table::kJobs, "j", "1")).ok());
  }
  EXPECT_THAT(ColumnFamiliesOnDisk(path), IsSupersetOf({"future", "jobs", "meta"}));
}

TEST(RocksDbStateStore, SyncOff_CommitsStillVisibleAndSurviveReopen) {
  TempDir dir;
  RocksDbStoreOptions options;
  options.path = dir.path() + "/db";
  options.sync = false;
  {
    auto store = RocksDbStateStore::Open(options);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->Commit(StoreBatch().Put(Table::kJobs, "j", "1")).ok());
  }
  auto store = RocksDbStateStore::Open(options);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ(*(*store)->Get(Table::kJobs, "j"), "1");
}

}  // namespace
}  // namespace tessera
