// What authenticating the bulk port costs (decision 0042): 256 MiB over 1, 2 and 4 new
// loopback TCP connections at once, as a restore from a buddy moves it, with each connection
//   mode 0: not authenticated (the bytes alone: the limit, as BM_LoopbackTcp);
//   mode 1: opened by the bulk port's HMAC challenge–response (common/bulk_handshake.h, the
//           real AcceptBulkPeer / SendBulkHello / RecvFirstBulkStatus), then the bytes as they
//           are — what the agents do;
//   mode 2: TLS 1.3 (OpenSSL, its default suite, an ECDSA P-256 certificate made here; the
//           client does not verify it, which costs nothing per byte), the bytes through it —
//           what TLS on the bulk port would cost.
// Sender and receiver share this process, as two agents share a node's cores; each receives
// into a preallocated destination faulted in once. Every mode runs in the same process, so the
// ratios compare like with like.
//
//   bazel run -c opt //tests/bench:bulk_auth_benchmark
#include <fcntl.h>
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

void BM_BulkAuth(benchmark::State& state) {
  const int streams = static_cast<int>(state.range(0));
  const int mode = static_cast<int>(state.range(1));
  const uint64_t per_stream = kBytes / streams;
  static const TlsContexts* tls = new TlsContexts();
  absl::StatusOr<TcpSocket> listener = TcpSocket::Listen("127.0.0.1:0", 16);
  if (!listener.ok()) {
    state.SkipWithError(listener.status().ToString().c_str());
    return;
  }
  const std::string address = "127.0.0.1:" + std::to_string(listener->port());
  Dest();
  for (auto _ : state) {
    std::vector<absl::Status> sent(streams), received(streams);
    std::vector<std::thread> threads;
    for (int i = 0; i < streams; ++i) {
      threads.emplace_back([&, i] {
        absl::StatusOr<TcpSocket> c = listener->Accept();
        sent[i] = c.ok() ? Send(*c, mode, per_stream, *tls) : c.status();
      });
      threads.emplace_back([&, i] {
        absl::StatusOr<TcpSocket> c = TcpSocket::Connect(address, absl::Now() + absl::Minutes(1));
        received[i] =
            c.ok() ? Receive(*c, mode, Dest() + i * per_stream, per_stream, *tls) : c.status();
      });
    }
    for (std::thread& t : threads) t.join();
    for (int i = 0; i < streams; ++i) {
      if (!sent[i].ok()) state.SkipWithError(sent[i].ToString().c_str());
      if (!received[i].ok()) state.SkipWithError(received[i].ToString().c_str());
    }
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kBytes));
  state.SetLabel(mode == 0 ? "none" : mode == 1 ? "hmac handshake" : "tls " + TlsSuite());
}
BENCHMARK(BM_BulkAuth)
    ->ArgsProduct({{1, 2, 4}, {0, 1, 2}})
    ->UseRealTime()
    ->MinTime(2.0)
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace tessera

BENCHMARK_MAIN();
