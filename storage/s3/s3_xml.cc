#include "storage/s3/s3_xml.h"

#include <libxml/parser.h>
#include <libxml/tree.h>
#include <libxml/xmlerror.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/status.h"
#include "storage/s3/s3_url.h"

namespace tessera::s3 {
namespace {

// A parsed document; freed with the last reference.
struct DocFree {
  void operator()(xmlDoc* doc) const { xmlFreeDoc(doc); }
};
using Doc = std::unique_ptr<xmlDoc, DocFree>;

struct CtxtFree {
  void operator()(xmlParserCtxt* ctxt) const { xmlFreeParserCtxt(ctxt); }
};

absl::string_view Name(const xmlNode* node) { return reinterpret_cast<const char*>(node->name); }

// Parses `xml` and checks the root element's local name.
absl::StatusOr<Doc> ParseDocument(absl::string_view xml, absl::string_view root_name) {
  InitXml();
  // S3 may send whitespace ahead of a slow reply (CompleteMultipartUpload) to keep the
  // connection alive; an XML declaration must come first, so drop it.
  xml = absl::StripLeadingAsciiWhitespace(xml);
  if (xml.size() > static_cast<size_t>(INT32_MAX)) {
    return absl::InvalidArgumentError("S3 reply is too large to be XML this client parses");
  }
  std::unique_ptr<xmlParserCtxt, CtxtFree> ctxt(xmlNewParserCtxt());
  if (ctxt == nullptr) return absl::ResourceExhaustedError("libxml2: no parser context");
  // No network, no DTD, no entity substitution, errors kept in the context (not printed).
  const int options =
      XML_PARSE_NONET | XML_PARSE_NOERROR | XML_PARSE_NOWARNING | XML_PARSE_NOBLANKS;
  Doc doc(xmlCtxtReadMemory(ctxt.get(), xml.data(), static_cast<int>(xml.size()), "s3-reply.xml",
                            "UTF-8", options));
  if (doc == nullptr) {
    const xmlError* error = xmlCtxtGetLastError(ctxt.get());
    std::string what = error != nullptr && error->message != nullptr
                           ? std::string(absl::StripAsciiWhitespace(error->message))
                           : "unknown error";
    return absl::InvalidArgumentError(
        absl::StrCat("S3 reply is not well-formed XML (", what,
                     error != nullptr ? absl::StrCat(" at line ", error->line) : "", ")"));
  }
  const xmlNode* root = xmlDocGetRootElement(doc.get());
  if (root == nullptr || Name(root) != root_name) {
    return absl::InvalidArgumentError(
        absl::StrCat("S3 reply is not <", root_name, "> XML (root element <",
                     root == nullptr ? "" : std::string(Name(root)), ">)"));
  }
  return std::move(doc);
}

const xmlNode* Root(const Doc& doc) { return xmlDocGetRootElement(doc.get()); }

// The element children of `parent` named `name`.
std::vector<const xmlNode*> Children(const xmlNode* parent, absl::string_view name) {
  std::vector<const xmlNode*> out;
  for (const xmlNode* n = parent->children; n != nullptr; n = n->next) {
    if (n->type == XML_ELEMENT_NODE && Name(n) == name) out.push_back(n);
  }
  return out;
}

const xmlNode* Child(const xmlNode* parent, absl::string_view name) {
  for (const xmlNode* n = parent->children; n != nullptr; n = n->next) {
    if (n->type == XML_ELEMENT_NODE && Name(n) == name) return n;
  }
  return nullptr;
}

std::string Text(const xmlNode* node) {
  xmlChar* content = xmlNodeGetContent(node);
  if (content == nullptr) return "";
  std::string out(reinterpret_cast<const char*>(content));
  xmlFree(content);
  return out;
}

// The text of child `name`, or nullopt-like "" with `found` false.
std::string ChildText(const xmlNode* parent, absl::string_view name, bool* found = nullptr) {
  const xmlNode* child = Child(parent, name);
  if (found != nullptr) *found = child != nullptr;
  return child == nullptr ? "" : Text(child);
}

absl::Status Missing(absl::string_view root, absl::string_view element) {
  return absl::InvalidArgumentError(
      absl::StrCat("S3 reply <", root, "> lacks a required <", element, ">"));
}

absl::StatusOr<std::string> RequiredText(const xmlNode* parent, absl::string_view root,
                                         absl::string_view name) {
  bool found = false;
  std::string text = ChildText(parent, name, &found);
  if (!found) return Missing(root, name);
  return text;
}

absl::StatusOr<bool> RequiredBool(const xmlNode* parent, absl::string_view root,
                                  absl::string_view name) {
  bool found = false;
  const std::string text(absl::StripAsciiWhitespace(ChildText(parent, name, &found)));
  if (!found) return Missing(root, name);
  if (text == "true") return true;
  if (text == "false") return false;
  return absl::InvalidArgumentError(absl::StrCat("S3 reply <", root, "> has <", name, "> \"",
                                                 absl::CHexEscape(text), "\", not true or false"));
}

// Decodes `text` if the reply said its keys are url-encoded.
absl::StatusOr<std::string> MaybeDecode(std::string text, bool url_encoded) {
  if (!url_encoded) return text;
  return UrlDecodeKey(text);
}

bool UrlEncoded(const xmlNode* root) {
  return absl::AsciiStrToLower(absl::StripAsciiWhitespace(ChildText(root, "EncodingType"))) ==
         "url";
}

}  // namespace

void InitXml() {
  static std::once_flag once;
  std::call_once(once, [] { xmlInitParser(); });
}

absl::StatusOr<ListObjectsPage> ParseListObjectsV2(absl::string_view xml) {
  static constexpr absl::string_view kRoot = "ListBucketResult";
  ASSIGN_OR_RETURN(Doc doc, ParseDocument(xml, kRoot));
  const xmlNode* root = Root(doc);
  const bool encoded = UrlEncoded(root);
  ListObjectsPage page;
  ASSIGN_OR_RETURN(page.is_truncated, RequiredBool(root, kRoot, "IsTruncated"));
  // The token is opaque, never url-encoded.
  page.next_continuation_token = ChildText(root, "NextContinuationToken");
  if (page.is_truncated && page.next_continuation_token.empty()) {
    return Missing(kRoot, "NextContinuationToken");
  }
  for (const xmlNode* contents : Children(root, "Contents")) {
    ObjectInfo object;
    ASSIGN_OR_RETURN(std::string key, RequiredText(contents, "Contents", "Key"));
    ASSIGN_OR_RETURN(object.key, MaybeDecode(std::move(key), encoded));
    bool has_size = false;
    const std::string size = ChildText(contents, "Size", &has_size);
    if (!has_size) return Missing("Contents", "Size");
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(size), &object.size)) {
      return absl::InvalidArgumentError(
          absl::StrCat("S3 reply <Contents> of key \"", absl::CHexEscape(object.key),
                       "\" has <Size> \"", absl::CHexEscape(size), "\", not a byte count"));
    }
    object.etag = ChildText(contents, "ETag");
    page.objects.push_back(std::move(object));
  }
  for (const xmlNode* common : Children(root, "CommonPrefixes")) {
    ASSIGN_OR_RETURN(std::string prefix, RequiredText(common, "CommonPrefixes", "Prefix"));
    ASSIGN_OR_RETURN(std::string decoded, MaybeDecode(std::move(prefix), encoded));
    page.common_prefixes.push_back(std::move(decoded));
  }
  return page;
}

