#include "services/coordinator/http_front.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "glog/logging.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "services/coordinator/request_stream.h"
#include "services/coordinator/request_validator.h"
#include "services/coordinator/text_stream.h"

namespace mneme::coordinator {
namespace {

using nlohmann::json;

// An HTTP status with an OpenAI error body.
struct HttpError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;
};

HttpError FromStatus(const absl::Status& st) {
  HttpError e;
  e.message = std::string(st.message());
  e.param = InvalidFieldName(st);
  switch (st.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kOutOfRange:
      e.status = 400;
      break;
    case absl::StatusCode::kResourceExhausted:
      e.status = 429;
      e.type = "rate_limit_error";
      break;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kFailedPrecondition:
      e.status = 503;
      e.type = "service_unavailable";
      break;
    case absl::StatusCode::kNotFound:
      e.status = 404;
      break;
    default:
      e.status = 500;
      e.type = "internal_error";
  }
  return e;
}

json ErrorBody(const HttpError& e) {
  return json{{"error",
               {{"message", e.message},
                {"type", e.type},
                {"param", e.param.empty() ? json(nullptr) : json(e.param)},
                {"code", e.status}}}};
}

void SendError(httplib::Response& res, const HttpError& e) {
  res.status = e.status;
  res.set_content(ErrorBody(e).dump(), "application/json");
}

HttpError BadField(const std::string& field, const std::string& what) {
  HttpError e;
  e.message = absl::StrCat("'", field, "' ", what);
  e.param = field;
  return e;
}

// Typed optional fields: nullopt when absent or null; an error when of the
// wrong type (or, where a range is given, out of it). The limits of a
// generation request are request_validator.h's, checked once the request is
// built.
struct Fields {
  const json& body;
  std::optional<HttpError> error;

