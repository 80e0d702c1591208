#include "agent/peer/slice_inbox.h"

#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using Kind = SliceInbox::Admission::Kind;

constexpr char kGuard = '\xAB';

// A destination with guard bytes on both sides, to catch writes outside [dest, dest + n).
struct Guarded {
  explicit Guarded(size_t n) : buffer(n + 64, kGuard) { std::fill_n(dest(), n, '\0'); }
  char* dest() { return buffer.data() + 32; }
  bool GuardsIntact() const {
    for (size_t i = 0; i < 32; ++i) {
      if (buffer[i] != kGuard || buffer[buffer.size() - 1 - i] != kGuard) return false;
    }
    return true;
  }
  std::string buffer;
};

SliceRecv Expected(uint32_t from, void* dest, size_t nbytes, const std::string& key = "w") {
  SliceRecv r;
  r.key = key;
  r.box = Box{{0, 0}, {4, 8}};
  r.from_rank = from;
  r.begin = 4;
  r.end = 4 + static_cast<int64_t>(nbytes / 4);
  r.dest = dest;
  r.nbytes = nbytes;
  return r;
}

IncomingChunk Chunk(const std::string& session, uint32_t from, uint64_t slice_nbytes,
                    uint64_t offset, uint64_t length, const std::string& key = "w") {
  IncomingChunk c;
  c.session_id = session;
  c.key = key;
  c.box = Box{{0, 0}, {4, 8}};
  c.from_rank = from;
  c.begin = 4;
  c.end = 4 + static_cast<int64_t>(slice_nbytes / 4);
  c.slice_nbytes = slice_nbytes;
  c.offset = offset;
  c.length = length;
  return c;
}

// Admits and, for kWrite, copies `data` (the whole chunk) as a transport would.
Kind Deliver(SliceInbox& inbox, const IncomingChunk& chunk, const std::string& data,
             absl::Status* status = nullptr, std::function<void()> on_ready = [] {}) {
  static int token;
  SliceInbox::Admission a = inbox.Admit(chunk, &token, std::move(on_ready));
  if (status != nullptr) *status = a.status;
  if (a.kind == Kind::kWrite) {
    std::copy_n(data.data() + a.skip_bytes, a.write_bytes, a.dest);
    inbox.Commit(a, true);
  }
  return a.kind;
}

absl::Time Soon() { return absl::Now() + absl::Seconds(30); }

TEST(SliceInbox, ChunksInOrder_SliceLandsAndWaitSucceeds) {
  SliceInbox inbox;
  Guarded dest(16);
  std::vector<SliceRecv> recvs = {Expected(1, dest.dest(), 16)};
  ASSERT_TRUE(inbox.Expect("s", recvs).ok());
  const std::string data = "0123456789abcdef";
  EXPECT_EQ(Deliver(inbox, Chunk("s", 1, 16, 0, 10), data.substr(0, 10)), Kind::kWrite);
  EXPECT_EQ(Deliver(inbox, Chunk("s", 1, 16, 10, 6), data.substr(10)), Kind::kWrite);
  EXPECT_TRUE(inbox.Wait("s", Soon()).ok());
  EXPECT_EQ(std::string(dest.dest(), 16), data);
  EXPECT_TRUE(dest.GuardsIntact());
}

TEST(SliceInbox, ResentBytes_SkippedNotRewritten) {
  SliceInbox inbox;
  Guarded dest(8);
  std::vector<SliceRecv> recvs = {Expected(1, dest.dest(), 8)};
  ASSERT_TRUE(inbox.Expect("s", recvs).ok());
  EXPECT_EQ(Deliver(inbox, Chunk("s", 1, 8, 0, 6), "abcdef"), Kind::kWrite);
  // A resend from offset 4: its first two bytes are already there.
  SliceInbox::Admission a = inbox.Admit(Chunk("s", 1, 8, 4, 4), this, [] {});
  ASSERT_EQ(a.kind, Kind::kWrite);
  EXPECT_EQ(a.skip_bytes, 2u);
  EXPECT_EQ(a.write_bytes, 2u);
  EXPECT_EQ(a.dest, dest.dest() + 6);
  const std::string resend = "XXgh";  // bytes [4, 8); "XX" must not overwrite "ef"
  std::copy_n(resend.data() + a.skip_bytes, a.write_bytes, a.dest);
  inbox.Commit(a, true);
  EXPECT_TRUE(inbox.Wait("s", Soon()).ok());
  EXPECT_EQ(std::string(dest.dest(), 8), "abcdefgh");
}

TEST(SliceInbox, ChunkLeavingGap_Rejected) {
  SliceInbox inbox;
  Guarded dest(8);
  std::vector<SliceRecv> recvs = {Expected(1, dest.dest(), 8)};
  ASSERT_TRUE(inbox.Expect("s", recvs).ok());
  absl::Status status;
  EXPECT_EQ(Deliver(inbox, Chunk("s", 1, 8, 2, 4), "abcd", &status), Kind::kRejected);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(dest.dest(), 8), std::string(8, '\0'));
}

