#include "services/coordinator/coordinator_flags.h"

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "common/cluster_secret.h"
#include "common/host_port.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "services/common/server_flags.h"
#include "services/coordinator/openai_request.h"

ABSL_FLAG(std::string, workers, "",
          "HOST:PORT of every worker, comma-separated, in rank order.");
ABSL_FLAG(std::string, coordinator_id, "",
          "This coordinator's instance id (at most 256 bytes), sent with "
          "every step: workers refuse to run or release a sequence created "
          "under another id, and a coordinator restarted with the same id "
          "owns its sequences again. Default: HOSTNAME/LISTEN_ADDRESS.");
ABSL_FLAG(absl::Duration, step_timeout, absl::Seconds(120),
          "Deadline of one step on the workers.");
ABSL_FLAG(absl::Duration, join_timeout, absl::Seconds(150),
          "Deadline of the workers' JoinGroup when the coordinator forms or "
          "re-forms their group (keep it above the workers' --comm_timeout).");
ABSL_FLAG(bool, worker_step_stream, true,
          "Send steps over one long-lived StepStream per worker (else one "
          "unary Step call per step and worker).");
ABSL_FLAG(bool, overlap_scheduling, true,
          "Plan and send the next decode step while one runs (needs "
          "--worker_step_stream).");
ABSL_FLAG(int64_t, num_speculative_tokens, 0,
          "DSpark speculative decoding: draft tokens per decode step, in "
          "[0, 64] (0: off); the workers must run with at least as many "
          "(their --num_speculative_tokens).");
ABSL_FLAG(std::string, spec_verify, "block",
          "How sampled drafts are verified: block (block verification, the "
          "DSpark recipe's) or standard (per-token rejection sampling).");
ABSL_FLAG(absl::Duration, idle_check_interval, absl::Seconds(1),
          "How often an idle coordinator checks that its workers are up and "
          "in one group (a rank restarted while idle is found this way).");
ABSL_FLAG(int64_t, max_num_batched_tokens, 8192,
          "Token budget of one step (the prefill chunk size).");
ABSL_FLAG(int64_t, max_num_seqs, 256, "Most requests running at once.");
ABSL_FLAG(int64_t, long_prefill_token_threshold, 0,
          "Most prompt tokens of one sequence per step; 0 = the budget.");
ABSL_FLAG(int64_t, max_context_tokens, 0,
          "Longest prompt + max_new_tokens; 0 = what the KV cache holds.");
ABSL_FLAG(int64_t, max_queued_requests, 1024,
          "Most waiting requests; more are RESOURCE_EXHAUSTED.");
ABSL_FLAG(int64_t, max_queued_tokens, 4194304,
          "Most prompt tokens waiting; more are RESOURCE_EXHAUSTED.");
ABSL_FLAG(int64_t, kv_cache_bytes, 0,
          "KV bytes per rank the scheduler may use; 0 = the workers' pool.");
ABSL_FLAG(int, max_prefetch_hints, 4,
          "Prefill chunks whose Engram rows are prefetched per step.");

ABSL_FLAG(std::string, http_listen, "",
          "HOST:PORT of the OpenAI-compatible HTTP API; empty or none = off, "
          "port 0 = any free port.");
ABSL_FLAG(std::string, served_model_name, "mneme",
          "The model name HTTP clients send and /v1/models lists.");
ABSL_FLAG(int, http_threads, 64,
          "Threads of the HTTP API (bounds its concurrent requests).");
ABSL_FLAG(std::string, http_api_key_file, "",
          "A file whose first line is the API key clients of the public APIs "
          "must send: HTTP as 'Authorization: Bearer KEY', the gRPC Serving "
          "API as the metadata 'authorization: Bearer KEY' (the MNEME_API_KEY "
          "environment variable also sets it); empty = no key.");
ABSL_FLAG(int, http_max_concurrent_requests, 0,
          "Generation requests the HTTP API serves at once, more are 429; "
          "0 = --http_threads - 1.");
ABSL_FLAG(absl::Duration, http_read_timeout, absl::Seconds(30),
          "The longest one read of an HTTP request (headers, body) may take.");
