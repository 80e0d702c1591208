#include "agent/peer_memory.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"
#include "agent/peer/chunk_codec.h"
#include "common/bulk_wire.h"
#include "common/grpc_reactors.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "common/status.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/proto_buffer_reader.h"

namespace tessera {
namespace {

// Appends `chunk`'s data to `buffer` (which holds `*received` of `total` bytes) if it is the
// next piece in order and fits; false, changing nothing, otherwise.
bool AppendInOrder(const v1::MemoryCopyChunk& chunk, uint64_t total, MemoryBuffer& buffer,
                   uint64_t* received) {
  const std::string& data = chunk.data();
  if (chunk.offset() != *received || data.size() > total - *received) return false;
  memcpy(buffer.data() + *received, data.data(), data.size());
  *received += data.size();
  return true;
}

// PutMemoryCopy: chunks in order into a reserved buffer, kept once the last byte is in. A
// sender that sends nothing for the stall limit is cancelled (`watch`): its read ends not ok,
// as when the sender closes, so a copy not yet whole has its room given back (one that is
// whole is kept, though the sender, which never closed, hears CANCELLED).
class PutReactor final : public grpc::ServerReadReactor<v1::MemoryCopyChunk> {
 public:
  PutReactor(const std::string* job_id, BuddyStore* store, v1::PutMemoryCopyResponse* response,
             std::unique_ptr<StalledCallCanceller::Watch> watch)
      : job_id_(job_id), store_(store), response_(response), watch_(std::move(watch)) {
    StartRead(&chunk_);
  }

  void OnReadDone(bool ok) override {
    if (ok) watch_->Progress();
    if (!ok) {  // the sender closed the stream, or it was cancelled
      if (buffer_ == nullptr) return Fail(absl::InvalidArgumentError("no memory copy was sent"));
      if (received_ != copy_.nbytes()) {
        return Fail(absl::InvalidArgumentError(absl::StrCat("the memory copy of ", copy_.file(),
                                                            " ended after ", received_, " of ",
                                                            copy_.nbytes(), " bytes")));
      }
      store_->Keep(std::move(copy_), std::move(buffer_));
      kept_ = true;
      response_->set_bytes_received(received_);
      Finish(grpc::Status::OK);
      return;
    }
    if (buffer_ == nullptr) {
      if (!chunk_.has_copy()) {
        return Fail(absl::InvalidArgumentError("the first chunk names no memory copy"));
      }
      copy_ = chunk_.copy();
      absl::StatusOr<std::shared_ptr<MemoryBuffer>> buffer =
          ReserveBuddyCopy(*job_id_, *store_, chunk_.job_id(), copy_);
      if (!buffer.ok()) return Fail(buffer.status());
      buffer_ = *std::move(buffer);
    }
    if (!AppendInOrder(chunk_, copy_.nbytes(), *buffer_, &received_)) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("chunk of ", chunk_.data().size(), " bytes at ", chunk_.offset(),
                       " of the memory copy of ", copy_.file(), ": expected bytes from ", received_,
                       " of ", copy_.nbytes())));
    }
    StartRead(&chunk_);
  }

  void OnDone() override {
    GiveBackRoom();  // the sender went away mid-stream
    delete this;
  }

 private:
  // The room is given back before the sender hears the error, so a send it makes next finds it.
  void Fail(const absl::Status& status) {
    GiveBackRoom();
    Finish(ToGrpcStatus(status));
  }

  void GiveBackRoom() {
    if (buffer_ != nullptr && !kept_) {
      store_->Abandon(buffer_.get());
      buffer_.reset();
    }
  }

  const std::string* const job_id_;
  BuddyStore* const store_;
  v1::PutMemoryCopyResponse* const response_;
  const std::unique_ptr<StalledCallCanceller::Watch> watch_;
  v1::MemoryCopyChunk chunk_;
  v1::MemoryCopy copy_;
  std::shared_ptr<MemoryBuffer> buffer_;  // set once room is reserved
  uint64_t received_ = 0;
  bool kept_ = false;
};