TEST(SliceInbox, WrongSize_RejectedSessionFailsNothingWritten) {
  SliceInbox inbox;
  Guarded dest(8);
  std::vector<SliceRecv> recvs = {Expected(1, dest.dest(), 8)};
  ASSERT_TRUE(inbox.Expect("s", recvs).ok());
  IncomingChunk chunk = Chunk("s", 1, 12, 0, 12);
  chunk.end = 4 + 2;  // same range as expected, more bytes
  absl::Status status;
  EXPECT_EQ(Deliver(inbox, chunk, "abcdefghijkl", &status), Kind::kRejected);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(inbox.Wait("s", Soon()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(dest.dest(), 8), std::string(8, '\0'));
  EXPECT_TRUE(dest.GuardsIntact());
}

TEST(SliceInbox, UnknownKey_RejectedSessionUnaffected) {
  SliceInbox inbox;
  Guarded dest(4);
  std::vector<SliceRecv> recvs = {Expected(1, dest.dest(), 4)};
  ASSERT_TRUE(inbox.Expect("s", recvs).ok());
  absl::Status status;
  EXPECT_EQ(Deliver(inbox, Chunk("s", 1, 4, 0, 4, "other"), "zzzz", &status), Kind::kRejected);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Deliver(inbox, Chunk("s", 1, 4, 0, 4), "abcd"), Kind::kWrite);
  EXPECT_TRUE(inbox.Wait("s", Soon()).ok());
  EXPECT_EQ(std::string(dest.dest(), 4), "abcd");
}

TEST(SliceInbox, ChunkBeforeExpect_ParkedThenAdmitted) {
  int parked_hook_calls = 0;
  SliceInboxOptions options;
  options.on_parked = [&](const std::string& session) {
    EXPECT_EQ(session, "s");
    ++parked_hook_calls;
  };
  SliceInbox inbox(options);
  bool ready = false;
  EXPECT_EQ(Deliver(inbox, Chunk("s", 1, 4, 0, 4), "abcd", nullptr, [&] { ready = true; }),
            Kind::kParked);
  EXPECT_EQ(parked_hook_calls, 1);
  EXPECT_EQ(inbox.parked(), 1u);
  Guarded dest(4);
  std::vector<SliceRecv> recvs = {Expected(1, dest.dest(), 4)};
  ASSERT_TRUE(inbox.Expect("s", recvs).ok());
  EXPECT_TRUE(ready);
  EXPECT_EQ(inbox.parked(), 0u);
  EXPECT_EQ(Deliver(inbox, Chunk("s", 1, 4, 0, 4), "abcd"), Kind::kWrite);
  EXPECT_TRUE(inbox.Wait("s", Soon()).ok());
  EXPECT_EQ(std::string(dest.dest(), 4), "abcd");
}

TEST(SliceInbox, Unpark_WithdrawsCallback) {
  SliceInbox inbox;
  int token = 0;
  bool ready = false;
  ASSERT_EQ(inbox.Admit(Chunk("s", 1, 4, 0, 4), &token, [&] { ready = true; }).kind,
            Kind::kParked);
  EXPECT_TRUE(inbox.Unpark(&token));
  EXPECT_FALSE(inbox.Unpark(&token));
  ASSERT_TRUE(inbox.Expect("s", {}).ok());
  EXPECT_FALSE(ready);
}

TEST(SliceInbox, CancelUnknownSession_WakesParkedAndAbortsLaterUse) {
  SliceInbox inbox;
  bool ready = false;
  ASSERT_EQ(Deliver(inbox, Chunk("s", 1, 4, 0, 4), "abcd", nullptr, [&] { ready = true; }),
            Kind::kParked);
  inbox.Cancel("s");
  EXPECT_TRUE(ready);
  absl::Status status;
  EXPECT_EQ(Deliver(inbox, Chunk("s", 1, 4, 0, 4), "abcd", &status), Kind::kRejected);
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(inbox.Expect("s", {}).code(), absl::StatusCode::kAborted);
}

TEST(SliceInbox, CancelActiveSession_WaitAborted) {
  SliceInbox inbox;
  Guarded dest(4);
  std::vector<SliceRecv> recvs = {Expected(1, dest.dest(), 4)};
  ASSERT_TRUE(inbox.Expect("s", recvs).ok());
  absl::Status waited;
  absl::Notification done;
  std::thread waiter([&] {
    waited = inbox.Wait("s", absl::InfiniteFuture());
    done.Notify();
  });
  inbox.Cancel("s");
  done.WaitForNotification();
  waiter.join();
  EXPECT_EQ(waited.code(), absl::StatusCode::kAborted);
  absl::Status status;
  EXPECT_EQ(Deliver(inbox, Chunk("s", 1, 4, 0, 4), "abcd", &status), Kind::kRejected);
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted);
}

