#include "agent/peer/grpc_peer_transport.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "agent/peer/chunk_codec.h"
#include "agent/peer/slice_receive.h"
#include "common/grpc_reactors.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "common/peer_call_proof.h"
#include "common/status.h"
#include "common/tcp_socket.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/support/channel_arguments.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "grpcpp/support/server_callback.h"
#include "grpcpp/support/client_callback.h"

namespace tessera {
namespace {

// Room for a chunk's header next to its data in one message.
constexpr int kHeaderAllowance = 64 << 10;

std::string StreamSliceId(const v1::SliceChunk& h) {
  return absl::StrCat(h.session_id(), "\n", h.key(), "\n",
                      BoxToString(BoxFromProto(h.box())), "\n", h.from_rank(), "\n",
                      h.range().begin());
}

}  // namespace

PeerResolver StaticPeerResolver(std::map<uint32_t, std::string> addresses) {
  return [addresses = std::move(addresses)](const std::string& session_id,
                                            uint32_t rank) -> absl::StatusOr<std::string> {
    auto it = addresses.find(rank);
    if (it == addresses.end()) {
      return absl::NotFoundError(
          absl::StrCat("no peer address for rank ", rank, " in session ", session_id));
    }
    return it->second;
  };
}

std::string AdvertisedPeerAddress(const std::string& peer_host,
                                  const std::string& listen_address, int port,
                                  const std::string& hostname) {
  std::string host = UnbracketHost(peer_host);
  if (host.empty()) {
    absl::StatusOr<std::pair<std::string, std::string>> listen = SplitHostPort(listen_address);
    const std::string listen_host = listen.ok() ? listen->first : "";
    const bool wildcard = listen_host.empty() || listen_host == "0.0.0.0" ||
                          listen_host == "::" || listen_host == "*" ||
                          listen_host == "0:0:0:0:0:0:0:0";
    host = wildcard ? hostname : listen_host;
  }
  return JoinHostPort(host, absl::StrCat(port));
}

// ---------------------------------------------------------------------------------------------
// Receiving side.

// One PushSlices stream. The "driver" (Process/EndOfStream) runs on gRPC's callback threads or,
// for a stream parked until its session is expected, on the thread that calls
// SliceInbox::Expect()/Cancel(). process_mu_ serialises drivers, and OnDone takes it before
// deleting the reactor, so a driver still unwinding after Finish() never touches freed memory.
// Finish() is called exactly once: by a driver, or by whoever withdraws a parked stream with
// SliceInbox::Unpark() (exclusive by construction).
class GrpcPeerTransport::PushReactor : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  PushReactor(SliceInbox* inbox, grpc::ByteBuffer* response)
      : inbox_(inbox), response_(response) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    std::lock_guard<std::mutex> lock(process_mu_);
    if (ok) {
      ProcessLocked();
    } else {
      EndOfStreamLocked();  // the sender half-closed (or the call was cancelled)
    }
  }

  void OnCancel() override {
    cancelled_.store(true);
    if (inbox_->Unpark(this)) Finish(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
  }

  void OnDone() override {
    { std::lock_guard<std::mutex> lock(process_mu_); }
    delete this;
  }

 private:
  struct StreamSlice {
    uint64_t delivered_to = 0;  // end of the last chunk this stream delivered
    uint64_t nbytes = 0;
  };

  void Resume() {
    std::lock_guard<std::mutex> lock(process_mu_);
    ProcessLocked();
  }

  // Handles request_, then reads the next message, parks, or finishes.
  void ProcessLocked() {
    ReceivedSliceChunk received;
    {
      grpc::ProtoBufferReader reader(&request_);
      received = ReceiveSliceChunk(&reader, request_.Length(), *inbox_, this, [this] { Resume(); });
    }
    if (!received.decoded.ok()) {
      FinishLocked(ToGrpcStatus(received.decoded));
      return;
    }
    const SliceInbox::Admission& admission = received.admission;
    const v1::SliceChunk& header = received.header;
    const uint64_t data_len = received.data_len;
    switch (admission.kind) {
      case SliceInbox::Admission::Kind::kParked:
        // Resume() runs when the session is expected or cancelled; a cancellation that raced
        // with parking is caught here or by OnCancel (whichever unparks).
        if (cancelled_.load() && inbox_->Unpark(this)) {
          FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
        }
        return;
      case SliceInbox::Admission::Kind::kSessionDone:
        FinishLocked(grpc::Status::OK);
        return;
      case SliceInbox::Admission::Kind::kRejected:
        FinishLocked(ToGrpcStatus(admission.status));
        return;
      case SliceInbox::Admission::Kind::kWrite: {
        bytes_received_ += admission.write_bytes;
        StreamSlice& slice = slices_[StreamSliceId(header)];
        slice.nbytes = header.slice_nbytes();
        slice.delivered_to = std::max(slice.delivered_to, header.offset() + data_len);
        request_.Clear();
        StartRead(&request_);
        return;
      }
    }
  }

  void EndOfStreamLocked() {
    for (const auto& [id, slice] : slices_) {
      if (slice.delivered_to < slice.nbytes) {
        FinishLocked(grpc::Status(
            grpc::StatusCode::INVALID_ARGUMENT,
            absl::StrCat("the stream ended after ", slice.delivered_to, " of ", slice.nbytes,
                         " bytes of a slice")));
        return;
      }
    }
    FinishLocked(grpc::Status::OK);
  }

  void FinishLocked(const grpc::Status& status) {
    if (status.ok()) {
      v1::PushSlicesResponse response;
      response.set_bytes_received(bytes_received_);
      uint32_t completed = 0;
      for (const auto& [id, slice] : slices_) completed += slice.delivered_to >= slice.nbytes;
      response.set_slices_completed(completed);
      const std::string bytes = response.SerializeAsString();
      grpc::Slice slice(bytes);
      *response_ = grpc::ByteBuffer(&slice, 1);
    }
    Finish(status);
  }

  SliceInbox* const inbox_;
  grpc::ByteBuffer* const response_;
  std::atomic<bool> cancelled_{false};
  std::mutex process_mu_;
  // Guarded by process_mu_ (std::mutex: see the class comment on destruction).
  grpc::ByteBuffer request_;
  std::map<std::string, StreamSlice> slices_;
  uint64_t bytes_received_ = 0;
};

