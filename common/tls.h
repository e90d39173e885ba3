#ifndef MNEME_COMMON_TLS_H_
#define MNEME_COMMON_TLS_H_

#include <grpcpp/channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mneme {

// Transport security of a server: PEM files. All empty = plaintext (the
// default, for 127.0.0.1). cert + key = TLS. cert + key + client_ca = mutual
// TLS: clients must present a certificate signed by client_ca.
struct ServerTlsOptions {
  // Server certificate chain (PEM). Default: "" (plaintext).
  std::string cert_file;
  // Server private key (PEM). Default: "".
  std::string key_file;
  // CA bundle (PEM) that client certificates must chain to; set to require
  // mutual TLS. Default: "" (no client certificates asked for).
  std::string client_ca_file;
};

// Transport security of a client. All empty = plaintext.
struct ClientTlsOptions {
  // CA bundle (PEM) that the server certificate must chain to. Set to use TLS.
  // Default: "" (plaintext).
  std::string ca_file;
  // Client certificate chain and key (PEM) for mutual TLS. Default: "".
  std::string cert_file;
  std::string key_file;
  // Overrides the name checked against the server certificate (e.g.
  // "localhost" when connecting to 127.0.0.1). Default: "" (the target host).
  std::string server_name_override;
};

// Credentials for the server. InvalidArgument when only one of cert/key is
// given or client_ca is given without them; NotFound / PermissionDenied
// naming the flag and the file when a file cannot be read.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerTlsOptions& options);

// Credentials for a client channel; errors as above.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
MakeChannelCredentials(const ClientTlsOptions& options);

// Reads a whole (small) file; NotFound / PermissionDenied / Internal naming
// `what` and the path.
absl::StatusOr<std::string> ReadSmallFile(const std::string& path,
                                          absl::string_view what);

}  // namespace mneme

#endif  // MNEME_COMMON_TLS_H_