  const json* Get(const char* name) {
    auto it = body.find(name);
    if (it == body.end() || it->is_null()) return nullptr;
    return &*it;
  }
  std::optional<double> Number(const char* name) {
    const json* v = Get(name);
    if (v == nullptr || error) return std::nullopt;
    if (!v->is_number()) {
      error = BadField(name, "must be a number");
      return std::nullopt;
    }
    return v->get<double>();
  }
  std::optional<int64_t> Int(const char* name, int64_t lo = INT64_MIN,
                             int64_t hi = INT64_MAX) {
    const json* v = Get(name);
    if (v == nullptr || error) return std::nullopt;
    if (!v->is_number_integer()) {
      error = BadField(name, "must be an integer");
      return std::nullopt;
    }
    const int64_t i = v->get<int64_t>();
    if (i < lo || i > hi) {
      error = BadField(name, absl::StrCat("must be in [", lo, ", ", hi, "]"));
      return std::nullopt;
    }
    return i;
  }
  std::optional<bool> Bool(const char* name) {
    const json* v = Get(name);
    if (v == nullptr || error) return std::nullopt;
    if (!v->is_boolean()) {
      error = BadField(name, "must be true or false");
      return std::nullopt;
    }
    return v->get<bool>();
  }
};

// What the handlers share of one request.
struct Job {
  bool chat = false;
  bool stream = false;
  bool include_usage = false;
  bool want_logprobs = false;
  std::string id;
  int64_t created = 0;
  std::string model;
  GenerateParams params;
  std::vector<std::string> stops;
  // How the client spelled max_new_tokens.
  std::string max_tokens_field = "max_tokens";
};

std::string NewId(const char* prefix) {
  static std::atomic<uint64_t> counter{0};
  thread_local std::mt19937_64 rng(std::random_device{}());
  return absl::StrFormat("%s-%016x%04x", prefix, rng(),
                         counter.fetch_add(1) & 0xffff);
}

const char* FinishName(GenerateEnd end, bool stopped_on_text) {
  if (stopped_on_text) return "stop";
  switch (end) {
    case GenerateEnd::kStop:
      return "stop";
    case GenerateEnd::kLength:
      return "length";
    case GenerateEnd::kAbort:
      return "abort";
  }
  return "stop";
}

// Reads the request fields both endpoints share into `job`.
std::optional<HttpError> ParseCommon(const json& body,
                                     const std::string& model_name, Job& job) {
  Fields f{body, std::nullopt};
  const json* model = f.Get("model");
  if (model == nullptr || !model->is_string()) {
    return BadField("model", "is required (a string)");
  }
  if (model->get<std::string>() != model_name) {
    HttpError e = BadField(
        "model", absl::StrCat("'", model->get<std::string>(),
                              "' is not served here (this server serves '",
                              model_name, "')"));
    e.type = "invalid_request_error";
    return e;
  }
  job.model = model_name;
  const std::optional<int64_t> n = f.Int("n", 1, 1);
  job.max_tokens_field = job.chat && body.contains("max_completion_tokens")
                             ? "max_completion_tokens"
                             : "max_tokens";
  const std::optional<int64_t> max_tokens = f.Int(job.max_tokens_field.c_str());
  const std::optional<double> temperature = f.Number("temperature");
  const std::optional<double> top_p = f.Number("top_p");
  const std::optional<int64_t> top_k = f.Int("top_k");
  const std::optional<double> min_p = f.Number("min_p");
  const std::optional<int64_t> seed = f.Int("seed", 0, INT64_MAX);
  const std::optional<bool> stream = f.Bool("stream");
  const std::optional<bool> ignore_eos = f.Bool("ignore_eos");
  if (f.error) return f.error;
  (void)n;  // Only 1 is accepted.
  if (const json* echo = f.Get("echo");
      echo != nullptr && !(echo->is_boolean() && !echo->get<bool>())) {
    return BadField("echo", "is not supported");
  }
  job.stream = stream.value_or(false);
  if (const json* so = f.Get("stream_options")) {
    if (!so->is_object())
      return BadField("stream_options", "must be an object");
    auto it = so->find("include_usage");
    if (it != so->end() && !it->is_null()) {
      if (!it->is_boolean()) {
        return BadField("stream_options.include_usage", "must be a boolean");
      }
      job.include_usage = it->get<bool>();
    }
  }
  if (const json* lp = f.Get("logprobs")) {
    if (job.chat) {
      if (!lp->is_boolean()) return BadField("logprobs", "must be a boolean");
      job.want_logprobs = lp->get<bool>();
    } else {
      if (!lp->is_number_integer() || lp->get<int64_t>() < 0 ||
          lp->get<int64_t>() > 1) {
        return BadField("logprobs", "must be 0 or 1 (only the chosen token)");
      }
      job.want_logprobs = lp->get<int64_t>() > 0;
    }
  }
  GenerateParams& p = job.params;
  p.max_new_tokens = max_tokens.value_or(kDefaultMaxNewTokens);
  p.sampling.set_temperature(static_cast<float>(temperature.value_or(1.0)));
  p.sampling.set_top_p(static_cast<float>(top_p.value_or(1.0)));
  // -1 (as in vLLM) and 0 both mean no top-k; the validator bounds the rest.
  const int64_t k = top_k.value_or(0) == -1 ? 0 : top_k.value_or(0);
  p.sampling.set_top_k(static_cast<int32_t>(
      std::clamp<int64_t>(k, std::numeric_limits<int32_t>::min(),
                          std::numeric_limits<int32_t>::max())));
  p.sampling.set_min_p(static_cast<float>(min_p.value_or(0)));
  p.sampling.set_seed(static_cast<uint64_t>(seed.value_or(0)));
  p.ignore_eos = ignore_eos.value_or(false);
  p.logprobs = true;
  if (const json* stop = f.Get("stop")) {
    if (stop->is_string()) {
      job.stops.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      for (const json& s : *stop) {
        if (!s.is_string()) return BadField("stop", "must hold strings");
        job.stops.push_back(s.get<std::string>());
      }
    } else {
      return BadField("stop", "must be a string or a list of strings");
    }
  }
  if (const json* ids = f.Get("stop_token_ids")) {
    if (!ids->is_array()) return BadField("stop_token_ids", "must be a list");
    for (const json& id : *ids) {
      if (!id.is_number_integer()) {
        return BadField("stop_token_ids", "must hold integers");
      }
      p.stop_token_ids.push_back(id.get<int64_t>());
    }
  }
  return std::nullopt;
}

// The prompt of a completion: text (tokenized with the BOS the tokenizer
// adds) or token ids.
std::optional<HttpError> ParsePrompt(const json& body,
                                     const text::Tokenizer& tokenizer,
                                     Job& job) {
  auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) {
    return BadField("prompt", "is required");
  }
  const json& prompt = *it;
  if (prompt.is_string()) {
    absl::StatusOr<std::vector<int64_t>> ids = tokenizer.Encode(
        prompt.get<std::string>(), text::AddSpecialTokens::kYes);
    if (!ids.ok())
      return BadField("prompt", std::string(ids.status().message()));
    job.params.prompt = *std::move(ids);
    return std::nullopt;
  }
  if (prompt.is_array()) {
    if (!prompt.empty() && !prompt[0].is_number_integer()) {
      return BadField("prompt",
                      "must be one prompt: a string or a list of token ids "
                      "(batches are not supported)");
    }
    for (const json& id : prompt) {
      if (!id.is_number_integer()) {
        return BadField("prompt", "token ids must be integers");
      }
      job.params.prompt.push_back(id.get<int64_t>());
    }
    return std::nullopt;
  }
  return BadField("prompt", "must be a string or a list of token ids");
}

