#include "services/coordinator/http_front.h"

#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <deque>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/cluster_secret.h"
#include "common/connection_probe.h"
#include "common/status_macros.h"
#include "common/version.h"
#include "glog/logging.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "services/coordinator/openai_choice.h"
#include "services/coordinator/openai_request.h"
#include "services/coordinator/request_stream.h"
#include "services/coordinator/request_validator.h"

namespace mneme::coordinator {
namespace {

using nlohmann::json;

void SendError(httplib::Response& res, const HttpError& e) {
  res.status = e.status;
  res.set_content(HttpErrorBody(e).dump(), "application/json");
}

void SendJson(httplib::Response& res, const json& body) {
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace),
                  "application/json");
}

// The body as a JSON object, or the error to send.
std::optional<HttpError> ParseBody(const httplib::Request& req, json& body) {
  body = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded() || !body.is_object()) {
    HttpError e;
    e.message = body.is_discarded() ? "the body is not valid JSON"
                                    : "the body must be a JSON object";
    return e;
  }
  return std::nullopt;
}

// httplib's thread pool with a bounded queue: enqueue() (the accept loop)
// waits while `max_queued` connections wait for a thread, so the front stops
// accepting instead of queueing without end.
class BoundedThreadPool final : public httplib::TaskQueue {
 public:
  BoundedThreadPool(int threads, int max_queued) : max_queued_(max_queued) {
    for (int i = 0; i < threads; ++i) {
      threads_.emplace_back([this] { Work(); });
    }
  }
  ~BoundedThreadPool() override { shutdown(); }

  void enqueue(std::function<void()> fn) override {
    absl::MutexLock lock(&mu_);
    auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || jobs_.size() < static_cast<size_t>(max_queued_);
    };
    mu_.Await(absl::Condition(&room));
    jobs_.push_back(std::move(fn));
  }

  void shutdown() override {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    for (std::thread& t : threads_) {
      if (t.joinable()) t.join();
    }
  }

 private:
  void Work() {
    while (true) {
      std::function<void()> fn;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stopping_ || !jobs_.empty();
        };
        mu_.Await(absl::Condition(&ready));
        if (jobs_.empty()) return;  // Stopping, and nothing left.
        fn = std::move(jobs_.front());
        jobs_.pop_front();
      }
      fn();
    }
  }

  const int max_queued_;
  absl::Mutex mu_;
  std::deque<std::function<void()>> jobs_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

// SO_REUSEADDR only: httplib's default also sets SO_REUSEPORT, which would
// let a second coordinator bind the same port and take half its clients.
void ListenSocketOptions(socket_t sock) {
  int yes = 1;
  setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
}

// One of the front's concurrent generation requests, given back on
// destruction.
class RequestSlot {
 public:
  explicit RequestSlot(std::atomic<int>& active) : active_(active) {}
  ~RequestSlot() { active_.fetch_sub(1); }
  RequestSlot(const RequestSlot&) = delete;
  RequestSlot& operator=(const RequestSlot&) = delete;

 private:
  std::atomic<int>& active_;
};

// The body (as ParseBody) and the served tokenizer.
std::optional<HttpError> BodyAndTokenizer(const httplib::Request& req,
                                          TextCodec& codec, json& body,
                                          const text::Tokenizer*& tokenizer) {
  if (std::optional<HttpError> e = ParseBody(req, body)) return e;
  absl::StatusOr<const text::Tokenizer*> t = codec.tokenizer();
  if (!t.ok()) return HttpErrorFromStatus(t.status());
  tokenizer = *t;
  return std::nullopt;
}

std::string NewId(const char* prefix) {
  static std::atomic<uint64_t> counter{0};
  thread_local std::mt19937_64 rng(std::random_device{}());
  return absl::StrFormat("%s-%016x%04x", prefix, rng(),
                         counter.fetch_add(1) & 0xffff);
}

json Usage(int64_t prompt, int64_t completion) {
  return json{{"prompt_tokens", prompt},
              {"completion_tokens", completion},
              {"total_tokens", prompt + completion}};
}

// One choice of a request in flight.
struct Running {
  std::string engine_id;
  std::shared_ptr<RequestStream> stream;
  std::unique_ptr<ChoiceOutput> output;
  bool finished = false;
  absl::Status status;
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
};

