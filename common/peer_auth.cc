#include "common/peer_auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cstdint>
#include <utility>

namespace tessera {

absl::StatusOr<std::string> RandomBytes(size_t n) {
  std::string bytes(n, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(bytes.data()), static_cast<int>(n)) != 1) {
    return absl::InternalError("OpenSSL's RAND_bytes failed: no random bytes for a nonce or key");
  }
  return bytes;
}

std::string PeerMac(absl::string_view key, std::initializer_list<absl::string_view> parts) {
  std::string message;
  for (absl::string_view part : parts) {
    const uint32_t n = static_cast<uint32_t>(part.size());
    message += {static_cast<char>(n), static_cast<char>(n >> 8), static_cast<char>(n >> 16),
                static_cast<char>(n >> 24)};
    message.append(part.data(), part.size());
  }
  std::string mac(EVP_MAX_MD_SIZE, '\0');
  unsigned int written = 0;
  // HMAC-SHA256 fails only if OpenSSL cannot allocate; the empty result then matches no MAC
  // (SameMac), so a peer is refused, never let in.
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(message.data()), message.size(),
           reinterpret_cast<unsigned char*>(mac.data()), &written) == nullptr ||
      written != kPeerMacBytes) {
    return std::string();
  }
  mac.resize(written);
  return mac;
}

bool SameMac(absl::string_view a, absl::string_view b) {
  return a.size() == kPeerMacBytes && b.size() == kPeerMacBytes &&
         CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string JobPeerSecret(absl::string_view coordinator_key, absl::string_view job_id) {
  return PeerMac(coordinator_key, {"tessera job peer secret v1", job_id});
}

void PeerKeyring::Set(std::string secret) {
  absl::MutexLock lock(&mu_);
  secret_ = std::move(secret);
}

PeerCredential PeerKeyring::Get() const {
  absl::MutexLock lock(&mu_);
  return PeerCredential{job_id_, secret_};
}

}  // namespace tessera