TEST(SliceInbox, Deadline_WaitDeadlineExceededLateChunkAborted) {
  SliceInbox inbox;
  Guarded dest(4);
  std::vector<SliceRecv> recvs = {Expected(1, dest.dest(), 4)};
  ASSERT_TRUE(inbox.Expect("s", recvs).ok());
  EXPECT_EQ(inbox.Wait("s", absl::Now()).code(), absl::StatusCode::kDeadlineExceeded);
  absl::Status status;
  EXPECT_EQ(Deliver(inbox, Chunk("s", 1, 4, 0, 4), "abcd", &status), Kind::kRejected);
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(std::string(dest.dest(), 4), std::string(4, '\0'));
}

TEST(SliceInbox, CompletedSession_LateChunkDoneAndExpectAgainRejected) {
  SliceInbox inbox;
  Guarded dest(4);
  std::vector<SliceRecv> recvs = {Expected(1, dest.dest(), 4)};
  ASSERT_TRUE(inbox.Expect("s", recvs).ok());
  EXPECT_EQ(Deliver(inbox, Chunk("s", 1, 4, 0, 4), "abcd"), Kind::kWrite);
  ASSERT_TRUE(inbox.Wait("s", Soon()).ok());
  EXPECT_EQ(Deliver(inbox, Chunk("s", 1, 4, 0, 4), "zzzz"), Kind::kSessionDone);
  EXPECT_EQ(std::string(dest.dest(), 4), "abcd");
  EXPECT_EQ(inbox.Expect("s", recvs).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(inbox.Wait("s", Soon()).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(SliceInbox, EmptySlices_CompleteAtOnce) {
  SliceInbox inbox;
  std::vector<SliceRecv> recvs = {Expected(1, nullptr, 0), Expected(2, nullptr, 0)};
  ASSERT_TRUE(inbox.Expect("s", recvs).ok());
  EXPECT_TRUE(inbox.Wait("s", absl::Now()).ok());
}

TEST(SliceInbox, SessionsDoNotMix) {
  SliceInbox inbox;
  Guarded a(4), b(4);
  std::vector<SliceRecv> ra = {Expected(1, a.dest(), 4)};
  std::vector<SliceRecv> rb = {Expected(1, b.dest(), 4)};
  ASSERT_TRUE(inbox.Expect("a", ra).ok());
  ASSERT_TRUE(inbox.Expect("b", rb).ok());
  EXPECT_EQ(inbox.Expect("a", ra).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Deliver(inbox, Chunk("b", 1, 4, 0, 4), "BBBB"), Kind::kWrite);
  EXPECT_EQ(Deliver(inbox, Chunk("a", 1, 4, 0, 4), "AAAA"), Kind::kWrite);
  EXPECT_TRUE(inbox.Wait("a", Soon()).ok());
  EXPECT_TRUE(inbox.Wait("b", Soon()).ok());
  EXPECT_EQ(std::string(a.dest(), 4), "AAAA");
  EXPECT_EQ(std::string(b.dest(), 4), "BBBB");
}

TEST(SliceInbox, SecondChunkWhileFirstInFlight_Rejected) {
  SliceInbox inbox;
  Guarded dest(8);
  std::vector<SliceRecv> recvs = {Expected(1, dest.dest(), 8)};
  ASSERT_TRUE(inbox.Expect("s", recvs).ok());
  int t1 = 0, t2 = 0;
  SliceInbox::Admission first = inbox.Admit(Chunk("s", 1, 8, 0, 4), &t1, [] {});
  ASSERT_EQ(first.kind, Kind::kWrite);
  SliceInbox::Admission second = inbox.Admit(Chunk("s", 1, 8, 0, 8), &t2, [] {});
  EXPECT_EQ(second.kind, Kind::kRejected);
  EXPECT_EQ(second.status.code(), absl::StatusCode::kFailedPrecondition);
  inbox.Commit(first, /*written=*/false);  // a failed copy: the bytes may come again
  EXPECT_EQ(Deliver(inbox, Chunk("s", 1, 8, 0, 8), "abcdefgh"), Kind::kWrite);
  EXPECT_TRUE(inbox.Wait("s", Soon()).ok());
}

TEST(SliceInbox, EndedSessionsMemoryBounded_OldestForgotten) {
  SliceInboxOptions options;
  options.max_ended_sessions = 1;
  SliceInbox inbox(options);
  ASSERT_TRUE(inbox.Expect("old", {}).ok());
  ASSERT_TRUE(inbox.Wait("old", Soon()).ok());
  ASSERT_TRUE(inbox.Expect("new", {}).ok());
  ASSERT_TRUE(inbox.Wait("new", Soon()).ok());
  EXPECT_EQ(Deliver(inbox, Chunk("new", 1, 4, 0, 4), "abcd"), Kind::kSessionDone);
  // "old" is forgotten: its chunk waits like any chunk of an unknown session.
  int token = 0;
  EXPECT_EQ(inbox.Admit(Chunk("old", 1, 4, 0, 4), &token, [] {}).kind, Kind::kParked);
  EXPECT_TRUE(inbox.Unpark(&token));
}

}  // namespace
}  // namespace tessera
