// rejection_client: one trainer rank on tessera::Client (client/client.h) that saves what the
// Python module cannot express, for rejections_test.py: names that are not UTF-8 (a Python str
// cannot hold such bytes) and plans over the size limits (built here in a second, where Python
// would take minutes). Prints one JSON line: {"case", "saved", "code", "status", "message",
// "fqns", "state_key", "seconds"}; exits 0 whenever the save ran to an outcome (the test
// judges it), 2 on bad usage or if the agent cannot be reached.
//
//   rejection_client --agent=SOCKET --case=CASE --step=N
//
// Cases:
//   non_utf8_fqn        one tensor named "layers.\xff\xfe.weight"
//   non_utf8_state_key  optimizer state "exp_avg\xc3" of a valid parameter
//   too_many_shards     1,048,577 0-d tensors: one over the coordinator's per-rank limit
//   request_too_large   262,144 tensors with 1,024-byte names: over 256 MiB on the wire
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "common/status.h"

namespace {

// `s` as a JSON string. Bytes >= 0x80 pass through: the test decodes the line as UTF-8 and
// fails if a message is not.
std::string Json(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      out += absl::StrFormat("\\u%04x", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

tessera::TensorRef Scalar(std::string fqn, float* value) {
  tessera::TensorRef t;
  t.fqn = std::move(fqn);
  t.dtype = tessera::v1::DTYPE_F32;
  t.data = value;
  t.nbytes = sizeof(float);
  return t;
}

// The tensors of `name`, or false for an unknown case.
bool BuildCase(const std::string& name, float* value, std::vector<tessera::TensorRef>* out) {
  if (name == "non_utf8_fqn") {
    out->push_back(Scalar("layers.\xff\xfe.weight", value));
  } else if (name == "non_utf8_state_key") {
    out->push_back(Scalar("layers.0.weight", value));
    tessera::TensorRef state = Scalar("layers.0.weight", value);
    state.kind = tessera::v1::SHARD_KIND_OPTIMIZER;
    state.state_key = "exp_avg\xc3";
    out->push_back(state);
  } else if (name == "too_many_shards") {
    const size_t n = (size_t{1} << 20) + 1;
    out->reserve(n);
    for (size_t i = 0; i < n; ++i) out->push_back(Scalar(absl::StrCat("t.", i), value));
  } else if (name == "request_too_large") {
    const size_t n = size_t{1} << 18;
    out->reserve(n);
    for (size_t i = 0; i < n; ++i) {
      std::string fqn = absl::StrCat("t.", i, ".");
      fqn.resize(tessera::kMaxFqnBytes, 'x');
      out->push_back(Scalar(std::move(fqn), value));
    }
  } else {
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::string agent, name;
  int64_t step = -1;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--agent=", 0) == 0) {
      agent = arg.substr(8);
    } else if (arg.rfind("--case=", 0) == 0) {
      name = arg.substr(7);
    } else if (arg.rfind("--step=", 0) == 0) {
      if (!absl::SimpleAtoi(arg.substr(7), &step)) step = -1;
    }
  }
  float value = 1.5f;
  std::vector<tessera::TensorRef> tensors;
  if (agent.empty() || step < 0 || !BuildCase(name, &value, &tensors)) {
    std::fprintf(stderr,
                 "usage: rejection_client --agent=SOCKET --case=non_utf8_fqn|non_utf8_state_key|"
                 "too_many_shards|request_too_large --step=N\n");
    return 2;
  }
  tessera::ClientOptions options;
  options.get_info_timeout = absl::Seconds(30);
  options.begin_save_timeout = absl::Seconds(120);
  absl::StatusOr<std::unique_ptr<tessera::Client>> client =
      tessera::Client::Connect(agent, options);
  if (!client.ok()) {
    std::fprintf(stderr, "rejection_client: %s\n", client.status().ToString().c_str());
    return 2;
  }
  const absl::Time start = absl::Now();
  absl::StatusOr<tessera::SaveResult> saved = (*client)->Save(step, tensors);
  absl::Status status = saved.status();
  if (saved.ok()) status = (*client)->WaitCommitted(step, absl::Seconds(60)).status();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);

  std::string fqns, state_key;
  if (std::optional<tessera::v1::ErrorDetail> d = tessera::GetErrorDetail(status); d) {
    for (const std::string& f : d->fqns()) absl::StrAppend(&fqns, fqns.empty() ? "" : ", ", Json(f));
    state_key = d->state_key();
  }
  const tessera::v1::ErrorCode code = tessera::GetErrorCode(status);
  std::printf(
      "{\"case\": %s, \"saved\": %s, \"code\": %s, \"status\": %s, \"message\": %s, "
      "\"fqns\": [%s], \"state_key\": %s, \"seconds\": %.3f}\n",
      Json(name).c_str(), saved.ok() ? "true" : "false",
      Json(code == tessera::v1::ERROR_CODE_UNSPECIFIED ? "" : tessera::ErrorCodeName(code))
          .c_str(),
      Json(absl::StatusCodeToString(status.code())).c_str(),
      Json(std::string(status.message())).c_str(), fqns.c_str(), Json(state_key).c_str(),
      seconds);
  return 0;
}
