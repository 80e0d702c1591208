#include "client/client.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <fstream>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "agent/buddy_store.h"
#include "agent/memory_bulk.h"
#include "agent/memory_tier.h"
#include "agent/staging_pool.h"
#include "client/bounce_copy.h"
#include "client/describe.h"
#include "common/plan_fingerprint.h"
#include "common/fake_bulk_holder.h"
#include "client/parallel_copy.h"
#include "common/checksum.h"
#include "common/dtype.h"
#include "common/grpc_status.h"
#include "common/status.h"
#include "common/tensor_key.h"
#include "common/threads.h"
#include "cuda_runtime_api.h"
#include "gmock/gmock.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "shm/cuda_host.h"
#include "tessera/v1/agent.grpc.pb.h"

namespace tessera {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint8_t kUntouched = 0xEE;  // what the fake fills staging with before handing it out
constexpr uint64_t kSlotGap = 64;     // bytes the fake leaves between slots

// Deterministic bytes that differ per tensor (`seed`) and per position.
void FillPattern(void* data, size_t size, uint32_t seed) {
  auto* p = static_cast<uint8_t*>(data);
  for (size_t i = 0; i < size; ++i) p[i] = static_cast<uint8_t>(seed * 131u + i * 7u + (i >> 9));
}
std::vector<uint8_t> Pattern(size_t size, uint32_t seed) {
  std::vector<uint8_t> bytes(size);
  FillPattern(bytes.data(), size, seed);
  return bytes;
}

v1::Layout Mesh(std::vector<std::pair<std::string, uint32_t>> dims) {
  v1::Layout layout;
  for (const auto& [name, degree] : dims) {
    v1::MeshDim* dim = layout.add_dims();
    dim->set_name(name);
    dim->set_degree(degree);
  }
  return layout;
}

// A directory for unix sockets: Bazel's test temp dir unless its path is too long for
// sockaddr_un (108 bytes).
std::string SocketDir() {
  for (const char* var : {"TESSERA_TEST_TMPDIR", "TEST_TMPDIR"}) {
    const char* dir = getenv(var);
    if (dir != nullptr && *dir != '\0' && strlen(dir) < 80) return dir;
  }
  return "/tmp";
}

// How many mappings of shared-memory region `name` ("/tessera-...") this process holds, the
// region's name removed ("... (deleted)") or not.
int MappingsOf(const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  int n = 0;
  for (std::string line; std::getline(maps, line);) {
    if (absl::EndsWith(line, name) || absl::EndsWith(line, name + " (deleted)")) ++n;
  }
  return n;
}

// The agent's side of the protocol, scripted: real shared memory from a StagingPool, slots laid
// out with gaps, and a record of every request.
class FakeAgent final : public v1::Agent::Service {
 public:
  explicit FakeAgent(StagingPool* pool) : pool_(pool) {}

  // What one Staged call found in staging: each slot's bytes.
  struct Snapshot {
    std::string session_id;
    uint64_t stall_ns = 0;
    std::vector<std::string> slots;     // bytes of each slot (empty for big slots)
    std::vector<uint64_t> slot_hashes;  // Xxh3 of each slot
    bool gaps_untouched = true;         // every byte outside the slots still kUntouched
  };

  v1::AgentIdentity identity;
  absl::Mutex mu;
  grpc::Status info_status ABSL_GUARDED_BY(mu);
  grpc::Status begin_error ABSL_GUARDED_BY(mu);
  bool bad_slot_count ABSL_GUARDED_BY(mu) = false;
  std::vector<v1::BeginSaveRequest> begin_requests ABSL_GUARDED_BY(mu);
  std::vector<Snapshot> staged ABSL_GUARDED_BY(mu);
  // Staged calls that withdrew their snapshot (an overlapped save refused at its fence).
  std::vector<v1::StagedRequest> withdrawals ABSL_GUARDED_BY(mu);
  std::vector<v1::RefuseSaveRequest> refusals ABSL_GUARDED_BY(mu);
  // While set, BeginSave (after recording its request) and WaitCommitted wait for it to be
  // cleared, as an agent does for the other ranks and for the commit.
  bool hold_begin ABSL_GUARDED_BY(mu) = false;
  bool hold_waits ABSL_GUARDED_BY(mu) = false;
  std::string region_name ABSL_GUARDED_BY(mu);  // of the last BeginSave
  bool retain_each_save ABSL_GUARDED_BY(mu) = false;  // keep each staged region resident
  grpc::Status wait_status ABSL_GUARDED_BY(mu);
  std::vector<v1::WaitCommittedRequest> wait_requests ABSL_GUARDED_BY(mu);
  grpc::Status load_error ABSL_GUARDED_BY(mu);
  std::set<std::string> absent_states ABSL_GUARDED_BY(mu);  // "fqn/state_key" absent on load
  std::vector<v1::LoadRequest> load_requests ABSL_GUARDED_BY(mu);
  // As an agent serving in place: to a request with client_verifies, each slot is one block
  // left for the client to check; in the first `corrupt_loads` such loads a byte of slot 0
  // differs from what its listed XXH3 was taken over (a memory copy that no longer matches).
  bool list_blocks ABSL_GUARDED_BY(mu) = false;
  int corrupt_loads ABSL_GUARDED_BY(mu) = 0;
  // ListResidentBlocks' answer: the blocks of the resident region identity names, or
  // UNIMPLEMENTED (an agent without the call) while empty.
  v1::ListResidentBlocksResponse resident_blocks ABSL_GUARDED_BY(mu);
  // While set, ListResidentBlocks waits (for it to be cleared, or the call to be cancelled)
  // once it has set listing_entered.
  bool hold_listing ABSL_GUARDED_BY(mu) = false;
  bool listing_entered ABSL_GUARDED_BY(mu) = false;
  // As an agent on a node that replaced a lost one: to a request with client_fetches, the
  // load's bytes are a memory copy held by `holder` (a buddy's bulk port at `holder_address`;
  // the fake keeps the copy there, laid out as its load region would be), each slot one block
  // to check; in the first `corrupt_fetches` such loads a byte of slot 0 differs from its
  // block's XXH3.
  BuddyStore* holder ABSL_GUARDED_BY(mu) = nullptr;
  std::string holder_address ABSL_GUARDED_BY(mu);
  int corrupt_fetches ABSL_GUARDED_BY(mu) = 0;
  int failing_releases ABSL_GUARDED_BY(mu) = 0;  // the next n ReleaseLoad calls fail
  bool hold_releases_open ABSL_GUARDED_BY(mu) = true;  // ReleaseLoad waits while false
  std::vector<v1::ReserveStagingRequest> reserve_requests ABSL_GUARDED_BY(mu);
  std::vector<std::string> released ABSL_GUARDED_BY(mu);
  // At each ReleaseLoad: the mappings of the load region in this process (the fake's own
  // pool mapping is one; a client that unmaps before releasing adds none).
  std::vector<int> mappings_at_release ABSL_GUARDED_BY(mu);

  // Xxh3 of the whole region of the last BeginSave.
  uint64_t RegionHash() {
    absl::MutexLock lock(&mu);
    return Xxh3(region_.data, region_.size);
  }

  grpc::Status GetInfo(grpc::ServerContext*, const v1::GetInfoRequest*,
                       v1::AgentIdentity* response) override {
    absl::MutexLock lock(&mu);
    if (!info_status.ok()) return info_status;
    *response = identity;
    return grpc::Status::OK;
  }

  grpc::Status RefuseSave(grpc::ServerContext*, const v1::RefuseSaveRequest* request,
                          v1::RefuseSaveResponse*) override {
    absl::MutexLock lock(&mu);
    refusals.push_back(*request);
    return grpc::Status::OK;
  }

  grpc::Status ListResidentBlocks(grpc::ServerContext* context,
                                  const v1::ListResidentBlocksRequest*,
                                  v1::ListResidentBlocksResponse* response) override {
    absl::MutexLock lock(&mu);
    listing_entered = true;
    // A synchronous handler learns of a cancellation only by asking.
    auto released = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return !hold_listing; };
    while (!mu.AwaitWithTimeout(absl::Condition(&released), absl::Milliseconds(5))) {
      if (context->IsCancelled()) return grpc::Status::CANCELLED;
    }
    if (resident_blocks.shm_name().empty()) {
      return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "not listed by this fake");
    }
    *response = resident_blocks;
    return grpc::Status::OK;
  }

  grpc::Status BeginSave(grpc::ServerContext*, const v1::BeginSaveRequest* request,
                         v1::BeginSaveResponse* response) override {
    absl::MutexLock lock(&mu);
    begin_requests.push_back(*request);
    auto begin_released = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return !hold_begin; };
    mu.Await(absl::Condition(&begin_released));
    if (!begin_error.ok()) return begin_error;
    std::vector<v1::StagingSlot> slots;
    const uint64_t total = Layout(request->shards(), &slots);
    grpc::Status status = AcquireLocked(total);
    if (!status.ok()) return status;
    response->set_session_id(absl::StrCat("session-", begin_requests.size()));
    response->set_shm_name(region_.name);
    response->set_shm_size(total);
    for (const v1::StagingSlot& slot : slots) *response->add_slots() = slot;
    if (bad_slot_count) response->mutable_slots()->RemoveLast();
    response->set_plan_cached(
        begin_requests.size() > 1 &&
        FingerprintShards(0, begin_requests[begin_requests.size() - 2].shards()) ==
            FingerprintShards(0, request->shards()));
    slots_ = slots;
    return grpc::Status::OK;
  }

  grpc::Status Staged(grpc::ServerContext*, const v1::StagedRequest* request,
                      v1::StagedResponse*) override {
    absl::MutexLock lock(&mu);
    if (request->withdrawn().code() != v1::ERROR_CODE_UNSPECIFIED) {
      withdrawals.push_back(*request);
      return grpc::Status::OK;
    }
    Snapshot snapshot;
    snapshot.session_id = request->session_id();
    snapshot.stall_ns = request->trainer_stall_ns();
    const auto* base = static_cast<const uint8_t*>(region_.data);
    std::vector<bool> in_slot(region_.size, false);
    for (const v1::StagingSlot& slot : slots_) {
      const auto* bytes = reinterpret_cast<const char*>(base + slot.offset());
      snapshot.slot_hashes.push_back(Xxh3(bytes, slot.nbytes()));
      snapshot.slots.push_back(slot.nbytes() <= kMiB ? std::string(bytes, slot.nbytes()) : "");
      for (uint64_t i = 0; i < slot.nbytes(); ++i) in_slot[slot.offset() + i] = true;
    }
    for (uint64_t i = 0; i < region_.size; ++i) {
      if (!in_slot[i] && base[i] != kUntouched) snapshot.gaps_untouched = false;
    }
    staged.push_back(std::move(snapshot));
    // As a committed save does with the memory tier on: the next save stages elsewhere.
    if (retain_each_save) pool_->Retain(region_.acquisition);
    return grpc::Status::OK;
  }

  grpc::Status WaitCommitted(grpc::ServerContext*, const v1::WaitCommittedRequest* request,
                             v1::WaitCommittedResponse* response) override {
    absl::MutexLock lock(&mu);
    wait_requests.push_back(*request);
    auto waits_released = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return !hold_waits; };
    mu.Await(absl::Condition(&waits_released));
    if (!wait_status.ok()) return wait_status;
    response->set_step(request->step());
    response->set_checkpoint_dir(absl::StrCat("/ckpt/job/step-", request->step()));
    return grpc::Status::OK;
  }

  // Fills slot i with Pattern(nbytes, 1000 + i), except absent optimizer states.
  grpc::Status Load(grpc::ServerContext*, const v1::LoadRequest* request,
                    v1::LoadResponse* response) override {
    absl::MutexLock lock(&mu);
    load_requests.push_back(*request);
    if (!load_error.ok()) return load_error;
    std::vector<bool> absent(request->shards_size());
    google::protobuf::RepeatedPtrField<v1::ShardDesc> shards = request->shards();
    for (int i = 0; i < shards.size(); ++i) {
      absent[i] = absent_states.count(shards[i].fqn() + "/" + shards[i].state_key()) > 0;
      if (absent[i]) shards[i].set_state_absent(true);
    }
    std::vector<v1::StagingSlot> slots;
    const uint64_t total = Layout(shards, &slots);
    if (shards.empty()) {  // which step: as an agent, from its resident set, rewriting nothing
      response->set_load_id(absl::StrCat("load-", load_requests.size()));
      response->set_step(request->step() < 0 ? 42 : request->step());
      response->set_shm_name(region_.name);
      return grpc::Status::OK;
    }
    if (holder != nullptr && request->client_fetches()) {
      return LoadFetchedLocked(*request, absent, slots, total, response);
    }
    grpc::Status status = AcquireLocked(total);
    if (!status.ok()) return status;
    for (int i = 0; i < shards.size(); ++i) {
      FillPattern(static_cast<char*>(region_.data) + slots[i].offset(), slots[i].nbytes(),
                  1000 + i);
      if (absent[i]) response->add_absent(i);
    }
    response->set_load_id(absl::StrCat("load-", load_requests.size()));
    response->set_step(request->step() < 0 ? 42 : request->step());
    response->set_shm_name(region_.name);
    response->set_shm_size(total);
    for (const v1::StagingSlot& slot : slots) *response->add_slots() = slot;
    if (list_blocks && request->client_verifies()) {
      for (size_t i = 0; i < slots.size(); ++i) {
        if (slots[i].nbytes() == 0) continue;
        char* bytes = static_cast<char*>(region_.data) + slots[i].offset();
        v1::BlockCheck* block = response->add_unverified_blocks();
        block->set_offset(slots[i].offset());
        block->set_length(slots[i].nbytes());
        block->set_xxh3(Xxh3(bytes, slots[i].nbytes()));
        if (i == 0 && corrupt_loads > 0) bytes[slots[i].nbytes() / 2] ^= 0x5a;
      }
      if (corrupt_loads > 0) --corrupt_loads;
    }
    return grpc::Status::OK;
  }

  // The answer naming the copy on `holder` (see `holder`), which it puts there first.
  grpc::Status LoadFetchedLocked(const v1::LoadRequest& request, const std::vector<bool>& absent,
                                 const std::vector<v1::StagingSlot>& slots, uint64_t total,
                                 v1::LoadResponse* response) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    v1::MemoryCopy copy;
    copy.set_step(request.step() < 0 ? 42 : request.step());
    copy.set_session_id("session-of-the-copy");
    copy.set_file("data-00000.safetensors");
    copy.set_nbytes(total);
    copy.set_writer_rank(0);
    absl::StatusOr<std::shared_ptr<MemoryBuffer>> room = holder->Reserve(copy);
    if (!room.ok()) return ToGrpcStatus(room.status());
    response->set_load_id(absl::StrCat("load-", load_requests.size()));
    response->set_step(copy.step());
    response->set_shm_size(total);
    for (size_t i = 0; i < slots.size(); ++i) {
      char* bytes = (*room)->data() + slots[i].offset();
      FillPattern(bytes, slots[i].nbytes(), 1000 + static_cast<int>(i));
      *response->add_slots() = slots[i];
      if (absent[i]) response->add_absent(static_cast<uint32_t>(i));
      if (slots[i].nbytes() == 0) continue;
      v1::BlockCheck* block = response->add_unverified_blocks();
      block->set_offset(slots[i].offset());
      block->set_length(slots[i].nbytes());
      block->set_xxh3(Xxh3(bytes, slots[i].nbytes()));
      if (i == 0 && corrupt_fetches > 0) bytes[slots[i].nbytes() / 2] ^= 0x5a;
    }
    if (corrupt_fetches > 0) --corrupt_fetches;
    holder->Keep(copy, *std::move(room));
    response->mutable_fetch()->set_job_id("job");
    response->mutable_fetch()->set_peer_secret(TestPeerCredential().secret);
    copy.set_bulk_address(holder_address);
    *response->mutable_fetch()->mutable_copy() = copy;
    response->set_bytes_from_memory(total);
    response->set_bytes_fetched_from_peers(total);
    return grpc::Status::OK;
  }

  // As the agent: both sets of regions (memory tier), for the request's bound.
  grpc::Status ReserveStaging(grpc::ServerContext*, const v1::ReserveStagingRequest* request,
                              v1::ReserveStagingResponse* response) override {
    absl::MutexLock lock(&mu);
    reserve_requests.push_back(*request);
    absl::StatusOr<std::vector<StagingSlot>> regions =
        pool_->Reserve(request->bytes() + request->tensors() * kSlotGap * 3, 2);
    if (!regions.ok()) return ToGrpcStatus(regions.status());
    for (const StagingSlot& region : *regions) {
      v1::StagingRegion* out = response->add_regions();
      out->set_shm_name(region.name);
      out->set_shm_size(region.capacity);
    }
    return grpc::Status::OK;
  }

  grpc::Status ReleaseLoad(grpc::ServerContext*, const v1::ReleaseLoadRequest* request,
                           v1::ReleaseLoadResponse*) override {
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(&hold_releases_open));
    released.push_back(request->load_id());
    mappings_at_release.push_back(MappingsOf(region_.name));
    if (failing_releases > 0) {
      --failing_releases;
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "release refused by the test");
    }
    return grpc::Status::OK;
  }


 private:
  // Slots in request order, each 64-byte aligned after a gap; absent state gets none.
  static uint64_t Layout(const google::protobuf::RepeatedPtrField<v1::ShardDesc>& shards,
                         std::vector<v1::StagingSlot>* slots) {
    uint64_t cursor = kSlotGap;
    for (const v1::ShardDesc& s : shards) {
      v1::StagingSlot slot;
      if (!s.state_absent() && s.nbytes() > 0) {
        slot.set_offset(cursor);
        slot.set_nbytes(s.nbytes());
        cursor = (cursor + s.nbytes() + kSlotGap + 63) / 64 * 64;
      }
      slots->push_back(slot);
    }
    return cursor;
  }

  grpc::Status AcquireLocked(uint64_t size) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    absl::StatusOr<std::vector<StagingSlot>> regions = pool_->Acquire({size});
    if (!regions.ok()) return ToGrpcStatus(regions.status());
    region_ = (*regions)[0];
    std::memset(region_.data, kUntouched, region_.capacity);
    region_name = region_.name;
    return grpc::Status::OK;
  }

  StagingPool* const pool_;
  StagingSlot region_ ABSL_GUARDED_BY(mu);
  std::vector<v1::StagingSlot> slots_ ABSL_GUARDED_BY(mu);
};

class ClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    const int n = counter++;
    StagingPoolOptions pool_options;
    pool_options.job_id = absl::StrCat("clienttest", getpid());
    pool_options.incarnation = static_cast<uint64_t>(n);
    pool_options.budget_bytes = 1024 * kMiB;
    absl::StatusOr<std::unique_ptr<StagingPool>> pool = StagingPool::Create(pool_options);
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = std::move(*pool);

    fake_ = std::make_unique<FakeAgent>(pool_.get());
    fake_->identity.set_job_id("llama");
    fake_->identity.mutable_coord()->set_rank(1);
    fake_->identity.mutable_coord()->add_index(0);
    fake_->identity.mutable_coord()->add_index(1);
    *fake_->identity.mutable_layout() = Mesh({{"tp", 2}, {"dp", 2}});

    socket_ = absl::StrCat(SocketDir(), "/tessera-client-", getpid(), "-", n, ".sock");
    unlink(socket_.c_str());
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix:" + socket_, grpc::InsecureServerCredentials());
    builder.RegisterService(fake_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr) << "cannot listen on " << socket_;
  }

  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
    unlink(socket_.c_str());
  }

  // Waits until the fake has seen `n` ReleaseLoad calls: Load releases in the background.
  void AwaitReleases(size_t n) {
    auto seen = [&] { return fake_->released.size() >= n; };
    absl::MutexLock lock(&fake_->mu);
    ASSERT_TRUE(fake_->mu.AwaitWithTimeout(absl::Condition(&seen), absl::Seconds(60)))
        << "no ReleaseLoad " << n << " in 60 s";
  }

  // A resident region of 4 MiB holding a checkpoint of one tensor of `n` bytes (at most
  // 4 MiB less the fake's slot gap) before the trainer connects, its one block listed
  // (ListResidentBlock): a load of that tensor fills it, as the agent's save did.
  void MakeCheckedResident(uint64_t n);
  // Connects while the fake holds ListResidentBlocks: returns once the client's prefetch
  // waits in that call (until hold_listing is cleared or the call cancelled).
  std::unique_ptr<Client> ConnectWhileTheListingIsHeld();

  std::unique_ptr<Client> Connect(ClientOptions options = {}) {
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(socket_, options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? std::move(*client) : nullptr;
  }

  std::unique_ptr<StagingPool> pool_;
  std::unique_ptr<FakeAgent> fake_;
  std::string socket_;
  std::unique_ptr<grpc::Server> server_;
};

// A host tensor over `bytes` (U8 unless told otherwise), the full 1-d tensor by default.
TensorRef HostRef(const std::string& fqn, std::vector<uint8_t>* bytes,
                  v1::DType dtype = v1::DTYPE_U8) {
  TensorRef t;
  t.fqn = fqn;
  t.dtype = dtype;
  t.global_shape = {static_cast<int64_t>(bytes->size() / DTypeSize(dtype))};
  t.data = bytes->data();
  t.nbytes = bytes->size();
  return t;
}

// `size` bytes of device memory at `device`, as a uint8 tensor `fqn`.
TensorRef CudaRef(const std::string& fqn, void* device, size_t size) {
  TensorRef t;
  t.fqn = fqn;
  t.dtype = v1::DTYPE_U8;
  t.global_shape = {static_cast<int64_t>(size)};
  t.data = device;
  t.nbytes = size;
  t.memory = Memory::kCuda;
  return t;
}

std::string Bytes(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }

// ---------------------------------------------------------------------------------------------
// Connect

TEST_F(ClientTest, Connect_FetchesIdentity) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(client->identity().job_id(), "llama");
  EXPECT_EQ(client->identity().coord().rank(), 1u);
  EXPECT_EQ(client->identity().layout().dims_size(), 2);
  // "unix:" targets are accepted as they are.
  EXPECT_TRUE(Client::Connect("unix:" + socket_).ok());
}

TEST_F(ClientTest, Connect_SocketPathTooLong_InvalidArgumentNamingIt) {
  // 116 bytes: a unix socket path holds at most 107 (gRPC alone would say only that it could
  // not create the channel).
  const std::string too_long = "/tmp/" + std::string(100, 'd') + "/agent.sock";
  for (const std::string& target : {too_long, "unix:" + too_long}) {
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(target);
    ASSERT_FALSE(client.ok());
    EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument) << client.status();
    EXPECT_EQ(client.status().message(),
              "agent socket path '" + too_long +
                  "' is 116 bytes; a unix socket path holds at most 107: start the agent with "
                  "a shorter --socket");
  }
}

TEST_F(ClientTest, Connect_NoAgentListening_Unavailable) {
  const std::string missing = socket_ + ".missing";
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(missing);
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), absl::StatusCode::kUnavailable) << client.status();
  EXPECT_THAT(client.status().message(), HasSubstr(missing));
}

TEST_F(ClientTest, Connect_AgentNotRegistered_UnavailableWithDetail) {
  {
    absl::MutexLock lock(&fake_->mu);
    fake_->info_status = ToGrpcStatus(
        MakeError(absl::StatusCode::kUnavailable, v1::ERROR_CODE_AGENT_LOST, "not registered yet"));
  }
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(socket_);
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(GetErrorCode(client.status()), v1::ERROR_CODE_AGENT_LOST);
  EXPECT_THAT(client.status().message(), HasSubstr("not registered yet"));
}

TEST_F(ClientTest, Connect_EmptyPathOrBadOptions_InvalidArgument) {
  EXPECT_EQ(Client::Connect("").status().code(), absl::StatusCode::kInvalidArgument);
  ClientOptions options;
  options.copy_threads = 0;
  EXPECT_EQ(Client::Connect(socket_, options).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ClientTest, Connect_AgentWithInvalidMesh_Internal) {
  fake_->identity.mutable_layout()->Clear();
  EXPECT_EQ(Client::Connect(socket_).status().code(), absl::StatusCode::kInternal);
}

// ---------------------------------------------------------------------------------------------
// Save

TEST_F(ClientTest, Save_CopiesEachTensorIntoItsSlot) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  // A TP shard of a 2-d F32 weight, a BF16 bias, a 0-d scalar, an empty shard, extra bytes.
  std::vector<uint8_t> wq = Pattern(4 * 8 * 4, 1), bias = Pattern(16 * 2, 2), scale = Pattern(4, 3),
                       empty, rng = Pattern(13, 5);
  TensorRef w = HostRef("layers.0.wq.weight", &wq, v1::DTYPE_F32);
  w.global_shape = {8, 8};
  w.box = Box{{4, 0}, {4, 8}};
  TensorRef b = HostRef("layers.0.wq.bias", &bias, v1::DTYPE_BF16);
  TensorRef s = HostRef("scale", &scale, v1::DTYPE_F32);
  s.global_shape = {};
  TensorRef e = HostRef("layers.1.moe.expert", &empty, v1::DTYPE_F32);
  e.global_shape = {4, 2};
  e.box = Box{{4, 0}, {0, 2}};
  TensorRef x = HostRef("rng", &rng);
  x.kind = v1::SHARD_KIND_EXTRA;
  const std::vector<TensorRef> tensors = {w, b, s, e, x};

  absl::StatusOr<SaveResult> result = client->Save(100, tensors);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->session_id, "session-1");
  EXPECT_FALSE(result->plan_cached);
  EXPECT_GT(result->stall, absl::ZeroDuration());

  absl::MutexLock lock(&fake_->mu);
  ASSERT_EQ(fake_->begin_requests.size(), 1u);
  const v1::BeginSaveRequest& request = fake_->begin_requests[0];
  EXPECT_EQ(request.step(), 100);
  ASSERT_EQ(request.shards_size(), 5);
  EXPECT_EQ(request.shards(0).fqn(), "layers.0.wq.weight");
  EXPECT_EQ(request.shards(0).kind(), v1::SHARD_KIND_PARAM);
  EXPECT_EQ(request.shards(0).dtype(), v1::DTYPE_F32);
  EXPECT_THAT(request.shards(0).global_shape(), ElementsAre(8, 8));
  EXPECT_THAT(request.shards(0).box().offsets(), ElementsAre(4, 0));
  EXPECT_THAT(request.shards(0).box().lengths(), ElementsAre(4, 8));
  EXPECT_FALSE(request.shards(0).has_flat_range());
  EXPECT_EQ(request.shards(0).nbytes(), wq.size());
  // Default boxes: the full tensor; 0-d has no axes.
  EXPECT_THAT(request.shards(1).box().lengths(), ElementsAre(16));
  EXPECT_THAT(request.shards(2).box().lengths(), IsEmpty());
  EXPECT_EQ(request.shards(3).nbytes(), 0u);
  EXPECT_EQ(request.shards(4).kind(), v1::SHARD_KIND_EXTRA);

  ASSERT_EQ(fake_->staged.size(), 1u);
  const FakeAgent::Snapshot& staged = fake_->staged[0];
  EXPECT_EQ(staged.session_id, "session-1");
  EXPECT_GT(staged.stall_ns, 0u);
  EXPECT_EQ(staged.slots[0], Bytes(wq));
  EXPECT_EQ(staged.slots[1], Bytes(bias));
  EXPECT_EQ(staged.slots[2], Bytes(scale));
  EXPECT_EQ(staged.slots[3], "");
  EXPECT_EQ(staged.slots[4], Bytes(rng));
  EXPECT_TRUE(staged.gaps_untouched) << "a copy wrote outside its slot";
  EXPECT_EQ(client->stats().saves, 1u);
  EXPECT_EQ(client->stats().last_copy_threads, 1);
}

