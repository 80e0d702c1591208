#!/usr/bin/env bash
# Makes the test-only TLS files of storage/s3:s3_endpoint_test (committed; valid for 100 years;
# never use them outside the tests): a CA, and a server certificate it signed for the host
# names "localhost" and "vhost.localhost" (the virtual-hosted test's bucket), deliberately not
# for the address 127.0.0.1, so that a request to https://127.0.0.1 fails host-name checking.
# Run from this directory: bash make_certs.sh
set -euo pipefail
openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 36500 \
  -subj "/CN=tessera-test-s3-ca" 2>/dev/null
openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj "/CN=localhost" 2>/dev/null
printf 'subjectAltName=DNS:localhost,DNS:vhost.localhost\n' >server.ext
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem \
  -days 36500 -extfile server.ext 2>/dev/null
rm -f ca.key ca.srl server.csr server.ext
