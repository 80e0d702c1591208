#include "common/status.h"

#include <memory>
#include <optional>
#include <string>

#include "gtest/gtest.h"

namespace tessera {
namespace {

v1::ErrorDetail FullDetail() {
  v1::ErrorDetail detail;
  detail.set_code(v1::ERROR_CODE_DUPLICATE_FQN);
  detail.set_message("layers.0.wq.weight is claimed by pp=0 and pp=1");
  detail.add_fqns("layers.0.wq.weight");
  v1::RankRef* rank = detail.add_ranks();
  rank->set_rank(3);
  rank->set_coords("pp=1,tp=1,dp=0");
  detail.mutable_region()->add_offsets(0);
  detail.mutable_region()->add_lengths(16);
  detail.set_path("step-000000010/data-0.safetensors");
  detail.set_state_key("exp_avg");
  return detail;
}

TEST(MakeError, FullDetail_RoundTripsThroughGetErrorDetail) {
  const v1::ErrorDetail detail = FullDetail();
  absl::Status status = MakeError(absl::StatusCode::kInvalidArgument, detail);

  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), detail.message());
  std::optional<v1::ErrorDetail> got = GetErrorDetail(status);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->SerializeAsString(), detail.SerializeAsString());
  EXPECT_EQ(GetErrorCode(status), v1::ERROR_CODE_DUPLICATE_FQN);
}

TEST(MakeError, Shorthand_SetsCodeReasonAndMessage) {
  absl::Status status =
      MakeError(absl::StatusCode::kAborted, v1::ERROR_CODE_AGENT_LOST, "agent on node-3 lost");
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(status.message(), "agent on node-3 lost");
  EXPECT_EQ(GetErrorCode(status), v1::ERROR_CODE_AGENT_LOST);
  std::optional<v1::ErrorDetail> detail = GetErrorDetail(status);
  ASSERT_TRUE(detail.has_value());
  EXPECT_EQ(detail->message(), "agent on node-3 lost");
  EXPECT_EQ(detail->code(), v1::ERROR_CODE_AGENT_LOST);
}

TEST(MakeError, PayloadUsesDocumentedTypeUrl) {
  absl::Status status =
      MakeError(absl::StatusCode::kDataLoss, v1::ERROR_CODE_CHECKSUM_MISMATCH, "bad block 3");
  auto payload = status.GetPayload(kErrorDetailTypeUrl);
  ASSERT_TRUE(payload.has_value());
  v1::ErrorDetail parsed;
  ASSERT_TRUE(parsed.ParseFromString(std::string(*payload)));
  EXPECT_EQ(parsed.code(), v1::ERROR_CODE_CHECKSUM_MISMATCH);
}

TEST(GetErrorDetail, PlainStatus_HasNoDetail) {
  absl::Status status = absl::InternalError("boom");
  EXPECT_FALSE(GetErrorDetail(status).has_value());
  EXPECT_EQ(GetErrorCode(status), v1::ERROR_CODE_UNSPECIFIED);
}

TEST(GetErrorDetail, OkStatus_HasNoDetail) {
  EXPECT_FALSE(GetErrorDetail(absl::OkStatus()).has_value());
  EXPECT_EQ(GetErrorCode(absl::OkStatus()), v1::ERROR_CODE_UNSPECIFIED);
}

TEST(GetErrorDetail, UnparseablePayload_HasNoDetail) {
  absl::Status status = absl::InternalError("boom");
  // A truncated length-delimited field (field 2, length 100, no bytes) is not a valid message.
  status.SetPayload(kErrorDetailTypeUrl, absl::Cord(std::string("\x12\x64", 2)));
  EXPECT_FALSE(GetErrorDetail(status).has_value());
  EXPECT_EQ(GetErrorCode(status), v1::ERROR_CODE_UNSPECIFIED);
}

TEST(GetErrorDetail, OtherTypeUrl_Ignored) {
  absl::Status status = absl::InternalError("boom");
  v1::ErrorDetail detail = FullDetail();
  status.SetPayload("type.googleapis.com/other.Detail", absl::Cord(detail.SerializeAsString()));
  EXPECT_FALSE(GetErrorDetail(status).has_value());
}

TEST(ErrorCodeName, StripsPrefix) {
  EXPECT_EQ(ErrorCodeName(v1::ERROR_CODE_DUPLICATE_FQN), "DUPLICATE_FQN");
  EXPECT_EQ(ErrorCodeName(v1::ERROR_CODE_UNSPECIFIED), "UNSPECIFIED");
  EXPECT_EQ(ErrorCodeName(v1::ERROR_CODE_SESSION_IN_PROGRESS), "SESSION_IN_PROGRESS");
}

TEST(ErrorCodeName, EveryEnumValue_HasPrefixFreeName) {
  const google::protobuf::EnumDescriptor* desc = v1::ErrorCode_descriptor();
  for (int i = 0; i < desc->value_count(); ++i) {
    const auto* value = desc->value(i);
    std::string name = ErrorCodeName(static_cast<v1::ErrorCode>(value->number()));
    EXPECT_EQ("ERROR_CODE_" + name, value->name());
  }
}

TEST(ErrorCodeName, UnknownValue_NamesNumber) {
  EXPECT_EQ(ErrorCodeName(static_cast<v1::ErrorCode>(999)), "ERROR_CODE(999)");
}

