#ifndef MNEME_TESTS_TESTING_TLS_CERTS_H_
#define MNEME_TESTS_TESTING_TLS_CERTS_H_

#include <string>

#include "absl/status/statusor.h"

namespace mneme::testing {

// PEM files of a throwaway PKI made with the openssl command: one CA, a
// server certificate for localhost / 127.0.0.1 and a client certificate,
// both signed by the CA.
struct TlsCerts {
  std::string ca_cert;
  std::string server_cert;
  std::string server_key;
  std::string client_cert;
  std::string client_key;
};

// Generates the files under a fresh directory in $TEST_TMPDIR.
absl::StatusOr<TlsCerts> GenerateTlsCerts();

}  // namespace mneme::testing

#endif  // MNEME_TESTS_TESTING_TLS_CERTS_H_