absl::StatusOr<ListUploadsPage> ParseListMultipartUploads(absl::string_view xml) {
  static constexpr absl::string_view kRoot = "ListMultipartUploadsResult";
  ASSIGN_OR_RETURN(Doc doc, ParseDocument(xml, kRoot));
  const xmlNode* root = Root(doc);
  const bool encoded = UrlEncoded(root);
  ListUploadsPage page;
  ASSIGN_OR_RETURN(page.is_truncated, RequiredBool(root, kRoot, "IsTruncated"));
  ASSIGN_OR_RETURN(page.next_key_marker, MaybeDecode(ChildText(root, "NextKeyMarker"), encoded));
  page.next_upload_id_marker = ChildText(root, "NextUploadIdMarker");
  if (page.is_truncated && page.next_key_marker.empty() && page.next_upload_id_marker.empty()) {
    return Missing(kRoot, "NextKeyMarker or NextUploadIdMarker");
  }
  for (const xmlNode* node : Children(root, "Upload")) {
    MultipartUpload upload;
    ASSIGN_OR_RETURN(std::string key, RequiredText(node, "Upload", "Key"));
    ASSIGN_OR_RETURN(upload.key, MaybeDecode(std::move(key), encoded));
    ASSIGN_OR_RETURN(upload.upload_id, RequiredText(node, "Upload", "UploadId"));
    upload.initiated = ChildText(node, "Initiated");
    page.uploads.push_back(std::move(upload));
  }
  return page;
}