// ReadMemoryCopy: bytes [begin, end) of a copy in chunks, each chunk's data an external slice
// over the memory that holds it. Every slice holds `hold` until gRPC is done with it, so the
// memory outlives the last write even if the copy is dropped or replaced meanwhile. A reader
// that takes nothing for the stall limit is cancelled (`watch`): the pending write ends not
// ok, as when the reader goes away, and gRPC lets go of the slices.
class ReadReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  // Streams bytes [begin, end) at `data`.
  ReadReactor(const char* data, uint64_t begin, uint64_t end, std::shared_ptr<const void> hold,
              std::unique_ptr<StalledCallCanceller::Watch> watch)
      : data_(data), offset_(begin), end_(end), hold_(std::move(hold)), watch_(std::move(watch)) {
    WriteNext();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the reader went away"));
      return;
    }
    watch_->Progress();
    WriteNext();
  }

  void OnDone() override { delete this; }

 private:
  static void ReleaseHold(void* hold) { delete static_cast<std::shared_ptr<const void>*>(hold); }

  void WriteNext() {
    if (offset_ >= end_) {
      Finish(grpc::Status::OK);
      return;
    }
    const uint64_t n = std::min(kMemoryCopyChunkBytes, end_ - offset_);
    v1::MemoryCopyChunk header;
    header.set_offset(offset_);
    grpc::Slice parts[2] = {
        grpc::Slice(EncodeChunkPrefix(header, n)),
        grpc::Slice(const_cast<char*>(data_ + offset_), n, &ReleaseHold,
                    new std::shared_ptr<const void>(hold_)),
    };
    message_ = grpc::ByteBuffer(parts, 2);
    offset_ += n;
    StartWrite(&message_);
  }

  const char* const data_;
  uint64_t offset_;
  const uint64_t end_;
  const std::shared_ptr<const void> hold_;
  const std::unique_ptr<StalledCallCanceller::Watch> watch_;
  grpc::ByteBuffer message_;
};

// The part [offset, offset + length) of a copy of `size` bytes a ReadMemoryCopyRequest asks
// for, as [begin, end); length 0 means to the end.
absl::StatusOr<std::pair<uint64_t, uint64_t>> RequestedRange(
    const v1::ReadMemoryCopyRequest& request, uint64_t size) {
  const uint64_t offset = request.offset();
  const uint64_t length =
      request.length() == 0 && offset <= size ? size - offset : request.length();
  if (offset > size || length > size - offset) {
    return absl::OutOfRangeError(
        absl::StrCat(length, " bytes at ", offset, " of a memory copy of ", size, " bytes"));
  }
  return std::make_pair(offset, offset + length);
}

// The streams of one client ReadMemoryCopy: the first error any of them meets is the read's,
// and ends the others at once (a part that can no longer complete the copy is not worth
// waiting for, however long the read's deadline).
class ReadGroup {
 public:
  // Before any stream starts.
  void Add(grpc::ClientContext* context) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    contexts_.push_back(context);
  }

  // The contexts must live until every stream is done (ReadMemoryCopy's wait).
  void Fail(absl::Status status) ABSL_LOCKS_EXCLUDED(mu_) {
    std::vector<grpc::ClientContext*> others;
    {
      absl::MutexLock lock(&mu_);
      if (!first_.ok()) return;  // a stream the first error ended, or a later error
      first_ = std::move(status);
      others = contexts_;
    }
    for (grpc::ClientContext* context : others) context->TryCancel();
  }

  absl::Status first() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return first_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<grpc::ClientContext*> contexts_ ABSL_GUARDED_BY(mu_);
  absl::Status first_ ABSL_GUARDED_BY(mu_);
};

// One ReadMemoryCopy stream of the client: chunks in order into `dest` (the copy's start).
class ReadStream final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  ReadStream(char* dest, uint64_t begin, uint64_t end, ReadGroup* group,
             absl::BlockingCounter* done)
      : dest_(dest), next_(begin), end_(end), group_(group), done_(done) {
    group_->Add(&context_);
  }

  void Start(grpc::GenericStub* stub, const v1::ReadMemoryCopyRequest& request,
             absl::Time deadline, const PeerCredential& credential) {
    context_.set_deadline(absl::ToChronoTime(deadline));
    // Without a nonce (no randomness) the call carries no proof and the holder refuses it.
    ProvePeerCall(&context_, credential, kReadMemoryCopyMethod).IgnoreError();
    grpc::Slice bytes(request.SerializeAsString());
    request_ = grpc::ByteBuffer(&bytes, 1);
    stub->PrepareBidiStreamingCall(&context_, kReadMemoryCopyMethod, grpc::StubOptions(), this);
    StartWriteLast(&request_, grpc::WriteOptions());
    StartRead(&chunk_);
    StartCall();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream ended: OnDone brings its status
    uint64_t length = 0;
    bool in_order = true;
    grpc::ProtoBufferReader reader(&chunk_);
    absl::Status decoded = DecodeChunk<v1::MemoryCopyChunk>(
        &reader, chunk_.Length(), [&](const v1::MemoryCopyChunk& header, uint64_t len) {
          length = len;
          in_order = header.offset() == next_ && len <= end_ - next_;
          return in_order ? DataPlacement{true, dest_ + next_, 0, len} : DataPlacement{};
        });
    if (decoded.ok() && !in_order) {
      decoded = absl::DataLossError(absl::StrCat("a chunk of ", length, " bytes came where bytes [",
                                                 next_, ", ", end_, ") were expected"));
    }
    if (!decoded.ok()) return group_->Fail(std::move(decoded));  // cancels this stream too
    next_ += length;
    chunk_.Clear();
    StartRead(&chunk_);
  }

  void OnDone(const grpc::Status& status) override {
    if (!status.ok()) {
      group_->Fail(FromGrpcStatus(status));
    } else if (next_ != end_) {
      group_->Fail(
          absl::DataLossError(absl::StrCat("the stream ended at byte ", next_, " of ", end_)));
    }
    done_->DecrementCount();  // may free this object: nothing after it
  }

 private:
  char* const dest_;
  uint64_t next_;
  const uint64_t end_;
  ReadGroup* const group_;
  absl::BlockingCounter* const done_;
  grpc::ClientContext context_;
  grpc::ByteBuffer request_;
  grpc::ByteBuffer chunk_;
};

}  // namespace

