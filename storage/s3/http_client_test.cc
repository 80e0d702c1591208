// HttpClient against a server played by the test on a loopback socket: what a response claims
// about its size is not trusted before its bytes arrive.
#include "storage/s3/http_client.h"

#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/tcp_socket.h"
#include "gtest/gtest.h"
#include "storage/s3/credentials.h"
#include "storage/s3/s3_options.h"

namespace tessera::s3 {
namespace {

// Answers one request with `answer`, then closes.
class OneAnswerServer {
 public:
  explicit OneAnswerServer(std::string answer) : answer_(std::move(answer)) {
    absl::StatusOr<TcpSocket> listener = TcpSocket::Listen("127.0.0.1:0", 1);
    EXPECT_TRUE(listener.ok()) << listener.status();
    listener_ = *std::move(listener);
    thread_ = std::thread([this] {
      absl::StatusOr<TcpSocket> c = listener_.Accept();
      if (!c.ok()) return;
      const TimeLimit limit{absl::Now() + absl::Seconds(30), absl::Seconds(30)};
      std::string request;
      char buffer[4096];
      while (request.find("\r\n\r\n") == std::string::npos) {
        absl::StatusOr<size_t> n = c->RecvSome(buffer, sizeof(buffer), limit);
        if (!n.ok()) return;
        request.append(buffer, *n);
      }
      c->SendAll(answer_.data(), answer_.size(), limit).IgnoreError();
    });
  }
  ~OneAnswerServer() {
    listener_.Shutdown();
    thread_.join();
  }
  std::string endpoint() const { return absl::StrCat("http://127.0.0.1:", listener_.port()); }

 private:
  const std::string answer_;
  TcpSocket listener_;
  std::thread thread_;
};

TEST(HttpClientTest, HugeClaimedContentLength_NotReservedTheShortBodyIsAnError) {
  // 2^60 bytes claimed, 5 sent: reserving the claim would end the process (bad_alloc).
  OneAnswerServer server("HTTP/1.1 200 OK\r\nContent-Length: 1152921504606846976\r\n\r\nhello");
  S3ClientOptions options;
  options.endpoint = server.endpoint();
  options.addressing = AddressingStyle::kPath;
  HttpClient client(options, Credentials("AKIDEXAMPLE", "secret"));
  HttpRequest request;
  request.method = "GET";
  request.url = server.endpoint() + "/bucket/key";
  const HttpResponse response = client.Perform(request);
  EXPECT_NE(response.curl_code, 0) << "a body shorter than its Content-Length is an error";
  EXPECT_EQ(response.content_length, uint64_t{1} << 60);
  EXPECT_LE(response.body.capacity(), size_t{64} << 20);
}

}  // namespace
}  // namespace tessera::s3