class GrpcPeerTransport::Service
    : public v1::Peer::WithRawCallbackMethod_PushSlices<v1::Peer::Service> {
 public:
  Service(SliceInbox* inbox, const PeerKeyring* keyring)
      : inbox_(inbox), gate_(keyring != nullptr ? std::make_unique<PeerCallGate>(keyring) : nullptr) {}

  grpc::ServerReadReactor<grpc::ByteBuffer>* PushSlices(grpc::CallbackServerContext* context,
                                                        grpc::ByteBuffer* response) override {
    // A sender that does not prove it is of the job gets nothing of the inbox: no chunk read.
    if (gate_ != nullptr) {
      if (absl::Status admitted = gate_->Admit(*context, kPushSlicesMethod); !admitted.ok()) {
        LogWarning("Peer port: ", context->peer(), ": ", admitted.message());
        return new RefusedReads<grpc::ByteBuffer>(admitted);
      }
    }
    return new PushReactor(inbox_, response);
  }

 private:
  SliceInbox* const inbox_;
  const std::unique_ptr<PeerCallGate> gate_;  // null: calls not checked
};

// ---------------------------------------------------------------------------------------------
// Sending side.

// The streams of one Exchange() call: their completion, the first error, cancellation, and
// the references gRPC holds to the caller's staging.
class GrpcPeerTransport::SendGroup {
 public:
  SendGroup(SliceInbox* inbox, std::string session_id)
      : inbox_(inbox), session_id_(std::move(session_id)) {}

  const std::string& session_id() const { return session_id_; }

  // Registers a stream about to start; true if it must be cancelled right after starting.
  bool Add(PushStream* stream) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    streams_.push_back(stream);
    ++running_;
    return cancelling_;
  }

  // A stream's OnDone. The last thing a stream does.
  void StreamDone(const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (!status.ok() && first_error_.ok()) {
      first_error_ = status;
      // Wake the Exchange() waiting for its receives: the call has failed.
      inbox_->Fail(session_id_, status);
    }
    --running_;
  }

  // Records `reason` (if nothing failed before) and cancels every stream.
  void CancelAll(const absl::Status& reason) ABSL_LOCKS_EXCLUDED(mu_);

  bool cancelling() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return cancelling_;
  }

  // Blocks until every stream is done; returns the first error (OK if none).
  absl::Status WaitStreams() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](int* running) { return *running == 0; }, &running_));
    return first_error_;
  }

  // gRPC's references to staging (external slices).
  void AcquireRef() ABSL_LOCKS_EXCLUDED(refs_mu_) {
    absl::MutexLock lock(&refs_mu_);
    ++refs_;
  }
  static void ReleaseRef(void* group) {
    auto* self = static_cast<SendGroup*>(group);
    absl::MutexLock lock(&self->refs_mu_);
    --self->refs_;
  }
  void WaitRefsReleased() ABSL_LOCKS_EXCLUDED(refs_mu_) {
    absl::MutexLock lock(&refs_mu_);
    refs_mu_.Await(absl::Condition(+[](int64_t* refs) { return *refs == 0; }, &refs_));
  }

 private:
  SliceInbox* const inbox_;
  const std::string session_id_;

  mutable absl::Mutex mu_;
  std::vector<PushStream*> streams_ ABSL_GUARDED_BY(mu_);
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  bool cancelling_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);

  absl::Mutex refs_mu_;
  int64_t refs_ ABSL_GUARDED_BY(refs_mu_) = 0;
};