// A request's choices, submitted to the engine together and read through
// one doorbell.
struct Job {
  OpenAiRequest request;
  std::string id;
  int64_t created = 0;
  std::shared_ptr<Doorbell> bell = std::make_shared<Doorbell>();
  uint64_t rings = 0;
  std::vector<Running> choices;
  absl::Time deadline;

  json Envelope() const {
    const char* object =
        request.chat
            ? (request.stream ? "chat.completion.chunk" : "chat.completion")
            : "text_completion";
    return json{{"id", id},
                {"object", object},
                {"created", created},
                {"model", request.model}};
  }
  bool done() const {
    return std::all_of(choices.begin(), choices.end(),
                       [](const Running& r) { return r.finished; });
  }
  // The first error of a choice, OK if none.
  absl::Status status() const {
    for (const Running& r : choices) {
      if (!r.status.ok()) return r.status;
    }
    return absl::OkStatus();
  }
  json TotalUsage() const {
    // Each prompt counts once however many choices it has (as in OpenAI).
    int64_t prompt = 0;
    int64_t completion = 0;
    for (size_t i = 0; i < choices.size(); ++i) {
      if (i % static_cast<size_t>(request.n) == 0) {
        prompt += choices[i].prompt_tokens;
      }
      completion += choices[i].completion_tokens;
    }
    return Usage(prompt, completion);
  }
};

// Reads what every unfinished choice has (after waiting up to `wait` for
// news); `emit` receives each streaming choice object. Aborts a choice whose
// text hit a stop string, and every choice past the deadline.
template <typename Emit>
void Pump(Engine& engine, Job& job, absl::Duration wait, Emit&& emit) {
  job.rings = job.bell->Wait(job.rings, wait);
  const bool late = absl::Now() > job.deadline;
  for (Running& r : job.choices) {
    if (r.finished) continue;
    RequestStream::Batch b = r.stream->Next(absl::ZeroDuration());
    if (!b.prompt.empty()) r.output->AddPromptPositions(b.prompt);
    if (!b.tokens.empty()) {
      if (std::optional<json> c = r.output->Add(b.tokens, b.logprobs, b.top)) {
        emit(*c);
      }
    }
    if (b.finished) {
      r.finished = true;
      r.status = b.status;
      r.prompt_tokens = b.prompt_tokens;
      r.completion_tokens = b.completion_tokens;
      if (b.status.ok()) {
        for (json& c : r.output->Finish(b.end)) emit(c);
      }
      continue;
    }
    if (r.output->stopped() || late) {
      (void)engine.Abort(r.engine_id);  // NotFound if it just ended.
    }
  }
}

}  // namespace

HttpFront::HttpFront(const HttpFrontOptions& options, Engine* engine,
                     TextCodec* codec, InflightGate* gate)
    : options_(options), engine_(engine), codec_(codec), gate_(gate) {}

HttpFront::~HttpFront() { Stop(); }

void HttpFront::Stop() {
  if (server_ != nullptr) server_->stop();
  if (thread_.joinable()) thread_.join();
}