TEST_F(ClientTest, Save_MemoryOnly_AskedOfTheAgent) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  std::vector<uint8_t> bytes = Pattern(64, 1);
  const std::vector<TensorRef> tensors = {HostRef("w", &bytes)};
  ASSERT_TRUE(client->Save(1, tensors).ok());
  SaveOptions memory_only;
  memory_only.memory_only = true;
  ASSERT_TRUE(client->Save(2, tensors, memory_only).ok());
  absl::MutexLock lock(&fake_->mu);
  ASSERT_THAT(fake_->begin_requests, ::testing::SizeIs(2));
  EXPECT_FALSE(fake_->begin_requests[0].memory_only());
  EXPECT_TRUE(fake_->begin_requests[1].memory_only());
}

TEST_F(ClientTest, Save_PlanRejected_DetailSurfacesAndNothingCopied) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  std::vector<uint8_t> bytes = Pattern(64, 7);
  const std::vector<TensorRef> tensors = {HostRef("layers.0.w", &bytes)};
  ASSERT_TRUE(client->Save(1, tensors).ok());  // gives the fake a region to watch
  const uint64_t region_before = fake_->RegionHash();

  v1::ErrorDetail detail;
  detail.set_code(v1::ERROR_CODE_DUPLICATE_FQN);
  detail.set_message("layers.0.w is claimed by pp=0 and pp=1, which are not replicas");
  detail.add_fqns("layers.0.w");
  detail.add_ranks()->set_coords("pp=1,dp=0");
  {
    absl::MutexLock lock(&fake_->mu);
    fake_->begin_error = ToGrpcStatus(MakeError(absl::StatusCode::kInvalidArgument, detail));
  }
  bytes = Pattern(64, 8);  // different bytes: a copy would show in the region
  absl::StatusOr<SaveResult> result = client->Save(2, tensors);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GetErrorCode(result.status()), v1::ERROR_CODE_DUPLICATE_FQN);
  std::optional<v1::ErrorDetail> got = GetErrorDetail(result.status());
  ASSERT_TRUE(got.has_value());
  EXPECT_THAT(got->fqns(), ElementsAre("layers.0.w"));
  EXPECT_EQ(got->ranks(0).coords(), "pp=1,dp=0");
  EXPECT_THAT(result.status().message(), HasSubstr("not replicas"));

  EXPECT_EQ(fake_->RegionHash(), region_before);
  absl::MutexLock lock(&fake_->mu);
  EXPECT_EQ(fake_->begin_requests.size(), 2u);
  EXPECT_EQ(fake_->staged.size(), 1u) << "Staged must not follow a rejected plan";
}

TEST_F(ClientTest, Save_AbortedBySession_Aborted) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  {
    absl::MutexLock lock(&fake_->mu);
    fake_->begin_error = ToGrpcStatus(
        MakeError(absl::StatusCode::kAborted, v1::ERROR_CODE_ADMISSION_DENIED, "node over budget"));
  }
  std::vector<uint8_t> bytes = Pattern(8, 1);
  absl::StatusOr<SaveResult> result = client->Save(3, {HostRef("w", &bytes)});
  EXPECT_EQ(result.status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(GetErrorCode(result.status()), v1::ERROR_CODE_ADMISSION_DENIED);
}

// Local checks fail before any RPC, with MALFORMED_SHARD naming the tensor.
struct MalformedCase {
  std::string name;
  std::function<void(TensorRef*)> spoil;
  std::string message;
};

TEST_F(ClientTest, Save_MalformedTensor_InvalidArgumentBeforeAnyRpc) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  std::vector<uint8_t> bytes = Pattern(4 * 6 * 4, 9);
  const std::vector<MalformedCase> cases = {
      {"nbytes", [](TensorRef* t) { t->nbytes -= 4; }, "nbytes is 92 but 24 F32 elements are 96"},
      {"box",
       [](TensorRef* t) {
         t->box = Box{{2, 0}, {4, 6}};
       },
       "outside the tensor on axis 0"},
      {"box rank",
       [](TensorRef* t) {
         t->box = Box{{0}, {4}};
       },
       "rank 1 but the tensor has rank 2"},
      {"flat range", [](TensorRef* t) { t->flat_range = std::make_pair(20, 30); },
       "flat range [20, 30) is not within the 24 elements"},
      {"null data", [](TensorRef* t) { t->data = nullptr; }, "data is null"},
      {"dtype", [](TensorRef* t) { t->dtype = v1::DTYPE_UNSPECIFIED; }, "dtype 0 is not known"},
      {"kind", [](TensorRef* t) { t->kind = v1::SHARD_KIND_UNSPECIFIED; }, "not a shard kind"},
      {"fqn", [](TensorRef* t) { t->fqn.clear(); }, "bad fqn: name is empty"},
      {"fqn not UTF-8", [](TensorRef* t) { t->fqn = "layers.\xff\xfe.w"; },
       "bad fqn: name is not valid UTF-8 at byte 7"},
      {"fqn control character", [](TensorRef* t) { t->fqn = "layers.2\n.w"; },
       "bad fqn: name has a control character at byte 8"},
      {"fqn reserved character", [](TensorRef* t) { t->fqn = "layers.2@w"; },
       "bad fqn: name contains reserved character '@'"},
      {"state key not UTF-8",
       [](TensorRef* t) {
         t->kind = v1::SHARD_KIND_OPTIMIZER;
         t->state_key = "exp\xc3";
       },
       "bad state_key: name is not valid UTF-8 at byte 3"},
      {"too many axes",
       [](TensorRef* t) {
         t->global_shape.assign(65, 1);
         t->global_shape[0] = 24;
         t->box = Box{};
       },
       "the tensor has 65 axes; at most 64 are supported"},
      {"negative dim",
       [](TensorRef* t) {
         t->global_shape = {-4, 6};
         t->box = Box{};
       },
       "axis 0 has negative size -4"},
      {"volume overflows int64",
       [](TensorRef* t) {
         t->global_shape = {int64_t{1} << 40, int64_t{1} << 40};
         t->box = Box{{0, 0}, {4, 6}};
       },
       "overflows int64"},
      {"state on param", [](TensorRef* t) { t->state_key = "exp_avg"; },
       "only optimizer shards have a state_key"},
      {"no state key", [](TensorRef* t) { t->kind = v1::SHARD_KIND_OPTIMIZER; },
       "need a state_key"},
      {"replicated dim",
       [](TensorRef* t) {
         t->replicated_over = {{"dp", "pp"}};
       },
       "replicated_over names \"pp\", which is not a dim of the mesh {tp, dp}"},
      {"extra shape", [](TensorRef* t) { t->kind = v1::SHARD_KIND_EXTRA; },
       "extra shards must be U8, 1-d"},
  };
  for (const MalformedCase& c : cases) {
    TensorRef t = HostRef("layers.2.w", &bytes, v1::DTYPE_F32);
    t.global_shape = {4, 6};
    c.spoil(&t);
    std::vector<uint8_t> other = Pattern(4, 1);
    // The bad tensor is the second: the error must name it and its index.
    absl::StatusOr<SaveResult> result = client->Save(5, {HostRef("ok", &other), t});
    ASSERT_FALSE(result.ok()) << c.name;
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_EQ(GetErrorCode(result.status()), v1::ERROR_CODE_MALFORMED_SHARD) << c.name;
    EXPECT_THAT(result.status().message(), HasSubstr(c.message)) << c.name;
    // A name that is not UTF-8 is shown C-escaped: messages and ErrorDetail stay valid UTF-8.
    const std::string shown = ValidateName(t.fqn).ok() ? t.fqn : absl::CHexEscape(t.fqn);
    EXPECT_THAT(result.status().message(), HasSubstr("Tensor 1 (\"" + shown + "\"")) << c.name;
    std::optional<v1::ErrorDetail> detail = GetErrorDetail(result.status());
    ASSERT_TRUE(detail.has_value()) << c.name;
    EXPECT_THAT(detail->fqns(), ElementsAre(shown)) << c.name;
  }
  EXPECT_EQ(client->Save(-1, {}).status().code(), absl::StatusCode::kInvalidArgument);
  absl::MutexLock lock(&fake_->mu);
  EXPECT_THAT(fake_->begin_requests, IsEmpty());
}

TEST_F(ClientTest, Save_RequestOverSizeLimit_PlanTooLargeBeforeAnyRpc) {
  ClientOptions options;
  options.max_plan_request_bytes = 64 << 10;
  std::unique_ptr<Client> client = Connect(options);
  ASSERT_NE(client, nullptr);
  std::vector<uint8_t> bytes = Pattern(4, 3);
  std::vector<TensorRef> tensors;
  for (int i = 0; i < 1000; ++i) {  // ~100 bytes of description each: over 64 KiB
    tensors.push_back(HostRef(absl::StrCat("layers.", i, ".", std::string(64, 'w')), &bytes));
  }
  absl::StatusOr<SaveResult> result = client->Save(3, tensors);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GetErrorCode(result.status()), v1::ERROR_CODE_PLAN_TOO_LARGE);
  EXPECT_THAT(result.status().message(), HasSubstr("describes 1000 tensor pieces in "));
  EXPECT_THAT(result.status().message(), HasSubstr("over the limit of 65536 bytes"));
  EXPECT_EQ(GetErrorCode(client->Load(-1, tensors).status()), v1::ERROR_CODE_PLAN_TOO_LARGE);
  // Under the limit the same client saves.
  tensors.resize(10);
  EXPECT_TRUE(client->Save(3, tensors).ok());
  absl::MutexLock lock(&fake_->mu);
  EXPECT_EQ(fake_->begin_requests.size(), 1u);
}

TEST_F(ClientTest, Connect_PlanRequestLimitOutOfRange_InvalidArgument) {
  for (size_t limit : {size_t{0}, kMaxPlanRequestBytes + 1}) {
    ClientOptions options;
    options.max_plan_request_bytes = limit;
    EXPECT_EQ(Client::Connect(socket_, options).status().code(),
              absl::StatusCode::kInvalidArgument)
        << limit;
  }
}

TEST(DescribeShards, DefaultReplicatedOver_DpForParamsOnlyWhenMeshHasDp) {
  std::vector<uint8_t> bytes(16);
  auto ref = [&](v1::ShardKind kind) {
    TensorRef t;
    t.fqn = "w";
    t.kind = kind;
    t.dtype = v1::DTYPE_U8;
    t.global_shape = {16};
    t.data = bytes.data();
    t.nbytes = bytes.size();
    if (kind == v1::SHARD_KIND_OPTIMIZER) t.state_key = "exp_avg";
    return t;
  };
  TensorRef param = ref(v1::SHARD_KIND_PARAM);
  TensorRef optimizer = ref(v1::SHARD_KIND_OPTIMIZER);
  TensorRef extra = ref(v1::SHARD_KIND_EXTRA);
  extra.replicated_over = {{"dp"}};  // ignored: extras belong to their rank
  TensorRef norm = ref(v1::SHARD_KIND_PARAM);
  norm.replicated_over = {{"dp", "tp"}};
  TensorRef unreplicated = ref(v1::SHARD_KIND_PARAM);
  unreplicated.replicated_over = std::vector<std::string>{};
  const std::vector<TensorRef> tensors = {param, optimizer, extra, norm, unreplicated};

  absl::StatusOr<std::vector<v1::ShardDesc>> with_dp =
      DescribeShards(Mesh({{"pp", 2}, {"tp", 2}, {"dp", 4}}), tensors);
  ASSERT_TRUE(with_dp.ok()) << with_dp.status();
  EXPECT_THAT((*with_dp)[0].replicated_over(), ElementsAre("dp"));
  EXPECT_THAT((*with_dp)[1].replicated_over(), IsEmpty());
  EXPECT_THAT((*with_dp)[2].replicated_over(), IsEmpty());
  EXPECT_THAT((*with_dp)[3].replicated_over(), ElementsAre("dp", "tp"));
  EXPECT_THAT((*with_dp)[4].replicated_over(), IsEmpty());

  // HSDP names its dims dp_replicate x dp_shard: no default.
  norm.replicated_over = {{"tp"}};
  absl::StatusOr<std::vector<v1::ShardDesc>> without_dp =
      DescribeShards(Mesh({{"dp_replicate", 2}, {"dp_shard", 2}, {"tp", 2}}), {param, norm});
  ASSERT_TRUE(without_dp.ok()) << without_dp.status();
  EXPECT_THAT((*without_dp)[0].replicated_over(), IsEmpty());
  EXPECT_THAT((*without_dp)[1].replicated_over(), ElementsAre("tp"));
}

