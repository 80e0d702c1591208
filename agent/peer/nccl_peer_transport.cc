#include "agent/peer/nccl_peer_transport.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "agent/peer/nccl_schedule.h"
#include "common/status.h"
#include "cuda_runtime_api.h"
#include "nccl.h"

namespace tessera {
namespace {

constexpr size_t kMaxCancelledRemembered = 1024;
constexpr size_t kHeaderWords = 3;  // PairHeader on the wire: count, bytes, fingerprint

absl::Status CudaError(cudaError_t err, absl::string_view what) {
  (void)cudaGetLastError();  // clear the sticky "last error"
  return absl::InternalError(
      absl::StrCat(what, ": ", cudaGetErrorName(err), ": ", cudaGetErrorString(err)));
}

absl::Status NcclError(ncclResult_t result, absl::string_view what, ncclComm_t comm) {
  std::string message = absl::StrCat(what, ": ", ncclGetErrorString(result));
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && last[0] != '\0') absl::StrAppend(&message, " (", last, ")");
  // System and remote errors are a peer or the network going away: retryable.
  if (result == ncclSystemError || result == ncclRemoteError) {
    return absl::UnavailableError(message);
  }
  return absl::InternalError(message);
}

absl::StatusOr<std::string> NewUniqueId() {
  ncclUniqueId id;
  const ncclResult_t result = ncclGetUniqueId(&id);
  if (result != ncclSuccess) return NcclError(result, "ncclGetUniqueId", nullptr);
  return std::string(id.internal, NCCL_UNIQUE_ID_BYTES);
}

}  // namespace

bool NcclAvailable() {
  static const bool available = [] {
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    int version = 0;
    return count > 0 && ncclGetVersion(&version) == ncclSuccess;
  }();
  return available;
}

// The GPU resources of one Exchange(): device, stream, bounce buffers, communicator. The
// destructor releases them; a communicator that failed (or whose call was cancelled) is
// aborted, which also stops its kernels.
class NcclPeerTransport::Run {
 public:
  Run(const NcclPeerTransport* transport, const std::string& session_id, absl::Time deadline)
      : transport_(transport), session_id_(session_id), deadline_(deadline) {}

  ~Run() {
    if (comm_ != nullptr) {
      bool clean = false;
      if (!failed_) {
        const ncclResult_t result = ncclCommFinalize(comm_);
        clean = (result == ncclSuccess || result == ncclInProgress) &&
                WaitComm("ncclCommFinalize").ok();
      }
      if (clean) {
        (void)ncclCommDestroy(comm_);
      } else {
        (void)ncclCommAbort(comm_);
      }
    }
    for (void* buffer : {meta_, send_bounce_, recv_bounce_}) {
      if (buffer != nullptr) (void)cudaFree(buffer);
    }
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
    (void)cudaGetLastError();
  }

  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;