// --- RETURN_IF_ERROR / ASSIGN_OR_RETURN -------------------------------------------------

absl::Status StatusFrom(bool ok, int* calls) {
  ++*calls;
  return ok ? absl::OkStatus() : absl::NotFoundError("no such thing");
}

absl::StatusOr<int> ValueFrom(bool ok, int value, int* calls) {
  ++*calls;
  if (!ok) return absl::FailedPreconditionError("not ready");
  return value;
}

absl::StatusOr<std::unique_ptr<int>> MoveOnlyFrom(bool ok) {
  if (!ok) return absl::UnavailableError("gone");
  return std::make_unique<int>(7);
}

// Runs RETURN_IF_ERROR on a Status, then marks `reached`.
absl::Status ReturnIfErrorOnStatus(bool ok, int* calls, bool* reached) {
  RETURN_IF_ERROR(StatusFrom(ok, calls));
  *reached = true;
  return absl::OkStatus();
}

// Runs RETURN_IF_ERROR on a StatusOr, then marks `reached`.
absl::Status ReturnIfErrorOnStatusOr(bool ok, int* calls, bool* reached) {
  RETURN_IF_ERROR(ValueFrom(ok, 1, calls));
  *reached = true;
  return absl::OkStatus();
}

absl::StatusOr<int> AssignTwice(bool first_ok, bool second_ok, int* calls) {
  ASSIGN_OR_RETURN(int a, ValueFrom(first_ok, 20, calls));
  // Two uses in one function must not collide (distinct temporaries per line).
  ASSIGN_OR_RETURN(int b, ValueFrom(second_ok, 22, calls));
  return a + b;
}

absl::Status AssignToExisting(bool ok, int* out) {
  int calls = 0;
  ASSIGN_OR_RETURN(*out, ValueFrom(ok, 5, &calls));
  return absl::OkStatus();
}

absl::StatusOr<int> AssignMoveOnly(bool ok) {
  ASSIGN_OR_RETURN(std::unique_ptr<int> p, MoveOnlyFrom(ok));
  return *p;
}

TEST(ReturnIfError, OkStatus_ContinuesAndEvaluatesOnce) {
  int calls = 0;
  bool reached = false;
  EXPECT_TRUE(ReturnIfErrorOnStatus(true, &calls, &reached).ok());
  EXPECT_TRUE(reached);
  EXPECT_EQ(calls, 1);
}

TEST(ReturnIfError, ErrorStatus_ReturnsItUnchanged) {
  int calls = 0;
  bool reached = false;
  absl::Status s = ReturnIfErrorOnStatus(false, &calls, &reached);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "no such thing");
  EXPECT_FALSE(reached);
  EXPECT_EQ(calls, 1);
}

TEST(ReturnIfError, OkStatusOr_Continues) {
  int calls = 0;
  bool reached = false;
  EXPECT_TRUE(ReturnIfErrorOnStatusOr(true, &calls, &reached).ok());
  EXPECT_TRUE(reached);
  EXPECT_EQ(calls, 1);
}

TEST(ReturnIfError, ErrorStatusOr_ReturnsItsStatus) {
  int calls = 0;
  bool reached = false;
  absl::Status s = ReturnIfErrorOnStatusOr(false, &calls, &reached);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(reached);
}

TEST(ReturnIfError, StructuredError_KeepsPayload) {
  auto f = []() -> absl::Status {
    RETURN_IF_ERROR(MakeError(absl::StatusCode::kAborted, v1::ERROR_CODE_TIMEOUT, "slow"));
    return absl::OkStatus();
  };
  absl::Status s = f();
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(GetErrorCode(s), v1::ERROR_CODE_TIMEOUT);
}

TEST(ReturnIfError, UsableAsSingleStatementInIfElse) {
  auto f = [](bool take_branch) -> absl::Status {
    if (take_branch)
      RETURN_IF_ERROR(absl::InternalError("x"));
    else
      return absl::CancelledError("else");
    return absl::OkStatus();
  };
  EXPECT_EQ(f(true).code(), absl::StatusCode::kInternal);
  EXPECT_EQ(f(false).code(), absl::StatusCode::kCancelled);
}

TEST(AssignOrReturn, BothOk_AssignsValues) {
  int calls = 0;
  absl::StatusOr<int> v = AssignTwice(true, true, &calls);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, 42);
  EXPECT_EQ(calls, 2);
}

TEST(AssignOrReturn, FirstFails_ReturnsEarly) {
  int calls = 0;
  absl::StatusOr<int> v = AssignTwice(false, true, &calls);
  EXPECT_EQ(v.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(calls, 1);
}

TEST(AssignOrReturn, SecondFails_ReturnsItsStatus) {
  int calls = 0;
  absl::StatusOr<int> v = AssignTwice(true, false, &calls);
  EXPECT_EQ(v.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(calls, 2);
}

TEST(AssignOrReturn, ExistingLvalue_AssignedOnlyOnOk) {
  int out = -1;
  EXPECT_FALSE(AssignToExisting(false, &out).ok());
  EXPECT_EQ(out, -1);
  EXPECT_TRUE(AssignToExisting(true, &out).ok());
  EXPECT_EQ(out, 5);
}

TEST(AssignOrReturn, MoveOnlyValue_Moved) {
  absl::StatusOr<int> v = AssignMoveOnly(true);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, 7);
  EXPECT_EQ(AssignMoveOnly(false).status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace tessera
