// Options of an S3 client (s3_client.h): where the store is, how to reach it safely, and how
// hard to try. Every field has a default that works against AWS S3 in us-east-1.
#ifndef TESSERA_STORAGE_S3_S3_OPTIONS_H_
#define TESSERA_STORAGE_S3_S3_OPTIONS_H_

#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "storage/s3/retry.h"
#include "storage/s3/s3_url.h"

namespace tessera::s3 {

struct S3ClientOptions {
  // The store's URL, "http(s)://host[:port][/path]": "https://s3.eu-west-1.amazonaws.com",
  // "https://storage.googleapis.com", "http://127.0.0.1:8333". Default: "" (AWS S3 in
  // `region`: https://s3.<region>.amazonaws.com).
  std::string endpoint;

  // The region requests are signed for (SigV4's scope). Stores without regions accept
  // "us-east-1"; GCS accepts "auto". Default: "us-east-1".
  std::string region = "us-east-1";

  // Path-style (endpoint/bucket/key) or virtual-hosted (bucket.endpoint/key) requests
  // (s3_url.h). MinIO, SeaweedFS and Ceph RGW usually need kPath. Default: kVirtualHosted.
  AddressingStyle addressing = AddressingStyle::kVirtualHosted;

  // Verify the server's TLS certificate and its host name. Turn off only for a test store
  // with a self-signed certificate; prefer `ca_file`. Default: true.
  bool verify_tls = true;

  // A PEM file of CA certificates to verify the server against instead of the system's.
  // Default: "" (the system's store).
  std::string ca_file;

  // Longest wait for a TCP (and TLS) connection. Default: 10 s.
  absl::Duration connect_timeout = absl::Seconds(10);

  // A transfer moving fewer than `stall_min_bytes_per_second` for `stall_timeout` is abandoned
  // as stalled (CURLOPT_LOW_SPEED_LIMIT / _TIME) and retried. There is no total time limit per
  // request: a large part at a steady pace takes as long as it takes. Defaults: 1 byte/s, 30 s.
  int64_t stall_min_bytes_per_second = 1;
  absl::Duration stall_timeout = absl::Seconds(30);

  // Retries of 5xx, 429 and transport failures (retry.h). Default: RetryPolicy's defaults.
  RetryPolicy retry;

  // Idle connections kept open for reuse (one libcurl handle each; more may be open while
  // more calls run at once). Default: 16.
  int max_idle_connections = 16;

  // Keys per ListObjectsV2 page (max-keys; S3 caps it at 1000). ListObjects returns all pages
  // either way. Default: 1000.
  int list_page_size = 1000;

  // Keys per DeleteObjects request (S3 caps it at 1000). Default: 1000.
  int delete_batch_size = 1000;
};

}  // namespace tessera::s3

#endif  // TESSERA_STORAGE_S3_S3_OPTIONS_H_
