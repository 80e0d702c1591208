// What authenticating the bulk port costs (decision 0042): 256 MiB over 1, 2 and 4 new
// loopback TCP connections at once, as a restore from a buddy moves it, with each connection
//   mode 0: not authenticated (the bytes alone: the limit, as BM_LoopbackTcp);
//   mode 1: opened by the bulk port's HMAC challenge–response (common/bulk_handshake.h, the
//           real AcceptBulkPeer / SendBulkHello / RecvFirstBulkStatus), then the bytes as they
//           are — what the agents do;
//   mode 2: TLS 1.3 (OpenSSL, its default suite, an ECDSA P-256 certificate made here; the
//           client does not verify it, which costs nothing per byte), the bytes through it —
//           what TLS on the bulk port would cost.
// Third argument 0: one connection moving no bytes — what a handshake costs on its own, which
// a read pays once per connection. Sender and receiver share this process, as two agents share a node's cores; each receives
// into a preallocated destination faulted in once. Every mode runs in the same process;
// BM_BulkAuthPaired runs the three back to back in each iteration, so its ratios compare like
// with like on a machine that others load.
//
//   bazel run -c opt //tests/bench:bulk_auth_benchmark
#include <fcntl.h>
#include <signal.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <algorithm>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "benchmark/benchmark.h"
#include "common/bulk_wire.h"
#include "common/peer_auth.h"
#include "common/tcp_socket.h"

namespace tessera {
namespace {

constexpr uint64_t kBytes = uint64_t{256} << 20;

// A TLS peer that closes first makes the other side's last write (its close_notify, session
// tickets) fail: an error to see, not a SIGPIPE that ends the benchmark.
const bool kSigpipeIgnored = signal(SIGPIPE, SIG_IGN) != SIG_ERR;
constexpr size_t kTlsPiece = 1 << 20;  // per SSL_write/SSL_read call (TLS records are 16 KiB)

const std::string& Source() {
  static const std::string* src = new std::string(kBytes, '\x5a');
  return *src;
}

char* Dest() {
  static std::string* dest = new std::string(kBytes, '\0');
  return dest->data();
}

PeerCredential Credential() {
  return PeerCredential{"job", JobPeerSecret(std::string(kPeerSecretBytes, 'b'), "job")};
}

// The suite TLS negotiated (for the label; written under Receive's mutex, read after the
// threads joined).
std::string& TlsSuite() {
  static std::string* suite = new std::string;
  return *suite;
}

void Blocking(const TcpSocket& socket) {
  fcntl(socket.fd(), F_SETFL, fcntl(socket.fd(), F_GETFL) & ~O_NONBLOCK);
}

// A server and a client context for TLS over a self-signed ECDSA P-256 certificate.
struct TlsContexts {
  SSL_CTX* server = nullptr;
  SSL_CTX* client = nullptr;

