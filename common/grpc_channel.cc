#include "common/grpc_channel.h"

#include <grpc/grpc.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/support/channel_arguments.h>
#include <grpcpp/support/client_interceptor.h>

#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/cluster_secret.h"
#include "common/status_macros.h"

namespace mneme {
namespace {

// Adds fixed entries (the cluster secret, the API key) to the initial
// metadata of every call.
class MetadataInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit MetadataInterceptor(
      const std::vector<std::pair<std::string, std::string>>* entries)
      : entries_(entries) {}

  void Intercept(
      grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::
                PRE_SEND_INITIAL_METADATA)) {
      for (const auto& [key, value] : *entries_) {
        methods->GetSendInitialMetadata()->emplace(key, value);
      }
    }
    methods->Proceed();
  }

 private:
  const std::vector<std::pair<std::string, std::string>>* const entries_;
};

class MetadataInterceptorFactory final
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit MetadataInterceptorFactory(
      std::vector<std::pair<std::string, std::string>> entries)
      : entries_(std::move(entries)) {}

  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* /*info*/) override {
    return new MetadataInterceptor(&entries_);
  }

 private:
  const std::vector<std::pair<std::string, std::string>> entries_;
};

struct PeerDefaults {
  absl::Mutex mu;
  ClientTlsOptions tls ABSL_GUARDED_BY(mu);
  std::string cluster_secret_file ABSL_GUARDED_BY(mu);
};

PeerDefaults& Defaults() {
  static PeerDefaults* const defaults = new PeerDefaults();
  return *defaults;
}

bool IsEmpty(const ClientTlsOptions& tls) {
  return tls.ca_file.empty() && tls.cert_file.empty() && tls.key_file.empty() &&
         tls.server_name_override.empty();
}

}  // namespace

void SetPeerChannelDefaults(const ClientChannelOptions& defaults) {
  PeerDefaults& d = Defaults();
  absl::MutexLock lock(&d.mu);
  d.tls = defaults.tls;
  d.cluster_secret_file = defaults.cluster_secret_file;
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> CreateClientChannel(
    const std::string& target, const ClientChannelOptions& options) {
  if (target.empty()) {
    return absl::InvalidArgumentError("channel target is empty");
  }
  if (options.max_receive_message_bytes < 1 ||
      options.max_receive_message_bytes > std::numeric_limits<int>::max()) {
    return absl::InvalidArgumentError(
        "max_receive_message_bytes must be in [1, 2^31)");
  }
  if (options.keepalive_time < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("keepalive_time must not be negative");
  }
  if (options.keepalive_time > absl::ZeroDuration() &&
      options.keepalive_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "keepalive_timeout must be positive when keepalive_time is set");
  }
  ClientTlsOptions tls = options.tls;
  std::string secret_file = options.cluster_secret_file;
  {
    PeerDefaults& d = Defaults();
    absl::MutexLock lock(&d.mu);
    if (IsEmpty(tls)) tls = d.tls;
    if (secret_file.empty()) secret_file = d.cluster_secret_file;
  }
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials,
                   MakeChannelCredentials(tls));
  std::vector<
      std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>>
      interceptors;
  std::vector<std::pair<std::string, std::string>> metadata;
  if (!secret_file.empty()) {
    ASSIGN_OR_RETURN(std::vector<std::string> secrets,
                     ReadClusterSecretFile(secret_file));
    metadata.emplace_back(kClusterSecretMetadataKey, std::move(secrets[0]));
  }
  if (!options.api_key.empty()) {
    metadata.emplace_back("authorization",
                          absl::StrCat("Bearer ", options.api_key));
  }
  if (!metadata.empty()) {
    interceptors.push_back(
        std::make_unique<MetadataInterceptorFactory>(std::move(metadata)));
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(
      static_cast<int>(options.max_receive_message_bytes));
  if (!tls.server_name_override.empty()) {
    args.SetSslTargetNameOverride(tls.server_name_override);
  }
  if (options.keepalive_time > absl::ZeroDuration()) {
    args.SetInt(
        GRPC_ARG_KEEPALIVE_TIME_MS,
        static_cast<int>(absl::ToInt64Milliseconds(options.keepalive_time)));
    args.SetInt(
        GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
        static_cast<int>(absl::ToInt64Milliseconds(options.keepalive_timeout)));
    args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 0);
  }
  if (interceptors.empty()) {
    return grpc::CreateCustomChannel(target, credentials, args);
  }
  return grpc::experimental::CreateCustomChannelWithInterceptors(
      target, credentials, args, std::move(interceptors));
}

}  // namespace mneme
