#include "common/tls.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/support/channel_arguments.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace mneme {
namespace {

// PEM files are small; anything larger is not one.
constexpr std::streamoff kMaxPemBytes = 1 << 20;

}  // namespace

absl::StatusOr<std::string> ReadSmallFile(const std::string& path,
                                          absl::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    const std::string message =
        absl::StrCat("cannot read ", what, "=", path, ": ", std::strerror(err));
    if (err == ENOENT) return absl::NotFoundError(message);
    if (err == EACCES) return absl::PermissionDeniedError(message);
    return absl::InternalError(message);
  }
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  if (size < 0 || size > kMaxPemBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot read ", what, "=", path, ": not a regular file under 1 MiB"));
  }
  in.seekg(0);
  std::ostringstream contents;
  contents << in.rdbuf();
  if (size > 0 && contents.str().empty()) {
    return absl::InternalError(
        absl::StrCat("cannot read ", what, "=", path, ": read failed"));
  }
  return contents.str();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerTlsOptions& options) {
  if (options.cert_file.empty() && options.key_file.empty()) {
    if (!options.client_ca_file.empty()) {
      return absl::InvalidArgumentError(
          "--tls_client_ca needs --tls_cert and --tls_key");
    }
    return grpc::InsecureServerCredentials();
  }
  if (options.cert_file.empty() || options.key_file.empty()) {
    return absl::InvalidArgumentError(
        "--tls_cert and --tls_key must be given together");
  }
  ASSIGN_OR_RETURN(std::string cert,
                   ReadSmallFile(options.cert_file, "--tls_cert"));
  ASSIGN_OR_RETURN(std::string key,
                   ReadSmallFile(options.key_file, "--tls_key"));

  grpc::SslServerCredentialsOptions ssl(
      GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  ssl.pem_key_cert_pairs.push_back({key, cert});
  if (!options.client_ca_file.empty()) {
    ASSIGN_OR_RETURN(std::string ca,
                     ReadSmallFile(options.client_ca_file, "--tls_client_ca"));
    ssl.pem_root_certs = ca;
    ssl.client_certificate_request =
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(ssl);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
MakeChannelCredentials(const ClientTlsOptions& options) {
  if (options.ca_file.empty()) {
    if (!options.cert_file.empty() || !options.key_file.empty()) {
      return absl::InvalidArgumentError(
          "a client certificate needs --tls_ca as well");
    }
    return grpc::InsecureChannelCredentials();
  }
  if (options.cert_file.empty() != options.key_file.empty()) {
    return absl::InvalidArgumentError(
        "--tls_cert and --tls_key must be given together");
  }
  grpc::SslCredentialsOptions ssl;
  ASSIGN_OR_RETURN(std::string ca, ReadSmallFile(options.ca_file, "--tls_ca"));
  ssl.pem_root_certs = ca;
  if (!options.cert_file.empty()) {
    ASSIGN_OR_RETURN(std::string cert,
                     ReadSmallFile(options.cert_file, "--tls_cert"));
    ASSIGN_OR_RETURN(std::string key,
                     ReadSmallFile(options.key_file, "--tls_key"));
    ssl.pem_cert_chain = cert;
    ssl.pem_private_key = key;
  }
  return grpc::SslCredentials(ssl);
}

}  // namespace mneme