TEST_F(ClientTest, Save_DefaultReplicatedOver_SentOnTheWire) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  std::vector<uint8_t> bytes = Pattern(8, 1);
  ASSERT_TRUE(client->Save(1, {HostRef("w", &bytes)}).ok());
  absl::MutexLock lock(&fake_->mu);
  EXPECT_THAT(fake_->begin_requests[0].shards(0).replicated_over(), ElementsAre("dp"));
}

TEST_F(ClientTest, Save_FlatRangeAndAbsentState_SliceCopiedAbsentSkipped) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  // DP rank 1 of 2 holds elements [12, 24) of a TP-local [4, 6] F32 box of exp_avg.
  std::vector<uint8_t> slice = Pattern(12 * 4, 11);
  TensorRef exp_avg = HostRef("layers.0.w", &slice, v1::DTYPE_F32);
  exp_avg.kind = v1::SHARD_KIND_OPTIMIZER;
  exp_avg.state_key = "exp_avg";
  exp_avg.global_shape = {8, 6};
  exp_avg.box = Box{{4, 0}, {4, 6}};
  exp_avg.flat_range = std::make_pair(12, 24);
  // No state yet for the bias.
  TensorRef absent;
  absent.fqn = "layers.0.b";
  absent.kind = v1::SHARD_KIND_OPTIMIZER;
  absent.dtype = v1::DTYPE_F32;
  absent.global_shape = {6};
  absent.state_absent = true;

  absl::StatusOr<SaveResult> result = client->Save(7, {exp_avg, absent});
  ASSERT_TRUE(result.ok()) << result.status();
  absl::MutexLock lock(&fake_->mu);
  const v1::BeginSaveRequest& request = fake_->begin_requests[0];
  EXPECT_EQ(request.shards(0).flat_range().begin(), 12);
  EXPECT_EQ(request.shards(0).flat_range().end(), 24);
  EXPECT_EQ(request.shards(0).nbytes(), 48u);
  EXPECT_EQ(request.shards(0).state_key(), "exp_avg");
  EXPECT_THAT(request.shards(0).replicated_over(), IsEmpty());
  EXPECT_TRUE(request.shards(1).state_absent());
  EXPECT_EQ(request.shards(1).nbytes(), 0u);
  EXPECT_TRUE(request.shards(1).state_key().empty());
  ASSERT_EQ(fake_->staged.size(), 1u);
  EXPECT_EQ(fake_->staged[0].slots[0], Bytes(slice));
  EXPECT_EQ(fake_->staged[0].slots[1], "");
  EXPECT_TRUE(fake_->staged[0].gaps_untouched);
}

TEST_F(ClientTest, Save_AbsentStateWithBytes_InvalidArgument) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  std::vector<uint8_t> bytes = Pattern(24, 1);
  TensorRef t = HostRef("layers.0.b", &bytes, v1::DTYPE_F32);
  t.kind = v1::SHARD_KIND_OPTIMIZER;
  t.state_absent = true;
  absl::StatusOr<SaveResult> result = client->Save(7, {t});
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(result.status().message(), HasSubstr("absent state stages nothing (0)"));
}

TEST_F(ClientTest, Save_SameRegion_MappingReusedAndReplacedWhenRegionChanges) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  std::vector<uint8_t> a = Pattern(1000, 1), b = Pattern(3000, 2);
  ASSERT_TRUE(client->Save(1, {HostRef("a", &a), HostRef("b", &b)}).ok());
  std::string first_region;
  {
    absl::MutexLock lock(&fake_->mu);
    first_region = fake_->region_name;
  }
  a = Pattern(1000, 3);  // new bytes, same plan
  absl::StatusOr<SaveResult> second = client->Save(2, {HostRef("a", &a), HostRef("b", &b)});
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_TRUE(second->plan_cached);
  EXPECT_EQ(client->stats().staging_maps, 1u);
  {
    absl::MutexLock lock(&fake_->mu);
    EXPECT_EQ(fake_->region_name, first_region);
    EXPECT_EQ(fake_->staged[1].slots[0], Bytes(a));
    EXPECT_EQ(fake_->staged[1].slots[1], Bytes(b));
  }

  // A save larger than the region: the agent replaces it under a new name.
  std::vector<uint8_t> big = Pattern(3 * kMiB, 4);
  absl::StatusOr<SaveResult> third = client->Save(3, {HostRef("a", &a), HostRef("big", &big)});
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_FALSE(third->plan_cached);
  EXPECT_EQ(client->stats().staging_maps, 2u);
  {
    absl::MutexLock lock(&fake_->mu);
    EXPECT_NE(fake_->region_name, first_region);
    EXPECT_EQ(fake_->staged[2].slots[0], Bytes(a));
    EXPECT_EQ(fake_->staged[2].slot_hashes[1], Xxh3(big.data(), big.size()));
    EXPECT_TRUE(fake_->staged[2].gaps_untouched);
  }

  // A smaller save in the same (grown) region reuses the mapping.
  ASSERT_TRUE(client->Save(4, {HostRef("a", &a)}).ok());
  EXPECT_EQ(client->stats().staging_maps, 2u);
  EXPECT_EQ(client->stats().saves, 4u);
}

TEST_F(ClientTest, Save_RegionsAlternate_EachMappedOnce) {
  // The agent keeps each committed save's region resident (memory tier), so saves alternate
  // between two regions: the client keeps both mapped.
  {
    absl::MutexLock lock(&fake_->mu);
    fake_->retain_each_save = true;
  }
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  std::vector<uint8_t> a = Pattern(1000, 1);
  std::set<std::string> regions;
  for (int64_t step = 1; step <= 5; ++step) {
    a[0] = static_cast<uint8_t>(step);
    ASSERT_TRUE(client->Save(step, {HostRef("a", &a)}).ok());
    absl::MutexLock lock(&fake_->mu);
    regions.insert(fake_->region_name);
    EXPECT_EQ(fake_->staged.back().slots[0], Bytes(a)) << "step " << step;
  }
  EXPECT_EQ(regions.size(), 2u);
  EXPECT_EQ(client->stats().staging_maps, 2u);
}

TEST_F(ClientTest, ReserveStaging_RegionsMappedAhead_NoSaveMapsOne) {
  {
    absl::MutexLock lock(&fake_->mu);
    fake_->retain_each_save = true;
  }
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  std::vector<uint8_t> a = Pattern(5000, 1);
  std::vector<uint8_t> b = Pattern(3000, 2);
  TensorRef absent;
  absent.fqn = "opt";
  absent.state_key = "exp_avg";
  absent.dtype = v1::DTYPE_U8;
  absent.global_shape = {8};
  absent.state_absent = true;
  ASSERT_TRUE(client->ReserveStaging({HostRef("a", &a), HostRef("b", &b), absent}).ok());
  {
    absl::MutexLock lock(&fake_->mu);
    ASSERT_EQ(fake_->reserve_requests.size(), 1u);
    EXPECT_EQ(fake_->reserve_requests[0].bytes(), 8000u);  // the absent state stages nothing
    EXPECT_EQ(fake_->reserve_requests[0].tensors(), 2u);
    EXPECT_EQ(fake_->reserve_requests[0].gather_bytes(), 0u);  // no optimizer slices
  }
  EXPECT_EQ(client->stats().staging_maps, 2u);

  // Saves alternate between the two reserved regions, which the client already maps.
  for (int64_t step = 1; step <= 4; ++step) {
    a[0] = static_cast<uint8_t>(step);
    ASSERT_TRUE(client->Save(step, {HostRef("a", &a), HostRef("b", &b)}).ok());
    absl::MutexLock lock(&fake_->mu);
    EXPECT_EQ(fake_->staged.back().slots[0], Bytes(a)) << "step " << step;
    EXPECT_EQ(fake_->staged.back().slots[1], Bytes(b)) << "step " << step;
  }
  EXPECT_EQ(client->stats().staging_maps, 2u);
  EXPECT_EQ(pool_->regions_created(), 2u);
}

// A distributed-optimizer slice: the request also declares room for the peers' slices this
// rank receives if it leads the box (with two DP ranks, all of the other half).
TEST_F(ClientTest, ReserveStaging_OptimizerSlice_DeclaresRoomForThePeersSlice) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  std::vector<uint8_t> param = Pattern(4096, 1);
  std::vector<uint8_t> slice = Pattern(2048, 2);
  TensorRef opt = HostRef("w", &slice);
  opt.kind = v1::SHARD_KIND_OPTIMIZER;
  opt.state_key = "exp_avg";
  opt.global_shape = {4096};
  opt.flat_range = std::make_pair(int64_t{2048}, int64_t{4096});
  ASSERT_TRUE(client->ReserveStaging({HostRef("w", &param), opt}).ok());
  absl::MutexLock lock(&fake_->mu);
  ASSERT_EQ(fake_->reserve_requests.size(), 1u);
  EXPECT_EQ(fake_->reserve_requests[0].bytes(), 4096u + 2048u);
  EXPECT_EQ(fake_->reserve_requests[0].gather_bytes(), 2048u);
}

TEST_F(ClientTest, ReserveStaging_NoBytesOrOverBudget_ErrorsNamingWhy) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  absl::Status empty = client->ReserveStaging({});
  EXPECT_EQ(empty.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(empty.message(), HasSubstr("no bytes"));
  // The fake's pool holds 1 GiB.
  TensorRef huge;
  huge.fqn = "w";
  huge.dtype = v1::DTYPE_U8;
  huge.global_shape = {1100 * static_cast<int64_t>(kMiB)};
  huge.nbytes = 1100 * kMiB;
  absl::Status over = client->ReserveStaging({huge});
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(GetErrorCode(over), v1::ERROR_CODE_ADMISSION_DENIED);
  EXPECT_THAT(over.message(), HasSubstr("ReserveStaging: "));
  EXPECT_EQ(client->stats().staging_maps, 0u);
}

TEST_F(ClientTest, Save_LargeTotal_ThreadedCopyByteExact) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  // Odd sizes, so the per-thread runs start and end inside tensors.
  std::vector<uint8_t> a = Pattern(40 * kMiB + 1, 21), b = Pattern(30 * kMiB + 7, 22),
                       c = Pattern(13, 23);
  absl::StatusOr<SaveResult> result =
      client->Save(9, {HostRef("a", &a), HostRef("b", &b), HostRef("c", &c)});
  ASSERT_TRUE(result.ok()) << result.status();
  // The default 4 threads, but no more than this machine's CPUs.
  EXPECT_EQ(client->stats().last_copy_threads, std::min(4, UsableCpus()));
  absl::MutexLock lock(&fake_->mu);
  const FakeAgent::Snapshot& staged = fake_->staged[0];
  EXPECT_EQ(staged.slot_hashes[0], Xxh3(a.data(), a.size()));
  EXPECT_EQ(staged.slot_hashes[1], Xxh3(b.data(), b.size()));
  EXPECT_EQ(staged.slots[2], Bytes(c));
  EXPECT_TRUE(staged.gaps_untouched);
}

TEST_F(ClientTest, Save_SlotsDoNotMatchRequest_Internal) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  {
    absl::MutexLock lock(&fake_->mu);
    fake_->bad_slot_count = true;
  }
  std::vector<uint8_t> a = Pattern(8, 1), b = Pattern(8, 2);
  absl::StatusOr<SaveResult> result = client->Save(1, {HostRef("a", &a), HostRef("b", &b)});
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(result.status().message(), HasSubstr("1 staging slots for 2 shards"));
  absl::MutexLock lock(&fake_->mu);
  EXPECT_THAT(fake_->staged, IsEmpty());
}

TEST_F(ClientTest, Save_AgentGone_Unavailable) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  server_->Shutdown();
  server_.reset();
  std::vector<uint8_t> a = Pattern(8, 1);
  absl::StatusOr<SaveResult> result = client->Save(1, {HostRef("a", &a)});
  EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable) << result.status();
}

TEST_F(ClientTest, Save_CudaTensorWithoutGpu_FailedPrecondition) {
  if (GpuAvailable()) GTEST_SKIP() << "a GPU is present";
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  std::vector<uint8_t> a = Pattern(8, 1);
  TensorRef t = HostRef("w", &a);
  t.memory = Memory::kCuda;
  absl::StatusOr<SaveResult> result = client->Save(1, {t});
  EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(result.status().message(), HasSubstr("\"w\""));
  absl::MutexLock lock(&fake_->mu);
  EXPECT_THAT(fake_->begin_requests, IsEmpty());
}

