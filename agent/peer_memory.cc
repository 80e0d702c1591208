#include "agent/peer_memory.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/status.h"

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

// PutMemoryCopy: chunks in order into a reserved buffer, kept once the last byte is in.
class PutReactor final : public grpc::ServerReadReactor<v1::MemoryCopyChunk> {
 public:
  PutReactor(const std::string* job_id, BuddyStore* store, v1::PutMemoryCopyResponse* response)
      : job_id_(job_id), store_(store), response_(response) {
    StartRead(&chunk_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the sender closed the stream
      if (buffer_ == nullptr) return Fail(absl::InvalidArgumentError("no memory copy was sent"));
      if (received_ != copy_.nbytes()) {
        return Fail(absl::InvalidArgumentError(absl::StrCat(
            "the memory copy of ", copy_.file(), " ended after ", received_, " of ",
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
      if (chunk_.job_id() != *job_id_) {
        return Fail(absl::FailedPreconditionError(absl::StrCat(
            "this agent serves job ", *job_id_, ", not ", chunk_.job_id())));
      }
      copy_ = chunk_.copy();
      absl::StatusOr<std::shared_ptr<MemoryBuffer>> buffer = store_->Reserve(copy_);
      if (!buffer.ok()) return Fail(buffer.status());
      buffer_ = *std::move(buffer);
    }
    if (!AppendInOrder(chunk_, copy_.nbytes(), *buffer_, &received_)) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          "chunk of ", chunk_.data().size(), " bytes at ", chunk_.offset(),
          " of the memory copy of ", copy_.file(), ": expected bytes from ", received_, " of ",
          copy_.nbytes())));
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
      store_->Abandon(copy_.writer_rank());
      buffer_.reset();
    }
  }

  const std::string* const job_id_;
  BuddyStore* const store_;
  v1::PutMemoryCopyResponse* const response_;
  v1::MemoryCopyChunk chunk_;
  v1::MemoryCopy copy_;
  std::shared_ptr<MemoryBuffer> buffer_;  // set once room is reserved
  uint64_t received_ = 0;
  bool kept_ = false;
};

// ReadMemoryCopy: the bytes in chunks, holding them until the stream is done.
class ReadReactor final : public grpc::ServerWriteReactor<v1::MemoryCopyChunk> {
 public:
  // Fails with `error` unless it is OK; else streams `size` bytes at `data`.
  ReadReactor(absl::Status error, const char* data, uint64_t size,
              std::shared_ptr<const void> hold)
      : data_(data), size_(size), hold_(std::move(hold)) {
    if (!error.ok()) {
      Finish(ToGrpcStatus(error));
      return;
    }
    WriteNext();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the reader went away"));
      return;
    }
    WriteNext();
  }

  void OnDone() override { delete this; }

 private:
  void WriteNext() {
    if (offset_ >= size_) {
      Finish(grpc::Status::OK);
      return;
    }
    const uint64_t n = std::min(kMemoryCopyChunkBytes, size_ - offset_);
    chunk_.Clear();
    chunk_.set_offset(offset_);
    chunk_.set_data(data_ + offset_, n);
    offset_ += n;
    StartWrite(&chunk_);
  }

  const char* const data_;
  const uint64_t size_;
  const std::shared_ptr<const void> hold_;
  uint64_t offset_ = 0;
  v1::MemoryCopyChunk chunk_;
};

}  // namespace

grpc::ServerReadReactor<v1::MemoryCopyChunk>* PeerMemoryService::PutMemoryCopy(
    grpc::CallbackServerContext* /*context*/, v1::PutMemoryCopyResponse* response) {
  return new PutReactor(&job_id_, store_, response);
}

grpc::ServerWriteReactor<v1::MemoryCopyChunk>* PeerMemoryService::ReadMemoryCopy(
    grpc::CallbackServerContext* /*context*/, const v1::ReadMemoryCopyRequest* request) {
  if (request->job_id() != job_id_) {
    return new ReadReactor(absl::FailedPreconditionError(absl::StrCat(
                               "this agent serves job ", job_id_, ", not ", request->job_id())),
                           nullptr, 0, nullptr);
  }
  // This agent's own copy, else one it holds as a buddy.
  ResidentView view = tier_->Find(request->step(), request->session_id());
  if (auto it = view.files.find(request->file()); it != view.files.end()) {
    std::shared_ptr<const void> hold = view.holds.empty() ? nullptr : view.holds.front();
    return new ReadReactor(absl::OkStatus(), it->second.data, it->second.size, std::move(hold));
  }
  if (std::optional<HeldCopy> held =
          store_->Find(request->step(), request->session_id(), request->file())) {
    const char* data = held->bytes->data();
    const uint64_t size = held->bytes->size();
    return new ReadReactor(absl::OkStatus(), data, size, std::move(held->bytes));
  }
  return new ReadReactor(absl::NotFoundError(absl::StrCat(
                             "no memory copy of ", request->file(), " of step ", request->step(),
                             " (session ", request->session_id(), ") here")),
                         nullptr, 0, nullptr);
}

absl::Status SendMemoryCopy(const std::shared_ptr<grpc::Channel>& channel,
                            const std::string& job, const v1::MemoryCopy& copy, const char* data,
                            absl::Duration timeout, const std::atomic<bool>* cancel,
                            const std::function<void()>& before_chunk) {
  v1::PeerMemory::Stub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  v1::PutMemoryCopyResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::MemoryCopyChunk>> writer =
      stub.PutMemoryCopy(&context, &response);
  v1::MemoryCopyChunk chunk;
  *chunk.mutable_copy() = copy;
  chunk.set_job_id(job);
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

absl::StatusOr<std::shared_ptr<const MemoryBuffer>> ReadMemoryCopy(
    const std::shared_ptr<grpc::Channel>& channel, const std::string& job,
    const v1::MemoryCopy& copy, absl::Duration timeout) {
  v1::PeerMemory::Stub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  v1::ReadMemoryCopyRequest request;
  request.set_job_id(job);
  request.set_step(copy.step());
  request.set_session_id(copy.session_id());
  request.set_file(copy.file());
  std::unique_ptr<grpc::ClientReader<v1::MemoryCopyChunk>> reader =
      stub.ReadMemoryCopy(&context, request);
  auto buffer = std::make_shared<MemoryBuffer>(copy.nbytes());
  uint64_t received = 0;
  v1::MemoryCopyChunk chunk;
  bool in_order = true;
  while (reader->Read(&chunk)) {
    if (!AppendInOrder(chunk, copy.nbytes(), *buffer, &received)) {
      in_order = false;
      context.TryCancel();
      break;
    }
  }
  const absl::Status status = FromGrpcStatus(reader->Finish());
  if (!in_order || (status.ok() && received != copy.nbytes())) {
    return absl::DataLossError(absl::StrCat("the memory copy of ", copy.file(), " from rank ",
                                            copy.rank(), " came with ", received, " of ",
                                            copy.nbytes(), " bytes, or out of order"));
  }
  RETURN_IF_ERROR(status);
  return std::shared_ptr<const MemoryBuffer>(std::move(buffer));
}

}  // namespace tessera