std::optional<HttpError> ParseMessages(const json& body,
                                       const text::DeepSeekV4ChatTemplate& tmpl,
                                       Job& job) {
  auto it = body.find("messages");
  if (it == body.end() || !it->is_array() || it->empty()) {
    return BadField("messages", "is required (a non-empty list)");
  }
  std::vector<text::ChatMessage> messages;
  for (size_t i = 0; i < it->size(); ++i) {
    const json& m = (*it)[i];
    const std::string where = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) return BadField(where, "must be an object");
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) {
      return BadField(where + ".role", "is required (a string)");
    }
    text::ChatMessage msg;
    const std::string r = role->get<std::string>();
    if (r == "system") {
      msg.role = text::ChatRole::kSystem;
    } else if (r == "user") {
      msg.role = text::ChatRole::kUser;
    } else if (r == "assistant") {
      msg.role = text::ChatRole::kAssistant;
    } else {
      return BadField(
          where + ".role",
          absl::StrCat("'", r, "' is not system, user or assistant"));
    }
    auto content = m.find("content");
    if (content == m.end() || content->is_null()) {
      msg.content = "";
    } else if (content->is_string()) {
      msg.content = content->get<std::string>();
    } else if (content->is_array()) {
      for (const json& part : *content) {
        auto type = part.find("type");
        auto text = part.find("text");
        if (!part.is_object() || type == part.end() || *type != "text" ||
            text == part.end() || !text->is_string()) {
          return BadField(where + ".content",
                          "parts must be {\"type\": \"text\", \"text\": ...}");
        }
        msg.content += text->get<std::string>();
      }
    } else {
      return BadField(where + ".content",
                      "must be a string or a list of parts");
    }
    messages.push_back(std::move(msg));
  }
  text::ChatRenderOptions options;
  bool thinking = false;
  if (auto kw = body.find("chat_template_kwargs"); kw != body.end()) {
    if (!kw->is_object()) {
      return BadField("chat_template_kwargs", "must be an object");
    }
    for (const char* key : {"thinking", "enable_thinking"}) {
      auto t = kw->find(key);
      if (t == kw->end() || t->is_null()) continue;
      if (!t->is_boolean()) {
        return BadField(absl::StrCat("chat_template_kwargs.", key),
                        "must be a boolean");
      }
      thinking = t->get<bool>();
    }
  }
  options.thinking =
      thinking ? text::ThinkingMode::kThinking : text::ThinkingMode::kChat;
  absl::StatusOr<std::vector<int64_t>> ids = tmpl.Encode(messages, options);
  if (!ids.ok())
    return BadField("messages", std::string(ids.status().message()));
  job.params.prompt = *std::move(ids);
  return std::nullopt;
}

json Usage(int64_t prompt, int64_t completion) {
  return json{{"prompt_tokens", prompt},
              {"completion_tokens", completion},
              {"total_tokens", prompt + completion}};
}

// One choice of a response or a stream chunk.
json Choice(const Job& job, const std::string& text,
            const std::optional<std::string>& finish, const json& logprobs,
            bool first_chunk) {
  json c = {{"index", 0}};
  if (job.chat) {
    json message = {{"content", text}};
    if (!job.stream || first_chunk) message["role"] = "assistant";
    c[job.stream ? "delta" : "message"] = message;
  } else {
    c["text"] = text;
  }
  c["logprobs"] = logprobs;
  c["finish_reason"] = finish.has_value() ? json(*finish) : json(nullptr);
  return c;
}

