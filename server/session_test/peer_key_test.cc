// server/session/schema.h PeerKey: the coordinator's key for its jobs' peer secrets.
#include <string>

#include "common/peer_auth.h"
#include "gtest/gtest.h"
#include "server/session/schema.h"
#include "server/store/memory_state_store.h"

namespace tessera {
namespace {

TEST(PeerKey, MadeOnce_TheSameAfterARestart) {
  MemoryStateStore store;
  absl::StatusOr<std::string> first = PeerKey(store);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->size(), kPeerSecretBytes);
  // A restarted coordinator reads the stored key: its jobs keep their secrets.
  absl::StatusOr<std::string> again = PeerKey(store);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, *first);
  MemoryStateStore other;
  EXPECT_NE(*PeerKey(other), *first);
}

TEST(PeerKey, StoredKeyOfAnotherLength_DataLoss) {
  MemoryStateStore store;
  ASSERT_TRUE(store.Commit(StoreBatch().Put(Table::kMeta, "peer_key", "short")).ok());
  EXPECT_EQ(PeerKey(store).status().code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace tessera
