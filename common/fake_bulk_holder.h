// FakeBulkHolder: a holder's bulk port played by a test (proto/tessera/v1/peer.proto "Bulk
// transfers", reads only), of job "job" with TestPeerCredential's secret (as the tests' agents:
// TestPeerKeyring). It serves reads of a byte string, counts connections, and can
// misbehave as a failing holder does: close a read after `cut_after` bytes, or — for reads
// from `stall_from` on — send the status and then nothing (or, `stall_unanswered`, not even
// the status), holding the connection open until it is destroyed. It serves one connection at a
// time, in the order it accepts them (see Serve for the one exception, which makes a
// cut-and-stall test independent of that order).
//
// Thread-safety: serves on its own thread; address() and connections() may be called from any.
#ifndef TESSERA_COMMON_FAKE_BULK_HOLDER_H_
#define TESSERA_COMMON_FAKE_BULK_HOLDER_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "common/bulk_wire.h"
#include "common/peer_auth.h"
#include "common/tcp_socket.h"
#include "gtest/gtest.h"

namespace tessera {

// Job `job` and its secret under a fixed key: what the tests' agents and holders share.
inline PeerCredential TestPeerCredential(const std::string& job = "job") {
  return PeerCredential{job, JobPeerSecret(std::string(kPeerSecretBytes, 't'), job)};
}

// A keyring holding TestPeerCredential(job), for a test's agent.
inline std::unique_ptr<PeerKeyring> TestPeerKeyring(const std::string& job = "job") {
  auto keyring = std::make_unique<PeerKeyring>(job);
  keyring->Set(TestPeerCredential(job).secret);
  return keyring;
}

class FakeBulkHolder {
 public:
  explicit FakeBulkHolder(std::string bytes, uint64_t cut_after = UINT64_MAX,
                          uint64_t stall_from = UINT64_MAX, bool stall_unanswered = false)
      : bytes_(std::move(bytes)),
        cut_after_(cut_after),
        stall_from_(stall_from),
        stall_unanswered_(stall_unanswered) {
    absl::StatusOr<TcpSocket> listener = TcpSocket::Listen("127.0.0.1:0", 16);
    EXPECT_TRUE(listener.ok()) << listener.status();
    listener_ = *std::move(listener);
    thread_ = std::thread([this] {
      for (absl::StatusOr<TcpSocket> c = listener_.Accept(); c.ok(); c = listener_.Accept()) {
        ++connections_;
        Serve(*std::move(c));
      }
    });
  }
  ~FakeBulkHolder() {
    listener_.Shutdown();
    thread_.join();
  }
  FakeBulkHolder(const FakeBulkHolder&) = delete;
  FakeBulkHolder& operator=(const FakeBulkHolder&) = delete;

  // Sends every read's bytes in 256 KiB pieces, pausing `pace` before each: a holder on a
  // slow but steady link. Call before the first read.
  void set_pace(absl::Duration pace) { pace_ = pace; }

  std::string address() const { return "127.0.0.1:" + std::to_string(listener_.port()); }
  int connections() const { return connections_.load(); }

 private:
  // One read. A read to stall is kept open and silent until the holder goes; then the reads
  // held back for it are served. With both a cut and stalls, a read to cut is held back until
  // one has stalled, so that a test sees a stalled read waiting when the cut one fails,
  // whichever connection comes first. Every other connection is closed once served — a cut
  // read ends there, not when the next connection is accepted.
  void Serve(TcpSocket c) {
    const absl::Time soon = absl::Now() + absl::Seconds(30);
    absl::StatusOr<AcceptedBulkPeer> peer = AcceptBulkPeer(c, TestPeerCredential(), soon);
    if (!peer.ok()) return;
    const v1::ReadMemoryCopyRequest& read = peer->request.read();
    if (read.offset() >= stall_from_) {
      if (!stall_unanswered_ &&
          !SendBulkStatus(c, absl::OkStatus(), read.length(), soon, peer->proof).ok()) {
        return;
      }
      stalled_.push_back(std::move(c));
      for (Held& held : held_back_) Send(held.socket, held.read, held.proof);
      held_back_.clear();
      return;
    }
    if (read.length() > cut_after_ && stall_from_ != UINT64_MAX && stalled_.empty()) {
      held_back_.push_back(Held{std::move(c), read, peer->proof});
      return;
    }
    Send(c, read, peer->proof);
  }

  void Send(TcpSocket& c, const v1::ReadMemoryCopyRequest& read, const std::string& proof) {
    const absl::Time soon = absl::Now() + absl::Seconds(30);
    if (!SendBulkStatus(c, absl::OkStatus(), read.length(), soon, proof).ok()) return;
    const uint64_t n = std::min(read.length(), cut_after_);
    const uint64_t piece = pace_ > absl::ZeroDuration() ? uint64_t{256} << 10 : n;
    for (uint64_t at = 0; at < n; at += piece) {
      if (pace_ > absl::ZeroDuration()) absl::SleepFor(pace_);  // the slow link, not a sync
      if (!c.SendAll(bytes_.data() + read.offset() + at, std::min(piece, n - at), soon).ok()) {
        return;
      }
    }
  }

  const std::string bytes_;
  const uint64_t cut_after_;
  const uint64_t stall_from_;
  const bool stall_unanswered_;
  absl::Duration pace_ = absl::ZeroDuration();
  TcpSocket listener_;
  std::atomic<int> connections_{0};
  std::vector<TcpSocket> stalled_;  // the serving thread's, as is held_back_
  struct Held {
    TcpSocket socket;
    v1::ReadMemoryCopyRequest read;
    std::string proof;  // the holder's, for its first status
  };
  std::vector<Held> held_back_;
  std::thread thread_;
};

}  // namespace tessera

#endif  // TESSERA_COMMON_FAKE_BULK_HOLDER_H_
