#include "storage/s3/s3_errors.h"

#include <curl/curl.h>

#include <optional>
#include <string>

#include "common/status.h"
#include "gtest/gtest.h"
#include "tessera/v1/types.pb.h"

namespace tessera::s3 {
namespace {

using C = absl::StatusCode;

TEST(S3ErrorStatusCode, TheTable) {
  struct Row {
    int http;
    const char* code;
    C want;
  };
  for (const Row& row : std::initializer_list<Row>{
           {403, "AccessDenied", C::kPermissionDenied},
           {403, "SignatureDoesNotMatch", C::kPermissionDenied},
           {403, "InvalidAccessKeyId", C::kPermissionDenied},
           {403, "", C::kPermissionDenied},
           {400, "ExpiredToken", C::kPermissionDenied},
           {404, "NoSuchKey", C::kNotFound},
           {404, "NoSuchBucket", C::kNotFound},
           {404, "", C::kNotFound},
           {404, "NoSuchUpload", C::kAborted},
           {409, "BucketAlreadyOwnedByYou", C::kAlreadyExists},
           {409, "BucketAlreadyExists", C::kAlreadyExists},
           {409, "ConditionalRequestConflict", C::kAborted},
           {409, "OperationAborted", C::kAborted},
           {412, "PreconditionFailed", C::kAlreadyExists},
           {416, "InvalidRange", C::kOutOfRange},
           {301, "PermanentRedirect", C::kFailedPrecondition},
           {400, "AuthorizationHeaderMalformed", C::kFailedPrecondition},
           {400, "RequestTimeout", C::kUnavailable},
           {400, "InvalidPart", C::kInvalidArgument},
           {400, "EntityTooSmall", C::kInvalidArgument},
           {400, "MalformedXML", C::kInvalidArgument},
           {501, "NotImplemented", C::kUnimplemented},
           {429, "", C::kUnavailable},
           {500, "InternalError", C::kUnavailable},
           {502, "", C::kUnavailable},
           {503, "SlowDown", C::kUnavailable},
           {504, "", C::kUnavailable},
           {200, "InternalError", C::kUnavailable},  // a 200 <Error> is the 500 it stands for
           {200, "SlowDown", C::kUnavailable},
           {200, "NoSuchUpload", C::kAborted},
           {200, "AccessDenied", C::kPermissionDenied},
           {200, "SomethingNew", C::kInternal},
           {418, "", C::kInternal},
           {405, "MethodNotAllowed", C::kInternal},
       }) {
    EXPECT_EQ(S3ErrorStatusCode(row.http, row.code), row.want) << row.http << " " << row.code;
  }
}

TEST(EffectiveHttpStatus, ErrorIn200_StandsForItsStatus) {
  EXPECT_EQ(EffectiveHttpStatus(200, "InternalError"), 500);
  EXPECT_EQ(EffectiveHttpStatus(200, "SlowDown"), 503);
  EXPECT_EQ(EffectiveHttpStatus(200, "ServiceUnavailable"), 503);
  EXPECT_EQ(EffectiveHttpStatus(200, "AccessDenied"), 200);
  EXPECT_EQ(EffectiveHttpStatus(404, "InternalError"), 404);
}

TEST(S3ErrorToStatus, Message_NamesOpUrlStatusCodeMessageRequestIdAttempts) {
  CallContext call{"PutObject", "ckpt", "run1/x.bin", 3, absl::Milliseconds(1500)};
  const absl::Status status =
      S3ErrorToStatus(call, 503, {"SlowDown", "Please reduce your request rate.", "REQ42"});
  EXPECT_EQ(status.code(), C::kUnavailable);
  EXPECT_EQ(status.message(),
            "PutObject s3://ckpt/run1/x.bin: HTTP 503 SlowDown: Please reduce your request "
            "rate. (request id REQ42; 3 attempts over 1.5 s)");
}

TEST(S3ErrorToStatus, Payload_IoErrorWithS3Path) {
  CallContext call{"GetObject", "ckpt", "a/b", 1};
  const absl::Status status = S3ErrorToStatus(call, 404, {"NoSuchKey", "gone", ""});
  std::optional<v1::ErrorDetail> detail = GetErrorDetail(status);
  ASSERT_TRUE(detail.has_value());
  EXPECT_EQ(detail->code(), v1::ERROR_CODE_IO_ERROR);
  EXPECT_EQ(detail->path(), "s3://ckpt/a/b");
}

TEST(S3ErrorToStatus, NoSuchBucket_MessageSaysTheBucketDoesNotExist) {
  CallContext call{"GetObject", "missing-bucket", "k", 1};
  const absl::Status status = S3ErrorToStatus(call, 404, {"NoSuchBucket", "", ""});
  EXPECT_EQ(status.code(), C::kNotFound);
  EXPECT_NE(status.message().find("bucket missing-bucket does not exist"), std::string::npos)
      << status.message();
}

TEST(S3ErrorToStatus, NoSuchUpload_AbortedSayingWhy) {
  CallContext call{"UploadPart", "b", "k", 1};
  const absl::Status status = S3ErrorToStatus(call, 404, {"NoSuchUpload", "", ""});
  EXPECT_EQ(status.code(), C::kAborted);
  EXPECT_NE(status.message().find("aborted, expired or already completed"), std::string::npos);
}

TEST(S3ErrorToStatus, HeadWithoutCode_SaysKeyOrBucket) {
  CallContext call{"HeadObject", "b", "k", 1};
  const absl::Status status = S3ErrorToStatus(call, 404, {});
  EXPECT_EQ(status.message(),
            "HeadObject s3://b/k: HTTP 404 (no such key, or no such bucket: the reply has no "
            "error code) (1 attempt)");
}

TEST(ClassifyCurlCode, ResetsAndTimeouts_Transient) {
  for (CURLcode code : {CURLE_COULDNT_CONNECT, CURLE_OPERATION_TIMEDOUT, CURLE_SEND_ERROR,
                        CURLE_RECV_ERROR, CURLE_GOT_NOTHING, CURLE_PARTIAL_FILE}) {
    EXPECT_EQ(ClassifyCurlCode(code), TransportFailure::kTransient) << code;
  }
}

TEST(ClassifyCurlCode, ConfigurationFailures_Permanent) {
  for (CURLcode code : {CURLE_COULDNT_RESOLVE_HOST, CURLE_PEER_FAILED_VERIFICATION,
                        CURLE_URL_MALFORMAT, CURLE_SSL_CACERT_BADFILE}) {
    EXPECT_EQ(ClassifyCurlCode(code), TransportFailure::kPermanent) << code;
  }
  EXPECT_EQ(ClassifyCurlCode(CURLE_OK), TransportFailure::kNone);
}

TEST(CurlStatusCode, TheTable) {
  EXPECT_EQ(CurlStatusCode(CURLE_COULDNT_CONNECT), C::kUnavailable);
  EXPECT_EQ(CurlStatusCode(CURLE_OPERATION_TIMEDOUT), C::kUnavailable);
  EXPECT_EQ(CurlStatusCode(CURLE_COULDNT_RESOLVE_HOST), C::kUnavailable);
  EXPECT_EQ(CurlStatusCode(CURLE_PEER_FAILED_VERIFICATION), C::kFailedPrecondition);
  EXPECT_EQ(CurlStatusCode(CURLE_SSL_CACERT_BADFILE), C::kFailedPrecondition);
  EXPECT_EQ(CurlStatusCode(CURLE_URL_MALFORMAT), C::kInvalidArgument);
  EXPECT_EQ(CurlStatusCode(CURLE_OUT_OF_MEMORY), C::kInternal);
}

TEST(TransportErrorToStatus, Message_NamesOpUrlCurlTextAndAttempts) {
  CallContext call{"GetObject", "b", "k", 5, absl::Seconds(2)};
  const absl::Status status =
      TransportErrorToStatus(call, CURLE_COULDNT_CONNECT, "Failed to connect to 127.0.0.1");
  EXPECT_EQ(status.code(), C::kUnavailable);
  EXPECT_EQ(status.message(),
            "GetObject s3://b/k: Couldn't connect to server: Failed to connect to 127.0.0.1 "
            "[curl error 7] (5 attempts over 2.0 s)");
}

TEST(CallError, BeforeAnyRequest_NoAttemptsSuffix) {
  CallContext call{"PutObject", "b", ""};
  const absl::Status status = CallError(call, C::kInvalidArgument, "S3 object key is empty");
  EXPECT_EQ(status.message(), "PutObject s3://b/: S3 object key is empty");
}

}  // namespace
}  // namespace tessera::s3