absl::StatusOr<std::unique_ptr<HttpFront>> HttpFront::Create(
    const HttpFrontOptions& options, Engine* engine, TextCodec* codec,
    InflightGate* gate) {
  if (engine == nullptr || codec == nullptr || gate == nullptr) {
    return absl::InvalidArgumentError("engine, codec and gate are required");
  }
  if (options.threads < 1 || options.threads > 4096) {
    return absl::InvalidArgumentError(absl::StrCat(
        "http threads=", options.threads, " must be in [1, 4096]"));
  }
  if (options.max_body_bytes < 1024) {
    return absl::InvalidArgumentError("http max_body_bytes must be >= 1024");
  }
  if (options.model_name.empty()) {
    return absl::InvalidArgumentError("the served model name is empty");
  }
  json kwargs = json::object();
  if (!options.default_chat_template_kwargs.empty()) {
    kwargs = json::parse(options.default_chat_template_kwargs, nullptr,
                         /*allow_exceptions=*/false);
    if (kwargs.is_discarded()) {
      return absl::InvalidArgumentError(
          "default_chat_template_kwargs is not valid JSON");
    }
    RETURN_IF_ERROR(CheckDefaultChatTemplateKwargs(kwargs));
  }
  if (options.max_concurrent_requests < 0 ||
      options.max_concurrent_requests > options.threads) {
    return absl::InvalidArgumentError(absl::StrCat(
        "http max_concurrent_requests=", options.max_concurrent_requests,
        " must be in [0, ", options.threads, "] (0: threads - 1)"));
  }
  if (options.max_queued_connections < 1) {
    return absl::InvalidArgumentError(
        "http max_queued_connections must be >= 1");
  }
  if (options.read_timeout < absl::Seconds(1) ||
      options.write_timeout < absl::Seconds(1)) {
    return absl::InvalidArgumentError(
        "http read and write timeouts must be at least 1 s");
  }
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return absl::InvalidArgumentError(
        "the HTTP TLS certificate and key go together");
  }
  std::unique_ptr<HttpFront> front(new HttpFront(options, engine, codec, gate));
  front->default_kwargs_ = std::move(kwargs);
  if (options.tls_cert_file.empty()) {
    front->server_ = std::make_unique<httplib::Server>();
  } else {
    auto tls = std::make_unique<httplib::SSLServer>(
        options.tls_cert_file.c_str(), options.tls_key_file.c_str());
    if (!tls->is_valid()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot use the HTTP TLS certificate ", options.tls_cert_file,
          " with the key ", options.tls_key_file,
          " (missing, unreadable, not PEM, or not a pair)"));
    }
    front->server_ = std::move(tls);
  }
  httplib::Server& s = *front->server_;
  const int threads = options.threads;
  const int queued = options.max_queued_connections;
  s.new_task_queue = [threads, queued] {
    return new BoundedThreadPool(threads, queued);
  };
  s.set_payload_max_length(static_cast<size_t>(options.max_body_bytes));
  s.set_socket_options(ListenSocketOptions);
  s.set_tcp_nodelay(true);
  s.set_read_timeout(absl::ToChronoSeconds(options.read_timeout));
  s.set_write_timeout(absl::ToChronoSeconds(options.write_timeout));
  s.set_keep_alive_timeout(5);
  s.set_keep_alive_max_count(1000);
  front->Routes();
  const int port =
      options.listen.port == 0
          ? s.bind_to_any_port(options.listen.host)
          : (s.bind_to_port(options.listen.host, options.listen.port)
                 ? options.listen.port
                 : -1);
  if (port <= 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen for HTTP on ", options.listen.ToString()));
  }
  front->port_ = port;
  httplib::Server* raw = front->server_.get();
  front->thread_ = std::thread([raw] { raw->listen_after_bind(); });
  // Serving before Create() returns: a Stop() before the server thread ran
  // would find nothing to stop, and the thread would then listen forever.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (!raw->is_running() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  if (!raw->is_running()) {
    return absl::InternalError("the HTTP server thread did not start");
  }
  return front;
}

