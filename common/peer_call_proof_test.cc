#include "common/peer_call_proof.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/peer_auth.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

const std::string kKey(kPeerSecretBytes, 'k');
const absl::Time kNow = absl::FromUnixSeconds(1'800'000'000);

class PeerCallGateTest : public ::testing::Test {
 protected:
  PeerCallGateTest() { keyring_.Set(JobPeerSecret(kKey, "job-a")); }

  std::string Proof(const std::string& job, absl::string_view method, absl::Time at = kNow,
                    char nonce = 'n') {
    return EncodePeerCallProof(MakePeerCallProof(PeerCredential{job, JobPeerSecret(kKey, job)},
                                                 method, at,
                                                 std::string(kPeerNonceBytes, nonce)));
  }

  absl::StatusCode Check(const std::string& value, absl::string_view method = kRelayMethod) {
    return gate_.Check(&value, method).code();
  }

  PeerKeyring keyring_{"job-a"};
  PeerCallGate gate_{&keyring_, [] { return kNow; }};
};

TEST_F(PeerCallGateTest, ProofOfTheJob_Admitted) {
  EXPECT_EQ(Check(Proof("job-a", kRelayMethod)), absl::StatusCode::kOk);
}

TEST_F(PeerCallGateTest, NoProof_Unauthenticated) {
  EXPECT_EQ(gate_.Check(nullptr, kRelayMethod).code(), absl::StatusCode::kUnauthenticated);
}

TEST_F(PeerCallGateTest, Replayed_UnauthenticatedTheSecondTime) {
  const std::string proof = Proof("job-a", kRelayMethod);
  ASSERT_EQ(Check(proof), absl::StatusCode::kOk);
  EXPECT_EQ(Check(proof), absl::StatusCode::kUnauthenticated);
}

TEST_F(PeerCallGateTest, AnotherJobsForgedStaleOrOtherMethod_Unauthenticated) {
  EXPECT_EQ(Check(Proof("job-b", kRelayMethod)), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(Check(Proof("job-a", kPushSlicesMethod)), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(Check(Proof("job-a", kRelayMethod, kNow - kPeerCallSkew - absl::Seconds(1), 'o')),
            absl::StatusCode::kUnauthenticated);
  PeerCallProof forged = *DecodePeerCallProof(Proof("job-a", kRelayMethod, kNow, 'f'));
  forged.mac[0] ^= 1;
  EXPECT_EQ(Check(EncodePeerCallProof(forged)), absl::StatusCode::kUnauthenticated);
  // None of these was admitted: the nonce of the forged one is still fresh.
  EXPECT_EQ(Check(Proof("job-a", kRelayMethod, kNow, 'f')), absl::StatusCode::kOk);
}

TEST_F(PeerCallGateTest, BeforeRegistration_EverythingRefused) {
  PeerKeyring empty("job-a");
  PeerCallGate gate(&empty, [] { return kNow; });
  const std::string unkeyed = EncodePeerCallProof(MakePeerCallProof(
      PeerCredential{"job-a", ""}, kRelayMethod, kNow, std::string(kPeerNonceBytes, 'n')));
  EXPECT_EQ(gate.Check(&unkeyed, kRelayMethod).code(), absl::StatusCode::kUnauthenticated);
}

TEST(PeerCallProof, Decode_RefusesMalformedValues) {
  for (const std::string& value :
       {std::string(""), std::string("v2.1.aa.bb"), std::string("v1.x.") + std::string(64, 'a') +
                                                        "." + std::string(64, 'a'),
        std::string("v1.1.") + std::string(62, 'a') + "." + std::string(64, 'a'),
        std::string("v1.1.") + std::string(64, 'A') + "." + std::string(64, 'a')}) {
    EXPECT_EQ(DecodePeerCallProof(value).status().code(), absl::StatusCode::kInvalidArgument)
        << value;
  }
}

TEST_F(PeerCallGateTest, TimeNotWrittenAsEncoded_Unauthenticated) {
  // The MAC covers the time as EncodePeerCallProof writes it; another spelling of the same
  // number ("+", leading zeros or spaces, which absl::SimpleAtoi takes) is not that proof.
  const std::string proof = Proof("job-a", kRelayMethod);
  const std::string time = absl::StrCat(absl::ToUnixMillis(kNow));
  for (const std::string& spelling : {"+" + time, "0" + time, " " + time, time + " "}) {
    std::string value = proof;
    value.replace(value.find(time), time.size(), spelling);
    EXPECT_EQ(DecodePeerCallProof(value).status().code(), absl::StatusCode::kInvalidArgument)
        << value;
    EXPECT_EQ(Check(value), absl::StatusCode::kUnauthenticated) << value;
  }
  EXPECT_EQ(Check(proof), absl::StatusCode::kOk);
}

}  // namespace
}  // namespace tessera
