#include "agent/peer_memory.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "agent/buddy_replicator.h"
#include "agent/buddy_store.h"
#include "agent/memory_tier.h"
#include "common/fake_bulk_holder.h"
#include "common/peer_auth.h"
#include "common/peer_call_proof.h"
#include "common/status.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

// Under --config=asan an allocation ASan cannot make aborts unless it may return null: the
// tests below ask for 2^62 bytes and expect the refusal a plain build gives.
extern "C" const char* __asan_default_options() { return "allocator_may_return_null=1"; }

namespace tessera {
namespace {

using ::testing::HasSubstr;

constexpr char kJob[] = "job";

std::string Pattern(uint64_t size, char seed) {
  std::string s(size, '\0');
  for (uint64_t i = 0; i < size; ++i) s[i] = static_cast<char>(seed + i * 7 + (i >> 12));
  return s;
}

v1::MemoryCopy Copy(int64_t step, const std::string& file, uint64_t nbytes, uint32_t writer) {
  v1::MemoryCopy c;
  c.set_step(step);
  c.set_session_id("s" + std::to_string(step));
  c.set_file(file);
  c.set_file_offset(4096);
  c.set_nbytes(nbytes);
  c.set_writer_rank(writer);
  return c;
}

// A PeerMemory server in this process: its own memory tier (holding `own_` as step 7) and a
// buddy store of `budget` bytes.
class PeerMemoryTest : public ::testing::Test {
 protected:
  void Start(uint64_t budget, PeerMemoryServiceOptions options = {}) {
    store_ = std::make_unique<BuddyStore>(budget);
    if (options.keyring == nullptr) options.keyring = keyring_.get();
    service_ = std::make_unique<PeerMemoryService>(kJob, &tier_, store_.get(), options);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    address_ = "127.0.0.1:" + std::to_string(port);
    channel_ = grpc::CreateChannel(address_, grpc::InsecureChannelCredentials());
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
  }

  const std::unique_ptr<PeerKeyring> keyring_ = TestPeerKeyring(kJob);

  // ReadMemoryCopy over `streams` connections into a buffer of copy.nbytes() bytes.
  absl::StatusOr<std::string> Read(const v1::MemoryCopy& copy, int streams = 1,
                                   const std::string& job = kJob) {
    std::vector<std::shared_ptr<grpc::Channel>> channels;
    for (int i = 0; i < streams; ++i) {
      grpc::ChannelArguments args;
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
      channels.push_back(
          grpc::CreateCustomChannel(address_, grpc::InsecureChannelCredentials(), args));
    }
    std::string dest(copy.nbytes(), '\0');
    RETURN_IF_ERROR(
        ReadMemoryCopy(channels, TestPeerCredential(job), copy, dest.data(), absl::Seconds(30)));
    return dest;
  }

  // A PutMemoryCopy stream of `chunk` alone, proving the job's secret (or carrying the proof
  // `proof`, the metadata's value, if not empty); its status code.
  grpc::StatusCode PutOneChunk(const v1::MemoryCopyChunk& chunk, const std::string& proof = "") {
    v1::PeerMemory::Stub stub(channel_);
    grpc::ClientContext context;
    if (proof.empty()) {
      EXPECT_TRUE(ProvePeerCall(&context, TestPeerCredential(), kPutMemoryCopyMethod).ok());
    } else {
      context.AddMetadata(kPeerProofMetadata, proof);
    }
    v1::PutMemoryCopyResponse response;
    std::unique_ptr<grpc::ClientWriter<v1::MemoryCopyChunk>> writer =
        stub.PutMemoryCopy(&context, &response);
    writer->Write(chunk);
    writer->WritesDone();
    return writer->Finish().error_code();
  }

  // Publishes `bytes` as this server's own resident copy of step 7, file "data-00000".
  void PublishOwn(std::shared_ptr<std::string> bytes) {
    tier_.Publish(ResidentCheckpoint{7, "s7", "data-00000", 4096, bytes->size(),
                                     ResidentRegion{"/own", bytes->data(), bytes->size(), bytes}});
  }

  MemoryTier tier_;
  std::unique_ptr<BuddyStore> store_;
  std::unique_ptr<PeerMemoryService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST(ReadPartsTest, ConsecutiveWholeChunks_NoEmptyPart) {
  using Parts = std::vector<std::pair<uint64_t, uint64_t>>;
  constexpr uint64_t kChunk = kMemoryCopyChunkBytes;
  // Five chunks over four streams: three parts, not a fourth one with nothing in it.
  EXPECT_EQ(ReadParts(5 * kChunk, 4),
            (Parts{{0, 2 * kChunk}, {2 * kChunk, 4 * kChunk}, {4 * kChunk, 5 * kChunk}}));
  EXPECT_EQ(ReadParts(2 * kChunk + 5, 4),
            (Parts{{0, kChunk}, {kChunk, 2 * kChunk}, {2 * kChunk, 2 * kChunk + 5}}));
  EXPECT_EQ(ReadParts(8 * kChunk, 4).size(), 4u);
  EXPECT_EQ(ReadParts(3 * kChunk, 1), (Parts{{0, 3 * kChunk}}));
  EXPECT_EQ(ReadParts(0, 4), (Parts{{0, 0}}));
  EXPECT_EQ(ReadParts(100, 0), (Parts{{0, 100}}));
}

TEST_F(PeerMemoryTest, PutThenRead_SameBytesHeldAsTheWritersCopy) {
  Start(/*budget=*/64 << 20);
  const std::string bytes = Pattern((9 << 20) + 123, 'a');  // several chunks, a short last one
  const v1::MemoryCopy copy = Copy(7, "data-00003", bytes.size(), /*writer=*/3);
  int hooks = 0;  // before_chunk: once before each of the 10 chunks
  ASSERT_TRUE(
      SendMemoryCopy(channel_, TestPeerCredential(), copy, bytes.data(), absl::Seconds(30), nullptr, [&hooks] {
        ++hooks;
      }).ok());
  EXPECT_EQ(hooks, 10);
  ASSERT_EQ(store_->Copies().size(), 1u);
  EXPECT_EQ(store_->Copies()[0].writer_rank(), 3u);
  EXPECT_EQ(store_->Copies()[0].nbytes(), bytes.size());

  // Three streams over the ten chunks: parts of four, four and two.
  absl::StatusOr<std::string> back = Read(copy, /*streams=*/3);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, bytes);

