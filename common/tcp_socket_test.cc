#include "common/tcp_socket.h"

#include <string>
#include <thread>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

absl::Time Soon() { return absl::Now() + absl::Seconds(30); }

// A listener on loopback and one connection to it: {client side, server side}.
struct Pair {
  TcpSocket listener;
  TcpSocket client;
  TcpSocket server;
};

Pair Connected() {
  Pair p;
  absl::StatusOr<TcpSocket> listener = TcpSocket::Listen("127.0.0.1:0", 4);
  EXPECT_TRUE(listener.ok()) << listener.status();
  p.listener = *std::move(listener);
  absl::StatusOr<TcpSocket> client =
      TcpSocket::Connect("127.0.0.1:" + std::to_string(p.listener.port()), Soon());
  EXPECT_TRUE(client.ok()) << client.status();
  p.client = *std::move(client);
  absl::StatusOr<TcpSocket> server = p.listener.Accept();
  EXPECT_TRUE(server.ok()) << server.status();
  p.server = *std::move(server);
  return p;
}

TEST(SplitHostPortTest, HostPortAndBracketedV6) {
  EXPECT_EQ(*SplitHostPort("10.0.0.5:7000"),
            std::make_pair(std::string("10.0.0.5"), std::string("7000")));
  EXPECT_EQ(*SplitHostPort("[fd00::5]:7001"),
            std::make_pair(std::string("fd00::5"), std::string("7001")));
  EXPECT_EQ(JoinHostPort("fd00::5", "7001"), "[fd00::5]:7001");
  EXPECT_EQ(JoinHostPort("node-a", "0"), "node-a:0");
  EXPECT_EQ(SplitHostPort("node-a").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SplitHostPort("node-a:").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ProbePortsTest, AListenerAcceptsAClosedPortRefusesTheRestIsUnknown) {
  absl::StatusOr<TcpSocket> listener = TcpSocket::Listen("127.0.0.1:0", 4);
  ASSERT_TRUE(listener.ok()) << listener.status();
  const std::string open = "127.0.0.1:" + std::to_string(listener->port());
  absl::StatusOr<TcpSocket> gone = TcpSocket::Listen("127.0.0.1:0", 4);
  ASSERT_TRUE(gone.ok()) << gone.status();
  const std::string closed = "127.0.0.1:" + std::to_string(gone->port());
  *gone = TcpSocket();  // the process that listened is gone
  EXPECT_EQ(ProbePorts({open, closed, "no-such-host.invalid:1", "not an address"}, Soon()),
            (std::vector<PortProbe>{PortProbe::kListening, PortProbe::kRefused,
                                    PortProbe::kUnknown, PortProbe::kUnknown}));
  EXPECT_EQ(ProbePorts({}, Soon()), std::vector<PortProbe>{});
}

TEST(TcpSocketTest, SendAllRecvAll_MoreThanTheSocketBuffers_ByteIdentical) {
  Pair p = Connected();
  std::string data(48 << 20, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 31 + (i >> 16));
  std::thread sender([&] { EXPECT_TRUE(p.client.SendAll(data.data(), data.size(), Soon()).ok()); });
  std::string got(data.size(), '\0');
  absl::Status received = p.server.RecvAll(got.data(), got.size(), Soon());
  sender.join();
  ASSERT_TRUE(received.ok()) << received;
  EXPECT_TRUE(got == data);
}

TEST(TcpSocketTest, RecvAll_PeerClosesEarly_DataLossSayingHowMuchArrived) {
  Pair p = Connected();
  ASSERT_TRUE(p.client.SendAll("abc", 3, Soon()).ok());
  p.client.Close();
  char buffer[8];
  absl::Status status = p.server.RecvAll(buffer, sizeof(buffer), Soon());
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_NE(status.message().find("after 3 of 8 bytes"), std::string::npos) << status;
}

TEST(TcpSocketTest, RecvAll_PeerSendsNothing_DeadlineExceededAtTheDeadline) {
  Pair p = Connected();
  char buffer[8];
  absl::Status status =
      p.server.RecvAll(buffer, sizeof(buffer), absl::Now() + absl::Milliseconds(50));
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  status = p.server.RecvAll(buffer, sizeof(buffer), absl::Now() - absl::Seconds(1));
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
}

// A stall limit ends a transfer only once no byte moves for that long: a peer that sends
// slowly but steadily (here a piece every 400 ms, 3.2 s in all) is received whole under a 2 s
// stall limit, however long the whole takes. The pauses stand for a slow link, not for a
// synchronisation. Failed before the limit existed: a 2 s limit was a deadline for the whole.
TEST(TcpSocketTest, RecvAll_SlowSteadyPeer_StallLimitLetsItFinish) {
  Pair p = Connected();
  constexpr int kPieces = 8;
  constexpr size_t kPiece = 64 << 10;
  std::thread sender([&] {
    const std::string piece(kPiece, 'x');
    for (int i = 0; i < kPieces; ++i) {
      // The slow link itself, not a synchronisation: the receive must really last longer
      // (3.2 s) than its stall limit (2 s), with every gap well inside it.
      absl::SleepFor(absl::Milliseconds(400));
      ASSERT_TRUE(p.client.SendAll(piece.data(), piece.size(), Soon()).ok());
    }
  });
  std::string got(kPieces * kPiece, '\0');
  const absl::Time start = absl::Now();
  absl::Status received =
      p.server.RecvAll(got.data(), got.size(), TimeLimit::Stall(absl::Seconds(2)));
  const absl::Duration took = absl::Now() - start;
  sender.join();
  ASSERT_TRUE(received.ok()) << received;
  EXPECT_EQ(got, std::string(got.size(), 'x'));
  EXPECT_GT(took, absl::Seconds(2));  // longer than the limit: it bounded no byte's wait
}

// A peer that stops: the receive ends within two stall limits of the last byte, saying so; a
// receiver that stops taking bytes ends the send likewise.
TEST(TcpSocketTest, StallLimit_PeerStops_DeadlineExceededNamingTheStall) {
  Pair p = Connected();
  ASSERT_TRUE(p.client.SendAll("abc", 3, Soon()).ok());
  char buffer[8];
  absl::Status status =
      p.server.RecvAll(buffer, sizeof(buffer), TimeLimit::Stall(absl::Milliseconds(100)));
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_NE(status.message().find("no byte moved for 100ms"), std::string::npos) << status;

  // A deadline sooner than the stall limit is the one that ends it.
  status = p.server.RecvAll(buffer, sizeof(buffer),
                            TimeLimit(absl::Now() + absl::Milliseconds(50), absl::Hours(1)));
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_NE(status.message().find("deadline passed"), std::string::npos) << status;

  const std::string big(64 << 20, 'y');  // more than the socket buffers hold
  status = p.client.SendAll(big.data(), big.size(), TimeLimit::Stall(absl::Milliseconds(100)));
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
}

TEST(TcpSocketTest, RecvSome_WhatHasArrived_ThenDataLossOnClose) {
  // On loopback a send has arrived by the time it returns.
  Pair p = Connected();
  ASSERT_TRUE(p.client.SendAll("abc", 3, Soon()).ok());
  char buffer[8];
  absl::StatusOr<size_t> got = p.server.RecvSome(buffer, sizeof(buffer), Soon());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(std::string(buffer, *got), "abc");
  ASSERT_TRUE(p.client.SendAll("defgh", 5, Soon()).ok());
  got = p.server.RecvSome(buffer, 2, Soon());  // never more than asked for
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(std::string(buffer, *got), "de");
  got = p.server.RecvSome(buffer, sizeof(buffer), Soon());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(std::string(buffer, *got), "fgh");
  p.client.Close();
  got = p.server.RecvSome(buffer, sizeof(buffer), Soon());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << got.status();
  EXPECT_EQ(p.server.RecvSome(buffer, 0, Soon()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TcpSocketTest, RecvSome_PeerSendsNothing_DeadlineExceeded) {
  Pair p = Connected();
  char buffer[8];
  absl::StatusOr<size_t> got =
      p.server.RecvSome(buffer, sizeof(buffer), absl::Now() + absl::Milliseconds(50));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded) << got.status();
}

TEST(TcpSocketTest, Shutdown_WakesABlockedReceive) {
  Pair p = Connected();
  absl::Status status;
  std::thread receiver([&] {
    char buffer[8];
    status = p.server.RecvAll(buffer, sizeof(buffer), Soon());
  });
  p.server.Shutdown();
  receiver.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
}

TEST(TcpSocketTest, Accept_AfterShutdown_Fails) {
  absl::StatusOr<TcpSocket> listener = TcpSocket::Listen("127.0.0.1:0", 4);
  ASSERT_TRUE(listener.ok());
  absl::Status accepted;
  std::thread acceptor([&] { accepted = listener->Accept().status(); });
  listener->Shutdown();
  acceptor.join();
  EXPECT_FALSE(accepted.ok());
}

TEST(TcpSocketTest, Connect_NothingListens_UnavailableNamingTheAddress) {
  absl::StatusOr<TcpSocket> listener = TcpSocket::Listen("127.0.0.1:0", 1);
  ASSERT_TRUE(listener.ok());
  const std::string address = "127.0.0.1:" + std::to_string(listener->port());
  listener->Close();  // the port is free again: connecting is refused
  absl::StatusOr<TcpSocket> socket = TcpSocket::Connect(address, Soon());
  EXPECT_EQ(socket.status().code(), absl::StatusCode::kUnavailable) << socket.status();
  EXPECT_NE(socket.status().message().find(address), std::string::npos);
  EXPECT_EQ(TcpSocket::Connect("no-port", Soon()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tessera
