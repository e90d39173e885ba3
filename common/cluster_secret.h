#ifndef MNEME_COMMON_CLUSTER_SECRET_H_
#define MNEME_COMMON_CLUSTER_SECRET_H_

#include <grpcpp/server_context.h>

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mneme {

// The shared secret that every internal hop of a cluster presents
// (coordinator -> workers, workers -> rank 0's rendezvous service, workers ->
// Engram store): clients send it as this gRPC metadata entry on every call,
// servers compare it in constant time and answer UNAUTHENTICATED otherwise.
inline constexpr char kClusterSecretMetadataKey[] = "x-mneme-cluster-secret";
// Bounds of one secret, in bytes.
inline constexpr size_t kMinClusterSecretBytes = 16;
inline constexpr size_t kMaxClusterSecretBytes = 1024;
// Secrets one file may hold (the current one and, while rotating, one more).
inline constexpr size_t kMaxClusterSecrets = 2;

// OK when `secret` is kMinClusterSecretBytes..kMaxClusterSecretBytes bytes of
// printable ASCII without spaces (0x21..0x7e, valid in gRPC metadata);
// InvalidArgument naming `what` otherwise (never quoting the secret).
absl::Status ValidateClusterSecret(absl::string_view secret,
                                   absl::string_view what);

// The secrets of a cluster secret file: one per non-empty line (trailing
// whitespace and "\r" ignored), 1..kMaxClusterSecrets of them. A client sends
// the first; a server accepts any (so a secret is rotated by adding the new
// one as a second line everywhere, then making it the first, then removing
// the old one; see docs/DEPLOY.md). NotFound / PermissionDenied naming the
// path when it cannot be read; InvalidArgument for an empty file, too many
// lines or an invalid secret.
absl::StatusOr<std::vector<std::string>> ReadClusterSecretFile(
    const std::string& path);

// Equality whose time depends only on the lengths of the inputs, not on
// where they differ.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

// OK when `accepted` is empty (no secret configured) or the call's metadata
// carries exactly one kClusterSecretMetadataKey entry equal to one of
// `accepted`; Unauthenticated otherwise.
absl::Status CheckClusterSecret(const grpc::ServerContextBase& context,
                                const std::vector<std::string>& accepted);

// The API key in `path`: its first line without surrounding whitespace.
// InvalidArgument naming the file when it cannot be read (at most 4 KiB)
// or its first line is empty.
absl::StatusOr<std::string> ReadApiKeyFile(const std::string& path);

// Whether `authorization` is "Bearer <key>" (the key compared in constant
// time): the API key of the public APIs, HTTP header or gRPC metadata.
bool BearerTokenMatches(absl::string_view authorization, absl::string_view key);

// OK when `key` is empty (no API key configured) or the call's metadata
// carries exactly one "authorization" entry "Bearer <key>"; Unauthenticated
// otherwise.
absl::Status CheckApiKey(const grpc::ServerContextBase& context,
                         absl::string_view key);

}  // namespace mneme

#endif  // MNEME_COMMON_CLUSTER_SECRET_H_