// ---------------------------------------------------------------------------------------------
// Overlapped saves (client/overlapped_save.h)

// Waits until the fake has recorded `staged` snapshots and `withdrawn` withdrawals.
void AwaitStaged(FakeAgent* fake, size_t staged, size_t withdrawn = 0) {
  auto seen = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake->mu) {
    return fake->staged.size() >= staged && fake->withdrawals.size() >= withdrawn;
  };
  absl::MutexLock lock(&fake->mu);
  ASSERT_TRUE(fake->mu.AwaitWithTimeout(absl::Condition(&seen), absl::Seconds(60)))
      << "no " << staged << " Staged and " << withdrawn << " withdrawals in 60 s";
}

SaveOptions Overlapped(SaveOptions::WhenBusy when_busy = SaveOptions::WhenBusy::kWait) {
  SaveOptions options;
  options.overlap = true;
  options.when_busy = when_busy;
  return options;
}

TEST_F(ClientTest, OverlappedSave_ReturnsBeforeBeginSave_SnapshotIsTheStateAtSave) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  // 8 MiB: copied on several threads; a slot over 1 MiB is compared by hash.
  std::vector<uint8_t> weight = Pattern(8 * kMiB, 1), bias = Pattern(4096, 2);
  const std::vector<uint8_t> weight_at_save = weight, bias_at_save = bias;
  {
    absl::MutexLock lock(&fake_->mu);
    fake_->hold_begin = true;  // every other rank still planning
  }
  absl::StatusOr<SaveResult> result =
      client->Save(7, {HostRef("w", &weight), HostRef("b", &bias)}, Overlapped());
  // Returned while BeginSave is held: nothing had been copied.
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(result->overlapped);
  EXPECT_TRUE(result->session_id.empty());
  {
    absl::MutexLock lock(&fake_->mu);
    EXPECT_TRUE(fake_->staged.empty());
    fake_->hold_begin = false;
  }
  // Forward and backward would run here; the optimizer step fences, then writes.
  ASSERT_TRUE(client->Fence().ok());
  std::fill(weight.begin(), weight.end(), 0x11);
  std::fill(bias.begin(), bias.end(), 0x22);
  AwaitStaged(fake_.get(), 1);
  absl::MutexLock lock(&fake_->mu);
  EXPECT_EQ(fake_->begin_requests[0].step(), 7);
  EXPECT_EQ(fake_->staged[0].slot_hashes[0], Xxh3(weight_at_save.data(), weight_at_save.size()));
  EXPECT_EQ(fake_->staged[0].slots[1], Bytes(bias_at_save));
  EXPECT_TRUE(fake_->staged[0].gaps_untouched);
  EXPECT_TRUE(fake_->withdrawals.empty());
  EXPECT_EQ(client->stats().overlapped_saves, 1u);
}

TEST_F(ClientTest, OverlappedSave_StateChangedBeforeFence_WithdrawnNeverStaged) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  std::vector<uint8_t> weight = Pattern(4096, 1);
  ASSERT_TRUE(client->Save(8, {HostRef("w", &weight)}, Overlapped()).ok());
  weight[0] ^= 0xff;  // an in-place write before the fence (an EMA, a BatchNorm's statistics)
  const absl::Status changed = MakeError(absl::StatusCode::kAborted, v1::ERROR_CODE_STATE_CHANGED,
                                         "tensor \"w\" was written before the fence");
  const absl::Status fenced = client->Fence(changed);
  EXPECT_EQ(fenced, changed);
  EXPECT_EQ(client->Fence(), changed) << "a second fence answers as the first";
  AwaitStaged(fake_.get(), 0, 1);
  absl::MutexLock lock(&fake_->mu);
  EXPECT_TRUE(fake_->staged.empty()) << "a snapshot the fence did not vouch for was staged";
  ASSERT_EQ(fake_->withdrawals.size(), 1u);
  EXPECT_EQ(fake_->withdrawals[0].session_id(), "session-1");
  EXPECT_EQ(fake_->withdrawals[0].withdrawn().code(), v1::ERROR_CODE_STATE_CHANGED);
  EXPECT_THAT(fake_->withdrawals[0].withdrawn().message(), HasSubstr("before the fence"));
  EXPECT_EQ(client->stats().overlap_refused, 1u);
}

TEST_F(ClientTest, OverlappedSave_ClientDestroyedUnfenced_NeverStaged) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  std::vector<uint8_t> weight = Pattern(4096, 1);
  ASSERT_TRUE(client->Save(9, {HostRef("w", &weight)}, Overlapped()).ok());
  client.reset();  // the trainer exits before its next optimizer step
  absl::MutexLock lock(&fake_->mu);
  EXPECT_TRUE(fake_->staged.empty());
  // Copied by then or not, the snapshot was withdrawn with the trainer's end as the reason,
  // or never copied (BeginSave cancelled).
  for (const v1::StagedRequest& w : fake_->withdrawals) {
    EXPECT_EQ(w.withdrawn().code(), v1::ERROR_CODE_AGENT_LOST);
    EXPECT_THAT(w.withdrawn().message(), HasSubstr("ended before its overlapped save of step 9"));
  }
}

TEST_F(ClientTest, OverlappedSave_PreviousStillInFlight_SkipsOrWaitsWithoutBlocking) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  std::vector<uint8_t> weight = Pattern(4096, 1);
  {
    absl::MutexLock lock(&fake_->mu);
    fake_->hold_waits = true;  // step 10 persists for as long as the test says
  }
  ASSERT_TRUE(client->Save(10, {HostRef("w", &weight)}, Overlapped()).ok());
  ASSERT_TRUE(client->Fence().ok());
  AwaitStaged(fake_.get(), 1);

  absl::StatusOr<SaveResult> skipped =
      client->Save(11, {HostRef("w", &weight)}, Overlapped(SaveOptions::WhenBusy::kSkip));
  ASSERT_TRUE(skipped.ok()) << skipped.status();
  EXPECT_THAT(skipped->skipped, HasSubstr("step 10's save is still in flight"));
  EXPECT_EQ(client->stats().overlap_skips, 1u);

  // Waiting: Save returns at once; the save thread begins step 12 once step 10 has ended.
  absl::StatusOr<SaveResult> waiting = client->Save(12, {HostRef("w", &weight)}, Overlapped());
  ASSERT_TRUE(waiting.ok()) << waiting.status();
  EXPECT_TRUE(waiting->skipped.empty());
  {
    absl::MutexLock lock(&fake_->mu);
    ASSERT_EQ(fake_->begin_requests.size(), 1u) << "step 12 began before step 10 ended";
    fake_->hold_waits = false;
  }
  ASSERT_TRUE(client->Fence().ok());
  AwaitStaged(fake_.get(), 2);
  absl::MutexLock lock(&fake_->mu);
  ASSERT_EQ(fake_->begin_requests.size(), 2u);
  EXPECT_EQ(fake_->begin_requests[1].step(), 12);
  // The skipped step was refused for every rank, saying why.
  auto refused = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake_->mu) {
    return !fake_->refusals.empty();
  };
  ASSERT_TRUE(fake_->mu.AwaitWithTimeout(absl::Condition(&refused), absl::Seconds(60)));
  EXPECT_EQ(fake_->refusals[0].step(), 11);
  EXPECT_EQ(fake_->refusals[0].error().code(), v1::ERROR_CODE_SESSION_IN_PROGRESS);
  EXPECT_THAT(fake_->refusals[0].error().message(), HasSubstr("skipped step 11"));
}

TEST_F(ClientTest, OverlappedSave_BeginSaveFails_FenceReturnsTheError) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  {
    absl::MutexLock lock(&fake_->mu);
    fake_->begin_error = ToGrpcStatus(MakeError(absl::StatusCode::kInvalidArgument,
                                                v1::ERROR_CODE_DUPLICATE_FQN, "w twice"));
  }
  std::vector<uint8_t> weight = Pattern(64, 1);
  ASSERT_TRUE(client->Save(13, {HostRef("w", &weight)}, Overlapped()).ok());
  const absl::Status fenced = client->Fence();
  EXPECT_EQ(fenced.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GetErrorCode(fenced), v1::ERROR_CODE_DUPLICATE_FQN);
  absl::MutexLock lock(&fake_->mu);
  EXPECT_TRUE(fake_->staged.empty());
}

TEST_F(ClientTest, OverlappedSave_MalformedTensor_RefusedBeforeReturning) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  std::vector<uint8_t> weight = Pattern(64, 1);
  TensorRef t = HostRef("w", &weight);
  t.global_shape = {63};  // 64 bytes of a 63-byte tensor
  absl::StatusOr<SaveResult> result = client->Save(14, {t}, Overlapped());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GetErrorCode(result.status()), v1::ERROR_CODE_MALFORMED_SHARD);
  EXPECT_TRUE(client->Fence().ok()) << "nothing in flight to fence";
}

// ---------------------------------------------------------------------------------------------
// WaitCommitted

TEST_F(ClientTest, WaitCommitted_Committed_ReturnsDirectory) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  absl::StatusOr<std::string> dir = client->WaitCommitted(100, absl::Seconds(30));
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_EQ(*dir, "/ckpt/job/step-100");
  ASSERT_TRUE(client->WaitCommitted(101).ok());
  absl::MutexLock lock(&fake_->mu);
  ASSERT_EQ(fake_->wait_requests.size(), 2u);
  EXPECT_EQ(fake_->wait_requests[0].step(), 100);
  EXPECT_EQ(fake_->wait_requests[0].timeout_ms(), 30000u);
  EXPECT_EQ(fake_->wait_requests[1].timeout_ms(), 0u) << "no limit";
}

TEST_F(ClientTest, WaitCommitted_Aborted_CarriesErrorDetail) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  v1::ErrorDetail detail;
  detail.set_code(v1::ERROR_CODE_AGENT_LOST);
  detail.set_message("the agent of rank 3 (tp=1,dp=1) stopped heartbeating");
  detail.add_ranks()->set_rank(3);
  {
    absl::MutexLock lock(&fake_->mu);
    fake_->wait_status = ToGrpcStatus(MakeError(absl::StatusCode::kAborted, detail));
  }
  absl::StatusOr<std::string> dir = client->WaitCommitted(100, absl::Seconds(30));
  ASSERT_FALSE(dir.ok());
  EXPECT_EQ(dir.status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(GetErrorCode(dir.status()), v1::ERROR_CODE_AGENT_LOST);
  EXPECT_EQ(GetErrorDetail(dir.status())->ranks(0).rank(), 3u);
  EXPECT_THAT(dir.status().message(), HasSubstr("stopped heartbeating"));
}

TEST_F(ClientTest, WaitCommitted_NonPositiveTimeout_InvalidArgument) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(client->WaitCommitted(1, absl::ZeroDuration()).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::MutexLock lock(&fake_->mu);
  EXPECT_THAT(fake_->wait_requests, IsEmpty());
}

// ---------------------------------------------------------------------------------------------
// Load

TEST_F(ClientTest, Load_CopiesSlotsIntoDestinations_ReportsAbsentAndReleases) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  std::vector<uint8_t> w(4 * 8 * 4, 0), m(12 * 4, 0), v(12 * 4, 0x5A), x(5, 0);
  TensorRef weight = HostRef("layers.0.w", &w, v1::DTYPE_F32);
  weight.global_shape = {8, 8};
  weight.box = Box{{0, 0}, {4, 8}};
  TensorRef exp_avg = HostRef("layers.0.w", &m, v1::DTYPE_F32);
  exp_avg.kind = v1::SHARD_KIND_OPTIMIZER;
  exp_avg.state_key = "exp_avg";
  exp_avg.global_shape = {8, 8};
  exp_avg.box = Box{{0, 0}, {4, 8}};
  exp_avg.flat_range = std::make_pair(0, 12);
  TensorRef exp_avg_sq = exp_avg;
  exp_avg_sq.state_key = "exp_avg_sq";
  exp_avg_sq.data = v.data();
  TensorRef extra = HostRef("rng", &x);
  extra.kind = v1::SHARD_KIND_EXTRA;
  {
    absl::MutexLock lock(&fake_->mu);
    fake_->absent_states = {"layers.0.w/exp_avg_sq"};
  }

  absl::StatusOr<LoadResult> result = client->Load(-1, {weight, exp_avg, exp_avg_sq, extra});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->step, 42);
  EXPECT_THAT(result->absent, ElementsAre(2u));
  EXPECT_EQ(w, Pattern(w.size(), 1000));
  EXPECT_EQ(m, Pattern(m.size(), 1001));
  EXPECT_EQ(v, std::vector<uint8_t>(12 * 4, 0x5A)) << "absent state must be left untouched";
  EXPECT_EQ(x, Pattern(x.size(), 1003));

  AwaitReleases(1);
  absl::MutexLock lock(&fake_->mu);
  ASSERT_EQ(fake_->load_requests.size(), 1u);
  const v1::LoadRequest& request = fake_->load_requests[0];
  EXPECT_EQ(request.step(), -1);
  ASSERT_EQ(request.shards_size(), 4);
  EXPECT_THAT(request.shards(0).box().lengths(), ElementsAre(4, 8));
  EXPECT_THAT(request.shards(0).replicated_over(), ElementsAre("dp"));
  EXPECT_EQ(request.shards(1).flat_range().end(), 12);
  EXPECT_EQ(request.shards(2).state_key(), "exp_avg_sq");
  EXPECT_THAT(fake_->released, ElementsAre("load-1"));
  // The client unmapped the load region before releasing it (only the fake's own mapping
  // is left): after the release its mapping could be the last, and unmapping it free the
  // region's pages inside Load.
  EXPECT_THAT(fake_->mappings_at_release, ElementsAre(1));
}

