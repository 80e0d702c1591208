#include "common/socket_group.h"

#include <string>
#include <thread>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

absl::Time Soon() { return absl::Now() + absl::Seconds(30); }

// Two connected loopback sockets: {the connecting side, the accepted side}.
std::pair<TcpSocket, TcpSocket> Connected() {
  absl::StatusOr<TcpSocket> listener = TcpSocket::Listen("127.0.0.1:0", 1);
  EXPECT_TRUE(listener.ok()) << listener.status();
  absl::StatusOr<TcpSocket> near =
      TcpSocket::Connect("127.0.0.1:" + std::to_string(listener->port()), Soon());
  EXPECT_TRUE(near.ok()) << near.status();
  absl::StatusOr<TcpSocket> far = listener->Accept();
  EXPECT_TRUE(far.ok()) << far.status();
  return {*std::move(near), *std::move(far)};
}

TEST(SocketGroupTest, Fail_EndsAReceiveBlockedOnARegisteredSocket_NotAnUnregisteredOne) {
  auto [sender, receiver] = Connected();
  auto [other_sender, other_receiver] = Connected();
  SocketGroup group;
  ASSERT_TRUE(group.Open(receiver));
  ASSERT_TRUE(group.Open(other_receiver));
  group.Close(other_receiver);
  absl::Status received;
  std::thread blocked([&] {
    char byte;
    received = receiver.RecvAll(&byte, 1, absl::InfiniteFuture());  // nothing is ever sent
  });
  group.Fail(absl::DataLossError("part 2 closed early"));
  blocked.join();  // returns only because Fail shut the socket down
  EXPECT_FALSE(received.ok());
  EXPECT_EQ(group.first_error(), absl::DataLossError("part 2 closed early"));

  ASSERT_TRUE(other_sender.SendAll("x", 1, Soon()).ok());
  char byte = 0;
  ASSERT_TRUE(other_receiver.RecvAll(&byte, 1, Soon()).ok());
  EXPECT_EQ(byte, 'x');
}

TEST(SocketGroupTest, TheFirstErrorWins_OkIgnored) {
  SocketGroup group;
  group.Fail(absl::OkStatus());
  EXPECT_FALSE(group.failed());
  EXPECT_TRUE(group.first_error().ok());
  group.Fail(absl::UnavailableError("first"));
  group.Fail(absl::DeadlineExceededError("second"));
  EXPECT_TRUE(group.failed());
  EXPECT_EQ(group.first_error(), absl::UnavailableError("first"));
}

TEST(SocketGroupTest, Run_TheBodysErrorFailsTheGroup_NothingRunsOrOpensAfter) {
  auto [sender, receiver] = Connected();
  SocketGroup group;
  int runs = 0;
  group.Run(receiver, [&] {
    ++runs;
    return absl::OkStatus();
  });
  EXPECT_FALSE(group.failed());
  group.Run(receiver, [&] {
    ++runs;
    return absl::NotFoundError("no such copy");
  });
  EXPECT_EQ(group.first_error(), absl::NotFoundError("no such copy"));
  group.Run(receiver, [&] {
    ++runs;
    return absl::OkStatus();
  });
  EXPECT_EQ(runs, 2);
  EXPECT_FALSE(group.Open(sender));
  // Run unregistered the socket before failing the group: it is not shut down.
  ASSERT_TRUE(sender.SendAll("y", 1, Soon()).ok());
  char byte = 0;
  ASSERT_TRUE(receiver.RecvAll(&byte, 1, Soon()).ok());
  EXPECT_EQ(byte, 'y');
}

}  // namespace
}  // namespace tessera
