#include "common/bulk_handshake.h"

#include <string>

#include "common/peer_auth.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

const std::string kKey(kPeerSecretBytes, 'k');

PeerCredential Of(const std::string& job) { return {job, JobPeerSecret(kKey, job)}; }

std::string Nonce(char c) { return std::string(kPeerNonceBytes, c); }

v1::BulkHello Hello(const PeerCredential& credential, const std::string& holder_nonce,
                    const std::string& request) {
  v1::BulkHello hello;
  hello.set_nonce(Nonce('p'));
  hello.set_request(request);
  hello.set_proof(BulkClientProof(credential, holder_nonce, hello.nonce(), request));
  return hello;
}

std::string ReadRequest(const std::string& job) {
  v1::BulkRequest request;
  request.mutable_read()->set_job_id(job);
  request.mutable_read()->set_file("data-00000");
  return request.SerializeAsString();
}

TEST(PeerAuth, JobSecrets_DifferPerJob_SamePerKey) {
  EXPECT_EQ(JobPeerSecret(kKey, "job-a").size(), kPeerSecretBytes);
  EXPECT_EQ(JobPeerSecret(kKey, "job-a"), JobPeerSecret(kKey, "job-a"));
  EXPECT_NE(JobPeerSecret(kKey, "job-a"), JobPeerSecret(kKey, "job-b"));
  EXPECT_NE(JobPeerSecret(kKey, "job-a"), JobPeerSecret(std::string(32, 'x'), "job-a"));
}

TEST(PeerAuth, PeerMac_PartsAreLengthPrefixed) {
  EXPECT_NE(PeerMac(kKey, {"ab", "c"}), PeerMac(kKey, {"a", "bc"}));
  EXPECT_FALSE(SameMac("", ""));  // what a failed HMAC returns matches nothing
}

TEST(BulkHandshake, Hello_OfTheJob_OpensItsRequest) {
  const PeerCredential job = Of("job-a");
  absl::StatusOr<v1::BulkRequest> request =
      OpenBulkHello(job, Nonce('h'), Hello(job, Nonce('h'), ReadRequest("job-a")));
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_EQ(request->read().file(), "data-00000");
}

TEST(BulkHandshake, Hello_ReplayedOnAnotherConnection_Unauthenticated) {
  const PeerCredential job = Of("job-a");
  const v1::BulkHello recorded = Hello(job, Nonce('h'), ReadRequest("job-a"));
  EXPECT_EQ(OpenBulkHello(job, Nonce('H'), recorded).status().code(),
            absl::StatusCode::kUnauthenticated);
}

TEST(BulkHandshake, Hello_OfAnotherJob_Unauthenticated) {
  EXPECT_EQ(OpenBulkHello(Of("job-a"), Nonce('h'), Hello(Of("job-b"), Nonce('h'),
                                                          ReadRequest("job-a")))
                .status()
                .code(),
            absl::StatusCode::kUnauthenticated);
}

TEST(BulkHandshake, Hello_WithAnAlteredRequest_Unauthenticated) {
  const PeerCredential job = Of("job-a");
  v1::BulkHello hello = Hello(job, Nonce('h'), ReadRequest("job-a"));
  v1::BulkRequest put;
  put.mutable_put()->set_job_id("job-a");
  hello.set_request(put.SerializeAsString());
  EXPECT_EQ(OpenBulkHello(job, Nonce('h'), hello).status().code(),
            absl::StatusCode::kUnauthenticated);
}

TEST(BulkHandshake, Holder_WithoutASecretYet_RefusesEvenAnEmptyOne) {
  const PeerCredential none{"job-a", ""};
  EXPECT_EQ(OpenBulkHello(none, Nonce('h'), Hello(none, Nonce('h'), ReadRequest("job-a")))
                .status()
                .code(),
            absl::StatusCode::kUnauthenticated);
}

TEST(BulkHandshake, ServerProof_OnlyTheJobsHolderPasses) {
  const PeerCredential job = Of("job-a");
  v1::BulkStatus status;
  status.set_proof(BulkServerProof(job, Nonce('h'), Nonce('p')));
  EXPECT_TRUE(CheckBulkServerProof(job, Nonce('h'), Nonce('p'), status, "x:1").ok());
  // The peer's own proof reflected back is not the holder's.
  status.set_proof(BulkClientProof(job, Nonce('h'), Nonce('p'), ""));
  EXPECT_EQ(CheckBulkServerProof(job, Nonce('h'), Nonce('p'), status, "x:1").code(),
            absl::StatusCode::kUnauthenticated);
  status.set_proof(BulkServerProof(Of("job-b"), Nonce('h'), Nonce('p')));
  EXPECT_EQ(CheckBulkServerProof(job, Nonce('h'), Nonce('p'), status, "x:1").code(),
            absl::StatusCode::kUnauthenticated);
}

TEST(BulkHandshake, Decoders_RefuseWrongLengths) {
  v1::BulkChallenge challenge;
  challenge.set_nonce("short");
  EXPECT_EQ(DecodeBulkChallenge(challenge.SerializeAsString()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeBulkChallenge("\xff\xff").status().code(), absl::StatusCode::kInvalidArgument);
  v1::BulkHello hello = Hello(Of("job-a"), Nonce('h'), "");
  hello.set_proof("short");
  EXPECT_EQ(DecodeBulkHello(hello.SerializeAsString()).status().code(),
            absl::StatusCode::kInvalidArgument);
  hello = Hello(Of("job-a"), Nonce('h'), "");
  EXPECT_TRUE(DecodeBulkHello(hello.SerializeAsString()).ok());
}

}  // namespace
}  // namespace tessera