void HttpFront::Routes() {
  httplib::Server& s = *server_;
  s.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    HttpError e;
    e.status = res.status;
    e.type = res.status == 404 ? "not_found_error" : "invalid_request_error";
    e.message = res.status == 404
                    ? absl::StrCat("no route ", req.method, " ", req.path)
                    : absl::StrCat("HTTP ", res.status);
    res.set_content(HttpErrorBody(e).dump(), "application/json");
  });
  // The API key guards everything but the liveness endpoints.
  s.set_pre_routing_handler(
      [this](const httplib::Request& req, httplib::Response& res) {
        if (options_.api_key.empty() || req.path == "/health" ||
            req.path == "/version") {
          return httplib::Server::HandlerResponse::Unhandled;
        }
        if (BearerTokenMatches(req.get_header_value("Authorization"),
                               options_.api_key)) {
          return httplib::Server::HandlerResponse::Unhandled;
        }
        HttpError e;
        e.status = 401;
        e.type = "invalid_request_error";
        e.message =
            "missing or wrong API key: send the header 'Authorization: Bearer "
            "<key>'";
        SendError(res, e);
        return httplib::Server::HandlerResponse::Handled;
      });
  s.set_exception_handler([](const httplib::Request&, httplib::Response& res,
                             const std::exception_ptr&) {
    HttpError e;
    e.status = 500;
    e.type = "internal_error";
    e.message = "internal error";
    SendError(res, e);
  });

  s.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    json model = {{"id", options_.model_name},
                  {"object", "model"},
                  {"created", 0},
                  {"owned_by", "mneme"},
                  {"root", options_.model_name}};
    if (absl::StatusOr<ModelInfo> info = engine_->model_info(); info.ok()) {
      model["max_model_len"] = info->max_context_tokens;
      model["context_length"] = info->max_context_tokens;
    }
    SendJson(res, json{{"object", "list"}, {"data", {model}}});
  });
  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (engine_->ready()) {
      SendJson(res, json::object());
      return;
    }
    HttpError e;
    e.status = 503;
    e.type = "service_unavailable";
    e.message = "the workers are not ready";
    SendError(res, e);
  });
  s.Get("/version", [](const httplib::Request&, httplib::Response& res) {
    SendJson(res, json{{"version", kMnemeVersion}});
  });
  s.Get("/tokenizer_info", [this](const httplib::Request&,
                                  httplib::Response& res) {
    absl::StatusOr<const text::Tokenizer*> tokenizer = codec_->tokenizer();
    if (!tokenizer.ok()) {
      return SendError(res, HttpErrorFromStatus(tokenizer.status()));
    }
    json info = json::object();
    const text::Tokenizer& t = **tokenizer;
    if (std::optional<absl::string_view> bos = t.bos_token()) {
      info["bos_token"] = std::string(*bos);
      info["bos_token_id"] = *t.bos_id();
    }
    if (std::optional<absl::string_view> eos = t.eos_token()) {
      info["eos_token"] = std::string(*eos);
      info["eos_token_id"] = *t.eos_id();
    }
    if (absl::StatusOr<ModelInfo> m = engine_->model_info(); m.ok()) {
      info["model_max_length"] = m->max_context_tokens;
    }
    SendJson(res, info);
  });
  s.Post("/tokenize", [this](const httplib::Request& req,
                             httplib::Response& res) { Tokenize(req, res); });
  s.Post("/detokenize",
         [this](const httplib::Request& req, httplib::Response& res) {
           Detokenize(req, res);
         });
  s.Post("/v1/completions",
         [this](const httplib::Request& req, httplib::Response& res) {
           Generate(false, req, res);
         });
  s.Post("/v1/chat/completions",
         [this](const httplib::Request& req, httplib::Response& res) {
           Generate(true, req, res);
         });
}

void HttpFront::Tokenize(const httplib::Request& req, httplib::Response& res) {
  json body;
  const text::Tokenizer* tokenizer = nullptr;
  if (std::optional<HttpError> e =
          BodyAndTokenizer(req, *codec_, body, tokenizer)) {
    return SendError(res, *e);
  }
  OpenAiRequest request;
  request.chat = body.contains("messages");
  if (request.chat) {
    // The prompt a chat request with these messages would have.
    absl::StatusOr<const text::DeepSeekV4ChatTemplate*> tmpl =
        codec_->chat_template();
    if (!tmpl.ok()) return SendError(res, HttpErrorFromStatus(tmpl.status()));
    if (std::optional<HttpError> e = ParseChat(
            body, **tmpl, *tokenizer, default_kwargs_, req.body, request)) {
      return SendError(res, *e);
    }
  } else {
    auto prompt = body.find("prompt");
    if (prompt == body.end() || !prompt->is_string()) {
      return SendError(res, BadField("prompt",
                                     "is required (a string), or give "
                                     "'messages'"));
    }
    bool add_special = true;
    if (auto a = body.find("add_special_tokens");
        a != body.end() && !a->is_null()) {
      if (!a->is_boolean()) {
        return SendError(res,
                         BadField("add_special_tokens", "must be a boolean"));
      }
      add_special = a->get<bool>();
    }
    absl::StatusOr<std::vector<int64_t>> ids = tokenizer->Encode(
        prompt->get<std::string>(), add_special ? text::AddSpecialTokens::kYes
                                                : text::AddSpecialTokens::kNo);
    if (!ids.ok()) {
      return SendError(res,
                       BadField("prompt", std::string(ids.status().message())));
    }
    request.prompts.push_back(*std::move(ids));
  }
  json out = {{"tokens", request.prompts.front()},
              {"count", request.prompts.front().size()}};
  if (absl::StatusOr<ModelInfo> m = engine_->model_info(); m.ok()) {
    out["max_model_len"] = m->max_context_tokens;
  }
  SendJson(res, out);
}