TEST_F(ClientTest, Load_LargeTotal_ThreadedCopyByteExact) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  // Above parallel_copy_min_bytes, odd sizes: per-thread runs start and end inside tensors.
  std::vector<uint8_t> a(5 * kMiB + 3, 0), b(3 * kMiB + 1, 0), c(7, 0);
  absl::StatusOr<LoadResult> result =
      client->Load(3, {HostRef("a", &a), HostRef("b", &b), HostRef("c", &c)});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(Xxh3(a.data(), a.size()), Xxh3(Pattern(a.size(), 1000).data(), a.size()));
  EXPECT_EQ(Xxh3(b.data(), b.size()), Xxh3(Pattern(b.size(), 1001).data(), b.size()));
  EXPECT_EQ(c, Pattern(c.size(), 1002));
  EXPECT_EQ(client->stats().staging_maps, 1u);
  AwaitReleases(1);
  absl::MutexLock lock(&fake_->mu);
  EXPECT_THAT(fake_->released, ElementsAre("load-1"));
  EXPECT_THAT(fake_->mappings_at_release, ElementsAre(1));
}

TEST_F(ClientTest, Load_InPlace_ClientChecksBlocksWhileCopying) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  {
    absl::MutexLock lock(&fake_->mu);
    fake_->list_blocks = true;
  }
  std::vector<uint8_t> a(5 * kMiB + 3, 0), b(1000, 0);
  absl::StatusOr<LoadResult> result = client->Load(2, {HostRef("a", &a), HostRef("b", &b)});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->bytes_verified_by_client, a.size() + b.size());
  EXPECT_EQ(result->memory_blocks_rejected, 0u);
  EXPECT_EQ(Xxh3(a.data(), a.size()), Xxh3(Pattern(a.size(), 1000).data(), a.size()));
  EXPECT_EQ(b, Pattern(b.size(), 1001));
  AwaitReleases(1);
  absl::MutexLock lock(&fake_->mu);
  ASSERT_EQ(fake_->load_requests.size(), 1u);
  EXPECT_TRUE(fake_->load_requests[0].client_verifies()) << "host destinations only";
  EXPECT_THAT(fake_->released, ElementsAre("load-1"));
}

TEST_F(ClientTest, Load_BlockMismatchInPlace_LoadsAgainAgentVerifying) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  {
    absl::MutexLock lock(&fake_->mu);
    fake_->list_blocks = true;
    fake_->corrupt_loads = 1;
  }
  std::vector<uint8_t> a(3000, 0), b(1000, 0);
  absl::StatusOr<LoadResult> result = client->Load(2, {HostRef("a", &a), HostRef("b", &b)});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->memory_blocks_rejected, 1u);
  EXPECT_EQ(result->bytes_verified_by_client, 0u) << "the second load was verified by the agent";
  EXPECT_EQ(a, Pattern(a.size(), 1000)) << "the corrupt bytes copied first were replaced";
  EXPECT_EQ(b, Pattern(b.size(), 1001));
  AwaitReleases(2);
  absl::MutexLock lock(&fake_->mu);
  ASSERT_EQ(fake_->load_requests.size(), 2u);
  EXPECT_TRUE(fake_->load_requests[0].client_verifies());
  EXPECT_FALSE(fake_->load_requests[1].client_verifies());
  EXPECT_EQ(fake_->load_requests[1].step(), 2) << "the step the first load resolved";
  EXPECT_THAT(fake_->released, ElementsAre("load-1", "load-2"));
}

// A buddy's bulk port on "another node" (agent/memory_bulk.h), which the fake agent names.
class ClientFetchTest : public ClientTest {
 protected:
  void SetUp() override {
    ClientTest::SetUp();
    MemoryBulkServerOptions options;
    options.listen_address = "127.0.0.1:0";
    absl::StatusOr<std::unique_ptr<MemoryBulkServer>> server =
        MemoryBulkServer::Start(keyring_.get(), &tier_, &store_, options);
    ASSERT_TRUE(server.ok()) << server.status();
    bulk_ = *std::move(server);
    absl::MutexLock lock(&fake_->mu);
    fake_->holder = &store_;
    fake_->holder_address = absl::StrCat("127.0.0.1:", bulk_->port());
    fake_->list_blocks = true;  // the agent's own answers, after a fetch fails, list blocks too
  }

  MemoryTier tier_;
  BuddyStore store_{64 * kMiB};
  const std::unique_ptr<PeerKeyring> keyring_ = TestPeerKeyring();
  std::unique_ptr<MemoryBulkServer> bulk_;
};

TEST_F(ClientFetchTest, Load_CopyOnAnotherNode_ReadFromItsHolderStraightIntoTheTensors) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  std::vector<uint8_t> a(5 * kMiB + 3, 0), b(1000, 0);
  absl::StatusOr<LoadResult> result = client->Load(2, {HostRef("a", &a), HostRef("b", &b)});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(a, Pattern(a.size(), 1000));
  EXPECT_EQ(b, Pattern(b.size(), 1001));
  EXPECT_EQ(result->bytes_verified_by_client, a.size() + b.size());
  EXPECT_EQ(result->bytes_fetched_by_client, a.size() + b.size());  // the blocks, no gaps
  EXPECT_EQ(result->memory_blocks_rejected, 0u);
  EXPECT_GT(result->fetch_time, absl::ZeroDuration());
  EXPECT_EQ(result->copy_time, absl::ZeroDuration());  // nothing went through a load region
  AwaitReleases(1);
  absl::MutexLock lock(&fake_->mu);
  ASSERT_EQ(fake_->load_requests.size(), 1u);
  EXPECT_TRUE(fake_->load_requests[0].client_fetches()) << "host destinations only";
  EXPECT_THAT(fake_->released, ElementsAre("load-1"));
}

TEST_F(ClientFetchTest, Load_FetchedBlockDoesNotMatch_LoadsAgainTheAgentVerifying) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  {
    absl::MutexLock lock(&fake_->mu);
    fake_->corrupt_fetches = 1;
  }
  std::vector<uint8_t> a(3000, 0), b(1000, 0);
  absl::StatusOr<LoadResult> result = client->Load(-1, {HostRef("a", &a), HostRef("b", &b)});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(a, Pattern(a.size(), 1000)) << "the corrupt bytes fetched first were replaced";
  EXPECT_EQ(b, Pattern(b.size(), 1001));
  EXPECT_EQ(result->memory_blocks_rejected, 1u);
  EXPECT_EQ(result->bytes_fetched_by_client, 0u);
  EXPECT_EQ(result->bytes_verified_by_client, 0u) << "the second load was verified by the agent";
  AwaitReleases(2);
  absl::MutexLock lock(&fake_->mu);
  ASSERT_EQ(fake_->load_requests.size(), 2u);
  EXPECT_FALSE(fake_->load_requests[1].client_fetches());
  EXPECT_FALSE(fake_->load_requests[1].client_verifies());
  EXPECT_EQ(fake_->load_requests[1].step(), 42) << "the step the first load resolved";
  EXPECT_THAT(fake_->released, ElementsAre("load-1", "load-2"));
}

TEST_F(ClientFetchTest, Load_HolderGone_LoadsAgainTheAgentFetchingTheClientChecking) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  bulk_.reset();  // the holder's node is gone too: its port refuses
  std::vector<uint8_t> a(3000, 0);
  absl::StatusOr<LoadResult> result = client->Load(2, {HostRef("a", &a)});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(a, Pattern(a.size(), 1000));
  EXPECT_EQ(result->bytes_fetched_by_client, 0u);
  EXPECT_EQ(result->bytes_verified_by_client, a.size()) << "checked while copied from the region";
  AwaitReleases(2);
  absl::MutexLock lock(&fake_->mu);
  ASSERT_EQ(fake_->load_requests.size(), 2u);
  EXPECT_FALSE(fake_->load_requests[1].client_fetches());
  EXPECT_TRUE(fake_->load_requests[1].client_verifies());
  EXPECT_THAT(fake_->load_requests[1].unreadable_holders(), ElementsAre(fake_->holder_address));
  EXPECT_TRUE(fake_->load_requests[0].unreadable_holders().empty());
  EXPECT_THAT(fake_->released, ElementsAre("load-1", "load-2"));
}

TEST_F(ClientFetchTest, Load_HolderAddressUnusable_LoadsAgainTheAgentFetching) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  {
    absl::MutexLock lock(&fake_->mu);
    fake_->holder_address = "no port";  // InvalidArgument from the connection, not the reply
  }
  std::vector<uint8_t> a(3000, 0);
  absl::StatusOr<LoadResult> result = client->Load(2, {HostRef("a", &a)});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(a, Pattern(a.size(), 1000));
  EXPECT_EQ(result->bytes_fetched_by_client, 0u);
  absl::MutexLock lock(&fake_->mu);
  ASSERT_EQ(fake_->load_requests.size(), 2u);
  EXPECT_FALSE(fake_->load_requests[1].client_fetches());
}

TEST_F(ClientFetchTest, Load_HolderStalls_TheLoadEndsAtItsTimeoutItsRetryIncluded) {
  // The holder sends its status and then nothing: the fetch waits out the load's timeout, and
  // the agent's retry has no time left (each attempt used to get a whole timeout).
  FakeBulkHolder stalling("", /*cut_after=*/UINT64_MAX, /*stall_from=*/0);
  {
    absl::MutexLock lock(&fake_->mu);
    fake_->holder_address = stalling.address();
  }
  ClientOptions options;
  // Long enough for the load request and the connection on a loaded machine (the holder must
  // have been reached once).
  options.load_timeout = absl::Seconds(2);
  std::unique_ptr<Client> client = Connect(options);
  ASSERT_NE(client, nullptr);
  std::vector<uint8_t> a(3000, 0);
  absl::StatusOr<LoadResult> result = client->Load(2, {HostRef("a", &a)});
  EXPECT_EQ(result.status().code(), absl::StatusCode::kDeadlineExceeded) << result.status();
  EXPECT_EQ(stalling.connections(), 1);
}

TEST_F(ClientTest, Load_ReturnsWhileItsReleaseIsHeldUp) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  auto open_releases = [&] {
    absl::MutexLock lock(&fake_->mu);
    fake_->hold_releases_open = true;
  };
  {
    absl::MutexLock lock(&fake_->mu);
    fake_->hold_releases_open = false;
  }
  absl::Cleanup reopen = open_releases;  // a failed assertion must not leave the fake stuck
  std::vector<uint8_t> a(4096, 0);
  // No ReleaseLoad can complete here, so Load returns before its release does.
  absl::StatusOr<LoadResult> first = client->Load(1, {HostRef("a", &a)});
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(a, Pattern(a.size(), 1000));
  open_releases();
  ASSERT_TRUE(client->Load(1, {HostRef("a", &a)}).ok());
  AwaitReleases(2);
  absl::MutexLock lock(&fake_->mu);
  EXPECT_THAT(fake_->released, ElementsAre("load-1", "load-2"));
}

TEST_F(ClientTest, Load_ReleaseFails_LoadSucceedsAndTheFailureIsCounted) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  {
    absl::MutexLock lock(&fake_->mu);
    fake_->failing_releases = 1;
  }
  std::vector<uint8_t> a(4096, 0);
  ASSERT_TRUE(client->Load(1, {HostRef("a", &a)}).ok());
  // The next Load waits for the first one's release: its failure is counted by then.
  ASSERT_TRUE(client->Load(1, {HostRef("a", &a)}).ok());
  EXPECT_EQ(client->stats().failed_releases, 1u);
  EXPECT_EQ(a, Pattern(a.size(), 1000));
}

TEST_F(ClientTest, Load_SaveRegionReused_NoExtraMapping) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  std::vector<uint8_t> a = Pattern(4096, 1);
  ASSERT_TRUE(client->Save(1, {HostRef("a", &a)}).ok());
  std::vector<uint8_t> into(4096, 0);
  ASSERT_TRUE(client->Load(1, {HostRef("a", &into)}).ok());
  EXPECT_EQ(into, Pattern(4096, 1000));
  EXPECT_EQ(client->stats().staging_maps, 1u);
  AwaitReleases(1);
  absl::MutexLock lock(&fake_->mu);
  EXPECT_THAT(fake_->mappings_at_release, ElementsAre(2)) << "the cached save mapping is kept";
}

// The agent's resident checkpoint, as a restarted trainer's Connect finds it: a region of the
// fake's pool (the one its loads are served from) named by GetInfo.
std::string MakeResident(StagingPool* pool, FakeAgent* fake, uint64_t bytes) {
  absl::StatusOr<std::vector<StagingSlot>> regions = pool->Acquire({bytes});
  EXPECT_TRUE(regions.ok()) << regions.status();
  if (!regions.ok()) return "";
  absl::MutexLock lock(&fake->mu);
  fake->identity.set_resident_shm_name((*regions)[0].name);
  fake->identity.set_resident_shm_size((*regions)[0].capacity);
  fake->identity.set_resident_bytes(bytes);
  return (*regions)[0].name;
}

