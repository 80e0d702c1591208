#include "agent/peer/peer_address_book.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

TEST(PeerAddressBook, Resolve_KnownSessionAndRank_Address) {
  PeerAddressBook book;
  book.Set("s10-a", {{0, "10.0.0.1:7000"}, {2, "10.0.0.2:7000"}});
  EXPECT_EQ(book.Resolve("s10-a", 2).value(), "10.0.0.2:7000");
  EXPECT_EQ(book.Resolve("s10-a", 1).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(book.Resolve("s20-b", 0).status().code(), absl::StatusCode::kUnavailable);
}

TEST(PeerAddressBook, Resolve_EmptyAddress_Unavailable) {
  PeerAddressBook book;
  book.Set("s1", {{0, ""}});
  EXPECT_EQ(book.Resolve("s1", 0).status().code(), absl::StatusCode::kUnavailable);
}

// The regression: sessions s10 … s90 then s100 and s110 — ids that sort before the older ones.
// Evicting by name dropped the newest session and its gather failed ("no address known").
TEST(PeerAddressBook, Set_MoreSessionsThanCapacity_EvictsTheOldestNotTheSmallestName) {
  PeerAddressBook book(8);
  for (int step = 10; step <= 110; step += 10) {
    book.Set(absl::StrCat("s", step, "-x"), {{0, absl::StrCat("host:", step)}});
    EXPECT_EQ(book.Resolve(absl::StrCat("s", step, "-x"), 0).value(), absl::StrCat("host:", step))
        << "step " << step;
  }
  EXPECT_FALSE(book.Resolve("s30-x", 0).ok());  // the 9th newest is gone
  EXPECT_TRUE(book.Resolve("s40-x", 0).ok());
}

TEST(PeerAddressBook, Set_SameSessionAgain_ReplacesAndRefreshes) {
  PeerAddressBook book(2);
  book.Set("a", {{0, "old"}});
  book.Set("b", {{0, "b"}});
  book.Set("a", {{0, "new"}});
  book.Set("c", {{0, "c"}});  // evicts b, the least recently set
  EXPECT_EQ(book.Resolve("a", 0).value(), "new");
  EXPECT_FALSE(book.Resolve("b", 0).ok());
  EXPECT_TRUE(book.Resolve("c", 0).ok());
}

}  // namespace
}  // namespace tessera