ABSL_FLAG(std::string, http_tls_cert, "",
          "Certificate chain (PEM) of the HTTP API: with --http_tls_key, the "
          "API speaks HTTPS only.");
ABSL_FLAG(std::string, http_tls_key, "",
          "Private key (PEM) of --http_tls_cert.");
ABSL_FLAG(std::string, default_chat_template_kwargs, "",
          "JSON object of chat-template kwargs every chat request starts "
          "from, e.g. '{\"thinking\": true, \"reasoning_effort\": "
          "\"high\"}'; a request's own override them.");
ABSL_FLAG(std::string, tokenizer, "",
          "tokenizer.json for the text APIs; empty = the served checkpoint's.");

namespace mneme {

absl::Status LoadApiKey(TextFrontFlags& t) {
  const std::string key_file = absl::GetFlag(FLAGS_http_api_key_file);
  if (!key_file.empty()) {
    absl::StatusOr<std::string> key = ReadApiKeyFile(key_file);
    if (!key.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--http_api_key_file: ", key.status().message()));
    }
    t.api_key = *std::move(key);
  } else if (const char* env = std::getenv("MNEME_API_KEY");
             env != nullptr && *env != '\0') {
    t.api_key = env;
  }
  if (t.http.has_value()) t.http->api_key = t.api_key;
  return absl::OkStatus();
}

absl::StatusOr<TextFrontFlags> TextFrontFlagsFromFlags() {
  TextFrontFlags t;
  t.tokenizer_path = absl::GetFlag(FLAGS_tokenizer);
  const std::string listen = absl::GetFlag(FLAGS_http_listen);
  if (listen.empty() || listen == "none") return t;
  coordinator::HttpFrontOptions o;
  ASSIGN_OR_RETURN(o.listen, ParseHostPort(listen, "--http_listen"));
  o.model_name = absl::GetFlag(FLAGS_served_model_name);
  if (o.model_name.empty()) {
    return absl::InvalidArgumentError("--served_model_name must not be empty");
  }
  o.threads = absl::GetFlag(FLAGS_http_threads);
  if (o.threads < 1 || o.threads > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("--http_threads=", o.threads, " must be in [1, 4096]"));
  }
  o.max_concurrent_requests = absl::GetFlag(FLAGS_http_max_concurrent_requests);
  if (o.max_concurrent_requests < 0 || o.max_concurrent_requests > o.threads) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--http_max_concurrent_requests=", o.max_concurrent_requests,
        " must be in [0, --http_threads]"));
  }
  o.read_timeout = absl::GetFlag(FLAGS_http_read_timeout);
  if (o.read_timeout < absl::Seconds(1)) {
    return absl::InvalidArgumentError("--http_read_timeout must be >= 1s");
  }
  o.tls_cert_file = absl::GetFlag(FLAGS_http_tls_cert);
  o.tls_key_file = absl::GetFlag(FLAGS_http_tls_key);
  if (o.tls_cert_file.empty() != o.tls_key_file.empty()) {
    return absl::InvalidArgumentError(
        "--http_tls_cert and --http_tls_key go together");
  }
  o.default_chat_template_kwargs =
      absl::GetFlag(FLAGS_default_chat_template_kwargs);
  if (!o.default_chat_template_kwargs.empty()) {
    const nlohmann::json kwargs = nlohmann::json::parse(
        o.default_chat_template_kwargs, nullptr, /*allow_exceptions=*/false);
    if (kwargs.is_discarded()) {
      return absl::InvalidArgumentError(
          "--default_chat_template_kwargs is not valid JSON");
    }
    if (absl::Status st = coordinator::CheckDefaultChatTemplateKwargs(kwargs);
        !st.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--default_chat_template_kwargs: ", st.message()));
    }
  }
  t.http = o;
  return t;
}

