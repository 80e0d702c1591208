#include "common/grpc_status.h"

#include <optional>
#include <string>

#include "common/status.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

v1::ErrorDetail SampleDetail() {
  v1::ErrorDetail detail;
  detail.set_code(v1::ERROR_CODE_INCOMPLETE_COVERAGE);
  detail.set_message("tok_embeddings.weight: rows 8..16 are not covered");
  detail.add_fqns("tok_embeddings.weight");
  detail.mutable_region()->add_offsets(8);
  detail.mutable_region()->add_lengths(8);
  v1::RankRef* rank = detail.add_ranks();
  rank->set_rank(5);
  rank->set_coords("pp=1,tp=0,dp=1");
  return detail;
}

TEST(GrpcStatus, Ok_MapsToOkBothWays) {
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok());
}

TEST(GrpcStatus, StructuredError_RoundTripsCodeMessageAndDetail) {
  const v1::ErrorDetail detail = SampleDetail();
  absl::Status in = MakeError(absl::StatusCode::kInvalidArgument, detail);

  grpc::Status wire = ToGrpcStatus(in);
  EXPECT_EQ(wire.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(wire.error_message(), detail.message());
  v1::ErrorDetail on_wire;
  ASSERT_TRUE(on_wire.ParseFromString(wire.error_details()));
  EXPECT_EQ(on_wire.SerializeAsString(), detail.SerializeAsString());

  absl::Status out = FromGrpcStatus(wire);
  EXPECT_EQ(out.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out.message(), detail.message());
  std::optional<v1::ErrorDetail> got = GetErrorDetail(out);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->SerializeAsString(), detail.SerializeAsString());
  EXPECT_EQ(GetErrorCode(out), v1::ERROR_CODE_INCOMPLETE_COVERAGE);
}

TEST(GrpcStatus, PlainError_RoundTripsWithoutDetail) {
  absl::Status in = absl::UnavailableError("connection refused");
  grpc::Status wire = ToGrpcStatus(in);
  EXPECT_EQ(wire.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(wire.error_message(), "connection refused");
  EXPECT_TRUE(wire.error_details().empty());

  absl::Status out = FromGrpcStatus(wire);
  EXPECT_EQ(out.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(out.message(), "connection refused");
  EXPECT_FALSE(GetErrorDetail(out).has_value());
}

TEST(GrpcStatus, EveryCanonicalCode_MapsToSameNumber) {
  for (int c = 1; c <= 16; ++c) {
    auto code = static_cast<absl::StatusCode>(c);
    absl::Status in(code, "m");
    grpc::Status wire = ToGrpcStatus(in);
    EXPECT_EQ(static_cast<int>(wire.error_code()), c);
    EXPECT_EQ(FromGrpcStatus(wire).code(), code) << c;
  }
}

TEST(GrpcStatus, DetailWithoutMessage_TakesGrpcMessage) {
  v1::ErrorDetail detail;
  detail.set_code(v1::ERROR_CODE_TIMEOUT);
  grpc::Status wire(grpc::StatusCode::ABORTED, "copy phase exceeded 30s",
                    detail.SerializeAsString());
  absl::Status out = FromGrpcStatus(wire);
  EXPECT_EQ(out.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(out.message(), "copy phase exceeded 30s");
  std::optional<v1::ErrorDetail> got = GetErrorDetail(out);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->code(), v1::ERROR_CODE_TIMEOUT);
  EXPECT_EQ(got->message(), "copy phase exceeded 30s");
}

TEST(GrpcStatus, UnparseableDetails_FallBackToPlainStatus) {
  // Field 2 (string) claiming 100 bytes with none following: not a valid message.
  grpc::Status wire(grpc::StatusCode::INTERNAL, "server bug", std::string("\x12\x64", 2));
  absl::Status out = FromGrpcStatus(wire);
  EXPECT_EQ(out.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(out.message(), "server bug");
  EXPECT_FALSE(GetErrorDetail(out).has_value());
}

TEST(GrpcStatus, AbslPayloadOfOtherType_NotSentAsDetails) {
  absl::Status in = absl::InternalError("x");
  in.SetPayload("type.googleapis.com/other.Thing", absl::Cord("abc"));
  grpc::Status wire = ToGrpcStatus(in);
  EXPECT_TRUE(wire.error_details().empty());
}

}  // namespace
}  // namespace tessera