json Envelope(const Job& job) {
  const char* object =
      job.chat ? (job.stream ? "chat.completion.chunk" : "chat.completion")
               : "text_completion";
  return json{{"id", job.id},
              {"object", object},
              {"created", job.created},
              {"model", job.model}};
}

json LogprobsOf(const Job& job, const TextStream& ts,
                absl::Span<const int64_t> tokens,
                absl::Span<const float> logprobs) {
  if (!job.want_logprobs) return nullptr;
  if (job.chat) {
    json content = json::array();
    for (size_t i = 0; i < tokens.size() && i < logprobs.size(); ++i) {
      content.push_back(
          {{"token", ts.TokenText(tokens[i])}, {"logprob", logprobs[i]}});
    }
    return json{{"content", content}};
  }
  json toks = json::array(), lps = json::array();
  for (size_t i = 0; i < tokens.size() && i < logprobs.size(); ++i) {
    toks.push_back(ts.TokenText(tokens[i]));
    lps.push_back(logprobs[i]);
  }
  return json{{"tokens", toks}, {"token_logprobs", lps}};
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
  std::unique_ptr<HttpFront> front(new HttpFront(options, engine, codec, gate));
  front->server_ = std::make_unique<httplib::Server>();
  httplib::Server& s = *front->server_;
  const int threads = options.threads;
  s.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  s.set_payload_max_length(static_cast<size_t>(options.max_body_bytes));
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
  return front;
}