grpc::ServerReadReactor<v1::MemoryCopyChunk>* PeerMemoryService::PutMemoryCopy(
    grpc::CallbackServerContext* context, v1::PutMemoryCopyResponse* response) {
  // Refused before any chunk is read or any room reserved.
  if (absl::Status admitted = Admit(*context, kPutMemoryCopyMethod); !admitted.ok()) {
    return new RefusedReads<v1::MemoryCopyChunk>(admitted);
  }
  return new PutReactor(&job_id_, store_, response,
                        stalls_.Add(context, options_.put_stall,
                                    absl::StrCat("memory copy put from ", context->peer())));
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* PeerMemoryService::ReadMemoryCopy(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request_bytes) {
  auto fail = [](const absl::Status& status) {
    return new RefusedStream<grpc::ByteBuffer>(status);
  };
  // Refused before the request is looked at.
  if (absl::Status admitted = Admit(*context, kReadMemoryCopyMethod); !admitted.ok()) {
    return fail(admitted);
  }
  v1::ReadMemoryCopyRequest request;
  grpc::ByteBuffer bytes(*request_bytes);  // shares the slices
  grpc::ProtoBufferReader reader(&bytes);
  if (!request.ParseFromZeroCopyStream(&reader)) {
    return fail(absl::InvalidArgumentError("malformed ReadMemoryCopyRequest"));
  }
  absl::StatusOr<RequestedBytes> found = FindRequestedBytes(job_id_, *tier_, *store_, request);
  if (!found.ok()) return fail(found.status());
  return new ReadReactor(
      found->data, found->begin, found->end, std::move(found->hold),
      stalls_.Add(context, options_.read_stall,
                  absl::StrCat("read of the memory copy of ", request.file(), " of step ",
                               request.step(), " by ", context->peer())));
}

absl::Status PeerMemoryService::Admit(const grpc::CallbackServerContext& context,
                                      const char* method) {
  if (gate_ == nullptr) return absl::OkStatus();
  absl::Status admitted = gate_->Admit(context, method);
  if (!admitted.ok()) LogWarning("PeerMemory: ", context.peer(), ": ", admitted.message());
  return admitted;
}

absl::StatusOr<RequestedBytes> FindRequestedBytes(const std::string& job_id, const MemoryTier& tier,
                                                  const BuddyStore& store,
                                                  const v1::ReadMemoryCopyRequest& request) {
  if (request.job_id() != job_id) {
    return absl::FailedPreconditionError(
        absl::StrCat("this agent serves job ", job_id, ", not ", request.job_id()));
  }
  RequestedBytes out;
  uint64_t size = 0;
  ResidentView view = tier.Find(request.step(), request.session_id());
  if (auto it = view.files.find(request.file()); it != view.files.end() && !view.holds.empty()) {
    out.data = it->second.data;
    size = it->second.size;
    out.hold = view.holds.front();
  } else if (std::optional<HeldCopy> held =
                 store.Find(request.step(), request.session_id(), request.file())) {
    out.data = held->bytes->data();
    size = held->bytes->size();
    out.hold = std::move(held->bytes);
  } else {
    return absl::NotFoundError(absl::StrCat("no memory copy of ", request.file(), " of step ",
                                            request.step(), " (session ", request.session_id(),
                                            ") here"));
  }
  ASSIGN_OR_RETURN(const auto range, RequestedRange(request, size));
  out.begin = range.first;
  out.end = range.second;
  return out;
}

absl::StatusOr<std::shared_ptr<MemoryBuffer>> ReserveBuddyCopy(const std::string& job_id,
                                                               BuddyStore& store,
                                                               const std::string& job,
                                                               const v1::MemoryCopy& copy) {
  if (job != job_id) {
    return absl::FailedPreconditionError(
        absl::StrCat("this agent serves job ", job_id, ", not ", job));
  }
  return store.Reserve(copy);
}

std::vector<std::pair<uint64_t, uint64_t>> ReadParts(uint64_t nbytes, int streams) {
  const uint64_t chunks = (nbytes + kMemoryCopyChunkBytes - 1) / kMemoryCopyChunkBytes;
  const uint64_t most = static_cast<uint64_t>(std::max(streams, 1));
  const uint64_t chunks_per_part = std::max<uint64_t>(1, (chunks + most - 1) / most);
  // 5 chunks over 4 streams: parts of 2, 2 and 1 chunks, not a fourth part with none.
  const uint64_t n = std::max<uint64_t>(1, (chunks + chunks_per_part - 1) / chunks_per_part);
  std::vector<std::pair<uint64_t, uint64_t>> parts;
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t begin = i * chunks_per_part * kMemoryCopyChunkBytes;
    const uint64_t end = i + 1 == n ? nbytes : (i + 1) * chunks_per_part * kMemoryCopyChunkBytes;
    parts.emplace_back(begin, end);
  }
  return parts;
}

