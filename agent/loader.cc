#include "agent/loader.h"

#include <algorithm>
#include <map>
#include <memory>
#include <optional>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "agent/range_reserver.h"
#include "agent/reserved_reads.h"
#include "common/box.h"
#include "common/ids.h"
#include "common/log.h"
#include "common/status.h"
#include "common/tensor_key.h"
#include "format/checkpoint_reader.h"
#include "format/commit.h"

namespace tessera {
namespace {

uint64_t AlignUp(uint64_t v) { return (v + 4095) / 4096 * 4096; }

// The data files `reads` read (CheckpointReader::DataFiles), sorted. Empty if the reads
// cannot be planned (Read reports the same error).
std::vector<std::string> FilesRead(const CheckpointReader& reader,
                                   const std::vector<ReadRequest>& reads) {
  absl::StatusOr<std::vector<std::string>> files = reader.DataFiles(reads);
  return files.ok() ? *std::move(files) : std::vector<std::string>{};
}

// FilesRead that `view` does not hold.
absl::flat_hash_set<std::string> FilesNotInView(const CheckpointReader& reader,
                                                const std::vector<ReadRequest>& reads,
                                                const ResidentView& view) {
  absl::flat_hash_set<std::string> files;
  for (std::string& file : FilesRead(reader, reads)) {
    if (!view.files.contains(file)) files.insert(std::move(file));
  }
  return files;
}

// Each of `files`' size as the manifest implies it: its last chunk's end, 4 KiB-aligned.
absl::flat_hash_map<std::string, uint64_t> FileSizes(
    const CheckpointReader& reader, const absl::flat_hash_set<std::string>& files) {
  absl::flat_hash_map<std::string, uint64_t> sizes;
  for (const v1::TensorEntry& tensor : reader.manifest().tensors()) {
    for (const v1::ChunkEntry& chunk : tensor.chunks()) {
      if (!files.contains(chunk.file())) continue;
      uint64_t& size = sizes[chunk.file()];
      size = std::max(size, AlignUp(chunk.offset() + chunk.nbytes()));
    }
  }
  return sizes;
}

// A memory-only checkpoint whose `missing` files no memory copy holds: it cannot be loaded.
absl::Status MemoryCopyLost(const CheckpointReader& reader,
                            const absl::flat_hash_set<std::string>& missing) {
  std::map<std::string, uint32_t> writers;  // sorted, for a stable message
  for (const v1::TensorEntry& tensor : reader.manifest().tensors()) {
    for (const v1::ChunkEntry& chunk : tensor.chunks()) {
      if (missing.contains(chunk.file())) writers[chunk.file()] = chunk.writer_rank();
    }
  }
  std::vector<std::string> named;
  for (const auto& [file, rank] : writers) {
    named.push_back(absl::StrCat(file, " (rank ", rank, ")"));
  }
  return MakeError(absl::StatusCode::kNotFound, v1::ERROR_CODE_MEMORY_COPY_LOST,
                   absl::StrCat("step ", reader.manifest().step(),
                                " is a memory-only checkpoint and no live agent holds ",
                                absl::StrJoin(named, ", "),
                                " in memory: it can no longer be loaded; load a checkpoint on "
                                "disk instead (step -1: the latest)"));
}

// A memory-only checkpoint whose copies the coordinator could not locate (`error`): not lost
// for all this agent knows — the load may be tried again.
absl::Status MemoryCopiesUnknown(int64_t step, const absl::Status& error) {
  return absl::UnavailableError(
      absl::StrCat("step ", step,
                   " is a memory-only checkpoint and the coordinator could not say which agents "
                   "hold it (",
                   error.ToString(), "): try the load again"));
}

// A memory-only checkpoint whose data file `copy` (held by another agent) this agent could
// not read: it may still be held — the load may be tried again.
absl::Status MemoryCopyUnread(int64_t step, const v1::MemoryCopy& copy) {
  return absl::UnavailableError(absl::StrCat(
      "step ", step, " is a memory-only checkpoint and rank ", copy.rank(), " on ", copy.node_id(),
      " holds ", copy.file(),
      ", but it could not be read from there (see this agent's log): try the load again"));
}

// Drops from `copies` those held behind a bulk port the trainer could not read from
// (LoadRequest.unreadable_holders), logging each.
void SkipUnreadableHolders(const google::protobuf::RepeatedPtrField<std::string>& unreadable,
                           std::vector<v1::MemoryCopy>& copies) {
  if (unreadable.empty()) return;
  const absl::flat_hash_set<std::string> skip(unreadable.begin(), unreadable.end());
  copies.erase(
      std::remove_if(copies.begin(), copies.end(),
                     [&](const v1::MemoryCopy& copy) {
                       if (copy.bulk_address().empty() || !skip.contains(copy.bulk_address())) {
                         return false;
                       }
                       LogInfo("not reading the memory copy of ", copy.file(), " held by rank ",
                               copy.rank(), " at ", copy.bulk_address(),
                               ": the trainer could not read from it");
                       return true;
                     }),
      copies.end());
}

// A load's reads of the checkpoint, one per requested shard it holds.
struct PlannedReads {
  std::vector<bool> absent;  // per requested shard: reported as absent, not read
  std::vector<ReadRequest> reads;
  std::vector<int> read_index;  // reads[k] serves request shard read_index[k]
};

// What each requested shard reads, from `reader`'s checkpoint as this rank's key names it.
// Reported as absent, not read (the trainer keeps its destination and knows): optimizer
// state the checkpoint records as absent (one entry "<fqn>#", no chunks), and a per-rank
// extra of a rank that did not exist when the checkpoint was saved (a job resumed on more
// ranks has no RNG state for its new ones). Destinations are set once the region is known.
PlannedReads PlanReads(const v1::LoadRequest& request, const CheckpointReader& reader,
                       uint32_t rank) {
  PlannedReads planned;
  planned.absent.assign(request.shards_size(), false);
  planned.reads.reserve(request.shards_size());
  for (int i = 0; i < request.shards_size(); ++i) {
    const v1::ShardDesc& shard = request.shards(i);
    const std::string key = TensorKeyOf(shard, rank);
    if (shard.kind() == v1::SHARD_KIND_EXTRA && reader.FindTensor(key) == nullptr) {
      planned.absent[i] = true;
      continue;
    }
    if (shard.kind() == v1::SHARD_KIND_OPTIMIZER && reader.FindTensor(key) == nullptr) {
      const v1::TensorEntry* marker = reader.FindTensor(shard.fqn() + "#");
      if (marker != nullptr && marker->state_absent()) {
        planned.absent[i] = true;
        continue;
      }
    }
    ReadRequest read;
    read.key = key;
    read.dtype = shard.dtype();
    read.global_shape.assign(shard.global_shape().begin(), shard.global_shape().end());
    read.box = shard.has_box() ? BoxFromProto(shard.box()) : FullBox(read.global_shape);
    if (shard.has_flat_range()) read.flat_range = shard.flat_range();
    read.dest_size = shard.nbytes();
    planned.reads.push_back(std::move(read));
    planned.read_index.push_back(i);
  }
  return planned;
}

}  // namespace

uint64_t Loader::FetchNeeded(const CheckpointReader& reader, const std::vector<ReadRequest>& reads,
                             const std::vector<v1::MemoryCopy>& copies, ResidentView& view) {
  // Only if another agent offers a file this view lacks is it worth planning the reads (Read
  // plans them again): on a restart where this node holds everything, nothing is done twice.
  const bool offered = std::any_of(copies.begin(), copies.end(), [&](const v1::MemoryCopy& c) {
    return c.rank() != rank_ && !c.peer_address().empty() && !view.files.contains(c.file());
  });
  if (!offered) return 0;
  const absl::flat_hash_set<std::string> files = FilesNotInView(reader, reads, view);
  if (files.empty()) return 0;
  return AddRemoteCopies(copies, rank_, FileSizes(reader, files), MaxFetchBytes(),
                         options_.fetch_copy, view);
}

uint64_t Loader::MaxFetchBytes() const {
  return options_.max_fetch_bytes > 0 ? options_.max_fetch_bytes : staging_->budget_bytes();
}

absl::StatusOr<Loader::Staged> Loader::StageFetched(const CheckpointReader& reader,
                                                    const std::vector<ReadRequest>& reads,
                                                    MemoryCopies& copies, bool client_verifies,
                                                    bool client_fetches) {
  ASSIGN_OR_RETURN(const std::string file, reader.ContiguousFile(reads));
  RETURN_IF_ERROR(copies.status());
  // A copy on this node (a peer's region, or one this agent holds as a buddy) is read where it
  // lies by the copying path, not fetched.
  std::vector<const v1::MemoryCopy*> remote;
  for (const v1::MemoryCopy& copy : *copies) {
    if (copy.file() != file) continue;
    if (copy.node_id() == options_.node_id) {
      return absl::FailedPreconditionError(absl::StrCat(file, " is held on this node"));
    }
    if (copy.rank() != rank_ && !copy.peer_address().empty()) remote.push_back(&copy);
  }
  const uint64_t file_size = FileSizes(reader, {file})[file];
  const absl::Time start = absl::Now();
  if (client_fetches && client_verifies) {
    // The trainer reads the copy from its holder: only located here, nothing read.
    for (const v1::MemoryCopy* copy : remote) {
      if (copy->bulk_address().empty() || !CheckRemoteCopySize(*copy, file_size).ok()) continue;
      absl::StatusOr<Staged> staged =
          Locate(reader, reads, file, ResidentBytes{copy->file_offset(), nullptr, copy->nbytes()},
                 /*client_verifies=*/true);
      if (!staged.ok()) return staged.status();
      staged->staging_time = absl::Now() - start;
      staged->in_place = false;  // not served from a region: the trainer reads the copy
      staged->shm_size = copy->nbytes();
      staged->fetched_from_peers = staged->stats.bytes_from_memory;  // the blocks it will read
      staged->client_fetch = *copy;
      return staged;
    }
  }
  // Holders that could not be read, by index into *copies: on every return, dropped from it
  // if the checkpoint is on disk, so that the copying path reads from the next holder or from
  // disk, not from them again. A memory-only checkpoint's holder may have its only copy: the
  // copying path asks it once more.
  absl::flat_hash_set<size_t> unreadable;
  absl::Cleanup drop_unreadable = [&] {
    if (unreadable.empty() || !reader.on_disk()) return;
    std::vector<v1::MemoryCopy> readable;
    for (size_t i = 0; i < copies->size(); ++i) {
      if (!unreadable.contains(i)) readable.push_back(std::move((*copies)[i]));
    }
    *copies = std::move(readable);
  };
  for (const v1::MemoryCopy* copy : remote) {
    absl::StatusOr<std::vector<StagingSlot>> region = absl::UnknownError("not acquired");
    absl::Time fetch_start = absl::InfiniteFuture();
    auto in_load_region = [&](uint64_t nbytes) -> absl::StatusOr<char*> {
      region = staging_->Acquire({std::max<uint64_t>(nbytes, 4096)});
      if (!region.ok()) return region.status();
      fetch_start = absl::Now();
      return static_cast<char*>((*region)[0].data);
    };
    if (!ReadRemoteCopy(*copy, file_size, MaxFetchBytes(), in_load_region, options_.fetch_copy)
             .ok()) {
      if (region.ok()) {  // the holder, not this agent, failed
        staging_->ReleaseAll();
        unreadable.insert(static_cast<size_t>(copy - copies->data()));
      }
      continue;
    }
    char* data = static_cast<char*>((*region)[0].data);
    const absl::Time fetched = absl::Now();
    const absl::Duration staging_time = fetched - start;
    // The fetched bytes are this load's own until it answers: verifying them here, a block that
    // does not match is read from the file over them (not the whole copy fetched again).
    absl::StatusOr<Staged> staged =
        Locate(reader, reads, file, ResidentBytes{copy->file_offset(), data, copy->nbytes()},
               client_verifies, client_verifies ? nullptr : data);
    if (!staged.ok()) {
      staging_->ReleaseAll();
      return staged.status();
    }
    staged->staging_time = staging_time;
    staged->fetch_time = fetched - fetch_start;
    staged->shm_name = (*region)[0].name;
    staged->shm_size = (*region)[0].capacity;
    staged->fetched_from_peers = copy->nbytes();
    return staged;
  }
  return absl::FailedPreconditionError(
      absl::StrCat("no agent on another node could send its memory copy of ", file));
}

absl::StatusOr<Loader::Staged> Loader::Locate(const CheckpointReader& reader,
                                              const std::vector<ReadRequest>& reads,
                                              const std::string& file,
                                              const ResidentBytes& resident, bool client_verifies,
                                              char* writable) {
  Staged staged;
  if (writable != nullptr) {
    ASSIGN_OR_RETURN(staged.results,
                     reader.RepairInMemory(reads, file, writable, resident.file_offset,
                                           resident.size, &staged.stats));
  } else {
    ASSIGN_OR_RETURN(staged.results,
                     reader.LocateInMemory(reads, file, resident, &staged.stats,
                                           client_verifies ? &staged.unverified : nullptr));
  }
  for (const ReadResult& result : staged.results) staged.offsets.push_back(result.resident_offset);
  staged.in_place = true;
  return staged;
}

absl::StatusOr<Loader::Staged> Loader::StageInPlace(const CheckpointReader& reader,
                                                    const std::vector<ReadRequest>& reads,
                                                    HeldCheckpoint& held, bool client_verifies) {
  const ResidentCheckpoint& resident = held.checkpoint;
  ASSIGN_OR_RETURN(Staged staged, Locate(reader, reads, resident.file,
                                         ResidentBytes{resident.file_offset, resident.region.data,
                                                       resident.nbytes},
                                         client_verifies));
  staged.shm_name = resident.region.name;
  staged.shm_size = resident.region.capacity;
  staged.hold = std::move(held.hold);
  return staged;
}

absl::StatusOr<Loader::Staged> Loader::StageCopy(const CheckpointReader& reader, int64_t step,
                                                 std::vector<ReadRequest>& reads,
                                                 std::optional<HeldCheckpoint> held,
                                                 const MemoryCopies& copies) {
  // Staging: one slot per read, each 4 KiB-aligned.
  Staged staged;
  uint64_t total = 0;
  for (const ReadRequest& read : reads) {
    staged.offsets.push_back(total);
    total += AlignUp(read.dest_size);
  }
  const absl::Time staging_start = absl::Now();
  // Reserved ahead of the reads, on a thread of its own, instead of all before them.
  ASSIGN_OR_RETURN(std::vector<StagingSlot> region,
                   staging_->Acquire({std::max<uint64_t>(total, 4096)},
                                     StagingPool::Reservation::kByCaller));
  const StagingSlot slot = region[0];
  auto reserver = std::make_unique<RangeReserver>(
      slot.capacity, options_.reserve_chunk_bytes,
      [slot](uint64_t offset, uint64_t length) {
        return StagingPool::ReserveBytes(slot, offset, length);
      });
  // The reserver stops before the region goes.
  auto release = [&] {
    reserver.reset();
    staging_->ReleaseAll();
  };
  auto* base = static_cast<unsigned char*>(slot.data);
  for (size_t k = 0; k < reads.size(); ++k) reads[k].dest = base + staged.offsets[k];
  staged.shm_name = slot.name;
  staged.shm_size = slot.capacity;

  // What this agent and its node's peers still hold of the checkpoint.
  ResidentView resident;
  if (held.has_value()) {
    const ResidentCheckpoint& own = held->checkpoint;
    resident.Add(own.file, own.file_offset, own.region.data, own.nbytes, std::move(held->hold));
  }
  if (options_.find_copies) {
    if (copies.ok()) {
      if (options_.buddies != nullptr) AddHeldCopies(*copies, rank_, *options_.buddies, resident);
      AddNodeCopies(*copies, rank_, options_.node_id, resident);
      if (options_.fetch_copy) {
        staged.fetched_from_peers = FetchNeeded(reader, reads, *copies, resident);
      }
    } else if (reader.on_disk()) {
      LogWarning("memory copies of step ", step, " unknown (", copies.status().ToString(),
                 "): reading what this agent does not hold from disk");
    }
  }
  staged.staging_time = absl::Now() - staging_start;
  if (!reader.on_disk()) {
    // Memory-only: what no copy holds cannot be read from anywhere. Said before reading.
    const absl::flat_hash_set<std::string> missing = FilesNotInView(reader, reads, resident);
    if (!missing.empty()) {
      release();
      if (options_.find_copies && !copies.ok()) return MemoryCopiesUnknown(step, copies.status());
      if (copies.ok()) {
        for (const v1::MemoryCopy& copy : *copies) {
          if (missing.contains(copy.file()) && copy.rank() != rank_) {
            return MemoryCopyUnread(step, copy);
          }
        }
      }
      return MemoryCopyLost(reader, missing);
    }
  }
  absl::StatusOr<std::vector<ReadResult>> results =
      ReadAsReserved(reader, reads, staged.offsets, *reserver, staged.stats,
                     resident.files.empty() ? nullptr : &resident.files, &staged.read_batches);
  if (!results.ok()) {
    release();
    return results.status();
  }
  reserver.reset();  // done: every read's bytes were reserved before it
  staged.results = *std::move(results);
  return staged;
}

Loader::Loader(Storage* storage, StagingPool* staging, uint32_t rank, LoaderOptions options)
    : storage_(storage), staging_(staging), rank_(rank), options_(std::move(options)) {}

Loader::~Loader() {
  absl::MutexLock lock(&mu_);
  JoinReleaserLocked();
}

void Loader::JoinReleaserLocked() {
  if (releaser_.joinable()) releaser_.join();
}

void Loader::SetJobDir(std::string job_dir) {
  absl::MutexLock lock(&dir_mu_);
  job_dir_ = std::move(job_dir);
}

std::string Loader::JobDir() const {
  absl::MutexLock lock(&dir_mu_);
  return job_dir_;
}

absl::StatusOr<v1::ListResidentBlocksResponse> Loader::ResidentBlocks() {
  std::optional<ResidentCheckpoint> resident;
  if (options_.memory != nullptr) resident = options_.memory->Current();
  if (!resident.has_value()) {
    return absl::NotFoundError("this agent holds no checkpoint in memory");
  }
  const std::string job_dir = JobDir();
  if (job_dir.empty()) {
    return absl::FailedPreconditionError("the agent is not registered with a coordinator yet");
  }
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(const std::unique_ptr<CheckpointReader> reader,
                   OpenLocked(job_dir, resident->step));
  if (reader->manifest().session_id() != resident->session_id) {
    return absl::NotFoundError(absl::StrCat(
        "step ", resident->step, " in memory was saved by session ", resident->session_id,
        ", the committed one by ", reader->manifest().session_id()));
  }
  v1::ListResidentBlocksResponse response;
  response.set_shm_name(resident->region.name);
  response.set_step(resident->step);
  for (const BlockCheck& block : reader->ResidentBlocks(
           resident->file, ResidentBytes{resident->file_offset, nullptr, resident->nbytes})) {
    v1::BlockCheck* check = response.add_blocks();
    check->set_offset(block.offset);
    check->set_length(block.length);
    check->set_xxh3(block.xxh3);
  }
  return response;
}

absl::StatusOr<v1::LoadResponse> Loader::Load(const v1::LoadRequest& request) {
  const std::string job_dir = JobDir();  // read once: a registration may set it meanwhile
  if (job_dir.empty()) {
    return absl::FailedPreconditionError("the agent is not registered with a coordinator yet");
  }
  absl::MutexLock lock(&mu_);
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
      OpenLocked(job_dir, request.step());
  if (!reader.ok()) return reader.status();
  const int64_t step = (*reader)->manifest().step();
  JoinReleaserLocked();  // its ReleaseAll must not run after our Acquire
  ReleaseCurrentLocked();

  PlannedReads planned = PlanReads(request, **reader, rank_);
  // The memory tier: what this agent holds of this very checkpoint (step and session). Served
  // in place if it can be, else by copying.
  std::optional<HeldCheckpoint> held;
  if (options_.memory != nullptr) {
    held = options_.memory->Hold(step, (*reader)->manifest().session_id());
  }
  v1::LoadResponse response;
  response.set_load_id(absl::StrCat("load-", rank_, "-", ++loads_));
  response.set_step(step);
  const absl::Time read_start = absl::Now();
  absl::StatusOr<Staged> staged =
      Stage(**reader, request, planned.reads, std::move(held), response.load_id());
  if (!staged.ok()) return staged.status();
  current_hold_ = std::move(staged->hold);
  const absl::Time read_end = absl::Now();
  FillResponse(request, **reader, *staged, std::move(planned.absent), planned.read_index,
               &response);
  current_load_ = response.load_id();
  LogLoad(response, request.shards_size(), *staged, read_start - start, read_end - read_start);
  return response;
}

absl::StatusOr<Loader::Staged> Loader::Stage(const CheckpointReader& reader,
                                             const v1::LoadRequest& request,
                                             std::vector<ReadRequest>& reads,
                                             std::optional<HeldCheckpoint> held,
                                             const std::string& load_id) {
  const int64_t step = reader.manifest().step();
  // The job's memory copies of the checkpoint, from the coordinator: not needed to serve this
  // agent's own copy in place, asked once otherwise.
  MemoryCopies copies = absl::FailedPreconditionError("no coordinator to ask for memory copies");
  bool copies_asked = false;
  auto find_copies = [&]() -> MemoryCopies& {
    if (!copies_asked && options_.find_copies) {
      copies = options_.find_copies(step, reader.manifest().session_id(), FilesRead(reader, reads),
                                    !reader.on_disk());
      if (copies.ok() && reader.on_disk()) {
        SkipUnreadableHolders(request.unreadable_holders(), *copies);
      }
    }
    copies_asked = true;
    return copies;
  };
  absl::StatusOr<Staged> staged = absl::FailedPreconditionError("nothing resident");
  if (held.has_value()) {
    staged = StageInPlace(reader, reads, *held, request.client_verifies());
  } else if (options_.fetch_copy) {
    staged = StageFetched(reader, reads, find_copies(), request.client_verifies(),
                          request.client_fetches());
  }
  if (!staged.ok() && held.has_value()) {
    LogInfo("load ", load_id, " step=", step, ": copying, not served in place (",
            staged.status().message(), ")");
  }
  if (!staged.ok()) staged = StageCopy(reader, step, reads, std::move(held), find_copies());
  return staged;
}

void Loader::FillResponse(const v1::LoadRequest& request, const CheckpointReader& reader,
                          const Staged& staged, std::vector<bool> absent,
                          const std::vector<int>& read_index, v1::LoadResponse* response) const {
  const ReadStats& stats = staged.stats;
  std::vector<uint64_t> offsets(request.shards_size(), 0);
  for (size_t k = 0; k < read_index.size(); ++k) {
    if (staged.results[k].state_absent) absent[read_index[k]] = true;
    offsets[read_index[k]] = staged.offsets[k];
  }
  response->set_shm_name(staged.shm_name);
  response->set_shm_size(staged.shm_size);
  for (int i = 0; i < request.shards_size(); ++i) {
    v1::StagingSlot* slot = response->add_slots();
    slot->set_offset(absent[i] ? 0 : offsets[i]);
    slot->set_nbytes(absent[i] ? 0 : request.shards(i).nbytes());
    if (absent[i]) response->add_absent(static_cast<uint32_t>(i));
  }
  response->set_bytes_from_memory(stats.bytes_from_memory);
  response->set_bytes_from_disk(stats.bytes_read);
  response->set_memory_blocks_rejected(stats.memory_blocks_rejected);
  response->set_bytes_fetched_from_peers(staged.fetched_from_peers);
  response->set_memory_only(!reader.on_disk());
  for (const BlockCheck& block : staged.unverified) {
    v1::BlockCheck* check = response->add_unverified_blocks();
    check->set_offset(block.offset);
    check->set_length(block.length);
    check->set_xxh3(block.xxh3);
  }
  if (staged.client_fetch.has_value()) {
    response->mutable_fetch()->set_job_id(options_.job_id);
    if (options_.peer_keyring != nullptr) {
      response->mutable_fetch()->set_peer_secret(options_.peer_keyring->Get().secret);
    }
    *response->mutable_fetch()->mutable_copy() = *staged.client_fetch;
  }
}

void Loader::LogLoad(const v1::LoadResponse& response, int shards, const Staged& staged,
                     absl::Duration setup, absl::Duration reading) {
  const ReadStats& stats = staged.stats;
  // One line per load, split where the time goes: opening (manifest), staging (making the load
  // region, finding and fetching copies; none in place), then the reads (bandwidth over the
  // bytes read from data files, verified blocks included) or, in place, verifying the
  // resident region.
  const double read_s = absl::ToDoubleSeconds(reading - staged.staging_time);
  const double read_mib_s =
      read_s > 0 ? static_cast<double>(stats.bytes_read) / read_s / (1 << 20) : 0;
  LogInfo("load ", response.load_id(), " step=", response.step(),
          response.memory_only() ? " memory_only=1" : "", " shards=", shards,
          " in_place=", staged.in_place ? 1 : 0,
          staged.client_fetch.has_value()
              ? absl::StrCat(" client_fetches_from=", staged.client_fetch->bulk_address())
              : "",
          " unverified_blocks=", staged.unverified.size(), " bytes=", stats.bytes_copied,
          " read_bytes=", stats.bytes_read, " read_shared_bytes=", stats.bytes_read_shared,
          " memory_bytes=", stats.bytes_from_memory,
          " memory_blocks_rejected=", stats.memory_blocks_rejected,
          " fetched_from_peers=", staged.fetched_from_peers, " reads=", stats.read_calls,
          " setup_ms=", absl::ToDoubleMilliseconds(setup),
          " staging_ms=", absl::ToDoubleMilliseconds(staged.staging_time),
          staged.fetch_time > absl::ZeroDuration()
              ? absl::StrCat(" fetch_ms=", absl::ToDoubleMilliseconds(staged.fetch_time))
              : "",
          staged.read_batches > 1 ? absl::StrCat(" read_batches=", staged.read_batches) : "",
          " read_ms=", read_s * 1e3, " read_mib_s=", read_mib_s);
}

absl::StatusOr<std::unique_ptr<CheckpointReader>> Loader::OpenLocked(const std::string& job_dir,
                                                                     int64_t step) {
  if (step < -2) {
    return absl::InvalidArgumentError(
        absl::StrCat("step ", step,
                     " is not a step: use >= 0, -1 (the latest on disk) or -2 (the newest, "
                     "a memory-only commit included)"));
  }
  auto open_disk = [&](int64_t s) {
    return CheckpointReader::Open(storage_, absl::StrCat(job_dir, "/", StepDirName(s)));
  };
  auto open_memory = [&](const v1::Manifest& manifest) {
    return CheckpointReader::FromManifest(manifest,
                                          absl::StrCat("memory-only step ", manifest.step()));
  };
  if (step >= 0) {
    absl::StatusOr<std::unique_ptr<CheckpointReader>> disk = open_disk(step);
    if (!absl::IsNotFound(disk.status()) || !options_.memory_manifest) return disk;
    absl::StatusOr<v1::Manifest> memory = options_.memory_manifest(step);
    if (memory.ok()) return open_memory(*memory);
    if (absl::IsNotFound(memory.status())) return disk;  // neither on disk nor in memory
    return absl::UnavailableError(
        absl::StrCat("step ", step,
                     " is not on disk, and the coordinator could not say whether it is a "
                     "memory-only commit: ",
                     memory.status().message()));
  }
  ASSIGN_OR_RETURN(int64_t latest, LatestStep(*storage_, job_dir));
  if (step == -2 && options_.memory_manifest) {
    absl::StatusOr<v1::Manifest> memory = options_.memory_manifest(-1);
    if (memory.ok() && memory->step() > latest) return open_memory(*memory);
    if (!memory.ok() && !absl::IsNotFound(memory.status())) {
      return absl::UnavailableError(absl::StrCat(
          "the coordinator could not say whether a memory-only commit is newer than the latest "
          "checkpoint on disk: ",
          memory.status().message()));
    }
  }
  if (latest < 0) {
    return MakeError(absl::StatusCode::kNotFound, v1::ERROR_CODE_CHECKPOINT_NOT_FOUND,
                     absl::StrCat("no committed checkpoint in ", job_dir));
  }
  return open_disk(latest);
}

void Loader::ReleaseCurrentLocked() {
  if (!current_load_.empty()) staging_->ReleaseAll();
  current_hold_.reset();
  current_load_.clear();
}

void Loader::Release(const std::string& load_id) {
  absl::MutexLock lock(&mu_);
  if (load_id.empty() || load_id != current_load_) return;
  current_load_.clear();
  JoinReleaserLocked();
  // Off this thread: a held resident region the pool has dropped meanwhile is unmapped by its
  // last holder, and a load region is freed.
  releaser_ = std::thread([staging = staging_, hold = std::move(current_hold_)]() mutable {
    hold.reset();
    staging->ReleaseAll();
  });
  current_hold_.reset();
}

}  // namespace tessera
