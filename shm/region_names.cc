#include "shm/region_names.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"

namespace tessera {
namespace {

constexpr size_t kMaxJobChars = 64;

std::string SanitizeJob(absl::string_view job_id) {
  std::string out;
  for (char c : job_id.substr(0, kMaxJobChars)) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    out.push_back(ok ? c : '_');
  }
  return out;
}

}  // namespace

std::string StagingRegionPrefix(absl::string_view job_id, uint32_t rank) {
  return absl::StrCat("tessera-", SanitizeJob(job_id), "-r", rank, "-");
}

std::string StagingIncarnationPrefix(absl::string_view job_id, uint32_t rank,
                                     uint64_t incarnation) {
  return absl::StrCat(StagingRegionPrefix(job_id, rank), absl::StrFormat("%016x", incarnation),
                      "-");
}

std::string StagingRegionName(absl::string_view job_id, uint32_t rank, uint64_t incarnation,
                              absl::string_view tag, uint64_t n) {
  return absl::StrCat("/", StagingIncarnationPrefix(job_id, rank, incarnation), tag, n);
}

bool IsStagingRegionRest(absl::string_view rest) {
  if (rest.size() < 18 || rest[16] != '-') return false;
  absl::string_view number = rest.substr(17);
  absl::ConsumePrefix(&number, kLoadRegionTag);
  const auto is_hex = [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); };
  const auto is_digit = [](char c) { return c >= '0' && c <= '9'; };
  return !number.empty() && std::all_of(rest.begin(), rest.begin() + 16, is_hex) &&
         std::all_of(number.begin(), number.end(), is_digit);
}

std::string StagingOwnerName(absl::string_view job_id, uint32_t rank) {
  return absl::StrCat("/tessera-", SanitizeJob(job_id), "-r", rank, ".owner");
}

}  // namespace tessera