absl::StatusOr<coordinator::GrpcWorkerGroupOptions>
WorkerGroupOptionsFromFlags() {
  coordinator::GrpcWorkerGroupOptions o;
  const std::string workers = absl::GetFlag(FLAGS_workers);
  if (workers.empty()) {
    return absl::InvalidArgumentError(
        "--workers=HOST:PORT,... (every worker, in rank order) is required");
  }
  o.workers = absl::StrSplit(workers, ',');
  for (size_t r = 0; r < o.workers.size(); ++r) {
    RETURN_IF_ERROR(
        ParseHostPort(o.workers[r], absl::StrCat("--workers (rank ", r, ")"))
            .status());
  }
  o.step_stream = absl::GetFlag(FLAGS_worker_step_stream);
  o.step_timeout = absl::GetFlag(FLAGS_step_timeout);
  if (o.step_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--step_timeout must be positive");
  }
  o.join_timeout = absl::GetFlag(FLAGS_join_timeout);
  if (o.join_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--join_timeout must be positive");
  }
  ASSIGN_OR_RETURN(const ClientChannelOptions peer,
                   PeerChannelOptionsFromFlags());
  o.tls = peer.tls;
  o.cluster_secret_file = peer.cluster_secret_file;
  o.coordinator_id = absl::GetFlag(FLAGS_coordinator_id);
  if (o.coordinator_id.size() > 256) {
    return absl::InvalidArgumentError(
        "--coordinator_id must be at most 256 bytes");
  }
  return o;
}

absl::StatusOr<coordinator::EngineOptions> EngineOptionsFromFlags() {
  coordinator::EngineOptions o;
  coordinator::SchedulerOptions& s = o.scheduler;
  struct IntFlag {
    const char* name;
    int64_t value;
    int64_t lo;
    int64_t* dst;
  };
  const std::vector<IntFlag> flags = {
      {"max_num_batched_tokens", absl::GetFlag(FLAGS_max_num_batched_tokens), 1,
       &s.max_num_batched_tokens},
      {"max_num_seqs", absl::GetFlag(FLAGS_max_num_seqs), 1, &s.max_num_seqs},
      {"long_prefill_token_threshold",
       absl::GetFlag(FLAGS_long_prefill_token_threshold), 0,
       &s.long_prefill_token_threshold},
      {"max_context_tokens", absl::GetFlag(FLAGS_max_context_tokens), 0,
       &s.max_context_tokens},
      {"max_queued_requests", absl::GetFlag(FLAGS_max_queued_requests), 1,
       &s.max_queued_requests},
      {"max_queued_tokens", absl::GetFlag(FLAGS_max_queued_tokens), 1,
       &s.max_queued_tokens},
      {"kv_cache_bytes", absl::GetFlag(FLAGS_kv_cache_bytes), 0,
       &s.kv_pool.bytes_per_rank},
      {"num_speculative_tokens", absl::GetFlag(FLAGS_num_speculative_tokens), 0,
       &s.num_speculative_tokens},
  };
  for (const IntFlag& f : flags) {
    if (f.value < f.lo || f.value > (int64_t{1} << 50)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", f.name, "=", f.value, " must be in [", f.lo, ", 2^50]"));
    }
    *f.dst = f.value;
  }
  if (s.num_speculative_tokens > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("--num_speculative_tokens=", s.num_speculative_tokens,
                     " must be in [0, 64]"));
  }
  const std::string verify = absl::GetFlag(FLAGS_spec_verify);
  if (verify == "block") {
    o.draft_verification = worker::v1::DRAFT_VERIFICATION_BLOCK;
  } else if (verify == "standard") {
    o.draft_verification = worker::v1::DRAFT_VERIFICATION_STANDARD;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--spec_verify=", verify, ": must be block or standard"));
  }
  o.overlap_scheduling = absl::GetFlag(FLAGS_overlap_scheduling);
  o.idle_check_interval = absl::GetFlag(FLAGS_idle_check_interval);
  if (o.idle_check_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--idle_check_interval must be positive");
  }
  o.max_prefetch_hints = absl::GetFlag(FLAGS_max_prefetch_hints);
  if (o.max_prefetch_hints < 0 || o.max_prefetch_hints > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_prefetch_hints=", o.max_prefetch_hints,
                     " must be in [0, 4096]"));
  }
  return o;
}

}  // namespace mneme
