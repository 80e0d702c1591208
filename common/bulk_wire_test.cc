// The bulk port's frames, decoded without a socket (common/bulk_wire.h): a claimed length above
// the limit is refused before anything is allocated for it, what SendBulkFrame sends decodes
// back, and a peer's status code that is no absl::StatusCode is not cast into one.
#include "common/bulk_wire.h"

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tessera/v1/peer.pb.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

TEST(BulkWireTest, HugeClaimedLength_RefusedNamingTheLimitAndThePeer) {
  const unsigned char prefix[4] = {0xff, 0xff, 0xff, 0xff};  // 4 GiB - 1
  absl::StatusOr<uint32_t> n = DecodeBulkFrameLength(prefix, "tessera.v1.BulkRequest", "10.0.0.7:9");
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(n.status().message(), HasSubstr("4294967295 bytes from 10.0.0.7:9"));
  EXPECT_THAT(n.status().message(), HasSubstr("at most 65536"));
}

TEST(BulkWireTest, EncodedFrame_DecodesBack) {
  v1::BulkRequest request;
  request.mutable_put()->set_job_id("job");
  request.mutable_put()->mutable_copy()->set_nbytes(4096);
  const std::string frame = EncodeBulkFrame(request);
  absl::StatusOr<uint32_t> n = DecodeBulkFrameLength(
      reinterpret_cast<const unsigned char*>(frame.data()), "frame", "peer");
  ASSERT_TRUE(n.ok()) << n.status();
  ASSERT_EQ(*n, frame.size() - 4);
  v1::BulkRequest decoded;
  ASSERT_TRUE(DecodeBulkFrameBody(absl::string_view(frame).substr(4), &decoded, "peer").ok());
  EXPECT_EQ(decoded.put().copy().nbytes(), 4096u);
  EXPECT_EQ(DecodeBulkFrameBody("\xff\xff\xff", &decoded, "peer").code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(BulkWireTest, StatusCodeNoAbslCode_Unknown) {
  v1::BulkStatus status;
  status.set_code(1000);
  status.set_message("odd");
  const absl::Status s = BulkStatusResult(status, "10.0.0.7:9").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnknown);
  EXPECT_THAT(s.message(), HasSubstr("odd (bulk port 10.0.0.7:9)"));
  status.set_code(static_cast<int>(absl::StatusCode::kNotFound));
  EXPECT_EQ(BulkStatusResult(status, "a").status().code(), absl::StatusCode::kNotFound);
  status.set_code(0);
  status.set_nbytes(12);
  EXPECT_EQ(*BulkStatusResult(status, "a"), 12u);
}

}  // namespace
}  // namespace tessera