  absl::Status Init(const NcclGroup& group, const NcclSchedule& schedule, int device) {
    RETURN_IF_ERROR(Cuda(cudaSetDevice(device), "cudaSetDevice"));
    RETURN_IF_ERROR(
        Cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate"));
    const size_t meta_bytes =
        2 * schedule.size * kHeaderWords * sizeof(uint64_t) + 2 * sizeof(int32_t);
    RETURN_IF_ERROR(Cuda(cudaMalloc(&meta_, meta_bytes), "cudaMalloc(headers)"));
    if (schedule.send_bounce_bytes > 0) {
      RETURN_IF_ERROR(
          Cuda(cudaMalloc(&send_bounce_, schedule.send_bounce_bytes), "cudaMalloc(send bounce)"));
    }
    if (schedule.recv_bounce_bytes > 0) {
      RETURN_IF_ERROR(
          Cuda(cudaMalloc(&recv_bounce_, schedule.recv_bounce_bytes), "cudaMalloc(recv bounce)"));
    }
    ncclUniqueId id;
    std::memcpy(id.internal, group.unique_id.data(), NCCL_UNIQUE_ID_BYTES);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // so that deadlines and cancellation reach a hung init
    const ncclResult_t result =
        ncclCommInitRankConfig(&comm_, schedule.size, id, schedule.self, &config);
    if (result != ncclSuccess && result != ncclInProgress) {
      failed_ = true;
      return NcclError(result, "ncclCommInitRankConfig", comm_);
    }
    return WaitComm("ncclCommInitRankConfig");
  }

  // Every pair compares what moves between them; every member gets the same verdict.
  absl::Status CheckHeaders(const NcclSchedule& schedule) {
    const int n = schedule.size;
    const size_t words = n * kHeaderWords;
    std::vector<uint64_t> host(2 * words, 0);
    for (int peer = 0; peer < n; ++peer) {
      const PairHeader& h = schedule.send_headers[peer];
      host[peer * kHeaderWords + 0] = h.count;
      host[peer * kHeaderWords + 1] = h.bytes;
      host[peer * kHeaderWords + 2] = h.fingerprint;
    }
    auto* dev = static_cast<uint64_t*>(meta_);
    RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(dev, host.data(), words * sizeof(uint64_t),
                                         cudaMemcpyHostToDevice, stream_),
                         "cudaMemcpyAsync(headers)"));
    RETURN_IF_ERROR(Nccl(ncclGroupStart(), "ncclGroupStart"));
    for (int peer = 0; peer < n; ++peer) {
      if (peer == schedule.self) continue;
      RETURN_IF_ERROR(Nccl(ncclSend(dev + peer * kHeaderWords, kHeaderWords * sizeof(uint64_t),
                                    ncclUint8, peer, comm_, stream_),
                           "ncclSend(header)"));
      RETURN_IF_ERROR(Nccl(ncclRecv(dev + words + peer * kHeaderWords,
                                    kHeaderWords * sizeof(uint64_t), ncclUint8, peer, comm_,
                                    stream_),
                           "ncclRecv(header)"));
    }
    RETURN_IF_ERROR(GroupEnd());
    RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(host.data() + words, dev + words,
                                         words * sizeof(uint64_t), cudaMemcpyDeviceToHost,
                                         stream_),
                         "cudaMemcpyAsync(headers)"));
    RETURN_IF_ERROR(WaitStream("header exchange"));

    absl::Status mismatch = absl::OkStatus();
    for (int peer = 0; peer < n && mismatch.ok(); ++peer) {
      if (peer == schedule.self) continue;
      PairHeader got;
      got.count = host[words + peer * kHeaderWords + 0];
      got.bytes = host[words + peer * kHeaderWords + 1];
      got.fingerprint = host[words + peer * kHeaderWords + 2];
      const PairHeader& want = schedule.recv_headers[peer];
      if (got != want) {
        mismatch = absl::InvalidArgumentError(absl::StrCat(
            "communicator rank ", peer, " sends ", got.count, " slice(s) of ", got.bytes,
            " bytes (fingerprint ", got.fingerprint, "); this leader expects ", want.count,
            " slice(s) of ", want.bytes, " bytes (fingerprint ", want.fingerprint, ")"));
      }
    }
    int32_t verdict = mismatch.ok() ? 1 : 0;
    auto* flag = reinterpret_cast<int32_t*>(dev + 2 * words);
    RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(flag, &verdict, sizeof(verdict), cudaMemcpyHostToDevice,
                                         stream_),
                         "cudaMemcpyAsync(verdict)"));
    RETURN_IF_ERROR(
        Nccl(ncclAllReduce(flag, flag, 1, ncclInt32, ncclMin, comm_, stream_), "ncclAllReduce"));
    RETURN_IF_ERROR(WaitComm("ncclAllReduce"));
    RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(&verdict, flag, sizeof(verdict), cudaMemcpyDeviceToHost,
                                         stream_),
                         "cudaMemcpyAsync(verdict)"));
    RETURN_IF_ERROR(WaitStream("verdict"));
    if (!mismatch.ok()) return mismatch;
    if (verdict == 0) {
      return absl::InvalidArgumentError(
          "another member of the gather group found that its slices disagree with a sender's");
    }
    return absl::OkStatus();
  }

  absl::Status MoveData(const NcclSchedule& schedule) {
    auto* send_bounce = static_cast<char*>(send_bounce_);
    auto* recv_bounce = static_cast<char*>(recv_bounce_);
    for (const NcclRound& round : schedule.rounds) {
      for (const NcclOp& op : round.ops) {
        if (!op.send) continue;
        RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(send_bounce + op.bounce_offset, op.host, op.nbytes,
                                             cudaMemcpyHostToDevice, stream_),
                             "cudaMemcpyAsync(staging to bounce)"));
      }
      RETURN_IF_ERROR(Nccl(ncclGroupStart(), "ncclGroupStart"));
      for (const NcclOp& op : round.ops) {
        if (op.send) {
          RETURN_IF_ERROR(Nccl(ncclSend(send_bounce + op.bounce_offset, op.nbytes, ncclUint8,
                                        op.peer, comm_, stream_),
                               "ncclSend"));
        } else {
          RETURN_IF_ERROR(Nccl(ncclRecv(recv_bounce + op.bounce_offset, op.nbytes, ncclUint8,
                                        op.peer, comm_, stream_),
                               "ncclRecv"));
        }
      }
      RETURN_IF_ERROR(GroupEnd());
      for (const NcclOp& op : round.ops) {
        if (op.send) continue;
        RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(op.host, recv_bounce + op.bounce_offset, op.nbytes,
                                             cudaMemcpyDeviceToHost, stream_),
                             "cudaMemcpyAsync(bounce to staging)"));
      }
      // The next round reuses the bounce buffers; waiting here also bounds queued work so a
      // deadline or cancellation is noticed within one round.
      RETURN_IF_ERROR(WaitStream("data round"));
    }
    return absl::OkStatus();
  }

 private:
  absl::Status Cuda(cudaError_t err, absl::string_view what) {
    if (err == cudaSuccess) return absl::OkStatus();
    failed_ = true;
    return CudaError(err, what);
  }

  absl::Status Nccl(ncclResult_t result, absl::string_view what) {
    if (result == ncclSuccess || result == ncclInProgress) return absl::OkStatus();
    failed_ = true;
    return NcclError(result, what, comm_);
  }

  absl::Status GroupEnd() {
    RETURN_IF_ERROR(Nccl(ncclGroupEnd(), "ncclGroupEnd"));
    return WaitComm("ncclGroupEnd");
  }

  // The deadline and cancellation checks shared by the waits.
  absl::Status CheckInterrupt(absl::string_view what) {
    if (transport_->Cancelled(session_id_)) {
      failed_ = true;
      return absl::AbortedError(absl::StrCat("session ", session_id_, " was cancelled during ", what));
    }
    if (absl::Now() >= deadline_) {
      failed_ = true;
      return absl::DeadlineExceededError(
          absl::StrCat("session ", session_id_, ": ", what, " did not finish in time"));
    }
    return absl::OkStatus();
  }

  // Until the communicator has no operation in progress (non-blocking mode).
  absl::Status WaitComm(absl::string_view what) {
    while (true) {
      ncclResult_t state = ncclSuccess;
      RETURN_IF_ERROR(Nccl(ncclCommGetAsyncError(comm_, &state), "ncclCommGetAsyncError"));
      if (state == ncclSuccess) return absl::OkStatus();
      if (state != ncclInProgress) {
        failed_ = true;
        return NcclError(state, what, comm_);
      }
      RETURN_IF_ERROR(CheckInterrupt(what));
      transport_->Pause(session_id_);
    }
  }

  // Until everything queued on the stream ran, watching NCCL for asynchronous errors.
  absl::Status WaitStream(absl::string_view what) {
    while (true) {
      ncclResult_t state = ncclSuccess;
      RETURN_IF_ERROR(Nccl(ncclCommGetAsyncError(comm_, &state), "ncclCommGetAsyncError"));
      if (state != ncclSuccess && state != ncclInProgress) {
        failed_ = true;
        return NcclError(state, what, comm_);
      }
      const cudaError_t query = cudaStreamQuery(stream_);
      if (query == cudaSuccess) return absl::OkStatus();
      if (query != cudaErrorNotReady) return Cuda(query, what);
      RETURN_IF_ERROR(CheckInterrupt(what));
      transport_->Pause(session_id_);
    }
  }

  const NcclPeerTransport* const transport_;
  const std::string session_id_;
  const absl::Time deadline_;
  bool failed_ = false;
  cudaStream_t stream_ = nullptr;
  void* meta_ = nullptr;  // headers and the verdict flag
  void* send_bounce_ = nullptr;
  void* recv_bounce_ = nullptr;
  ncclComm_t comm_ = nullptr;
};