absl::StatusOr<std::string> ParseInitiateMultipartUpload(absl::string_view xml) {
  static constexpr absl::string_view kRoot = "InitiateMultipartUploadResult";
  ASSIGN_OR_RETURN(Doc doc, ParseDocument(xml, kRoot));
  ASSIGN_OR_RETURN(std::string id, RequiredText(Root(doc), kRoot, "UploadId"));
  if (absl::StripAsciiWhitespace(id).empty()) return Missing(kRoot, "UploadId");
  return id;
}

absl::StatusOr<std::string> ParseCompleteMultipartUpload(absl::string_view xml) {
  static constexpr absl::string_view kRoot = "CompleteMultipartUploadResult";
  ASSIGN_OR_RETURN(Doc doc, ParseDocument(xml, kRoot));
  return RequiredText(Root(doc), kRoot, "ETag");
}

absl::StatusOr<S3ErrorReply> ParseError(absl::string_view xml) {
  ASSIGN_OR_RETURN(Doc doc, ParseDocument(xml, "Error"));
  const xmlNode* root = Root(doc);
  S3ErrorReply reply;
  reply.code = std::string(absl::StripAsciiWhitespace(ChildText(root, "Code")));
  reply.message = std::string(absl::StripAsciiWhitespace(ChildText(root, "Message")));
  reply.request_id = std::string(absl::StripAsciiWhitespace(ChildText(root, "RequestId")));
  return reply;
}

bool IsErrorReply(absl::string_view xml) { return ParseDocument(xml, "Error").ok(); }

absl::StatusOr<DeleteResult> ParseDeleteResult(absl::string_view xml) {
  static constexpr absl::string_view kRoot = "DeleteResult";
  ASSIGN_OR_RETURN(Doc doc, ParseDocument(xml, kRoot));
  const xmlNode* root = Root(doc);
  DeleteResult result;
  for (const xmlNode* node : Children(root, "Deleted")) {
    ASSIGN_OR_RETURN(std::string key, RequiredText(node, "Deleted", "Key"));
    result.deleted.push_back(std::move(key));
  }
  for (const xmlNode* node : Children(root, "Error")) {
    DeleteFailure failure;
    ASSIGN_OR_RETURN(failure.key, RequiredText(node, "Error", "Key"));
    failure.code = ChildText(node, "Code");
    failure.message = ChildText(node, "Message");
    result.failures.push_back(std::move(failure));
  }
  return result;
}

std::string XmlEscape(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      case '\r':
        out += "&#13;";
        break;
      case '\n':
        out += "&#10;";
        break;
      case '\t':
        out += "&#9;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

std::string CompleteMultipartUploadXml(const std::vector<CompletedPart>& parts) {
  std::string xml = "<CompleteMultipartUpload xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">";
  for (const CompletedPart& part : parts) {
    absl::StrAppend(&xml, "<Part><PartNumber>", part.part_number, "</PartNumber><ETag>",
                    XmlEscape(part.etag), "</ETag></Part>");
  }
  absl::StrAppend(&xml, "</CompleteMultipartUpload>");
  return xml;
}

std::string DeleteObjectsXml(const std::vector<std::string>& keys, bool quiet) {
  std::string xml = "<Delete xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">";
  if (quiet) absl::StrAppend(&xml, "<Quiet>true</Quiet>");
  for (const std::string& key : keys) {
    absl::StrAppend(&xml, "<Object><Key>", XmlEscape(key), "</Key></Object>");
  }
  absl::StrAppend(&xml, "</Delete>");
  return xml;
}

}  // namespace tessera::s3
