#include "storage/s3/s3_xml.h"

#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"

namespace tessera::s3 {
namespace {

// A recorded reply, from the test's runfiles.
std::string Testdata(const std::string& name) {
  std::ifstream in("storage/s3/testdata/" + name, std::ios::binary);
  EXPECT_TRUE(in.good()) << "missing testdata " << name;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(ParseListObjectsV2, Truncated_UrlEncodedKeysDecodedTokenKept) {
  absl::StatusOr<ListObjectsPage> page =
      ParseListObjectsV2(Testdata("list_objects_v2_truncated.xml"));
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_TRUE(page->is_truncated);
  EXPECT_EQ(page->next_continuation_token, "1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM=");
  ASSERT_EQ(page->objects.size(), 2u);
  EXPECT_EQ(page->objects[0].key, "run1/a b+c=\xc3\xa9.bin");
  EXPECT_EQ(page->objects[0].size, 8388608u);
  EXPECT_EQ(page->objects[0].etag, "\"9b2cf535f27731c974343645a3985328\"");
  EXPECT_EQ(page->objects[1].key, "run1/manifest.json");
  EXPECT_EQ(page->objects[1].size, 0u);
  EXPECT_TRUE(page->common_prefixes.empty());
}

TEST(ParseListObjectsV2, Delimiter_CommonPrefixesAndPlainKeys) {
  absl::StatusOr<ListObjectsPage> page =
      ParseListObjectsV2(Testdata("list_objects_v2_delimiter.xml"));
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_FALSE(page->is_truncated);
  ASSERT_EQ(page->objects.size(), 1u);
  EXPECT_EQ(page->objects[0].key, "LATEST");
  EXPECT_EQ(page->common_prefixes,
            (std::vector<std::string>{"step-000000010/", "step-000000020/"}));
}

TEST(ParseListObjectsV2, NoNamespace_StillParsed) {
  absl::StatusOr<ListObjectsPage> page = ParseListObjectsV2(
      "<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>k</Key><Size>3</Size>"
      "</Contents></ListBucketResult>");
  ASSERT_TRUE(page.ok()) << page.status();
  ASSERT_EQ(page->objects.size(), 1u);
  EXPECT_EQ(page->objects[0].size, 3u);
}

TEST(ParseListObjectsV2, TruncatedWithoutToken_Rejected) {
  absl::StatusOr<ListObjectsPage> page =
      ParseListObjectsV2("<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>");
  EXPECT_EQ(page.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(page.status().message().find("NextContinuationToken"), std::string::npos);
}

TEST(ParseListObjectsV2, BadSize_RejectedNamingTheKey) {
  absl::StatusOr<ListObjectsPage> page = ParseListObjectsV2(
      "<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>k1</Key>"
      "<Size>-4</Size></Contents></ListBucketResult>");
  EXPECT_EQ(page.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(page.status().message().find("k1"), std::string::npos);
}

TEST(ParseListObjectsV2, MissingIsTruncated_Rejected) {
  EXPECT_EQ(ParseListObjectsV2("<ListBucketResult/>").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ParseListObjectsV2, Malformed_ClearErrorNotCrash) {
  for (const char* xml :
       {"", "not xml", "<ListBucketResult><IsTruncated>", "<a></b>",
        "<?xml version=\"1.0\"?><ListBucketResult>&undefined;</ListBucketResult>", "\xff\xfe<"}) {
    absl::StatusOr<ListObjectsPage> page = ParseListObjectsV2(xml);
    EXPECT_EQ(page.status().code(), absl::StatusCode::kInvalidArgument) << xml;
    EXPECT_NE(page.status().message().find("XML"), std::string::npos) << page.status();
  }
}

TEST(ParseListObjectsV2, WrongRoot_NamesBoth) {
  absl::StatusOr<ListObjectsPage> page = ParseListObjectsV2(Testdata("error_no_such_bucket.xml"));
  EXPECT_EQ(page.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(page.status().message().find("<ListBucketResult>"), std::string::npos);
  EXPECT_NE(page.status().message().find("<Error>"), std::string::npos);
}

TEST(ParseListObjectsV2, ExternalEntity_NotLoaded) {
  // The reply may name a file; it is never read: the reference expands to nothing.
  absl::StatusOr<ListObjectsPage> page = ParseListObjectsV2(
      "<?xml version=\"1.0\"?><!DOCTYPE r [<!ENTITY x SYSTEM \"file:///etc/passwd\">]>"
      "<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>&x;</Key>"
      "<Size>1</Size></Contents></ListBucketResult>");
  ASSERT_TRUE(page.ok()) << page.status();
  ASSERT_EQ(page->objects.size(), 1u);
  EXPECT_EQ(page->objects[0].key, "");
}

TEST(ParseListObjectsV2, EntityExpansionBomb_Rejected) {
  std::string dtd = "<!DOCTYPE r [<!ENTITY a0 \"xxxxxxxxxx\">";
  for (int i = 1; i < 10; ++i) {
    dtd += "<!ENTITY a" + std::to_string(i) + " \"";
    for (int j = 0; j < 10; ++j) dtd += "&a" + std::to_string(i - 1) + ";";
    dtd += "\">";
  }
  dtd += "]>";
  absl::StatusOr<ListObjectsPage> page = ParseListObjectsV2(
      "<?xml version=\"1.0\"?>" + dtd +
      "<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>&a9;</Key>"
      "<Size>1</Size></Contents></ListBucketResult>");
  EXPECT_EQ(page.status().code(), absl::StatusCode::kInvalidArgument) << page.status();
}

TEST(ParseListObjectsV2, SeaweedFsTruncated_KeysDecodedTokenIsAKey) {
  absl::StatusOr<ListObjectsPage> page =
      ParseListObjectsV2(Testdata("seaweedfs_list_objects_v2_truncated.xml"));
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_TRUE(page->is_truncated);
  EXPECT_EQ(page->next_continuation_token, "run1/shard 1+\xc3\xa9.bin");
  ASSERT_EQ(page->objects.size(), 2u);
  EXPECT_EQ(page->objects[0].key, "run1/shard 0+\xc3\xa9.bin");
  EXPECT_EQ(page->objects[1].key, "run1/shard 1+\xc3\xa9.bin");
  EXPECT_EQ(page->objects[1].etag, "\"8d777f385d3dfec8815d20f7496026dc\"");
}

TEST(ParseListObjectsV2, SeaweedFsDelimiter_PrefixEncodedWithPercent20Decoded) {
  absl::StatusOr<ListObjectsPage> page =
      ParseListObjectsV2(Testdata("seaweedfs_list_objects_v2_delimiter.xml"));
  ASSERT_TRUE(page.ok()) << page.status();
  ASSERT_EQ(page->objects.size(), 1u);
  EXPECT_EQ(page->objects[0].key, "q/a+b c%.bin");
  EXPECT_EQ(page->common_prefixes, std::vector<std::string>{"q/a+b c%/"});
}

TEST(ParseListMultipartUploads, Truncated_KeysAndMarkerDecoded) {
  absl::StatusOr<ListUploadsPage> page =
      ParseListMultipartUploads(Testdata("list_multipart_uploads.xml"));
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_TRUE(page->is_truncated);
  EXPECT_EQ(page->next_key_marker, "run1/shard 2.bin");
  EXPECT_EQ(page->next_upload_id_marker,
            "VXBsb2FkIElEIGZvciBlbHZpbmcncyBteS1tb3ZpZS5tMnRzIHVwbG9hZA");
  ASSERT_EQ(page->uploads.size(), 2u);
  EXPECT_EQ(page->uploads[0].key, "run1/shard 1.bin");
  EXPECT_EQ(page->uploads[0].upload_id, "XMgbGlrZSBlbHZpbmcncyBub3QgaGF2aW5nIG11Y2ggbHVjaw");
  EXPECT_EQ(page->uploads[0].initiated, "2026-12-07T10:00:00.000Z");
}

TEST(ParseListMultipartUploads, SeaweedFsTruncated_OnlyUploadIdMarkerKeysRaw) {
  absl::StatusOr<ListUploadsPage> page =
      ParseListMultipartUploads(Testdata("seaweedfs_list_multipart_uploads.xml"));
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_TRUE(page->is_truncated);
  EXPECT_EQ(page->next_key_marker, "");
  EXPECT_EQ(page->next_upload_id_marker,
            "0cd3e90d31c8611207a353a058f830acf4c7c6ca_6187354b86a0496fa06c80332f2d98a6");
  ASSERT_EQ(page->uploads.size(), 1u);
  EXPECT_EQ(page->uploads[0].key, "run1/up 1+\xc3\xa9");
}

TEST(ParseListMultipartUploads, TruncatedWithoutMarkers_Rejected) {
  EXPECT_EQ(ParseListMultipartUploads("<ListMultipartUploadsResult><IsTruncated>true</IsTruncated>"
                                      "</ListMultipartUploadsResult>")
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ParseListMultipartUploads, UploadWithoutId_Rejected) {
  EXPECT_EQ(ParseListMultipartUploads("<ListMultipartUploadsResult><IsTruncated>false</IsTruncated>"
                                      "<Upload><Key>k</Key></Upload></ListMultipartUploadsResult>")
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ParseInitiateMultipartUpload, UploadId) {
  absl::StatusOr<std::string> id =
      ParseInitiateMultipartUpload(Testdata("initiate_multipart_upload.xml"));
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(*id, "VXBsb2FkIElEIGZvciA2aWWpbmcncyBteS1tb3ZpZS5tMnRzIHVwbG9hZA");
}

TEST(ParseInitiateMultipartUpload, EmptyUploadId_Rejected) {
  EXPECT_EQ(ParseInitiateMultipartUpload("<InitiateMultipartUploadResult><UploadId> </UploadId>"
                                         "</InitiateMultipartUploadResult>")
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ParseInitiateMultipartUpload, SeaweedFs) {
  absl::StatusOr<std::string> id =
      ParseInitiateMultipartUpload(Testdata("seaweedfs_initiate_multipart_upload.xml"));
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(*id, "0ead4dfd9c70ae33b4fa5e2184216ac6d7508ccc_00bb058593d64005ae5f447b7dd8d39f");
}

TEST(ParseCompleteMultipartUpload, SeaweedFs_NumericCharacterReferencesInETag) {
  absl::StatusOr<std::string> etag =
      ParseCompleteMultipartUpload(Testdata("seaweedfs_complete_multipart_upload.xml"));
  ASSERT_TRUE(etag.ok()) << etag.status();
  EXPECT_EQ(*etag, "\"de7dfe70924e91b296afd1f8fadf8458-1\"");
}

TEST(ParseCompleteMultipartUpload, LeadingWhitespace_ETag) {
  absl::StatusOr<std::string> etag =
      ParseCompleteMultipartUpload(Testdata("complete_multipart_upload.xml"));
  ASSERT_TRUE(etag.ok()) << etag.status();
  EXPECT_EQ(*etag, "\"3858f62230ac3c915f300c664312c11f-9\"");
}

TEST(IsErrorReply, ErrorIn200Body_Recognised) {
  EXPECT_TRUE(IsErrorReply(Testdata("complete_multipart_upload_error.xml")));
  EXPECT_FALSE(IsErrorReply(Testdata("complete_multipart_upload.xml")));
  EXPECT_FALSE(IsErrorReply("garbage"));
}

TEST(ParseError, CodeMessageRequestId) {
  absl::StatusOr<S3ErrorReply> reply = ParseError(Testdata("complete_multipart_upload_error.xml"));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->code, "InternalError");
  EXPECT_EQ(reply->message, "We encountered an internal error. Please try again.");
  EXPECT_EQ(reply->request_id, "656c76696e6727732072657175657374");
}

TEST(ParseError, NoSuchBucket) {
  absl::StatusOr<S3ErrorReply> reply = ParseError(Testdata("error_no_such_bucket.xml"));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->code, "NoSuchBucket");
}

TEST(ParseError, SeaweedFsNoSuchKey_NoNamespace) {
  absl::StatusOr<S3ErrorReply> reply = ParseError(Testdata("seaweedfs_error_no_such_key.xml"));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->code, "NoSuchKey");
  EXPECT_EQ(reply->message, "The specified key does not exist.");
  EXPECT_EQ(reply->request_id, "18EF113C1775273B82058373");
}

TEST(ParseError, HtmlPage_Rejected) {
  EXPECT_EQ(ParseError("<html><body>502 Bad Gateway</body></html>").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ParseDeleteResult, DeletedAndFailures) {
  absl::StatusOr<DeleteResult> result = ParseDeleteResult(Testdata("delete_result.xml"));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->deleted, std::vector<std::string>{"run1/a.bin"});
  ASSERT_EQ(result->failures.size(), 1u);
  EXPECT_EQ(result->failures[0].key, "run1/locked.bin");
  EXPECT_EQ(result->failures[0].code, "AccessDenied");
  EXPECT_EQ(result->failures[0].message, "Access Denied");
}

TEST(ParseDeleteResult, SeaweedFs_MissingKeyReportedDeleted) {
  absl::StatusOr<DeleteResult> result = ParseDeleteResult(Testdata("seaweedfs_delete_result.xml"));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->deleted, (std::vector<std::string>{"run1/shard 0+\xc3\xa9.bin", "run1/never"}));
  EXPECT_TRUE(result->failures.empty());
}

TEST(CompleteMultipartUploadXml, PartsInOrderETagsEscaped) {
  EXPECT_EQ(CompleteMultipartUploadXml({{1, "\"a1\""}, {2, "\"b2\""}}),
            "<CompleteMultipartUpload xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">"
            "<Part><PartNumber>1</PartNumber><ETag>&quot;a1&quot;</ETag></Part>"
            "<Part><PartNumber>2</PartNumber><ETag>&quot;b2&quot;</ETag></Part>"
            "</CompleteMultipartUpload>");
}

TEST(DeleteObjectsXml, QuietKeysEscaped) {
  EXPECT_EQ(DeleteObjectsXml({"a&b", "<c>"}),
            "<Delete xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Quiet>true</Quiet>"
            "<Object><Key>a&amp;b</Key></Object><Object><Key>&lt;c&gt;</Key></Object></Delete>");
}

TEST(XmlEscape, RoundTripsThroughTheParser) {
  const std::string key = "a&b<c>\"d'e\tf\r\ng \xc3\xa9";
  absl::StatusOr<DeleteResult> result = ParseDeleteResult(
      "<DeleteResult><Deleted><Key>" + XmlEscape(key) + "</Key></Deleted></DeleteResult>");
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->deleted, std::vector<std::string>{key});
}

}  // namespace
}  // namespace tessera::s3