  TlsContexts() {
    EVP_PKEY* key = EVP_EC_gen("P-256");
    X509* cert = X509_new();
    ASN1_INTEGER_set(X509_get_serialNumber(cert), 1);
    X509_gmtime_adj(X509_getm_notBefore(cert), 0);
    X509_gmtime_adj(X509_getm_notAfter(cert), 3600);
    X509_set_pubkey(cert, key);
    X509_NAME* name = X509_get_subject_name(cert);
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                               reinterpret_cast<const unsigned char*>("bench"), -1, -1, 0);
    X509_set_issuer_name(cert, name);
    X509_sign(cert, key, EVP_sha256());
    server = SSL_CTX_new(TLS_server_method());
    SSL_CTX_use_certificate(server, cert);
    SSL_CTX_use_PrivateKey(server, key);
    client = SSL_CTX_new(TLS_client_method());
    SSL_CTX_set_verify(client, SSL_VERIFY_NONE, nullptr);
    X509_free(cert);
    EVP_PKEY_free(key);
  }
  ~TlsContexts() {
    SSL_CTX_free(server);
    SSL_CTX_free(client);
  }
};

// One connection's sending side: the handshake of `mode`, then `n` bytes.
absl::Status Send(const TcpSocket& socket, int mode, uint64_t n, const TlsContexts& tls) {
  const absl::Time deadline = absl::Now() + absl::Minutes(1);
  if (mode == 1) {
    absl::StatusOr<AcceptedBulkPeer> peer = AcceptBulkPeer(socket, Credential(), deadline);
    if (!peer.ok()) return peer.status();
    if (absl::Status s = SendBulkStatus(socket, absl::OkStatus(), n, deadline, peer->proof);
        !s.ok()) {
      return s;
    }
  }
  if (mode != 2) return socket.SendAll(Source().data(), n, deadline);
  Blocking(socket);
  SSL* ssl = SSL_new(tls.server);
  SSL_set_fd(ssl, socket.fd());
  absl::Status status = absl::OkStatus();
  if (SSL_accept(ssl) != 1) status = absl::InternalError("SSL_accept failed");
  for (uint64_t at = 0; status.ok() && at < n;) {
    const int wrote = SSL_write(ssl, Source().data() + at, std::min<uint64_t>(kTlsPiece, n - at));
    if (wrote <= 0) status = absl::InternalError("SSL_write failed");
    at += std::max(wrote, 0);
  }
  SSL_shutdown(ssl);
  SSL_free(ssl);
  return status;
}

// One connection's receiving side, into `dest`.
absl::Status Receive(const TcpSocket& socket, int mode, char* dest, uint64_t n,
                     const TlsContexts& tls) {
  const absl::Time deadline = absl::Now() + absl::Minutes(1);
  if (mode == 1) {
    v1::BulkRequest request;
    request.mutable_read()->set_job_id("job");
    absl::StatusOr<BulkSession> session = SendBulkHello(socket, Credential(), request, deadline);
    if (!session.ok()) return session.status();
    absl::StatusOr<uint64_t> offered = RecvFirstBulkStatus(socket, "bench", *session, deadline);
    if (!offered.ok()) return offered.status();
  }
  if (mode != 2) return socket.RecvAll(dest, n, deadline);
  Blocking(socket);
  SSL* ssl = SSL_new(tls.client);
  SSL_set_fd(ssl, socket.fd());
  absl::Status status = absl::OkStatus();
  if (SSL_connect(ssl) != 1) status = absl::InternalError("SSL_connect failed");
  if (status.ok()) {
    static absl::Mutex mu;
    absl::MutexLock lock(&mu);
    TlsSuite() = SSL_get_cipher_name(ssl);
  }
  for (uint64_t at = 0; status.ok() && at < n;) {
    const int got = SSL_read(ssl, dest + at, std::min<uint64_t>(kTlsPiece, n - at));
    if (got <= 0) status = absl::InternalError("SSL_read failed");
    at += std::max(got, 0);
  }
  SSL_free(ssl);
  return status;
}

// A loopback listener, and the transfers of the benchmarks over it.
class Link {
 public:
  // False (the benchmark skipped, saying why) if it cannot listen.
  bool Open(benchmark::State& state) {
    absl::StatusOr<TcpSocket> listener = TcpSocket::Listen("127.0.0.1:0", 16);
    if (!listener.ok()) {
      state.SkipWithError(listener.status().ToString().c_str());
      return false;
    }
    listener_ = *std::move(listener);
    address_ = "127.0.0.1:" + std::to_string(listener_.port());
    Dest();
    return true;
  }