NcclPeerTransport::NcclPeerTransport(NcclPeerTransportOptions options)
    : options_(std::move(options)) {}

absl::Status NcclPeerTransport::Exchange(const std::string& session_id,
                                         absl::Span<const SliceSend> sends,
                                         absl::Span<const SliceRecv> recvs, absl::Time deadline) {
  if (!NcclAvailable()) {
    return absl::FailedPreconditionError("NCCL transport: no CUDA device is available");
  }
  if (!options_.broker) return absl::FailedPreconditionError("NCCL transport: no group broker");
  RETURN_IF_ERROR(ValidateExchange(options_.rank, sends, recvs));
  if (Cancelled(session_id)) {
    return absl::AbortedError(absl::StrCat("session ", session_id, " was cancelled"));
  }
  ASSIGN_OR_RETURN(NcclGroup group, options_.broker(session_id, NewUniqueId, deadline));
  if (group.unique_id.size() != NCCL_UNIQUE_ID_BYTES) {
    return absl::InvalidArgumentError(absl::StrCat("the gather group's NCCL id has ",
                                                   group.unique_id.size(), " bytes, not ",
                                                   NCCL_UNIQUE_ID_BYTES));
  }
  ASSIGN_OR_RETURN(NcclSchedule schedule,
                   BuildNcclSchedule(options_.rank, group.member_ranks, sends, recvs,
                                     options_.chunk_bytes));
  if (schedule.size == 1) return absl::OkStatus();  // a group of one moves nothing
  Run run(this, session_id, deadline);
  RETURN_IF_ERROR(run.Init(group, schedule, options_.device));
  RETURN_IF_ERROR(run.CheckHeaders(schedule));
  return run.MoveData(schedule);
}

void NcclPeerTransport::CancelSession(const std::string& session_id) {
  absl::MutexLock lock(&mu_);
  if (cancelled_.insert(session_id).second) {
    cancelled_order_.push_back(session_id);
    if (cancelled_order_.size() > kMaxCancelledRemembered) {
      cancelled_.erase(cancelled_order_.front());
      cancelled_order_.pop_front();
    }
  }
}

bool NcclPeerTransport::Cancelled(const std::string& session_id) const {
  absl::MutexLock lock(&mu_);
  return cancelled_.count(session_id) > 0;
}

void NcclPeerTransport::Pause(const std::string& session_id) const {
  absl::MutexLock lock(&mu_);
  auto cancelled = [this, &session_id]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return cancelled_.count(session_id) > 0;
  };
  mu_.AwaitWithTimeout(absl::Condition(&cancelled), options_.poll_interval);
}

}  // namespace tessera
