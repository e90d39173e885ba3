#ifndef MNEME_SERVICES_COORDINATOR_HTTP_FRONT_H_
#define MNEME_SERVICES_COORDINATOR_HTTP_FRONT_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/host_port.h"
#include "common/inflight_gate.h"
#include "nlohmann/json.hpp"
#include "services/coordinator/engine.h"
#include "services/coordinator/text_codec.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace mneme::coordinator {

struct HttpFrontOptions {
  // Where to listen; port 0 picks a free one (see HttpFront::port()).
  // Required.
  HostPort listen;
  // The model name clients must send ("model"), listed by /v1/models.
  // Default: "mneme".
  std::string model_name = "mneme";
  // Threads serving requests; a streaming request holds one until it ends,
  // so this bounds the concurrent HTTP requests. Default: 64.
  int threads = 64;
  // Largest request body, bytes. Default: 8 MiB.
  int64_t max_body_bytes = int64_t{8} << 20;
  // How often a streaming response with nothing new sends an SSE comment
  // (which is how a client that went away is noticed). Default: 1 s.
  absl::Duration keepalive_interval = absl::Seconds(1);
  // The longest a request may take. Default: 30 min.
  absl::Duration request_timeout = absl::Minutes(30);
  // Clients must send `Authorization: Bearer <api_key>` (everything but
  // /health and /version; 401 otherwise), like vLLM's --api-key. Default: ""
  // (no key).
  std::string api_key;
  // HTTPS: the certificate chain and private key (PEM files), both or
  // neither. Default: "" (plain HTTP).
  std::string tls_cert_file;
  std::string tls_key_file;
  // Generation requests served at once (a streaming one holds a thread);
  // more are 429 at once, so that threads stay free for quick answers.
  // Default: 0 = threads - 1 (at least 1).
  int max_concurrent_requests = 0;
  // Accepted connections waiting for a thread; beyond it the front stops
  // accepting (the kernel's listen backlog holds the rest). Default: 256.
  int max_queued_connections = 256;
  // The longest one read of a request (its headers, its body) or one write
  // of a response may take; a slower client is disconnected. Default: 30 s.
  absl::Duration read_timeout = absl::Seconds(30);
  absl::Duration write_timeout = absl::Seconds(30);
  // The chat-template kwargs of every chat request, as a JSON object
  // (`thinking`, `reasoning_effort`), which a request's own
  // chat_template_kwargs and reasoning_effort override. Default: "" (none:
  // chat mode; in thinking mode the format's default effort).
  std::string default_chat_template_kwargs;
};

// The OpenAI-compatible HTTP front of the coordinator (cpp-httplib), as
// docs/HTTP_API.md lists it: POST /v1/completions (prompts as text or token
// ids, batched; echo; logprobs), POST /v1/chat/completions (the DeepSeek-V4 /
// V4.1 chat formats with tools, reasoning and its effort; reasoning_content
// and tool_calls parsed from the output; logprobs), n choices per prompt,
// GET /v1/models, /health, /version, /tokenizer_info, POST /tokenize,
// /detokenize; non-streaming JSON or server-sent events ending with
// `data: [DONE]`, and errors in OpenAI's format: 400 for bad requests, 404
// for an unknown model or path, 429 at the admission limits, 503 while the
// cluster is not ready or draining. A streaming client that goes away aborts
// its request. Bounded: concurrent requests, queued connections, body size,
// read and write deadlines; an optional API key. Thread-safe; everything
// borrowed must outlive it.
class HttpFront {
 public:
  // Binds and starts serving on its own thread. InvalidArgument for bad
  // options; Unavailable when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<HttpFront>> Create(
      const HttpFrontOptions& options, Engine* engine, TextCodec* codec,
      InflightGate* gate);
  ~HttpFront();

  // The bound port.
  int port() const { return port_; }
  // Stops accepting and waits for the server thread. Idempotent.
  void Stop();

 private:
  HttpFront(const HttpFrontOptions& options, Engine* engine, TextCodec* codec,
            InflightGate* gate);
  void Routes();
  void Generate(bool chat, const httplib::Request& req, httplib::Response& res);
  void Tokenize(const httplib::Request& req, httplib::Response& res);
  void Detokenize(const httplib::Request& req, httplib::Response& res);

  const HttpFrontOptions options_;
  Engine* const engine_;
  TextCodec* const codec_;
  InflightGate* const gate_;
  nlohmann::json default_kwargs_;
  // Generation requests being served.
  std::atomic<int> active_requests_{0};
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace mneme::coordinator

#endif  // MNEME_SERVICES_COORDINATOR_HTTP_FRONT_H_
