#include "common/peer_call_proof.h"

#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace tessera {
namespace {

constexpr absl::string_view kLabel = "tessera peer call v1";

std::string Mac(const PeerCredential& credential, absl::string_view method, int64_t unix_ms,
                absl::string_view nonce) {
  return PeerMac(credential.secret,
                 {kLabel, credential.job_id, method, absl::StrCat(unix_ms), nonce});
}

absl::StatusOr<std::string> Unhex(absl::string_view hex, size_t bytes, absl::string_view what) {
  if (hex.size() != 2 * bytes || hex.find_first_not_of("0123456789abcdef") != hex.npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("a peer call proof's ", what, " must be ", 2 * bytes, " lowercase hex digits"));
  }
  return absl::HexStringToBytes(hex);
}

}  // namespace

PeerCallProof MakePeerCallProof(const PeerCredential& credential, absl::string_view method,
                                absl::Time now, std::string nonce) {
  PeerCallProof proof;
  proof.unix_ms = absl::ToUnixMillis(now);
  proof.mac = Mac(credential, method, proof.unix_ms, nonce);
  proof.nonce = std::move(nonce);
  return proof;
}

std::string EncodePeerCallProof(const PeerCallProof& proof) {
  return absl::StrCat("v1.", proof.unix_ms, ".", absl::BytesToHexString(proof.nonce), ".",
                      absl::BytesToHexString(proof.mac));
}

absl::StatusOr<PeerCallProof> DecodePeerCallProof(absl::string_view value) {
  const std::vector<absl::string_view> parts = absl::StrSplit(value, '.');
  if (parts.size() != 4 || parts[0] != "v1") {
    return absl::InvalidArgumentError(
        "a peer call proof must be v1.<unix ms>.<nonce hex>.<mac hex>");
  }
  PeerCallProof proof;
  // Only the spelling EncodePeerCallProof writes (the one the MAC covers): absl::SimpleAtoi
  // also takes a sign, leading zeros and spaces, which would make one proof many values.
  if (!absl::SimpleAtoi(parts[1], &proof.unix_ms) || absl::StrCat(proof.unix_ms) != parts[1]) {
    return absl::InvalidArgumentError(
        "a peer call proof's time is not a decimal integer as written by its encoder (no sign "
        "but '-', no leading zeros or spaces)");
  }
  absl::StatusOr<std::string> nonce = Unhex(parts[2], kPeerNonceBytes, "nonce");
  if (!nonce.ok()) return nonce.status();
  absl::StatusOr<std::string> mac = Unhex(parts[3], kPeerMacBytes, "mac");
  if (!mac.ok()) return mac.status();
  proof.nonce = *std::move(nonce);
  proof.mac = *std::move(mac);
  return proof;
}

absl::Status ProvePeerCall(grpc::ClientContext* context, const PeerCredential& credential,
                           absl::string_view method) {
  if (credential.secret.empty()) return absl::OkStatus();
  absl::StatusOr<std::string> nonce = RandomBytes(kPeerNonceBytes);
  if (!nonce.ok()) return nonce.status();
  context->AddMetadata(kPeerProofMetadata,
                       EncodePeerCallProof(MakePeerCallProof(credential, method, absl::Now(),
                                                             *std::move(nonce))));
  return absl::OkStatus();
}

absl::Status PeerCallGate::Admit(const grpc::ServerContextBase& context,
                                 absl::string_view method) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(kPeerProofMetadata);
  if (it == metadata.end()) return Check(nullptr, method);
  const std::string value(it->second.data(), it->second.size());
  return Check(&value, method);
}

absl::Status PeerCallGate::Check(const std::string* value, absl::string_view method) {
  const PeerCredential credential = keyring_->Get();
  auto refuse = [&](absl::string_view why) {
    return absl::UnauthenticatedError(absl::StrCat("a call of ", method, " refused: ", why,
                                                   " (peers must prove they belong to job ",
                                                   credential.job_id, ")"));
  };
  if (value == nullptr) return refuse("it carries no proof");
  absl::StatusOr<PeerCallProof> proof = DecodePeerCallProof(*value);
  if (!proof.ok()) return refuse(proof.status().message());
  if (credential.secret.size() != kPeerSecretBytes) {
    return refuse("this agent has no peer secret yet (not registered)");
  }
  const absl::Time now = now_();
  const absl::Time made = absl::FromUnixMillis(proof->unix_ms);
  if (made < now - kPeerCallSkew || made > now + kPeerCallSkew) {
    return refuse(absl::StrCat("its proof was made at ", absl::FormatTime(made),
                               ", more than ", absl::FormatDuration(kPeerCallSkew),
                               " from this agent's clock (", absl::FormatTime(now), ")"));
  }
  if (!SameMac(proof->mac, Mac(credential, method, proof->unix_ms, proof->nonce))) {
    return refuse("its proof does not match (forged, for another method, or another job's)");
  }
  absl::MutexLock lock(&mu_);
  while (!expiring_.empty() && expiring_.begin()->first < now) {
    seen_.erase(expiring_.begin()->second);
    expiring_.erase(expiring_.begin());
  }
  if (!seen_.insert(proof->nonce).second) return refuse("its proof was used before (a replay)");
  expiring_.emplace(made + kPeerCallSkew, proof->nonce);
  return absl::OkStatus();
}

}  // namespace tessera
