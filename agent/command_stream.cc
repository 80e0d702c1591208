#include "agent/command_stream.h"

#include <algorithm>

#include "common/log.h"

namespace tessera {

CommandStream::CommandStream(v1::Coordinator::Stub* stub, Lifeline* lifeline,
                             v1::CommandsRequest request, OnCommand on_command,
                             OnConnected on_connected, BackoffOptions backoff)
    : stub_(stub),
      lifeline_(lifeline),
      request_(std::move(request)),
      on_command_(std::move(on_command)),
      on_connected_(std::move(on_connected)),
      backoff_(backoff) {}

CommandStream::~CommandStream() { Stop(); }

void CommandStream::Start() {
  thread_ = std::thread([this] { Run(); });
}

void CommandStream::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    if (context_ != nullptr) context_->TryCancel();
  }
  if (thread_.joinable()) thread_.join();
}

void CommandStream::Run() {
  Backoff backoff(backoff_);
  while (true) {
    // Wait until registered (or stopping), in short slices so Stop() is prompt.
    while (!lifeline_->WaitRegistered(absl::Milliseconds(200))) {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
    }
    grpc::ClientContext context;
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
      context_ = &context;
    }
    std::unique_ptr<grpc::ClientReader<v1::Command>> reader =
        stub_->Commands(&context, request_);
    v1::Command command;
    bool got_any = false;
    while (reader->Read(&command)) {
      if (!got_any && on_connected_) on_connected_();
      got_any = true;
      on_command_(command);
    }
    grpc::Status status = reader->Finish();
    const uint64_t renewals = lifeline_->renewals();
    if (got_any) backoff.Reset();  // it worked for a while: start the backoff over
    {
      absl::MutexLock lock(&mu_);
      context_ = nullptr;
      if (stop_) return;
    }
    // Reopen after the backoff, or as soon as the coordinator answers the lifeline again (a
    // link back after a cut: the trainers' WaitCommitted hears a commit only on this stream),
    // whichever comes first. In slices, so that Stop() is prompt.
    const absl::Time until = absl::Now() + backoff.Next();
    while (absl::Now() < until &&
           !lifeline_->AwaitRenewal(renewals,
                                    std::min(until - absl::Now(), absl::Milliseconds(200)))) {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
    }
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
    }
    LogWarning("command stream ended (", status.error_message(), "); reopening");
  }
}

}  // namespace tessera