TEST_F(ClientTest, Load_ResidentRegionMappedAtConnect_TheLoadReadsThroughThatMapping) {
  const std::string resident = MakeResident(pool_.get(), fake_.get(), 8 * kMiB);
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->AwaitPrefetch(absl::Minutes(1)));
  const ClientStats connected = client->stats();
  EXPECT_EQ(connected.prefetch_bytes, 8 * kMiB);
  EXPECT_EQ(connected.prefetch_populated_bytes, 8 * kMiB);
  EXPECT_TRUE(connected.prefetch_done);
  EXPECT_EQ(MappingsOf(resident), 2) << "the fake's own and the client's";
  {
    absl::MutexLock lock(&fake_->mu);
    fake_->list_blocks = true;  // served in place, checked by the client
  }
  std::vector<uint8_t> a(5 * kMiB + 3, 0), b(1000, 0);
  absl::StatusOr<LoadResult> result = client->Load(2, {HostRef("a", &a), HostRef("b", &b)});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->prefetched_bytes, 8 * kMiB);
  EXPECT_EQ(result->bytes_verified_by_client, a.size() + b.size());
  EXPECT_EQ(Xxh3(a.data(), a.size()), Xxh3(Pattern(a.size(), 1000).data(), a.size()));
  EXPECT_EQ(b, Pattern(b.size(), 1001));
  EXPECT_EQ(client->stats().staging_maps, 0u) << "no mapping made for the load";
  // Kept for the next load from the region (the Python client's objects take three loads).
  std::vector<uint8_t> c(2000, 0);
  result = client->Load(2, {HostRef("c", &c)});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->prefetched_bytes, 8 * kMiB);
  EXPECT_EQ(c, Pattern(c.size(), 1000));
  EXPECT_EQ(client->stats().staging_maps, 0u);
  EXPECT_EQ(client->stats().prefetched_loads, 2u);
  AwaitReleases(2);
  {
    absl::MutexLock lock(&fake_->mu);
    EXPECT_EQ(fake_->region_name, resident);
    EXPECT_THAT(fake_->mappings_at_release, ElementsAre(2, 2)) << "kept across the loads";
  }
  std::vector<uint8_t> a2 = Pattern(10 * kMiB, 1);  // a larger region replaces the resident one
  ASSERT_TRUE(client->Save(3, {HostRef("a", &a2)}).ok());
  ASSERT_TRUE(client->Save(4, {HostRef("a", &a2)}).ok());  // joins the first one's unmapping
  EXPECT_EQ(MappingsOf(resident), 0) << "the save ended it";
}

// Makes `fake` list, for its resident region `resident` (MakeResident), one block where a
// load of one tensor of `nbytes` bytes finds it (FakeAgent::Layout), hashing to the XXH3 of
// Pattern(nbytes, 1000) — what that load finds there — with `xxh3_flip` xored in.
void ListResidentBlock(FakeAgent* fake, const std::string& resident, uint64_t nbytes,
                       uint64_t xxh3_flip = 0) {
  absl::MutexLock lock(&fake->mu);
  fake->resident_blocks.set_shm_name(resident);
  fake->resident_blocks.set_step(2);
  v1::BlockCheck* block = fake->resident_blocks.add_blocks();
  block->set_offset(kSlotGap);
  block->set_length(nbytes);
  block->set_xxh3(Xxh3(Pattern(nbytes, 1000).data(), nbytes) ^ xxh3_flip);
}

void ClientTest::MakeCheckedResident(uint64_t n) {
  const std::string resident = MakeResident(pool_.get(), fake_.get(), 4 * kMiB);
  ListResidentBlock(fake_.get(), resident, n);
  {
    absl::MutexLock lock(&fake_->mu);
    fake_->list_blocks = true;
  }
  std::vector<uint8_t> warm(n, 0);
  ClientOptions off;
  off.prefetch_resident = false;
  std::unique_ptr<Client> writer = Connect(off);
  ASSERT_NE(writer, nullptr);
  ASSERT_TRUE(writer->Load(2, {HostRef("a", &warm)}).ok());  // the fake fills the region
}

std::unique_ptr<Client> ClientTest::ConnectWhileTheListingIsHeld() {
  {
    absl::MutexLock lock(&fake_->mu);
    fake_->hold_listing = true;
  }
  std::unique_ptr<Client> client = Connect();
  if (client == nullptr) return nullptr;
  absl::MutexLock lock(&fake_->mu);
  fake_->mu.Await(absl::Condition(&fake_->listing_entered));
  return client;
}

TEST_F(ClientTest, Load_ResidentBlocksCheckedAtConnect_TheLoadOnlyCopiesThem) {
  const uint64_t n = 3 * kMiB + 5;
  ASSERT_NO_FATAL_FAILURE(MakeCheckedResident(n));
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->AwaitPrefetch(absl::Minutes(1)));
  EXPECT_EQ(client->stats().prefetch_checked_bytes, n);
  EXPECT_EQ(client->stats().prefetch_mismatched_blocks, 0u);
  std::vector<uint8_t> a(n, 0);
  absl::StatusOr<LoadResult> result = client->Load(2, {HostRef("a", &a)});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->bytes_verified_by_client, n);
  EXPECT_EQ(result->checked_ahead_bytes, n);
  EXPECT_EQ(a, Pattern(n, 1000));
}

TEST_F(ClientTest, Load_ResidentBlockListedWithAnotherHash_CheckedAgainAsItIsCopied) {
  const uint64_t n = 2 * kMiB;
  const std::string resident = MakeResident(pool_.get(), fake_.get(), 4 * kMiB);
  ListResidentBlock(fake_.get(), resident, n, /*xxh3_flip=*/1);  // another step's bytes
  {
    absl::MutexLock lock(&fake_->mu);
    fake_->list_blocks = true;
  }
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->AwaitPrefetch(absl::Minutes(1)));
  EXPECT_EQ(client->stats().prefetch_checked_bytes, 0u);
  EXPECT_EQ(client->stats().prefetch_mismatched_blocks, 1u);
  std::vector<uint8_t> a(n, 0);
  absl::StatusOr<LoadResult> result = client->Load(2, {HostRef("a", &a)});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->bytes_verified_by_client, n);
  EXPECT_EQ(result->checked_ahead_bytes, 0u);
  EXPECT_EQ(a, Pattern(n, 1000));
}

TEST_F(ClientTest, Connect_ResidentBlocksOfAnotherRegion_NothingCheckedAhead) {
  const uint64_t n = 2 * kMiB;
  const std::string resident = MakeResident(pool_.get(), fake_.get(), 4 * kMiB);
  ListResidentBlock(fake_.get(), resident + "-other", n);
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->AwaitPrefetch(absl::Minutes(1)));
  const ClientStats stats = client->stats();
  EXPECT_EQ(stats.prefetch_populated_bytes, 4 * kMiB);
  EXPECT_EQ(stats.prefetch_checked_bytes, 0u);
  EXPECT_EQ(stats.prefetch_mismatched_blocks, 0u);
}

TEST_F(ClientTest, Save_WhileTheAgentListsResidentBlocks_CancelsTheListing) {
  const std::string resident = MakeResident(pool_.get(), fake_.get(), 4 * kMiB);
  ListResidentBlock(fake_.get(), resident, 2 * kMiB);
  std::unique_ptr<Client> client = ConnectWhileTheListingIsHeld();
  ASSERT_NE(client, nullptr);
  // The save ends the resident mapping: it cancels the call the prefetch thread waits in
  // (else it would wait for the agent, here for the call's deadline).
  std::vector<uint8_t> a = Pattern(6 * kMiB, 1);
  ASSERT_TRUE(client->Save(1, {HostRef("a", &a)}).ok());
  const ClientStats stats = client->stats();
  EXPECT_TRUE(stats.prefetch_done);
  EXPECT_EQ(stats.prefetch_check_status.code(), absl::StatusCode::kCancelled)
      << stats.prefetch_check_status;
  EXPECT_EQ(stats.prefetch_checked_bytes, 0u);
  absl::MutexLock lock(&fake_->mu);
  fake_->hold_listing = false;
}

TEST_F(ClientTest, Load_WhileTheAgentListsResidentBlocks_CancelsTheListing) {
  const std::string resident = MakeResident(pool_.get(), fake_.get(), 4 * kMiB);
  ListResidentBlock(fake_.get(), resident, 2 * kMiB);
  std::unique_ptr<Client> client = ConnectWhileTheListingIsHeld();
  ASSERT_NE(client, nullptr);
  // The load takes the mapping, and the check stops there: the listing it waits for could
  // spare the load no hash, so the load cancels it rather than wait (here, for its deadline).
  std::vector<uint8_t> a(2 * kMiB, 0);
  absl::StatusOr<LoadResult> result = client->Load(2, {HostRef("a", &a)});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->prefetched_bytes, 4 * kMiB) << "read through the mapping made at connect";
  EXPECT_EQ(result->checked_ahead_bytes, 0u);
  const ClientStats stats = client->stats();
  EXPECT_TRUE(stats.prefetch_done);
  EXPECT_EQ(stats.prefetch_check_status.code(), absl::StatusCode::kCancelled)
      << stats.prefetch_check_status;
  absl::MutexLock lock(&fake_->mu);
  fake_->hold_listing = false;
}

TEST_F(ClientTest, Load_OfNoTensors_TheResidentCheckGoesOnForTheNextLoad) {
  const uint64_t n = 3 * kMiB + 5;
  ASSERT_NO_FATAL_FAILURE(MakeCheckedResident(n));
  std::unique_ptr<Client> client = ConnectWhileTheListingIsHeld();
  ASSERT_NE(client, nullptr);
  // Which step is latest (the Python client's latest(), a resumed trainer's first question):
  // answered without taking the mapping or stopping its check.
  absl::StatusOr<LoadResult> latest = client->Load(kLatestStep, {});
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->step, 42);
  EXPECT_FALSE(client->stats().prefetch_done) << "the check still waits for its listing";
  {
    absl::MutexLock lock(&fake_->mu);
    fake_->hold_listing = false;
  }
  ASSERT_TRUE(client->AwaitPrefetch(absl::Minutes(1)));
  EXPECT_EQ(client->stats().prefetch_checked_bytes, n);
  std::vector<uint8_t> a(n, 0);
  absl::StatusOr<LoadResult> result = client->Load(2, {HostRef("a", &a)});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->checked_ahead_bytes, n);
  EXPECT_EQ(a, Pattern(n, 1000));
}

TEST_F(ClientTest, Load_PrefetchOff_NothingMappedAtConnect) {
  const std::string resident = MakeResident(pool_.get(), fake_.get(), 4 * kMiB);
  ClientOptions options;
  options.prefetch_resident = false;
  std::unique_ptr<Client> client = Connect(options);
  ASSERT_NE(client, nullptr);
  EXPECT_TRUE(client->AwaitPrefetch(absl::ZeroDuration())) << "none started";
  EXPECT_EQ(client->stats().prefetch_bytes, 0u);
  EXPECT_EQ(MappingsOf(resident), 1) << "the fake's own";
  std::vector<uint8_t> a(3000, 0);
  absl::StatusOr<LoadResult> result = client->Load(2, {HostRef("a", &a)});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->prefetched_bytes, 0u);
  EXPECT_EQ(a, Pattern(a.size(), 1000));
  EXPECT_EQ(client->stats().staging_maps, 1u) << "mapped for the load";
}

TEST_F(ClientTest, Load_AgentServesAnotherRegion_ResidentMappingDroppedAndThatOneMapped) {
  const std::string resident = MakeResident(pool_.get(), fake_.get(), 4 * kMiB);
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->AwaitPrefetch(absl::Minutes(1)));
  // Larger than the resident region: the fake's pool replaces it with a new one.
  std::vector<uint8_t> a(6 * kMiB, 0);
  absl::StatusOr<LoadResult> result = client->Load(2, {HostRef("a", &a)});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->prefetched_bytes, 0u);
  EXPECT_EQ(Xxh3(a.data(), a.size()), Xxh3(Pattern(a.size(), 1000).data(), a.size()));
  EXPECT_EQ(client->stats().staging_maps, 1u);
  EXPECT_EQ(MappingsOf(resident), 0) << "the dropped region is no longer kept alive here";
}

TEST_F(ClientTest, Save_EndsTheResidentMapping_TheAgentMayDropTheRegion) {
  const std::string resident = MakeResident(pool_.get(), fake_.get(), 4 * kMiB);
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->AwaitPrefetch(absl::Minutes(1)));
  EXPECT_EQ(MappingsOf(resident), 2);
  std::vector<uint8_t> a = Pattern(6 * kMiB, 1);  // a larger region replaces the resident one
  ASSERT_TRUE(client->Save(1, {HostRef("a", &a)}).ok());
  // Unmapped off the save's path, on the thread the next Save, Load or ReserveStaging joins.
  ASSERT_TRUE(client->Save(2, {HostRef("a", &a)}).ok());
  EXPECT_EQ(MappingsOf(resident), 0);
  EXPECT_TRUE(client->stats().prefetch_done);
}

