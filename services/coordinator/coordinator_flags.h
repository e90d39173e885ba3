#ifndef MNEME_SERVICES_COORDINATOR_COORDINATOR_FLAGS_H_
#define MNEME_SERVICES_COORDINATOR_COORDINATOR_FLAGS_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "services/coordinator/engine.h"
#include "services/coordinator/grpc_worker_group.h"
#include "services/coordinator/http_front.h"

namespace mneme {

// The coordinator daemon's default gRPC and metrics ports.
inline constexpr int kCoordinatorPort = 50171;
inline constexpr int kCoordinatorMetricsPort = 50172;

// GrpcWorkerGroupOptions from --workers=HOST:PORT,... (rank order;
// required), --step_timeout, --coordinator_id and the peer flags of
// PeerChannelOptionsFromFlags (--peer_tls_*, --cluster_secret_file).
// InvalidArgument naming the flag.
absl::StatusOr<coordinator::GrpcWorkerGroupOptions>
WorkerGroupOptionsFromFlags();

// EngineOptions from --max_num_batched_tokens, --max_num_seqs,
// --long_prefill_token_threshold, --max_context_tokens (0 = the longest
// the workers' KV cache holds), --max_queued_requests, --max_queued_tokens,
// --kv_cache_bytes (per rank for the scheduler; 0 = the workers'),
// --max_prefetch_hints. InvalidArgument naming the flag.
absl::StatusOr<coordinator::EngineOptions> EngineOptionsFromFlags();

// The text front's settings: --http_listen=HOST:PORT (the OpenAI-compatible
// HTTP API; empty or "none" = off, port 0 = any), --served_model_name,
// --http_threads, --tokenizer (a tokenizer.json; empty = the checkpoint's).
struct TextFrontFlags {
  std::optional<coordinator::HttpFrontOptions> http;
  std::string tokenizer_path;
  // The API key of the public APIs (--http_api_key_file or MNEME_API_KEY):
  // the gRPC Serving API and the HTTP API; empty = none.
  std::string api_key;
};
// Names no file: --check_config runs it.
absl::StatusOr<TextFrontFlags> TextFrontFlagsFromFlags();
// Reads the API key (--http_api_key_file, else MNEME_API_KEY) into
// `t.api_key` and `t.http->api_key`; InvalidArgument naming the flag for a
// file that cannot be read or holds no key.
absl::Status LoadApiKey(TextFrontFlags& t);

}  // namespace mneme

#endif  // MNEME_SERVICES_COORDINATOR_COORDINATOR_FLAGS_H_
