#include "agent/reserved_reads.h"

#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "agent/gated_reserve.h"
#include "agent/range_reserver.h"
#include "common/box.h"
#include "common/ids.h"
#include "format/checkpoint_reader.h"
#include "format/test_checkpoint.h"
#include "gtest/gtest.h"
#include "storage/posix_storage.h"
#include "storage/testing.h"

namespace tessera {
namespace {

using testing_checkpoint::GridChunks;
using testing_checkpoint::RandomTensor;
using testing_checkpoint::Reference;
using testing_checkpoint::TestTensor;

constexpr uint64_t kQuarter = 64 * 1024 * 4;  // 64 rows of 1024 F32

// A 256 x 1024 F32 tensor in two row chunks, read as four requests of 64 rows each, one after
// another in a destination buffer, by quarters that a gated reserver hands out.
class ReservedReadsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = JoinPath(MakeTempDir("reserved_reads_test"), StepDirName(7));
    ASSERT_TRUE(storage_.CreateDirs(dir_).ok());
    tensor_ = RandomTensor("w", v1::DTYPE_F32, {256, 1024}, 9);
    tensor_.chunks = GridChunks(tensor_.shape, {2, 1}, 1);
    testing_checkpoint::TestCheckpointOptions options;
    options.block_size = 4096;
    options.step = 7;
    ASSERT_TRUE(testing_checkpoint::WriteTestCheckpoint(storage_, dir_, {tensor_}, options).ok());
    absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
        CheckpointReader::Open(&storage_, dir_);
    ASSERT_TRUE(reader.ok()) << reader.status();
    reader_ = *std::move(reader);
    dest_.assign(4 * kQuarter, '\xff');
    for (int q = 0; q < 4; ++q) {
      ReadRequest r;
      r.key = "w";
      r.dtype = v1::DTYPE_F32;
      r.global_shape = tensor_.shape;
      r.box = Quarter(q);
      r.dest = dest_.data() + q * kQuarter;
      r.dest_size = kQuarter;
      reads_.push_back(r);
      offsets_.push_back(q * kQuarter);
    }
  }

  static Box Quarter(int q) { return Box{{64 * q, 0}, {64, 1024}}; }
  bool QuarterRead(int q) const {
    return std::memcmp(dest_.data() + q * kQuarter, Reference(tensor_, Quarter(q)).data(),
                       kQuarter) == 0;
  }
  bool QuarterUntouched(int q) const {
    return std::string(dest_.data() + q * kQuarter, kQuarter) == std::string(kQuarter, '\xff');
  }

  PosixStorage storage_;
  std::string dir_;
  TestTensor tensor_;
  std::unique_ptr<CheckpointReader> reader_;
  std::string dest_;
  std::vector<ReadRequest> reads_;
  std::vector<uint64_t> offsets_;
};

TEST_F(ReservedReadsTest, AllReservedBeforehand_OneBatch) {
  GatedReserve gate;
  RangeReserver reserver(4 * kQuarter, kQuarter,
                         [&](uint64_t o, uint64_t n) { return gate(o, n); });
  gate.Allow(4);
  ASSERT_TRUE(reserver.WaitFor(4 * kQuarter).ok());
  ReadStats stats;
  int batches = 0;
  absl::StatusOr<std::vector<ReadResult>> results =
      ReadAsReserved(*reader_, reads_, offsets_, reserver, stats, nullptr, &batches);
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_EQ(results->size(), 4u);
  EXPECT_EQ(batches, 1);
  for (int q = 0; q < 4; ++q) EXPECT_TRUE(QuarterRead(q)) << "quarter " << q;
  EXPECT_EQ(stats.bytes_copied, 4 * kQuarter);
}

TEST_F(ReservedReadsTest, ReservedWhileReading_EveryByteReadStatsAddedUp) {
  GatedReserve gate;
  RangeReserver reserver(4 * kQuarter, kQuarter,
                         [&](uint64_t o, uint64_t n) { return gate(o, n); });
  gate.Allow(1);
  ReadStats stats;
  int batches = 0;
  absl::StatusOr<std::vector<ReadResult>> results;
  std::thread reading([&] {
    results = ReadAsReserved(*reader_, reads_, offsets_, reserver, stats, nullptr, &batches);
  });
  gate.Allow(3);  // whenever: the reads wait for what they write, never for more
  reading.join();
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_EQ(results->size(), 4u);
  EXPECT_GE(batches, 1);
  for (int q = 0; q < 4; ++q) EXPECT_TRUE(QuarterRead(q)) << "quarter " << q;
  // Each batch's stats are added: the same totals as one Read of the four requests.
  ReadStats whole;
  std::string again(4 * kQuarter, '\0');
  std::vector<ReadRequest> reads = reads_;
  for (int q = 0; q < 4; ++q) reads[q].dest = again.data() + q * kQuarter;
  ASSERT_TRUE(reader_->Read(reads, &whole).ok());
  EXPECT_EQ(stats.bytes_copied, whole.bytes_copied);
  EXPECT_EQ(stats.bytes_read, whole.bytes_read);
}

TEST_F(ReservedReadsTest, ReservationFails_NothingWrittenPastWhatWasReserved) {
  GatedReserve gate;
  RangeReserver reserver(4 * kQuarter, kQuarter,
                         [&](uint64_t o, uint64_t n) { return gate(o, n); });
  gate.Allow(1);
  gate.Allow(1, absl::ResourceExhaustedError("/dev/shm is full"));
  ReadStats stats;
  int batches = 0;
  absl::StatusOr<std::vector<ReadResult>> results =
      ReadAsReserved(*reader_, reads_, offsets_, reserver, stats, nullptr, &batches);
  EXPECT_EQ(results.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(batches, 1);
  EXPECT_TRUE(QuarterRead(0));
  for (int q = 1; q < 4; ++q) EXPECT_TRUE(QuarterUntouched(q)) << "quarter " << q;
}

}  // namespace
}  // namespace tessera