  // `total` bytes over `streams` new connections at once, each opened as `mode` says; the
  // time from the first connect to the last byte received.
  absl::StatusOr<absl::Duration> Transfer(int streams, int mode, uint64_t total) {
    static const TlsContexts* tls = new TlsContexts();
    const uint64_t per_stream = total / streams;
    std::vector<absl::Status> sent(streams), received(streams);
    std::vector<std::thread> threads;
    const absl::Time start = absl::Now();
    for (int i = 0; i < streams; ++i) {
      threads.emplace_back([&, i] {
        absl::StatusOr<TcpSocket> c = listener_.Accept();
        sent[i] = c.ok() ? Send(*c, mode, per_stream, *tls) : c.status();
      });
      threads.emplace_back([&, i] {
        absl::StatusOr<TcpSocket> c = TcpSocket::Connect(address_, absl::Now() + absl::Minutes(1));
        received[i] =
            c.ok() ? Receive(*c, mode, Dest() + i * per_stream, per_stream, *tls) : c.status();
      });
    }
    for (std::thread& t : threads) t.join();
    const absl::Duration took = absl::Now() - start;
    for (int i = 0; i < streams; ++i) {
      if (!sent[i].ok()) return sent[i];
      if (!received[i].ok()) return received[i];
    }
    return took;
  }

 private:
  TcpSocket listener_;
  std::string address_;
};

std::string ModeName(int mode) {
  return mode == 0 ? "none" : mode == 1 ? "hmac handshake" : "tls " + TlsSuite();
}

// Arguments: streams, mode, and 1 to move kBytes or 0 to move none (the connection and its
// handshake alone, which a read pays once per connection).
void BM_BulkAuth(benchmark::State& state) {
  const int streams = static_cast<int>(state.range(0));
  const int mode = static_cast<int>(state.range(1));
  const uint64_t total = state.range(2) != 0 ? kBytes : 0;
  Link link;
  if (!link.Open(state)) return;
  for (auto _ : state) {
    absl::StatusOr<absl::Duration> took = link.Transfer(streams, mode, total);
    if (!took.ok()) {
      state.SkipWithError(took.status().ToString().c_str());
      break;
    }
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * total));
  state.SetLabel(ModeName(mode));
}
BENCHMARK(BM_BulkAuth)
    ->ArgsProduct({{1, 2, 4}, {0, 1, 2}, {1}})
    ->ArgsProduct({{1}, {0, 1, 2}, {0}})
    ->UseRealTime()
    ->MinTime(2.0)
    ->Unit(benchmark::kMicrosecond);

// The ratios the decision rests on, robust to a machine that others load: each iteration
// moves kBytes once in every mode, back to back, in an order that rotates, and the counters
// are the medians over iterations of each mode's throughput divided by the unauthenticated
// one's of the same iteration (hmac_vs_none, tls_vs_none), with each mode's median MB/s.
void BM_BulkAuthPaired(benchmark::State& state) {
  const int streams = static_cast<int>(state.range(0));
  Link link;
  if (!link.Open(state)) return;
  std::vector<double> seconds[3];
  std::vector<double> hmac_ratio, tls_ratio;
  int first = 0;
  for (auto _ : state) {
    double took[3] = {0, 0, 0};
    for (int k = 0; k < 3; ++k) {
      const int mode = (first + k) % 3;
      absl::StatusOr<absl::Duration> t = link.Transfer(streams, mode, kBytes);
      if (!t.ok()) {
        state.SkipWithError(t.status().ToString().c_str());
        return;
      }
      took[mode] = absl::ToDoubleSeconds(*t);
      seconds[mode].push_back(took[mode]);
    }
    first = (first + 1) % 3;
    hmac_ratio.push_back(took[0] / took[1]);
    tls_ratio.push_back(took[0] / took[2]);
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  state.counters["hmac_vs_none"] = median(hmac_ratio);
  state.counters["tls_vs_none"] = median(tls_ratio);
  const char* names[3] = {"none_MBps", "hmac_MBps", "tls_MBps"};
  for (int mode = 0; mode < 3; ++mode) {
    state.counters[names[mode]] = kBytes / 1e6 / median(seconds[mode]);
  }
  state.SetLabel(ModeName(2));
}
BENCHMARK(BM_BulkAuthPaired)
    ->Arg(1)
    ->Arg(2)
    ->Arg(4)
    ->Iterations(31)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace tessera

BENCHMARK_MAIN();
