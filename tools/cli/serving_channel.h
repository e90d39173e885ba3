#ifndef MNEME_TOOLS_CLI_SERVING_CHANNEL_H_
#define MNEME_TOOLS_CLI_SERVING_CHANNEL_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "tools/cli/args.h"

namespace mneme::cli {

// The channel of a client command to a coordinator's Serving API at
// `server`. Every call carries the API key ("authorization: Bearer KEY") of
// --api-key-file FILE (its first line) or, without the flag, of the
// MNEME_API_KEY environment variable; none when neither is set.
// InvalidArgument naming the flag for a file that cannot be read or holds
// no key.
absl::StatusOr<std::shared_ptr<grpc::Channel>> ServingChannel(
    const Args& args, const std::string& server);

}  // namespace mneme::cli

#endif  // MNEME_TOOLS_CLI_SERVING_CHANNEL_H_