// One PushSlices stream to one leader. Writes run on gRPC's callback threads, one at a time.
class GrpcPeerTransport::PushStream
    : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  PushStream(SendGroup* group, uint32_t self_rank, uint32_t leader_rank, std::string address,
             std::vector<const SliceSend*> slices, uint64_t chunk_bytes)
      : group_(group),
        self_rank_(self_rank),
        leader_rank_(leader_rank),
        address_(std::move(address)),
        slices_(std::move(slices)),
        chunk_bytes_(chunk_bytes) {}

  void Start(grpc::GenericStub* stub, absl::Time deadline, const PeerCredential& credential) {
    context_.set_deadline(absl::ToChronoTime(deadline));
    // Without a nonce (no randomness) the call carries no proof and the leader refuses it.
    ProvePeerCall(&context_, credential, kPushSlicesMethod).IgnoreError();
    stub->PrepareBidiStreamingCall(&context_, kPushSlicesMethod, grpc::StubOptions(), this);
    StartRead(&response_);
    WriteNext();
    StartCall();
  }

  // Thread-safe; harmless once the call is over.
  void Cancel() { context_.TryCancel(); }

  void OnWriteDone(bool ok) override {
    if (ok) WriteNext();  // else the call is failing: OnDone brings its status
  }

  void OnReadDone(bool /*ok*/) override {}

  void OnDone(const grpc::Status& status) override {
    absl::Status result = absl::OkStatus();
    if (!status.ok()) {
      const std::string where = absl::StrCat("pushing slices to rank ", leader_rank_, " at ",
                                             address_, ": ");
      if (status.error_code() == grpc::StatusCode::CANCELLED) {
        result = absl::AbortedError(absl::StrCat(
            where, group_->cancelling() ? "cancelled here" : "the leader cancelled the stream"));
      } else {
        result = absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                              absl::StrCat(where, status.error_message()));
      }
    }
    group_->StreamDone(result);  // may free this object: nothing after it
  }

 private:
  void WriteNext() {
    if (slice_index_ == slices_.size()) {
      StartWritesDone();
      return;
    }
    const SliceSend& slice = *slices_[slice_index_];
    if (offset_ == 0) {
      header_.Clear();
      header_.set_session_id(group_->session_id());
      header_.set_key(slice.key);
      *header_.mutable_box() = BoxToProto(slice.box);
      header_.set_from_rank(self_rank_);
      header_.mutable_range()->set_begin(slice.begin);
      header_.mutable_range()->set_end(slice.end);
      header_.set_slice_nbytes(slice.nbytes);
    }
    const uint64_t len = std::min<uint64_t>(chunk_bytes_, slice.nbytes - offset_);
    header_.set_offset(offset_);
    const std::string prefix = EncodeChunkPrefix(header_, len);
    group_->AcquireRef();
    grpc::Slice parts[2] = {
        grpc::Slice(prefix),
        // Zero-copy: gRPC reads staging directly and calls ReleaseRef when done with it.
        grpc::Slice(const_cast<char*>(static_cast<const char*>(slice.data)) + offset_, len,
                    &SendGroup::ReleaseRef, group_),
    };
    request_ = grpc::ByteBuffer(parts, 2);
    offset_ += len;
    if (offset_ == slice.nbytes) {
      ++slice_index_;
      offset_ = 0;
    }
    StartWrite(&request_);
  }

  SendGroup* const group_;
  const uint32_t self_rank_;
  const uint32_t leader_rank_;
  const std::string address_;
  const std::vector<const SliceSend*> slices_;
  const uint64_t chunk_bytes_;

  grpc::ClientContext context_;
  grpc::ByteBuffer response_;
  // Used only by the write chain (one write in flight at a time).
  grpc::ByteBuffer request_;
  v1::SliceChunk header_;
  size_t slice_index_ = 0;
  uint64_t offset_ = 0;
};

void GrpcPeerTransport::SendGroup::CancelAll(const absl::Status& reason) {
  absl::MutexLock lock(&mu_);
  if (first_error_.ok()) first_error_ = reason;
  cancelling_ = true;
  for (PushStream* stream : streams_) stream->Cancel();
}

