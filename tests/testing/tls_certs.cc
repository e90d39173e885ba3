#include "tests/testing/tls_certs.h"

#include <cstdlib>
#include <fstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tests/testing/subprocess.h"

namespace mneme::testing {
namespace {

absl::Status Run(const std::string& command) {
  const int rc = std::system((command + " >/dev/null 2>&1").c_str());
  if (rc != 0) {
    return absl::InternalError(
        absl::StrCat("command failed (", rc, "): ", command));
  }
  return absl::OkStatus();
}

absl::Status MakeSigned(const std::string& dir, const std::string& name,
                        const std::string& subject, const std::string& ext) {
  const std::string base = dir + "/" + name;
  if (absl::Status s = Run(absl::StrCat(
          "openssl req -new -newkey rsa:2048 -nodes -subj '", subject,
          "' -keyout ", base, ".key -out ", base, ".csr"));
      !s.ok()) {
    return s;
  }
  std::ofstream(base + ".ext") << ext << "\n";
  return Run(absl::StrCat("openssl x509 -req -in ", base, ".csr -CA ", dir,
                          "/ca.crt -CAkey ", dir,
                          "/ca.key -CAcreateserial -days 2 -sha256 -extfile ",
                          base, ".ext -out ", base, ".crt"));
}

}  // namespace

absl::StatusOr<TlsCerts> GenerateTlsCerts() {
  const std::string dir = MakeTempDir("tls");
  if (absl::Status s = Run(absl::StrCat(
          "openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "
          "'/CN=mneme-test-ca' -keyout ",
          dir, "/ca.key -out ", dir, "/ca.crt"));
      !s.ok()) {
    return s;
  }
  if (absl::Status s = MakeSigned(dir, "server", "/CN=localhost",
                                  "subjectAltName=DNS:localhost,IP:127.0.0.1\n"
                                  "extendedKeyUsage=serverAuth");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = MakeSigned(dir, "client", "/CN=mneme-test-client",
                                  "extendedKeyUsage=clientAuth");
      !s.ok()) {
    return s;
  }
  return TlsCerts{dir + "/ca.crt", dir + "/server.crt", dir + "/server.key",
                  dir + "/client.crt", dir + "/client.key"};
}

}  // namespace mneme::testing
