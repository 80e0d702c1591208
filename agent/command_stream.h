// CommandStream: keeps the agent's Coordinator.Commands stream open and hands each command
// to a callback. Opens the stream once the Lifeline is registered; when the stream breaks
// (coordinator restart, network), waits with backoff — cut short the moment the coordinator
// answers the Lifeline again — and for a registration, then reopens: the coordinator replays
// the current command on connect. Each stream that delivers
// its first command is announced (`on_connected`) before that command is handed on: a
// (re)connection is when the agent re-sends its reports (coordinator.proto), and the first
// command is the first sign the coordinator took the stream.
//
// Thread-safety: Start/Stop from one thread; the callback runs on the stream's own thread.
#ifndef TESSERA_AGENT_COMMAND_STREAM_H_
#define TESSERA_AGENT_COMMAND_STREAM_H_

#include <functional>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "agent/backoff.h"
#include "agent/lifeline.h"
#include "grpcpp/grpcpp.h"
#include "tessera/v1/coordinator.grpc.pb.h"

namespace tessera {

class CommandStream {
 public:
  using OnCommand = std::function<void(const v1::Command&)>;
  using OnConnected = std::function<void()>;

  // `stub` and `lifeline` must outlive the stream. `on_connected` may be empty.
  CommandStream(v1::Coordinator::Stub* stub, Lifeline* lifeline, v1::CommandsRequest request,
                OnCommand on_command, OnConnected on_connected = nullptr,
                BackoffOptions backoff = {});
  ~CommandStream();  // Stop()s.

  void Start();
  // Cancels the open stream and joins the thread. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Run();

  v1::Coordinator::Stub* const stub_;
  Lifeline* const lifeline_;
  const v1::CommandsRequest request_;
  const OnCommand on_command_;
  const OnConnected on_connected_;
  const BackoffOptions backoff_;

  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;  // the open stream's
  std::thread thread_;  // last
};

}  // namespace tessera

#endif  // TESSERA_AGENT_COMMAND_STREAM_H_
