#include "common/cluster_secret.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/file_io.h"
#include "common/status_macros.h"
#include "common/tls.h"

namespace mneme {

absl::Status ValidateClusterSecret(absl::string_view secret,
                                   absl::string_view what) {
  if (secret.size() < kMinClusterSecretBytes ||
      secret.size() > kMaxClusterSecretBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": a cluster secret must be ", kMinClusterSecretBytes, "..",
        kMaxClusterSecretBytes, " bytes, got ", secret.size()));
  }
  for (const char c : secret) {
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(absl::StrCat(
          what,
          ": a cluster secret must be printable ASCII without spaces "
          "(e.g. the output of `openssl rand -hex 32`)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> ReadClusterSecretFile(
    const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text,
                   ReadSmallFile(path, "--cluster_secret_file"));
  std::vector<std::string> secrets;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripTrailingAsciiWhitespace(line);
    if (line.empty()) continue;
    if (secrets.size() == kMaxClusterSecrets) {
      return absl::InvalidArgumentError(
          absl::StrCat("--cluster_secret_file=", path, " holds more than ",
                       kMaxClusterSecrets, " secrets"));
    }
    RETURN_IF_ERROR(ValidateClusterSecret(
        line,
        absl::StrCat("--cluster_secret_file=", path, " line ", line_number)));
    secrets.emplace_back(line);
  }
  if (secrets.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--cluster_secret_file=", path, " holds no secret"));
  }
  return secrets;
}

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  const size_t n = std::max(a.size(), b.size());
  uint32_t diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const auto x = static_cast<uint8_t>(i < a.size() ? a[i] : 0);
    const auto y = static_cast<uint8_t>(i < b.size() ? b[i] : 0);
    diff |= static_cast<uint32_t>(x ^ y);
  }
  return diff == 0;
}

absl::Status CheckClusterSecret(const grpc::ServerContextBase& context,
                                const std::vector<std::string>& accepted) {
  if (accepted.empty()) return absl::OkStatus();
  const auto& metadata = context.client_metadata();
  const auto range = metadata.equal_range(kClusterSecretMetadataKey);
  if (range.first == range.second) {
    return absl::UnauthenticatedError(
        absl::StrCat("the call carries no cluster secret (metadata ",
                     kClusterSecretMetadataKey, ")"));
  }
  if (std::next(range.first) != range.second) {
    return absl::UnauthenticatedError(
        "the call carries several cluster secrets");
  }
  const absl::string_view presented(range.first->second.data(),
                                    range.first->second.size());
  bool match = false;
  // Compare with every accepted secret, so the time does not tell which one
  // matched.
  for (const std::string& secret : accepted) {
    match = ConstantTimeEquals(presented, secret) || match;
  }
  if (!match) return absl::UnauthenticatedError("wrong cluster secret");
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadApiKeyFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadSmallFile(path, 4096);
  if (!text.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", text.status().message()));
  }
  std::string key(absl::StripAsciiWhitespace(
      absl::string_view(*text).substr(0, text->find('\n'))));
  if (key.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(path, " holds no key"));
  }
  return key;
}

bool BearerTokenMatches(absl::string_view authorization,
                        absl::string_view key) {
  static constexpr absl::string_view kBearer = "Bearer ";
  if (!absl::StartsWith(authorization, kBearer)) return false;
  authorization.remove_prefix(kBearer.size());
  return ConstantTimeEquals(authorization, key);
}

absl::Status CheckApiKey(const grpc::ServerContextBase& context,
                         absl::string_view key) {
  if (key.empty()) return absl::OkStatus();
  const auto& metadata = context.client_metadata();
  const auto range = metadata.equal_range("authorization");
  if (range.first == range.second) {
    return absl::UnauthenticatedError(
        "missing API key: send the metadata 'authorization: Bearer <key>'");
  }
  if (std::next(range.first) != range.second ||
      !BearerTokenMatches(absl::string_view(range.first->second.data(),
                                            range.first->second.size()),
                          key)) {
    return absl::UnauthenticatedError("wrong API key");
  }
  return absl::OkStatus();
}

}  // namespace mneme