void HttpFront::Routes() {
  httplib::Server& s = *server_;
  s.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    HttpError e;
    e.status = res.status;
    e.message = res.status == 404
                    ? absl::StrCat("no route ", req.method, " ", req.path)
                    : absl::StrCat("HTTP ", res.status);
    res.set_content(ErrorBody(e).dump(), "application/json");
  });

  s.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    json model = {{"id", options_.model_name},
                  {"object", "model"},
                  {"created", 0},
                  {"owned_by", "mneme"}};
    if (absl::StatusOr<ModelInfo> info = engine_->model_info(); info.ok()) {
      model["max_model_len"] = info->max_context_tokens;
    }
    res.set_content(json{{"object", "list"}, {"data", {model}}}.dump(),
                    "application/json");
  });

  auto generate = [this](bool chat, const httplib::Request& req,
                         httplib::Response& res) {
    std::optional<InflightGate::Pass> pass = gate_->Enter();
    if (!pass.has_value()) {
      HttpError e;
      e.status = 503;
      e.type = "service_unavailable";
      e.message = "the coordinator is shutting down";
      return SendError(res, e);
    }
    const json body =
        json::parse(req.body, nullptr, /*allow_exceptions=*/false);
    if (body.is_discarded() || !body.is_object()) {
      HttpError e;
      e.message = body.is_discarded() ? "the body is not valid JSON"
                                      : "the body must be a JSON object";
      return SendError(res, e);
    }
    auto job = std::make_shared<Job>();
    job->chat = chat;
    if (std::optional<HttpError> e =
            ParseCommon(body, options_.model_name, *job)) {
      return SendError(res, *e);
    }
    absl::StatusOr<const text::Tokenizer*> tokenizer = codec_->tokenizer();
    if (!tokenizer.ok()) return SendError(res, FromStatus(tokenizer.status()));
    if (chat) {
      absl::StatusOr<const text::DeepSeekV4ChatTemplate*> tmpl =
          codec_->chat_template();
      if (!tmpl.ok()) return SendError(res, FromStatus(tmpl.status()));
      if (std::optional<HttpError> e = ParseMessages(body, **tmpl, *job)) {
        return SendError(res, *e);
      }
    } else if (std::optional<HttpError> e =
                   ParsePrompt(body, **tokenizer, *job)) {
      return SendError(res, *e);
    }
    RequestFieldNames names;
    names.prompt = chat ? "messages" : "prompt";
    names.max_new_tokens = job->max_tokens_field;
    const absl::StatusOr<ModelInfo> model = engine_->model_info();
    if (absl::Status st =
            ValidateGenerateRequest(job->params, job->stops.size(),
                                    model.ok() ? &*model : nullptr, names);
        !st.ok()) {
      return SendError(res, FromStatus(st));
    }
    job->id = NewId(chat ? "chatcmpl" : "cmpl");
    job->created = absl::ToUnixSeconds(absl::Now());
    job->params.request_id = job->id;
    auto stream = std::make_shared<RequestStream>();
    absl::StatusOr<std::string> id = engine_->Submit(job->params, stream);
    if (!id.ok()) return SendError(res, FromStatus(id.status()));
    auto text = std::make_shared<TextStream>(**tokenizer, job->stops);
    const absl::Time deadline = absl::Now() + options_.request_timeout;

    if (!job->stream) {
      // Collect the whole answer.
      std::string out;
      std::vector<int64_t> tokens;
      std::vector<float> logprobs;
      RequestStream::Batch b;
      while (true) {
        b = stream->Next(options_.keepalive_interval);
        out += text->Add(b.tokens);
        tokens.insert(tokens.end(), b.tokens.begin(), b.tokens.end());
        logprobs.insert(logprobs.end(), b.logprobs.begin(), b.logprobs.end());
        if (text->stopped() && !b.finished) {
          (void)engine_->Abort(job->id);  // NotFound if it just ended.
          continue;                       // Until the engine confirms.
        }
        if (b.finished) break;
        if (absl::Now() > deadline) {
          (void)engine_->Abort(job->id);
        }
      }
      if (!b.status.ok()) return SendError(res, FromStatus(b.status));
      out += text->Finish();
      json response = Envelope(*job);
      response["choices"] = {
          Choice(*job, out, FinishName(b.end, text->stopped()),
                 LogprobsOf(*job, *text, tokens, logprobs), true)};
      response["usage"] = Usage(b.prompt_tokens, b.completion_tokens);
      res.set_content(response.dump(), "application/json");
      return;
    }

    // Server-sent events: one chunk per batch of new text, the finish
    // chunk, usage if asked, then [DONE]. An SSE comment while nothing is
    // new notices a client that went away.
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, job, stream, text, deadline,
         pass = std::make_shared<InflightGate::Pass>(std::move(*pass))](
            size_t, httplib::DataSink& sink) {
          auto send = [&sink](const json& j) {
            const std::string line = absl::StrCat("data: ", j.dump(), "\n\n");
            return sink.write(line.data(), line.size());
          };
          bool first = true;
          while (true) {
            RequestStream::Batch b = stream->Next(options_.keepalive_interval);
            std::string delta = text->Add(b.tokens);
            if (text->stopped() && !b.finished) {
              (void)engine_->Abort(job->id);
            }
            if (b.finished && b.status.ok()) delta += text->Finish();
            if (!delta.empty() || (first && !b.tokens.empty())) {
              json chunk = Envelope(*job);
              chunk["choices"] = {
                  Choice(*job, delta, std::nullopt,
                         LogprobsOf(*job, *text, b.tokens, b.logprobs), first)};
              first = false;
              if (!send(chunk)) {
                (void)engine_->Abort(job->id);
                return false;
              }
            } else if (!b.finished) {
              static constexpr char kPing[] = ": keep-alive\n\n";
              if (!sink.write(kPing, sizeof(kPing) - 1)) {
                (void)engine_->Abort(job->id);
                return false;
              }
            }
            if (b.finished) {
              if (!b.status.ok()) {
                send(ErrorBody(FromStatus(b.status)));
              } else {
                json last = Envelope(*job);
                last["choices"] = {Choice(*job, "",
                                          FinishName(b.end, text->stopped()),
                                          nullptr, first)};
                send(last);
                if (job->include_usage) {
                  json usage = Envelope(*job);
                  usage["choices"] = json::array();
                  usage["usage"] = Usage(b.prompt_tokens, b.completion_tokens);
                  send(usage);
                }
              }
              static constexpr char kDone[] = "data: [DONE]\n\n";
              sink.write(kDone, sizeof(kDone) - 1);
              sink.done();
              return true;
            }
            if (absl::Now() > deadline) (void)engine_->Abort(job->id);
          }
        });
  };
  s.Post("/v1/completions",
         [generate](const httplib::Request& req, httplib::Response& res) {
           generate(false, req, res);
         });
  s.Post("/v1/chat/completions",
         [generate](const httplib::Request& req, httplib::Response& res) {
           generate(true, req, res);
         });
}

}  // namespace mneme::coordinator
