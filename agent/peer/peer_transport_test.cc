#include "agent/peer/peer_transport.h"

#include <vector>

#include "gtest/gtest.h"

namespace tessera {
namespace {

SliceSend Send(uint32_t leader, const void* data, size_t nbytes, int64_t begin = 0,
               int64_t end = 4) {
  SliceSend s;
  s.key = "w";
  s.box = Box{{0}, {8}};
  s.begin = begin;
  s.end = end;
  s.data = data;
  s.nbytes = nbytes;
  s.leader_rank = leader;
  return s;
}

SliceRecv Recv(uint32_t from, void* dest, size_t nbytes, int64_t begin = 0, int64_t end = 4) {
  SliceRecv r;
  r.key = "w";
  r.box = Box{{0}, {8}};
  r.from_rank = from;
  r.begin = begin;
  r.end = end;
  r.dest = dest;
  r.nbytes = nbytes;
  return r;
}

TEST(ValidateExchange, WellFormed_Ok) {
  char buf[16] = {};
  std::vector<SliceSend> sends = {Send(1, buf, 16), Send(2, nullptr, 0, 4, 4)};
  std::vector<SliceRecv> recvs = {Recv(1, buf, 16), Recv(2, buf, 16, 4, 8), Recv(3, nullptr, 0)};
  EXPECT_TRUE(ValidateExchange(0, sends, recvs).ok());
}

TEST(ValidateExchange, NullDataWithBytes_Rejected) {
  std::vector<SliceSend> sends = {Send(1, nullptr, 16)};
  EXPECT_EQ(ValidateExchange(0, sends, {}).code(), absl::StatusCode::kInvalidArgument);
  std::vector<SliceRecv> recvs = {Recv(1, nullptr, 16)};
  EXPECT_EQ(ValidateExchange(0, {}, recvs).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ValidateExchange, BadRange_Rejected) {
  char buf[16] = {};
  std::vector<SliceSend> sends = {Send(1, buf, 16, 5, 4)};
  EXPECT_EQ(ValidateExchange(0, sends, {}).code(), absl::StatusCode::kInvalidArgument);
  std::vector<SliceRecv> recvs = {Recv(1, buf, 16, -1, 4)};
  EXPECT_EQ(ValidateExchange(0, {}, recvs).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ValidateExchange, SelfAsPeer_Rejected) {
  char buf[16] = {};
  std::vector<SliceSend> sends = {Send(0, buf, 16)};
  EXPECT_EQ(ValidateExchange(0, sends, {}).code(), absl::StatusCode::kInvalidArgument);
  std::vector<SliceRecv> recvs = {Recv(0, buf, 16)};
  EXPECT_EQ(ValidateExchange(0, {}, recvs).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ValidateExchange, DuplicateRecv_Rejected) {
  char a[16] = {}, b[16] = {};
  std::vector<SliceRecv> recvs = {Recv(1, a, 16), Recv(1, b, 16)};
  absl::Status status = ValidateExchange(0, {}, recvs);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("twice"), absl::string_view::npos) << status;
}

}  // namespace
}  // namespace tessera
