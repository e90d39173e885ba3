#include "tools/cli/serving_channel.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/cluster_secret.h"
#include "common/grpc_channel.h"

namespace mneme::cli {

absl::StatusOr<std::shared_ptr<grpc::Channel>> ServingChannel(
    const Args& args, const std::string& server) {
  ClientChannelOptions options;
  if (args.Has("api-key-file")) {
    absl::StatusOr<std::string> key =
        ReadApiKeyFile(args.Get("api-key-file", ""));
    if (!key.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--api-key-file ", key.status().message()));
    }
    options.api_key = *std::move(key);
  } else if (const char* env = std::getenv("MNEME_API_KEY");
             env != nullptr && *env != '\0') {
    options.api_key = env;
  }
  return CreateClientChannel(server, options);
}

}  // namespace mneme::cli