TEST_F(ClientTest, Connect_ResidentRegionGone_LoadMapsWhatTheAgentNames) {
  {
    absl::MutexLock lock(&fake_->mu);
    fake_->identity.set_resident_shm_name("/tessera-clienttest-gone");
    fake_->identity.set_resident_shm_size(4 * kMiB);
    fake_->identity.set_resident_bytes(4 * kMiB);
  }
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->AwaitPrefetch(absl::Minutes(1)));
  EXPECT_EQ(client->stats().prefetch_populated_bytes, 0u);
  std::vector<uint8_t> a(3000, 0);
  absl::StatusOr<LoadResult> result = client->Load(2, {HostRef("a", &a)});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->prefetched_bytes, 0u);
  EXPECT_EQ(a, Pattern(a.size(), 1000));
}

TEST_F(ClientTest, Load_CheckpointMissing_NotFoundWithDetailAndNoRelease) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  {
    absl::MutexLock lock(&fake_->mu);
    fake_->load_error = ToGrpcStatus(
        MakeError(absl::StatusCode::kNotFound, v1::ERROR_CODE_CHECKPOINT_NOT_FOUND, "no step 5"));
  }
  std::vector<uint8_t> into(8, 0);
  absl::StatusOr<LoadResult> result = client->Load(5, {HostRef("a", &into)});
  EXPECT_EQ(result.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(GetErrorCode(result.status()), v1::ERROR_CODE_CHECKPOINT_NOT_FOUND);
  absl::MutexLock lock(&fake_->mu);
  EXPECT_THAT(fake_->released, IsEmpty());
}

TEST_F(ClientTest, Load_StateAbsentOrBadStep_InvalidArgument) {
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  TensorRef t;
  t.fqn = "layers.0.b";
  t.kind = v1::SHARD_KIND_OPTIMIZER;
  t.dtype = v1::DTYPE_F32;
  t.global_shape = {6};
  t.state_absent = true;
  absl::StatusOr<LoadResult> result = client->Load(1, {t});
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(result.status().message(), HasSubstr("state_absent"));
  // -1 and -2 name the latest on disk and the newest commit; below that is no step.
  EXPECT_EQ(client->Load(-3, {}).status().code(), absl::StatusCode::kInvalidArgument);
  absl::MutexLock lock(&fake_->mu);
  EXPECT_THAT(fake_->load_requests, IsEmpty());
}

// ---------------------------------------------------------------------------------------------
// CUDA: device tensors, where a GPU is present.

TEST_F(ClientTest, SaveAndLoad_CudaTensors_CopiedThroughDevice) {
  if (!GpuAvailable()) GTEST_SKIP() << "no GPU";
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  const std::vector<uint8_t> host = Pattern(2 * kMiB + 3, 31);
  void* device = nullptr;
  ASSERT_EQ(cudaMalloc(&device, host.size()), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(device, host.data(), host.size(), cudaMemcpyHostToDevice), cudaSuccess);
  std::vector<uint8_t> also_host = Pattern(100, 32);
  const TensorRef t = CudaRef("gpu.w", device, host.size());
  absl::StatusOr<SaveResult> saved = client->Save(1, {t, HostRef("cpu.w", &also_host)});
  ASSERT_TRUE(saved.ok()) << saved.status();
  {
    absl::MutexLock lock(&fake_->mu);
    EXPECT_EQ(fake_->staged[0].slot_hashes[0], Xxh3(host.data(), host.size()));
    EXPECT_EQ(fake_->staged[0].slots[1], Bytes(also_host));
  }

  absl::StatusOr<LoadResult> loaded = client->Load(1, {t});
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  std::vector<uint8_t> back(host.size());
  ASSERT_EQ(cudaMemcpy(back.data(), device, back.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, Pattern(host.size(), 1000));

  // A host pointer declared as device memory is refused before any RPC.
  TensorRef wrong = HostRef("cpu.w", &also_host);
  wrong.memory = Memory::kCuda;
  EXPECT_EQ(client->Save(2, {wrong}).status().code(), absl::StatusCode::kInvalidArgument);
  cudaFree(device);
}

TEST_F(ClientTest, OverlappedSave_CudaTensor_CopyFollowsTheCallersStreamAndPrecedesTheFence) {
  if (!GpuAvailable()) GTEST_SKIP() << "no GPU";
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  constexpr size_t kBytes = 64 * kMiB;
  void* device = nullptr;
  ASSERT_EQ(cudaMalloc(&device, kBytes), cudaSuccess);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(device, 0x11, kBytes, stream), cudaSuccess);
  // The state at save() is what `stream` has queued so far (0x33, after the 0x11), not yet
  // written when Save returns: the copy must wait for it, without the host waiting.
  ASSERT_EQ(cudaMemsetAsync(device, 0x33, kBytes, stream), cudaSuccess);
  SaveOptions options = Overlapped();
  options.cuda_stream = stream;
  ASSERT_TRUE(client->Save(21, {CudaRef("gpu.w", device, kBytes)}, options).ok());
  ASSERT_TRUE(client->Fence().ok());
  // The optimizer step after the fence: never in the snapshot.
  ASSERT_EQ(cudaMemsetAsync(device, 0x55, kBytes, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  AwaitStaged(fake_.get(), 1);
  const std::vector<uint8_t> expected(kBytes, 0x33);
  absl::MutexLock lock(&fake_->mu);
  EXPECT_EQ(fake_->staged[0].slot_hashes[0], Xxh3(expected.data(), expected.size()));
  cudaStreamDestroy(stream);
  cudaFree(device);
}

TEST_F(ClientTest, Load_LargeCudaTensor_CopiedOnSeveralThreadsThroughPinnedBuffers) {
  if (!GpuAvailable()) GTEST_SKIP() << "no GPU";
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  // Above parallel_copy_min_bytes: cut into copy_threads runs, each bounced through two
  // 8 MiB buffers, parts ending inside pieces.
  const size_t size = 40 * kMiB + 7;
  void* device = nullptr;
  ASSERT_EQ(cudaMalloc(&device, size), cudaSuccess);
  ASSERT_EQ(cudaMemset(device, 0xff, size), cudaSuccess);
  const TensorRef t = CudaRef("gpu.big", device, size);
  absl::StatusOr<LoadResult> loaded = client->Load(1, {t});
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_GT(loaded->copy_time, absl::ZeroDuration());
  std::vector<uint8_t> back(size);
  ASSERT_EQ(cudaMemcpy(back.data(), device, size, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_TRUE(back == Pattern(size, 1000));
  cudaFree(device);
}

// Work the trainer queued that writes the destination (its initialisation), still queued
// when the load runs, ends before the load's copies: the client copies on streams of its own,
// not ordered after the trainer's. Here a stream held by a host function until released,
// then a fill of the destination queued behind it. Without the wait the load returned at once
// and the fill, released after it, overwrote what it loaded.
void CUDART_CB WaitForRelease(void* release) {
  static_cast<absl::Notification*>(release)->WaitForNotification();
}

TEST_F(ClientTest, Load_CudaTensorWithWorkQueued_CopiedAfterThatWork) {
  if (!GpuAvailable()) GTEST_SKIP() << "no GPU";
  std::unique_ptr<Client> client = Connect();
  ASSERT_NE(client, nullptr);
  const size_t size = 2 * kMiB + 3;
  void* device = nullptr;
  ASSERT_EQ(cudaMalloc(&device, size), cudaSuccess);
  cudaStream_t trainer = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&trainer, cudaStreamNonBlocking), cudaSuccess);
  absl::Notification release;
  ASSERT_EQ(cudaLaunchHostFunc(trainer, WaitForRelease, &release), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(device, 0xff, size, trainer), cudaSuccess);
  const TensorRef t = CudaRef("gpu.w", device, size);
  absl::StatusOr<LoadResult> loaded;
  absl::Notification returned;
  std::thread load([&] {
    loaded = client->Load(1, {t});
    returned.Notify();
  });
  // Released once the load returned (no wait: it copied before the fill) or after a bound
  // (it waits for the stream): the fill then runs, and only a load after it keeps its bytes.
  returned.WaitForNotificationWithTimeout(absl::Seconds(5));
  release.Notify();
  load.join();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(cudaStreamSynchronize(trainer), cudaSuccess);
  std::vector<uint8_t> back(size);
  ASSERT_EQ(cudaMemcpy(back.data(), device, size, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_TRUE(back == Pattern(size, 1000)) << "the queued fill overwrote the loaded bytes";
  cudaStreamDestroy(trainer);
  cudaFree(device);
}

TEST(BounceCopier, ManyPartsThroughBothBuffers_ByteExact) {
  if (!GpuAvailable()) GTEST_SKIP() << "no GPU";
  absl::StatusOr<std::unique_ptr<BounceCopier>> bounce = BounceCopier::Create(kMiB);
  ASSERT_TRUE(bounce.ok()) << bounce.status();
  const std::vector<uint8_t> a = Pattern(5 * kMiB + 3, 41);
  const std::vector<uint8_t> b = Pattern(kMiB / 2, 42);
  void* device = nullptr;
  ASSERT_EQ(cudaMalloc(&device, a.size() + b.size()), cudaSuccess);
  // Two copies queued before Finish: the second's parts reuse buffers the first's still use.
  ASSERT_TRUE((*bounce)->ToDevice(device, a.data(), a.size()).ok());
  ASSERT_TRUE((*bounce)->ToDevice(static_cast<char*>(device) + a.size(), b.data(), b.size()).ok());
  ASSERT_TRUE((*bounce)->Finish().ok());
  std::vector<uint8_t> back(a.size() + b.size());
  ASSERT_EQ(cudaMemcpy(back.data(), device, back.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_TRUE(std::equal(a.begin(), a.end(), back.begin()));
  EXPECT_TRUE(std::equal(b.begin(), b.end(), back.begin() + a.size()));
  // Host memory is not a destination.
  EXPECT_EQ((*bounce)->ToDevice(back.data(), a.data(), 16).code(),
            absl::StatusCode::kInvalidArgument);
  cudaFree(device);
}

TEST(BounceCopier, NoGpu_NoPageLockedMemory_ResourceExhausted) {
  if (GpuAvailable()) GTEST_SKIP() << "a GPU is present";
  EXPECT_EQ(BounceCopier::Create(kMiB).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(BounceCopier::Create(0).status().code(), absl::StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------------------------
// Pure helpers

TEST(ParallelCopy, ManyItemsAcrossThreads_ByteExact) {
  std::vector<std::vector<uint8_t>> src, dst;
  std::vector<CopyItem> items;
  for (size_t i = 0; i < 37; ++i) {
    src.push_back(Pattern(i * i * 97 + i, static_cast<uint32_t>(i)));
    dst.emplace_back(src.back().size(), 0);
  }
  for (size_t i = 0; i < src.size(); ++i) {
    items.push_back(CopyItem{dst[i].data(), src[i].data(), src[i].size()});
  }
  EXPECT_EQ(ParallelCopy(items, 3, /*parallel_min_bytes=*/0), 3);
  EXPECT_EQ(dst, src);
}

TEST(ParallelCopy, SmallOrEmpty_SerialOrNothing) {
  std::vector<uint8_t> src = Pattern(5, 1), dst(5, 0);
  EXPECT_EQ(ParallelCopy({CopyItem{dst.data(), src.data(), 5}}, 4, 1024), 1);
  EXPECT_EQ(dst, src);
  // Above the threshold but fewer bytes than threads: at most one thread per byte.
  std::vector<uint8_t> src2 = Pattern(3, 2), dst2(3, 0);
  EXPECT_LE(ParallelCopy({CopyItem{dst2.data(), src2.data(), 3}}, 8, 0), 3);
  EXPECT_EQ(dst2, src2);
  EXPECT_EQ(ParallelCopy({}, 4, 0), 0);
}

// The one fingerprint of a local plan (the agent's, common/plan_fingerprint.h) over what
// DescribeShards makes of the trainer's tensors.
TEST(PlanFingerprint, EqualForEqualPlans_DiffersWhenAPieceChanges) {
  std::vector<uint8_t> bytes(64);
  TensorRef t;
  t.fqn = "w";
  t.dtype = v1::DTYPE_F32;
  t.global_shape = {4, 4};
  t.box = Box{{0, 0}, {2, 4}};
  t.data = bytes.data();
  t.nbytes = 32;
  const v1::Layout mesh = Mesh({{"dp", 2}});
  auto fingerprint = [&](const TensorRef& ref) {
    absl::StatusOr<std::vector<v1::ShardDesc>> shards = DescribeShards(mesh, {ref});
    EXPECT_TRUE(shards.ok()) << shards.status();
    return FingerprintShards(0, *shards);
  };
  const uint64_t base = fingerprint(t);
  EXPECT_EQ(fingerprint(t), base);
  TensorRef moved = t;
  moved.box = Box{{2, 0}, {2, 4}};
  EXPECT_NE(fingerprint(moved), base);
  TensorRef other_data = t;  // where the bytes live is not part of the plan
  other_data.data = bytes.data() + 32;
  EXPECT_EQ(fingerprint(other_data), base);
}

}  // namespace
}  // namespace tessera