// ---------------------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<GrpcPeerTransport>> GrpcPeerTransport::Create(
    GrpcPeerTransportOptions options) {
  if (!options.resolve_peer) {
    return absl::InvalidArgumentError("GrpcPeerTransport needs a peer resolver");
  }
  if (options.chunk_bytes == 0 ||
      options.chunk_bytes + kHeaderAllowance >
          static_cast<uint64_t>(std::max(options.max_receive_message_bytes, 0))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk_bytes ", options.chunk_bytes, " must be > 0 and leave ", kHeaderAllowance,
        " bytes of header room under max_receive_message_bytes ",
        options.max_receive_message_bytes));
  }
  std::unique_ptr<GrpcPeerTransport> transport(new GrpcPeerTransport(std::move(options)));
  const GrpcPeerTransportOptions& opts = transport->options_;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(
      opts.listen_address,
      opts.server_credentials ? opts.server_credentials : grpc::InsecureServerCredentials(),
      &transport->port_);
  builder.RegisterService(transport->service_.get());
  for (grpc::Service* service : opts.extra_services) builder.RegisterService(service);
  builder.SetMaxReceiveMessageSize(opts.max_receive_message_bytes);
  transport->server_ = builder.BuildAndStart();
  if (transport->server_ == nullptr || transport->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve the Peer service on ", opts.listen_address));
  }
  return transport;
}

GrpcPeerTransport::GrpcPeerTransport(GrpcPeerTransportOptions options)
    : options_(std::move(options)),
      inbox_(options_.inbox),
      service_(std::make_unique<Service>(&inbox_, options_.keyring)) {}

GrpcPeerTransport::~GrpcPeerTransport() {
  // Cancels in-flight streams (parked ones are withdrawn in OnCancel) and waits for every
  // reactor's OnDone, so nothing uses the inbox afterwards.
  if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now());
}

absl::Status GrpcPeerTransport::Exchange(const std::string& session_id,
                                         absl::Span<const SliceSend> sends,
                                         absl::Span<const SliceRecv> recvs, absl::Time deadline) {
  RETURN_IF_ERROR(ValidateExchange(options_.rank, sends, recvs));
  std::map<uint32_t, std::vector<const SliceSend*>> by_leader;
  for (const SliceSend& send : sends) {
    if (send.nbytes > 0) by_leader[send.leader_rank].push_back(&send);
  }
  std::map<uint32_t, std::string> addresses;
  for (const auto& [leader, unused] : by_leader) {
    ASSIGN_OR_RETURN(addresses[leader], options_.resolve_peer(session_id, leader));
  }
  // Expect before sending: a peer that is waiting for our slices may be sending us its own.
  RETURN_IF_ERROR(inbox_.Expect(session_id, recvs));

  SendGroup group(&inbox_, session_id);
  std::vector<std::unique_ptr<grpc::GenericStub>> stubs;
  std::vector<std::unique_ptr<PushStream>> streams;
  {
    absl::MutexLock lock(&mu_);
    sending_.emplace(session_id, &group);
  }
  grpc::ChannelArguments args;
  // A private subchannel: dropping the channel closes its connection, which releases any
  // reference the transport still holds to staging.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // No retries: a retry buffer would hold (copies of) staging bytes for nothing.
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  const std::shared_ptr<grpc::ChannelCredentials> credentials =
      options_.channel_credentials ? options_.channel_credentials
                                   : grpc::InsecureChannelCredentials();
  for (auto& [leader, slices] : by_leader) {
    stubs.push_back(std::make_unique<grpc::GenericStub>(
        grpc::CreateCustomChannel(addresses[leader], credentials, args)));
    streams.push_back(std::make_unique<PushStream>(&group, options_.rank, leader,
                                                   addresses[leader], std::move(slices),
                                                   options_.chunk_bytes));
    const bool cancel = group.Add(streams.back().get());
    streams.back()->Start(stubs.back().get(), deadline,
                          options_.keyring != nullptr ? options_.keyring->Get() : PeerCredential{});
    if (cancel) streams.back()->Cancel();
  }

  const absl::Status received = inbox_.Wait(session_id, deadline);
  if (!received.ok()) group.CancelAll(received);
  const absl::Status sent = group.WaitStreams();
  {
    absl::MutexLock lock(&mu_);
    for (auto it = sending_.lower_bound(session_id);
         it != sending_.end() && it->first == session_id; ++it) {
      if (it->second == &group) {
        sending_.erase(it);
        break;
      }
    }
  }
  streams.clear();
  stubs.clear();  // the last references to the channels
  group.WaitRefsReleased();
  // The first error in time: a failed push wakes the receive wait with the same status.
  return sent.ok() ? received : sent;
}

void GrpcPeerTransport::CancelSession(const std::string& session_id) {
  inbox_.Cancel(session_id);
  absl::MutexLock lock(&mu_);
  for (auto it = sending_.lower_bound(session_id);
       it != sending_.end() && it->first == session_id; ++it) {
    it->second->CancelAll(absl::AbortedError(absl::StrCat("session ", session_id, " was cancelled")));
  }
}

}  // namespace tessera