void HttpFront::Detokenize(const httplib::Request& req,
                           httplib::Response& res) {
  json body;
  const text::Tokenizer* tokenizer = nullptr;
  if (std::optional<HttpError> e =
          BodyAndTokenizer(req, *codec_, body, tokenizer)) {
    return SendError(res, *e);
  }
  auto tokens = body.find("tokens");
  if (tokens == body.end() || !tokens->is_array()) {
    return SendError(res, BadField("tokens", "is required (a list of ids)"));
  }
  std::vector<int64_t> ids;
  ids.reserve(tokens->size());
  for (const json& t : *tokens) {
    if (!t.is_number_integer()) {
      return SendError(res, BadField("tokens", "must hold integers"));
    }
    ids.push_back(t.get<int64_t>());
  }
  SendJson(res, json{{"prompt",
                      tokenizer->Decode(ids, text::SkipSpecialTokens::kNo)}});
}

void HttpFront::Generate(bool chat, const httplib::Request& req,
                         httplib::Response& res) {
  std::optional<InflightGate::Pass> pass = gate_->Enter();
  if (!pass.has_value()) {
    HttpError e;
    e.status = 503;
    e.type = "service_unavailable";
    e.message = "the coordinator is shutting down";
    return SendError(res, e);
  }
  const int limit = options_.max_concurrent_requests > 0
                        ? options_.max_concurrent_requests
                        : std::max(1, options_.threads - 1);
  auto slot = std::make_shared<RequestSlot>(active_requests_);
  if (active_requests_.fetch_add(1) >= limit) {
    HttpError e;
    e.status = 429;
    e.type = "rate_limit_error";
    e.message = absl::StrCat("the HTTP front serves ", limit,
                             " requests at once; try again later");
    return SendError(res, e);
  }
  json body;
  if (std::optional<HttpError> e = ParseBody(req, body)) {
    return SendError(res, *e);
  }
  auto job = std::make_shared<Job>();
  OpenAiRequest& request = job->request;
  if (std::optional<HttpError> e =
          ParseOpenAiCommon(body, options_.model_name, chat, request)) {
    return SendError(res, *e);
  }
  absl::StatusOr<const text::Tokenizer*> tokenizer = codec_->tokenizer();
  if (!tokenizer.ok()) {
    return SendError(res, HttpErrorFromStatus(tokenizer.status()));
  }
  if (chat) {
    absl::StatusOr<const text::DeepSeekV4ChatTemplate*> tmpl =
        codec_->chat_template();
    if (!tmpl.ok()) return SendError(res, HttpErrorFromStatus(tmpl.status()));
    if (std::optional<HttpError> e = ParseChat(
            body, **tmpl, **tokenizer, default_kwargs_, req.body, request)) {
      return SendError(res, *e);
    }
  } else if (std::optional<HttpError> e =
                 ParseCompletionPrompts(body, **tokenizer, request)) {
    return SendError(res, *e);
  }
  RequestFieldNames names;
  names.prompt = chat ? "messages" : "prompt";
  names.max_new_tokens = request.max_tokens_field;
  const absl::StatusOr<ModelInfo> model = engine_->model_info();
  std::vector<GenerateParams> params = ChoiceParams(request);
  for (const GenerateParams& p : params) {
    if (absl::Status st = ValidateGenerateRequest(
            p, request.stops.size(), model.ok() ? &*model : nullptr, names);
        !st.ok()) {
      return SendError(res, HttpErrorFromStatus(st));
    }
  }
  job->id = NewId(chat ? "chatcmpl" : "cmpl");
  job->created = absl::ToUnixSeconds(absl::Now());
  job->deadline = absl::Now() + options_.request_timeout;
  job->choices.resize(params.size());
  std::vector<std::shared_ptr<GenerateSink>> sinks;
  sinks.reserve(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    Running& r = job->choices[i];
    const size_t prompt = i / static_cast<size_t>(request.n);
    r.output = std::make_unique<ChoiceOutput>(
        request, static_cast<int>(i), **tokenizer,
        params[i].sampling.seed() ^ static_cast<uint64_t>(i));
    r.output->SetPrompt(request.prompts[prompt], request.prompt_texts[prompt]);
    r.stream = std::make_shared<RequestStream>(job->bell);
    sinks.push_back(r.stream);
    params[i].request_id =
        params.size() == 1 ? job->id : absl::StrCat(job->id, "-", i);
  }
  // Every choice is admitted, or none (a 429 leaves nothing behind).
  absl::StatusOr<std::vector<std::string>> ids =
      engine_->SubmitAll(std::move(params), std::move(sinks));
  if (!ids.ok()) return SendError(res, HttpErrorFromStatus(ids.status()));
  for (size_t i = 0; i < ids->size(); ++i) {
    job->choices[i].engine_id = (*ids)[i];
  }

  if (!request.stream) {
    // A client that goes away aborts every choice, as with streaming: its
    // socket is looked at between waits (found once the request outlasts
    // one wait).
    std::optional<ConnectionProbe> probe;
    bool looked = false;
    while (!job->done()) {
      Pump(*engine_, *job, options_.keepalive_interval, [](const json&) {});
      if (job->done()) break;
      if (!looked) {
        looked = true;
        absl::StatusOr<ConnectionProbe> p = ConnectionProbe::Find(
            req.local_addr, req.local_port, req.remote_addr, req.remote_port);
        if (p.ok()) {
          probe = *p;
        } else {
          VLOG(1) << "no disconnect detection for " << job->id << ": "
                  << p.status();
        }
      }
      if (probe.has_value() && probe->PeerClosed()) {
        LOG(INFO) << job->id << ": the client went away; aborting";
        for (const Running& r : job->choices) {
          if (!r.finished) (void)engine_->Abort(r.engine_id);
        }
        probe.reset();
      }
    }
    if (absl::Status st = job->status(); !st.ok()) {
      return SendError(res, HttpErrorFromStatus(st));
    }
    json response = job->Envelope();
    json choices = json::array();
    for (const Running& r : job->choices) choices.push_back(r.output->Whole());
    response["choices"] = std::move(choices);
    response["usage"] = job->TotalUsage();
    if (chat && request.prompt_logprobs >= 0) {
      response["prompt_logprobs"] =
          job->choices.front().output->PromptLogprobsJson();
    }
    SendJson(res, response);
    return;
  }

  // Server-sent events: a chunk per choice with news, each choice's finish
  // chunk, usage if asked, then [DONE]. An SSE comment while nothing is new
  // notices a client that went away (which aborts every choice).
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, job, slot,
       pass = std::make_shared<InflightGate::Pass>(std::move(*pass))](
          size_t, httplib::DataSink& sink) {
        auto send = [&sink](const json& j) {
          const std::string line = absl::StrCat(
              "data: ", j.dump(-1, ' ', false, json::error_handler_t::replace),
              "\n\n");
          return sink.write(line.data(), line.size());
        };
        auto abort_all = [this, &job] {
          for (const Running& r : job->choices) {
            if (!r.finished) (void)engine_->Abort(r.engine_id);
          }
        };
        while (!job->done()) {
          bool ok = true;
          bool sent = false;
          Pump(*engine_, *job, options_.keepalive_interval,
               [&](const json& choice) {
                 if (!ok) return;
                 json chunk = job->Envelope();
                 chunk["choices"] = json::array({choice});
                 if (job->request.include_usage) chunk["usage"] = nullptr;
                 ok = send(chunk);
                 sent = true;
               });
          if (ok && !sent && !job->done()) {
            static constexpr char kPing[] = ": keep-alive\n\n";
            ok = sink.write(kPing, sizeof(kPing) - 1);
          }
          if (!ok) {
            abort_all();
            return false;
          }
        }
        if (absl::Status st = job->status(); !st.ok()) {
          send(HttpErrorBody(HttpErrorFromStatus(st)));
        } else if (job->request.include_usage) {
          json usage = job->Envelope();
          usage["choices"] = json::array();
          usage["usage"] = job->TotalUsage();
          send(usage);
        }
        static constexpr char kDone[] = "data: [DONE]\n\n";
        sink.write(kDone, sizeof(kDone) - 1);
        sink.done();
        return true;
      });
}

}  // namespace mneme::coordinator