  // A newer copy from the same writer replaces it.
  const std::string newer = Pattern(5000, 'z');
  ASSERT_TRUE(SendMemoryCopy(channel_, TestPeerCredential(), Copy(8, "data-00003", newer.size(), 3), newer.data(),
                             absl::Seconds(30))
                  .ok());
  ASSERT_EQ(store_->Copies().size(), 1u);
  EXPECT_EQ(store_->Copies()[0].step(), 8);
  EXPECT_EQ(Read(copy).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(PeerMemoryTest, Read_TheAgentsOwnResidentCopy) {
  Start(/*budget=*/1 << 20);
  auto own = std::make_shared<std::string>(Pattern((2 << 20) + 5, 'o'));
  PublishOwn(own);
  for (int streams : {1, 2, 4}) {  // three chunks: one, two or three streams
    absl::StatusOr<std::string> back = Read(Copy(7, "data-00000", own->size(), 0), streams);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, *own) << streams << " streams";
  }
}

TEST_F(PeerMemoryTest, Read_ARange_ThoseBytesWithOffsetsFromTheCopysStart) {
  Start(/*budget=*/1 << 20);
  auto own = std::make_shared<std::string>(Pattern((3 << 20) + 5, 'r'));
  PublishOwn(own);
  v1::PeerMemory::Stub stub(channel_);  // the generated client: the wire is plain protobuf
  grpc::ClientContext context;
  EXPECT_TRUE(ProvePeerCall(&context, TestPeerCredential(), kReadMemoryCopyMethod).ok());
  v1::ReadMemoryCopyRequest request;
  request.set_job_id(kJob);
  request.set_step(7);
  request.set_session_id("s7");
  request.set_file("data-00000");
  request.set_offset((1 << 20) + 1);
  request.set_length((1 << 20) + 2);
  std::unique_ptr<grpc::ClientReader<v1::MemoryCopyChunk>> reader =
      stub.ReadMemoryCopy(&context, request);
  std::vector<uint64_t> offsets;
  std::string got;
  v1::MemoryCopyChunk chunk;
  while (reader->Read(&chunk)) {
    offsets.push_back(chunk.offset());
    got += chunk.data();
  }
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_EQ(offsets, (std::vector<uint64_t>{(1 << 20) + 1, (2 << 20) + 1}));
  EXPECT_EQ(got, own->substr((1 << 20) + 1, (1 << 20) + 2));
}

TEST_F(PeerMemoryTest, Read_MoreBytesThanHeld_OutOfRangeNamingTheSizes) {
  Start(/*budget=*/1 << 20);
  auto own = std::make_shared<std::string>(Pattern(5000, 'x'));
  PublishOwn(own);
  for (int streams : {1, 2}) {
    absl::Status status = Read(Copy(7, "data-00000", 5001, 0), streams).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kOutOfRange) << status;
    EXPECT_NE(status.message().find("5000 bytes"), std::string::npos) << status;
  }
}

TEST_F(PeerMemoryTest, Read_NothingHeldOrAnotherJob_Errors) {
  Start(/*budget=*/1 << 20);
  absl::Status none = Read(Copy(7, "data-00009", 10, 9)).status();
  EXPECT_EQ(none.code(), absl::StatusCode::kNotFound) << none;
  EXPECT_NE(none.message().find("data-00009"), std::string::npos);
  // Another job's agent proves another secret.
  EXPECT_EQ(Read(Copy(7, "data-00009", 10, 9), 1, "other").status().code(),
            absl::StatusCode::kUnauthenticated);
}

// Issue 51: a peer without the job's secret is refused before any byte of a copy moves or any
// room is reserved.
TEST_F(PeerMemoryTest, Auth_ReaderWithoutTheSecret_Unauthenticated) {
  Start(/*budget=*/1 << 20);
  PublishOwn(std::make_shared<std::string>(Pattern(3 << 20, 'o')));
  std::vector<std::shared_ptr<grpc::Channel>> channels = {channel_};
  std::string dest(3 << 20, '\0');
  EXPECT_EQ(ReadMemoryCopy(channels, PeerCredential{kJob, ""}, Copy(7, "data-00000", 3 << 20, 0),
                           dest.data(), absl::Seconds(30))
                .code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(dest, std::string(3 << 20, '\0'));
}

TEST_F(PeerMemoryTest, Auth_ForgedOrReplayedPut_UnauthenticatedAndNothingReserved) {
  Start(/*budget=*/1 << 20);
  v1::MemoryCopyChunk chunk;
  chunk.set_job_id(kJob);
  *chunk.mutable_copy() = Copy(7, "data-00001", 3, 1);
  chunk.set_data("abc");
  auto put = [&](const std::string& proof) { return PutOneChunk(chunk, proof); };
  PeerCallProof forged = MakePeerCallProof(TestPeerCredential(), kPutMemoryCopyMethod,
                                           absl::Now(), std::string(kPeerNonceBytes, 'f'));
  forged.mac[0] ^= 1;
  EXPECT_EQ(put(EncodePeerCallProof(forged)), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(store_->Copies().empty());
  // A put seen on the wire and replayed: kept once, refused the second time, nothing reserved.
  const std::string seen = EncodePeerCallProof(MakePeerCallProof(
      TestPeerCredential(), kPutMemoryCopyMethod, absl::Now(), std::string(kPeerNonceBytes, 'r')));
  ASSERT_EQ(put(seen), grpc::StatusCode::OK);
  EXPECT_EQ(put(seen), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(store_->Copies().size(), 1u);
  EXPECT_TRUE(store_->Reserve(Copy(8, "data-00002", (1 << 20) - 3, 2)).ok());
}

TEST_F(PeerMemoryTest, Put_OverTheBuddyBudget_RefusedAndNothingHeld) {
  Start(/*budget=*/1 << 20);
  const std::string bytes = Pattern((1 << 20) + 1, 'b');
  absl::Status s = SendMemoryCopy(channel_, TestPeerCredential(), Copy(7, "data-00001", bytes.size(), 1),
                                  bytes.data(), absl::Seconds(30));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_TRUE(store_->Copies().empty());
}

TEST_F(PeerMemoryTest, Put_ASizeNoMemoryHolds_RefusedAndTheAgentServesOn) {
  Start(/*budget=*/std::numeric_limits<uint64_t>::max());  // the size passes the budget
  v1::MemoryCopyChunk chunk;
  *chunk.mutable_copy() = Copy(7, "data-00001", uint64_t{1} << 62, 1);
  chunk.set_job_id(kJob);
  chunk.set_data("first bytes");
  EXPECT_EQ(PutOneChunk(chunk), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(store_->Copies().empty());
  const std::string bytes = Pattern(1000, 'n');  // the server is still there, and takes this
  ASSERT_TRUE(SendMemoryCopy(channel_, TestPeerCredential(), Copy(7, "data-00001", bytes.size(), 1), bytes.data(),
                             absl::Seconds(30))
                  .ok());
  EXPECT_EQ(store_->Copies().size(), 1u);
}

TEST_F(PeerMemoryTest, Put_FromAnotherJob_UnauthenticatedAndNothingHeld) {
  Start(/*budget=*/1 << 20);
  const std::string bytes = Pattern(1000, 'j');
  EXPECT_EQ(SendMemoryCopy(channel_, TestPeerCredential("other-job"),
                           Copy(7, "data-00001", bytes.size(), 1), bytes.data(), absl::Seconds(30))
                .code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(store_->Copies().empty());
}

TEST_F(PeerMemoryTest, Put_GapInTheChunks_InvalidArgumentAndTheRoomGivenBack) {
  Start(/*budget=*/1 << 20);
  v1::MemoryCopyChunk chunk;
  *chunk.mutable_copy() = Copy(7, "data-00001", 1 << 20, 1);
  chunk.set_job_id(kJob);
  chunk.set_offset(4096);  // the first byte is at 0
  chunk.set_data("late");
  EXPECT_EQ(PutOneChunk(chunk), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(store_->Copies().empty());
  // The whole budget is free again: a copy of all of it fits.
  const std::string all = Pattern(1 << 20, 'w');
  EXPECT_TRUE(SendMemoryCopy(channel_, TestPeerCredential(), Copy(7, "data-00002", all.size(), 2), all.data(),
                             absl::Seconds(30))
                  .ok());
}

// A client channel whose HTTP/2 window stays small (no bandwidth probing): a reader that
// does not read holds the server's writes after the first few chunks.
std::shared_ptr<grpc::Channel> SmallWindowChannel(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

TEST_F(PeerMemoryTest, Read_AReaderThatTakesNothing_CutOffAfterTheStallLimitAndTheCopyLetGo) {
  PeerMemoryServiceOptions options;
  options.read_stall = absl::Seconds(1);  // from the call's start, before its first chunk too
  Start(/*budget=*/1 << 20, options);
  // The copy's memory, once nothing holds it (shared: it may be freed after a failed test).
  auto freed = std::make_shared<absl::Notification>();
  constexpr uint64_t kSize = uint64_t{64} << 20;  // far more than the reader's windows take
  std::shared_ptr<std::string> own(new std::string(Pattern(kSize, 'q')),
                                   [freed](std::string* bytes) {
                                     delete bytes;
                                     freed->Notify();
                                   });
  PublishOwn(own);
  v1::PeerMemory::Stub stub(SmallWindowChannel(address_));
  grpc::ClientContext context;  // no deadline: only the server can end this call
  EXPECT_TRUE(ProvePeerCall(&context, TestPeerCredential(), kReadMemoryCopyMethod).ok());
  v1::ReadMemoryCopyRequest request;
  request.set_job_id(kJob);
  request.set_step(7);
  request.set_session_id("s7");
  request.set_file("data-00000");
  std::unique_ptr<grpc::ClientReader<v1::MemoryCopyChunk>> reader =
      stub.ReadMemoryCopy(&context, request);
  v1::MemoryCopyChunk chunk;
  ASSERT_TRUE(reader->Read(&chunk)) << reader->Finish().error_message();  // being served
  own.reset();  // the copy is dropped (the tier only refers to it): the read alone holds it
  EXPECT_TRUE(freed->WaitForNotificationWithTimeout(absl::Seconds(20)))
      << "a read that took nothing still holds the copy";
  uint64_t received = chunk.data().size();
  while (reader->Read(&chunk)) received += chunk.data().size();
  EXPECT_LT(received, kSize);
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(service_->AwaitIdle(absl::Seconds(20)));
}

TEST_F(PeerMemoryTest, Put_ASenderThatStopsSending_CutOffAfterTheStallLimitAndTheRoomGivenBack) {
  PeerMemoryServiceOptions options;
  options.put_stall = absl::Seconds(1);  // from the call's start, before its first chunk too
  Start(/*budget=*/4 << 20, options);
  v1::PeerMemory::Stub stub(channel_);
  grpc::ClientContext context;  // no deadline: only the server can end this call
  EXPECT_TRUE(ProvePeerCall(&context, TestPeerCredential(), kPutMemoryCopyMethod).ok());
  v1::PutMemoryCopyResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::MemoryCopyChunk>> writer =
      stub.PutMemoryCopy(&context, &response);
  v1::MemoryCopyChunk chunk;
  *chunk.mutable_copy() = Copy(7, "data-00001", 3 << 20, 1);  // 3 MiB of the 4 reserved
  chunk.set_job_id(kJob);
  chunk.set_data(Pattern(1 << 20, 'p'));
  ASSERT_TRUE(writer->Write(chunk));
  // The sender sends nothing more and never closes its side.
  absl::Notification ended;
  grpc::Status status;
  std::thread finish([&] {
    status = writer->Finish();
    ended.Notify();
  });
  const bool cut_off = ended.WaitForNotificationWithTimeout(absl::Seconds(20));
  if (!cut_off) context.TryCancel();  // so that the test ends
  finish.join();
  ASSERT_TRUE(cut_off) << "a put whose sender stopped is still being received";
  EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED) << status.error_message();
  ASSERT_TRUE(service_->AwaitIdle(absl::Seconds(20)));
  EXPECT_TRUE(store_->Copies().empty());
  // The whole budget is free again.
  EXPECT_TRUE(store_->Reserve(Copy(7, "data-00002", 4 << 20, 2)).ok());
}

TEST_F(PeerMemoryTest, Put_LongerInAllThanTheStallLimit_KeptWhileChunksArrive) {
  PeerMemoryServiceOptions options;
  options.put_stall = absl::Seconds(1);
  Start(/*budget=*/32 << 20, options);
  const std::string bytes = Pattern(20 << 20, 'k');  // twenty chunks
  // The sender pauses before each chunk, as while its trainer saves: the put lasts about two
  // seconds in all, twice the limit, while no gap comes near it. A limit on stalls is about
  // real time passing, so the pauses are real ones; no event can stand in for them.
  ASSERT_TRUE(SendMemoryCopy(channel_, TestPeerCredential(), Copy(7, "data-00005", bytes.size(), 5), bytes.data(),
                             absl::Seconds(30), nullptr,
                             [] { absl::SleepFor(absl::Milliseconds(100)); })
                  .ok());
  ASSERT_EQ(store_->Copies().size(), 1u);
  EXPECT_EQ(store_->Copies()[0].nbytes(), bytes.size());
}

// A PeerMemory server for a read of a copy in `parts` parts: each part but the first is never
// sent a byte of (until cancelled); the first fails with NotFound once all the others have
// reached the server, so that they are being served when the read's first error comes.
class FirstPartFailsOthersHang final : public v1::PeerMemory::CallbackService {
 public:
  explicit FirstPartFailsOthersHang(int parts) : parts_(parts) {}

  grpc::ServerWriteReactor<v1::MemoryCopyChunk>* ReadMemoryCopy(
      grpc::CallbackServerContext* /*context*/, const v1::ReadMemoryCopyRequest* request) override {
    auto* reactor = new Reactor(this, /*hangs=*/request->offset() != 0);
    absl::MutexLock lock(&mu_);
    if (request->offset() == 0) {
      first_ = reactor;
    } else {
      ++hanging_;
    }
    if (hanging_ == parts_ - 1 && first_ != nullptr) {
      FinishLocked(first_, grpc::Status(grpc::StatusCode::NOT_FOUND, "first part gone"));
      first_ = nullptr;
    }
    return reactor;
  }

  // True once every hanging part was cancelled, false if not within `timeout`.
  bool AwaitHangingCancelled(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto all = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return cancelled_ == parts_ - 1; };
    return mu_.AwaitWithTimeout(absl::Condition(&all), timeout);
  }

 private:
  // Sends nothing; finishes when told to, or when cancelled.
  class Reactor final : public grpc::ServerWriteReactor<v1::MemoryCopyChunk> {
   public:
    Reactor(FirstPartFailsOthersHang* owner, bool hangs) : owner_(owner), hangs_(hangs) {}
    void OnCancel() override {
      absl::MutexLock lock(&owner_->mu_);
      if (hangs_) ++owner_->cancelled_;
      if (owner_->first_ == this) owner_->first_ = nullptr;
      owner_->FinishLocked(this, grpc::Status::CANCELLED);
    }
    void OnDone() override { delete this; }

   private:
    friend class FirstPartFailsOthersHang;
    FirstPartFailsOthersHang* const owner_;
    const bool hangs_;
    bool finished_ = false;  // guarded by owner_->mu_
  };

  void FinishLocked(Reactor* reactor, const grpc::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (reactor->finished_) return;
    reactor->finished_ = true;
    reactor->Finish(status);
  }

  const int parts_;
  absl::Mutex mu_;
  int hanging_ ABSL_GUARDED_BY(mu_) = 0;           // hanging parts that reached the server
  int cancelled_ ABSL_GUARDED_BY(mu_) = 0;         // of those, cancelled
  Reactor* first_ ABSL_GUARDED_BY(mu_) = nullptr;  // the first part's, until it fails
};

TEST(ReadMemoryCopyTest, OneStreamFails_TheOthersEndedAtOnceAndItsErrorReturned) {
  FirstPartFailsOthersHang service(/*parts=*/3);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  const std::string address = "127.0.0.1:" + std::to_string(port);
  std::vector<std::shared_ptr<grpc::Channel>> channels =
      MemoryCopyChannels(address, grpc::InsecureChannelCredentials(), 3);
  std::string dest(3 * kMemoryCopyChunkBytes, '\0');
  absl::Notification returned;
  absl::Status status;
  std::thread read([&] {
    status = ReadMemoryCopy(channels, TestPeerCredential(), Copy(7, "data-00004", dest.size(), 4), dest.data(),
                            absl::Minutes(10));
    returned.Notify();
  });
  // Within far less than the read's own 10-minute timeout.
  const bool ended = returned.WaitForNotificationWithTimeout(absl::Seconds(20));
  if (!ended) server->Shutdown(std::chrono::system_clock::now());  // ends the hanging parts
  read.join();
  EXPECT_TRUE(ended) << "the other parts were read on after the first one failed";
  EXPECT_TRUE(service.AwaitHangingCancelled(absl::Seconds(20)));
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("first part gone"));
  server->Shutdown();
}

TEST(BuddyStore, Reserve_CopiesBeingReceivedCountAgainstTheBudget) {
  BuddyStore store(/*budget_bytes=*/1000);
  absl::StatusOr<std::shared_ptr<MemoryBuffer>> a = store.Reserve(Copy(7, "a", 600, 1));
  ASSERT_TRUE(a.ok());
  // Writer 2's copy would fit beside what is held (nothing) but not beside writer 1's in flight.
  EXPECT_EQ(store.Reserve(Copy(7, "b", 600, 2)).status().code(),
            absl::StatusCode::kResourceExhausted);
  store.Abandon(a->get());
  EXPECT_TRUE(store.Reserve(Copy(7, "b", 600, 2)).ok());
}

TEST(BuddyStore, Reserve_ASizeNoMemoryHolds_RefusedNotAllocated) {
  // The size is the sender's word: larger than the budget, refused before any allocation
  // (else `new` of 2^62 bytes throws and ends the agent).
  BuddyStore store(/*budget_bytes=*/1000);
  absl::StatusOr<std::shared_ptr<MemoryBuffer>> huge =
      store.Reserve(Copy(7, "a", uint64_t{1} << 62, 1));
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted) << huge.status();
  EXPECT_THAT(std::string(huge.status().message()), HasSubstr("buddy budget is 1000 bytes"));
  // Within a budget larger than memory: the allocation fails, and that is the answer.
  BuddyStore unbounded(/*budget_bytes=*/std::numeric_limits<uint64_t>::max());
  huge = unbounded.Reserve(Copy(7, "a", uint64_t{1} << 62, 1));
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted) << huge.status();
  EXPECT_THAT(std::string(huge.status().message()), HasSubstr("cannot allocate"));
  // Nothing was counted: the whole budget is free.
  EXPECT_TRUE(store.Reserve(Copy(7, "a", 1000, 1)).ok());
  EXPECT_TRUE(unbounded.Reserve(Copy(7, "a", 1000, 1)).ok());
}

TEST(BuddyStore, Reserve_AWritersEarlierPutStillArriving_CountsBesideItsNextOne) {
  // A sender that gave up on step 7's put sends step 8's while step 7's receive has not yet
  // seen the connection end: both buffers exist, and both count.
  BuddyStore store(/*budget_bytes=*/1000);
  absl::StatusOr<std::shared_ptr<MemoryBuffer>> step7 = store.Reserve(Copy(7, "a", 400, 1));
  ASSERT_TRUE(step7.ok());
  EXPECT_EQ(store.Reserve(Copy(8, "a", 700, 1)).status().code(),
            absl::StatusCode::kResourceExhausted);
  absl::StatusOr<std::shared_ptr<MemoryBuffer>> step8 = store.Reserve(Copy(8, "a", 400, 1));
  ASSERT_TRUE(step8.ok());
  // Step 7's receive ends: its room, not step 8's, is given back.
  store.Abandon(step7->get());
  EXPECT_EQ(store.Reserve(Copy(8, "b", 700, 2)).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(store.Reserve(Copy(8, "b", 600, 2)).ok());
}

TEST(BuddyStore, Keep_APutArrivingAfterOneReservedLater_NotKept) {
  BuddyStore store(/*budget_bytes=*/1000);
  absl::StatusOr<std::shared_ptr<MemoryBuffer>> step7 = store.Reserve(Copy(7, "a", 400, 1));
  absl::StatusOr<std::shared_ptr<MemoryBuffer>> step8 = store.Reserve(Copy(8, "a", 400, 1));
  ASSERT_TRUE(step7.ok() && step8.ok());
  store.Keep(Copy(8, "a", 400, 1), *step8);
  store.Keep(Copy(7, "a", 400, 1), *step7);
  EXPECT_TRUE(store.Find(8, "s8", "a").has_value());
  EXPECT_FALSE(store.Find(7, "s7", "a").has_value());
  // Neither copy's room is still counted as arriving: 600 fit beside step 8's 400.
  EXPECT_TRUE(store.Reserve(Copy(8, "b", 600, 2)).ok());
}

// Reserves room for `copy` in `store` and keeps it there, as a whole arrival does.
void ReserveAndKeep(BuddyStore& store, const v1::MemoryCopy& copy) {
  absl::StatusOr<std::shared_ptr<MemoryBuffer>> room = store.Reserve(copy);
  ASSERT_TRUE(room.ok()) << room.status();
  store.Keep(copy, *std::move(room));
}

TEST(BuddyStore, Keep_AnEarlierStepSentLater_ReplacesTheCopy) {
  // The job rolled back from step 300 and saves step 250: the sender's newest copy is 250's.
  BuddyStore store(/*budget_bytes=*/1000);
  ReserveAndKeep(store, Copy(300, "a", 400, 1));
  ReserveAndKeep(store, Copy(250, "a", 400, 1));
  EXPECT_TRUE(store.Find(250, "s250", "a").has_value());
  EXPECT_FALSE(store.Find(300, "s300", "a").has_value());
}

TEST(BuddyStore, Reserve_TheCopyBeingReplacedCountsTooUntilItIsReplaced) {
  BuddyStore store(/*budget_bytes=*/1300);
  ReserveAndKeep(store, Copy(7, "a", 600, 1));
  // Step 8's copy fits beside step 7's (1,200 of 1,300): step 7 stays readable until then.
  absl::StatusOr<std::shared_ptr<MemoryBuffer>> step8 = store.Reserve(Copy(8, "a", 600, 1));
  ASSERT_TRUE(step8.ok());
  EXPECT_TRUE(store.Find(7, "s7", "a").has_value());
  // Writer 2's 200 bytes do not fit beside both of writer 1's.
  EXPECT_EQ(store.Reserve(Copy(8, "b", 200, 2)).status().code(),
            absl::StatusCode::kResourceExhausted);
  store.Keep(Copy(8, "a", 600, 1), *step8);
  EXPECT_FALSE(store.Find(7, "s7", "a").has_value());
  EXPECT_TRUE(store.Find(8, "s8", "a").has_value());
}

TEST(BuddyStore, Reserve_ReplacementThatFitsOnlyAlone_DropsTheOlderCopyFirst) {
  BuddyStore store(/*budget_bytes=*/1000);
  ReserveAndKeep(store, Copy(7, "a", 600, 1));
  // Both copies of writer 1 would take 1,200 of 1,000 bytes: step 7's is let go for step 8's,
  // so what the store holds never exceeds its budget.
  ASSERT_TRUE(store.Reserve(Copy(8, "a", 600, 1)).ok());
  EXPECT_FALSE(store.Find(7, "s7", "a").has_value());
  EXPECT_TRUE(store.Copies().empty());
  // Room for writer 2: 400 beside the 600 being received.
  EXPECT_TRUE(store.Reserve(Copy(8, "b", 400, 2)).ok());
}

TEST_F(PeerMemoryTest, Put_WithoutACopyHeader_InvalidArgument) {
  Start(/*budget=*/1 << 20);
  v1::MemoryCopyChunk chunk;
  chunk.set_job_id(kJob);
  chunk.set_data("orphan bytes");
  EXPECT_EQ(PutOneChunk(chunk), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(store_->Copies().empty());
}

TEST(BuddyReplicator, FailedSendTriedAgainAtTheNextHeartbeat_RestartedBuddySentAgain) {
  MemoryTier tier;
  auto bytes = std::make_shared<std::string>(Pattern(1000, 'q'));
  tier.Publish(ResidentCheckpoint{7, "s7", "data-00005", 4096, bytes->size(),
                                  ResidentRegion{"/r", bytes->data(), bytes->size(), bytes}});
  absl::Mutex mu;
  int calls = 0;
  absl::Notification first, second, third;
  auto replicator = std::make_unique<BuddyReplicator>(
      &tier, /*rank=*/5,
      [&](const v1::MemoryBuddy& to, const v1::MemoryCopy& copy, const char* data,
          const std::atomic<bool>&) {
        EXPECT_EQ(to.peer_address(), "10.0.0.2:7000");
        EXPECT_EQ(copy.step(), 7);
        EXPECT_EQ(std::string(data, copy.nbytes()), *bytes);
        absl::MutexLock lock(&mu);
        switch (++calls) {
          case 1:
            first.Notify();
            return absl::UnavailableError("buddy down");  // tried again at the next heartbeat
          case 2:
            second.Notify();
            return absl::OkStatus();
          default:
            if (!third.HasBeenNotified()) third.Notify();
            return absl::OkStatus();
        }
      });
  v1::MemoryBuddy buddy;
  buddy.set_rank(1);
  buddy.set_peer_address("10.0.0.2:7000");
  buddy.set_incarnation(100);
  replicator->SetBuddy(buddy);  // a heartbeat reply
  ASSERT_TRUE(first.WaitForNotificationWithTimeout(absl::Seconds(60)));
  replicator->SetBuddy(buddy);  // the next one: the failed send goes again
  ASSERT_TRUE(second.WaitForNotificationWithTimeout(absl::Seconds(60)));
  replicator->SetBuddy(buddy);  // sent whole already: nothing
  buddy.set_incarnation(101);   // the buddy restarted at the same address: it holds nothing
  replicator->SetBuddy(buddy);
  ASSERT_TRUE(third.WaitForNotificationWithTimeout(absl::Seconds(60)));
  replicator.reset();  // joins: every send it would make is made
  absl::MutexLock lock(&mu);
  EXPECT_EQ(calls, 3);
}

// A send that goes on until cancelled (or `gate` opens), as a long transfer does. One that is
// neither within 20 s fails the test (GiveWay waited for the wrong send, say).
absl::Status SendUntilCancelled(const std::atomic<bool>& cancel, const std::atomic<bool>& gate) {
  const absl::Time give_up = absl::Now() + absl::Seconds(20);
  while (!cancel.load() && !gate.load()) {
    if (absl::Now() > give_up) {
      ADD_FAILURE() << "a send was neither cancelled nor let through in 20 s";
      return absl::DeadlineExceededError("test send gave up");
    }
    std::this_thread::yield();
  }
  return cancel.load() ? absl::CancelledError("cancelled") : absl::OkStatus();
}

// Publishes `step` (session "s<step>") held in `region`: the staging pool's own reference, so
// the region counts as held while another reference to it lives.
void PublishStep(MemoryTier& tier, int64_t step, const std::shared_ptr<std::string>& region) {
  tier.Publish(ResidentCheckpoint{
      step, absl::StrCat("s", step), "data-00005", 4096, region->size(),
      ResidentRegion{absl::StrCat("/r", step), region->data(), region->size(), region}});
}

v1::MemoryBuddy TestBuddy() {
  v1::MemoryBuddy buddy;
  buddy.set_rank(1);
  buddy.set_peer_address("10.0.0.2:7000");
  return buddy;
}

TEST(BuddyReplicator, GiveWay_SendOfAnOlderStepCancelled_ItsRegionLetGoBeforeItReturns) {
  // Saves faster than a buddy transfer: the send of step 7 must not hold step 7's region when
  // the save after step 8 reuses it, or that save makes a new region on the trainer's time.
  MemoryTier tier;
  auto region7 = std::make_shared<std::string>(Pattern(1000, 'a'));
  PublishStep(tier, 7, region7);
  absl::Notification started7, sent8;
  std::atomic<bool> cancelled7{false}, never{false}, save_done{false};
  BuddyReplicator replicator(&tier, /*rank=*/5,
                             [&](const v1::MemoryBuddy&, const v1::MemoryCopy& copy, const char*,
                                 const std::atomic<bool>& cancel) {
                               if (copy.step() == 8) {
                                 // As the agent's Send does, step 8's send waits while the trainer
                                 // is in its save — the save that called GiveWay, which must not
                                 // wait for this send in turn.
                                 absl::Status status = SendUntilCancelled(cancel, save_done);
                                 sent8.Notify();
                                 return status;
                               }
                               started7.Notify();
                               absl::Status status = SendUntilCancelled(cancel, never);
                               cancelled7.store(absl::IsCancelled(status));
                               return status;
                             });
  replicator.SetBuddy(TestBuddy());
  ASSERT_TRUE(started7.WaitForNotificationWithTimeout(absl::Seconds(60)));
  EXPECT_EQ(region7.use_count(), 2) << "the send holds step 7's region";

  auto region8 = std::make_shared<std::string>(Pattern(1000, 'b'));
  PublishStep(tier, 8, region8);
  replicator.OnPublished();
  EXPECT_TRUE(replicator.GiveWay(absl::Seconds(60)));  // the save of step 9 acquires staging
  EXPECT_TRUE(cancelled7.load()) << "the send of step 7 ran to its end";
  EXPECT_EQ(region7.use_count(), 1) << "step 7's region is still held";
  save_done.store(true);
  ASSERT_TRUE(sent8.WaitForNotificationWithTimeout(absl::Seconds(60)));  // the newest, next
}

TEST(BuddyReplicator, GiveWay_SendThatDoesNotStop_GivenUpAfterTheWait) {
  // A buddy that stopped reading holds the send in a write until the Send's deadline: the
  // save waits only so long, then stages elsewhere (never a hang on a peer's fault).
  MemoryTier tier;
  auto region7 = std::make_shared<std::string>(Pattern(1000, 'a'));
  PublishStep(tier, 7, region7);
  absl::Notification started7;
  std::atomic<bool> unblocked{false};
  BuddyReplicator replicator(&tier, /*rank=*/5,
                             [&](const v1::MemoryBuddy&, const v1::MemoryCopy& copy, const char*,
                                 const std::atomic<bool>&) {
                               if (copy.step() != 7) return absl::OkStatus();
                               started7.Notify();
                               std::atomic<bool> never{false};
                               return SendUntilCancelled(never, unblocked);  // ignores cancel
                             });
  replicator.SetBuddy(TestBuddy());
  ASSERT_TRUE(started7.WaitForNotificationWithTimeout(absl::Seconds(60)));
  auto region8 = std::make_shared<std::string>(Pattern(1000, 'b'));
  PublishStep(tier, 8, region8);
  replicator.OnPublished();
  EXPECT_FALSE(replicator.GiveWay(absl::Milliseconds(50)));
  EXPECT_EQ(region7.use_count(), 2) << "the stuck send still holds step 7's region";
  unblocked.store(true);
}

TEST(BuddyReplicator, GiveWay_AfterTwoGiveUpsInARow_TheThirdSendFinishes) {
  // Saves always faster than the buddy: without a limit no copy would ever arrive whole.
  MemoryTier tier;
  std::vector<std::shared_ptr<std::string>> regions;
  absl::Mutex mu;
  std::vector<int64_t> started ABSL_GUARDED_BY(mu);
  std::vector<int64_t> cancelled ABSL_GUARDED_BY(mu);
  std::atomic<bool> open{false};
  BuddyReplicator replicator(&tier, /*rank=*/5,
                             [&](const v1::MemoryBuddy&, const v1::MemoryCopy& copy, const char*,
                                 const std::atomic<bool>& cancel) {
                               {
                                 absl::MutexLock lock(&mu);
                                 started.push_back(copy.step());
                               }
                               absl::Status status = SendUntilCancelled(cancel, open);
                               if (absl::IsCancelled(status)) {
                                 absl::MutexLock lock(&mu);
                                 cancelled.push_back(copy.step());
                               }
                               return status;
                             });
  replicator.SetBuddy(TestBuddy());
  auto publish = [&](int64_t step) {
    regions.push_back(std::make_shared<std::string>(Pattern(1000, static_cast<char>('a' + step))));
    PublishStep(tier, step, regions.back());
    replicator.OnPublished();
  };
  auto await_sending = [&](int64_t step) {
    auto sending = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      return !started.empty() && started.back() == step;
    };
    absl::MutexLock lock(&mu);
    return mu.AwaitWithTimeout(absl::Condition(&sending), absl::Seconds(60));
  };
  publish(7);
  ASSERT_TRUE(await_sending(7));
  publish(8);
  EXPECT_TRUE(replicator.GiveWay(absl::Seconds(60)));  // step 7's send given up (1)
  ASSERT_TRUE(await_sending(8));
  publish(9);
  EXPECT_TRUE(replicator.GiveWay(absl::Seconds(60)));  // step 8's, given up (2)
  ASSERT_TRUE(await_sending(9));
  publish(10);
  EXPECT_FALSE(replicator.GiveWay(absl::Seconds(60)));  // step 9's send goes on to its end
  open.store(true);
  absl::MutexLock lock(&mu);
  EXPECT_EQ(cancelled, (std::vector<int64_t>{7, 8}));
}

TEST(BuddyReplicator, GiveWay_SendOfTheNewestStepGoesOn) {
  MemoryTier tier;
  auto region7 = std::make_shared<std::string>(Pattern(1000, 'a'));
  PublishStep(tier, 7, region7);
  absl::Notification started7, sent7;
  std::atomic<bool> open{false}, cancelled7{false};
  BuddyReplicator replicator(&tier, /*rank=*/5,
                             [&](const v1::MemoryBuddy&, const v1::MemoryCopy&, const char*,
                                 const std::atomic<bool>& cancel) {
                               started7.Notify();
                               absl::Status status = SendUntilCancelled(cancel, open);
                               cancelled7.store(absl::IsCancelled(status));
                               sent7.Notify();
                               return status;
                             });
  replicator.SetBuddy(TestBuddy());
  ASSERT_TRUE(started7.WaitForNotificationWithTimeout(absl::Seconds(60)));
  // Step 7 is the newest commit: its region is the resident one, which no save reuses.
  EXPECT_TRUE(replicator.GiveWay(absl::Seconds(60)));
  open.store(true);
  ASSERT_TRUE(sent7.WaitForNotificationWithTimeout(absl::Seconds(60)));
  EXPECT_FALSE(cancelled7.load());
}

TEST_F(PeerMemoryTest, Replicator_SendsTheNewestCopyToTheBuddy) {
  Start(/*budget=*/64 << 20);
  MemoryTier sender_tier;
  absl::Notification step8_sent;
  BuddyReplicator replicator(&sender_tier, /*rank=*/5,
                             [&](const v1::MemoryBuddy& to, const v1::MemoryCopy& copy,
                                 const char* data, const std::atomic<bool>& cancel) {
                               EXPECT_EQ(to.peer_address(), address_);
                               EXPECT_TRUE(copy.region().empty());
                               absl::Status s = SendMemoryCopy(channel_, TestPeerCredential(), copy, data,
                                                               absl::Seconds(30), &cancel);
                               if (s.ok() && copy.step() == 8) step8_sent.Notify();
                               return s;
                             });
  v1::MemoryBuddy buddy;
  buddy.set_rank(1);
  buddy.set_peer_address(address_);
  replicator.SetBuddy(buddy);

  auto first = std::make_shared<std::string>(Pattern(3 << 20, 'f'));
  sender_tier.Publish(
      ResidentCheckpoint{7, "s7", "data-00005", 4096, first->size(),
                         ResidentRegion{"/r", first->data(), first->size(), first}});
  replicator.OnPublished();
  auto second = std::make_shared<std::string>(Pattern(1 << 20, 's'));
  sender_tier.Publish(
      ResidentCheckpoint{8, "s8", "data-00005", 4096, second->size(),
                         ResidentRegion{"/r", second->data(), second->size(), second}});
  replicator.OnPublished();
  // Step 7 may be sent first or overtaken by step 8; step 8 is sent, and replaces it.
  ASSERT_TRUE(step8_sent.WaitForNotificationWithTimeout(absl::Seconds(60)));
  std::optional<HeldCopy> held = store_->Find(8, "s8", "data-00005");
  ASSERT_TRUE(held.has_value());
  EXPECT_EQ(held->copy.writer_rank(), 5u);
  EXPECT_EQ(std::string(held->bytes->data(), held->bytes->size()), *second);
  EXPECT_EQ(store_->Copies().size(), 1u);
}

}  // namespace
}  // namespace tessera
