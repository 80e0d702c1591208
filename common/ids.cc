#include "common/ids.h"

#include "absl/random/random.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"

namespace tessera {
namespace {

uint64_t RandomU64() {
  // One generator per thread, seeded from the OS: no lock on the id path.
  thread_local absl::BitGen gen;
  return absl::Uniform<uint64_t>(gen);
}

constexpr absl::string_view kStepPrefix = "step-";
constexpr absl::string_view kTmpInfix = ".tmp-";

}  // namespace

uint64_t NewIncarnation() {
  uint64_t v = 0;
  while (v == 0) v = RandomU64();
  return v;
}

std::string NewSessionId(int64_t step) {
  return absl::StrFormat("s%d-%016x", step, RandomU64());
}

std::string StepDirName(int64_t step) { return absl::StrFormat("step-%09d", step); }

std::string TmpDirName(int64_t step, absl::string_view session_id) {
  return absl::StrCat(StepDirName(step), kTmpInfix, session_id);
}

std::optional<int64_t> ParseStepDirName(absl::string_view name) {
  absl::string_view digits = name;
  if (!absl::ConsumePrefix(&digits, kStepPrefix) || digits.empty()) return std::nullopt;
  for (char c : digits) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return std::nullopt;
  }
  int64_t step = 0;
  if (!absl::SimpleAtoi(digits, &step)) return std::nullopt;
  // Only the name StepDirName makes: "step-1" or "step-0000000001" would be a second
  // directory for the same step.
  if (StepDirName(step) != name) return std::nullopt;
  return step;
}

bool IsTmpDirName(absl::string_view name) { return ParseTmpDirName(name).has_value(); }

std::optional<std::pair<int64_t, std::string>> ParseTmpDirName(absl::string_view name) {
  const size_t pos = name.find(kTmpInfix);
  if (pos == absl::string_view::npos || pos + kTmpInfix.size() >= name.size()) {
    return std::nullopt;
  }
  std::optional<int64_t> step = ParseStepDirName(name.substr(0, pos));
  if (!step.has_value()) return std::nullopt;
  return std::make_pair(*step, std::string(name.substr(pos + kTmpInfix.size())));
}

absl::Status CheckStorageRoot(absl::string_view own, absl::string_view received) {
  if (own.empty()) return absl::OkStatus();
  auto trimmed = [](absl::string_view root) {
    while (root.size() > 1 && root.back() == '/') root.remove_suffix(1);
    return root;
  };
  if (trimmed(own) == trimmed(received)) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat("the coordinator names storage root \"", received, "\", but this agent's is \"",
                   own, "\" (--storage_root): it reads and writes nothing there"));
}

std::string JobDirPath(absl::string_view root, absl::string_view job_id) {
  absl::string_view trimmed = root;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.remove_suffix(1);
  return absl::StrCat(trimmed, trimmed == "/" ? "" : "/", job_id);
}

std::string StepDirPath(absl::string_view root, absl::string_view job_id, int64_t step) {
  return absl::StrCat(JobDirPath(root, job_id), "/", StepDirName(step));
}

std::string TmpDirPath(absl::string_view root, absl::string_view job_id, int64_t step,
                       absl::string_view session_id) {
  return absl::StrCat(JobDirPath(root, job_id), "/", TmpDirName(step, session_id));
}

bool IsValidJobId(absl::string_view job_id) {
  if (job_id.empty() || job_id.size() > 128 || job_id[0] == '.') return false;
  for (char c : job_id) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' &&
        c != '-') {
      return false;
    }
  }
  return true;
}

}  // namespace tessera