absl::Status SendMemoryCopy(const std::shared_ptr<grpc::Channel>& channel,
                            const PeerCredential& credential,
                            const v1::MemoryCopy& copy, const char* data, absl::Duration timeout,
                            const std::atomic<bool>* cancel,
                            const std::function<void()>& before_chunk) {
  v1::PeerMemory::Stub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  RETURN_IF_ERROR(ProvePeerCall(&context, credential, kPutMemoryCopyMethod));
  v1::PutMemoryCopyResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::MemoryCopyChunk>> writer =
      stub.PutMemoryCopy(&context, &response);
  v1::MemoryCopyChunk chunk;
  *chunk.mutable_copy() = copy;
  chunk.set_job_id(credential.job_id);
  uint64_t offset = 0;
  do {
    if (before_chunk) before_chunk();
    if (cancel != nullptr && cancel->load()) {
      context.TryCancel();
      break;
    }
    const uint64_t n = std::min(kMemoryCopyChunkBytes, copy.nbytes() - offset);
    chunk.set_offset(offset);
    chunk.set_data(data + offset, n);
    if (!writer->Write(chunk)) break;  // the status below says why
    chunk.clear_copy();
    chunk.clear_job_id();
    offset += n;
  } while (offset < copy.nbytes());
  writer->WritesDone();
  return FromGrpcStatus(writer->Finish());
}

std::vector<std::shared_ptr<grpc::Channel>> MemoryCopyChannels(
    const std::string& address, const std::shared_ptr<grpc::ChannelCredentials>& credentials,
    int streams) {
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int i = 0; i < streams; ++i) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // no connection shared between them
    args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
    args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 16 << 20);
    channels.push_back(grpc::CreateCustomChannel(address, credentials, args));
  }
  return channels;
}

absl::Status ReadMemoryCopy(const std::vector<std::shared_ptr<grpc::Channel>>& channels,
                            const PeerCredential& credential, const v1::MemoryCopy& copy,
                            char* dest,
                            absl::Duration timeout) {
  if (channels.empty()) return absl::InvalidArgumentError("no channel to read a memory copy over");
  const std::vector<std::pair<uint64_t, uint64_t>> parts =
      ReadParts(copy.nbytes(), static_cast<int>(channels.size()));
  const absl::Time deadline = absl::Now() + timeout;
  absl::BlockingCounter done(static_cast<int>(parts.size()));
  ReadGroup group;
  std::vector<std::unique_ptr<grpc::GenericStub>> stubs;
  std::vector<std::unique_ptr<ReadStream>> reads;  // every one in the group before any starts
  for (size_t i = 0; i < parts.size(); ++i) {
    stubs.push_back(std::make_unique<grpc::GenericStub>(channels[i]));
    reads.push_back(
        std::make_unique<ReadStream>(dest, parts[i].first, parts[i].second, &group, &done));
  }
  for (size_t i = 0; i < parts.size(); ++i) {
    const auto [begin, end] = parts[i];
    reads[i]->Start(stubs[i].get(), MemoryCopyReadRequest(credential.job_id, copy, begin, end),
                    deadline, credential);
  }
  done.Wait();
  return group.first();
}

}  // namespace tessera
