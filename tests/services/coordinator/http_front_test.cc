// The OpenAI-compatible HTTP front on 127.0.0.1 (any port) with a real
// HTTP client, over an engine with a fake worker group: 400s for bad JSON
// and bad fields (naming the field), completions and chat completions, SSE
// framing, and the statuses of a lost worker and an unknown path.

#include "services/coordinator/http_front.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/inflight_gate.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "tests/services/coordinator/test_engine.h"
#include "tests/testing/tls_certs.h"

namespace mneme::coordinator {
namespace {

using ::mneme::coordinator::testing::TestEngine;
using ::nlohmann::json;
using ::testing::HasSubstr;
using ::testing::StartsWith;

std::vector<int64_t> Expected(int prompt_length, int n) {
  std::vector<int64_t> out;
  out.reserve(n);
  for (int i = 0; i < n; ++i)
    out.push_back(TestEngine::Token(prompt_length + i));
  return out;
}

struct Reply {
  int status = 0;
  std::string content_type;
  std::string body;
  json parsed;
};

class HttpFrontTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<TestEngine>> t = TestEngine::Create();
    ASSERT_TRUE(t.ok()) << t.status();
    t_ = *std::move(t);
    StartFront(DefaultOptions());
  }

  static HttpFrontOptions DefaultOptions() {
    HttpFrontOptions options;
    options.listen = {"127.0.0.1", 0};
    options.threads = 4;
    return options;
  }

  // (Re)starts the front with `options`.
  void StartFront(const HttpFrontOptions& options) {
    if (front_ != nullptr) front_->Stop();
    front_.reset();
    absl::StatusOr<std::unique_ptr<HttpFront>> front =
        HttpFront::Create(options, t_->engine.get(), t_->codec.get(), &gate_);
    ASSERT_TRUE(front.ok()) << front.status();
    front_ = *std::move(front);
    ASSERT_GT(front_->port(), 0);
  }

  void TearDown() override {
    if (front_ != nullptr) front_->Stop();
    if (t_ != nullptr) t_->engine->Stop();
  }

  // A raw TCP connection to the front; -1 (and the test failed) if none.
  int ConnectRaw() const {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    EXPECT_GE(fd, 0);
    if (fd < 0) return -1;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(front_->port()));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      ADD_FAILURE() << "cannot connect to the front";
      close(fd);
      return -1;
    }
    return fd;
  }

  Reply Post(const std::string& path, const std::string& body) {
    httplib::Client client("127.0.0.1", front_->port());
    client.set_read_timeout(30, 0);
    httplib::Result res = client.Post(path, body, "application/json");
    Reply r;
    EXPECT_TRUE(res) << "no response from " << path;
    if (!res) return r;
    r.status = res->status;
    r.content_type = res->get_header_value("Content-Type");
    r.body = res->body;
    r.parsed = json::parse(r.body, nullptr, /*allow_exceptions=*/false);
    return r;
  }
  Reply Post(const std::string& path, const json& body) {
    return Post(path, body.dump());
  }

  // The decoded text of `ids` (special tokens skipped), as the front
  // streams it.
  std::string Text(const std::vector<int64_t>& ids) {
    absl::StatusOr<const text::Tokenizer*> tokenizer = t_->codec->tokenizer();
    EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
    return tokenizer.ok()
               ? (*tokenizer)->Decode(ids, text::SkipSpecialTokens::kYes)
               : "";
  }

  static json Completion(const json& fields) {
    json body = {{"model", "mneme"}, {"temperature", 0}, {"ignore_eos", true}};
    body.update(fields);
    return body;
  }

  InflightGate gate_;
  std::unique_ptr<TestEngine> t_;
  std::unique_ptr<HttpFront> front_;
};

void ExpectError(const Reply& r, int status, const std::string& type) {
  EXPECT_EQ(r.status, status) << r.body;
  ASSERT_TRUE(r.parsed.is_object()) << r.body;
  ASSERT_TRUE(r.parsed.contains("error")) << r.body;
  EXPECT_EQ(r.parsed["error"]["type"], type) << r.body;
  EXPECT_EQ(r.parsed["error"]["code"], status) << r.body;
  EXPECT_TRUE(r.parsed["error"]["message"].is_string()) << r.body;
}

TEST_F(HttpFrontTest, BadJsonIs400) {
  for (const char* body : {"{not json", "[1, 2]", ""}) {
    const Reply r = Post("/v1/completions", std::string(body));
    ExpectError(r, 400, "invalid_request_error");
  }
}

TEST_F(HttpFrontTest, BadFieldsAre400NamingTheParam) {
  struct Case {
    std::string path;
    json body;
    std::string param;
  };
  const std::string kCompletions = "/v1/completions";
  const std::string kChat = "/v1/chat/completions";
  std::vector<std::string> stops(17, "s");
  const std::vector<Case> cases = {
      {kCompletions, Completion({{"prompt", "x"}, {"temperature", -1}}),
       "temperature"},
      {kCompletions, Completion({{"prompt", "x"}, {"top_p", 2}}), "top_p"},
      {kCompletions, Completion({{"prompt", "x"}, {"top_k", -2}}), "top_k"},
      {kCompletions, Completion({{"prompt", "x"}, {"min_p", 1.5}}), "min_p"},
      {kCompletions, Completion({{"prompt", "x"}, {"max_tokens", 0}}),
       "max_tokens"},
      {kCompletions, Completion({{"prompt", "x"}, {"max_tokens", "3"}}),
       "max_tokens"},
      {kCompletions, Completion({{"prompt", "x"}, {"stop", stops}}), "stop"},
      {kCompletions, Completion({{"prompt", "x"}, {"stop", 5}}), "stop"},
      {kCompletions,
       Completion(
           {{"prompt", "x"}, {"stop_token_ids", json::array({1 << 30})}}),
       "stop_token_ids"},
      {kCompletions, Completion({{"prompt", {1, "2"}}}), "prompt"},
      {kCompletions, Completion({{"prompt", {5, 1 << 30}}}), "prompt"},
      {kCompletions, Completion({{"prompt", std::vector<int>(300, 5)}}),
       "prompt"},
      {kCompletions, Completion({{"prompt", {{"a", 1}}}}), "prompt"},
      {kCompletions, Completion(json::object()), "prompt"},
      {kCompletions, json{{"prompt", "x"}}, "model"},
      {kChat, Completion({{"messages", json::array()}}), "messages"},
      {kChat,
       Completion({{"messages", {{{"role", "robot"}, {"content", "x"}}}}}),
       "messages[0].role"},
      {kChat,
       Completion({{"messages", {{{"role", "user"}, {"content", "x"}}}},
                   {"max_completion_tokens", 0}}),
       "max_completion_tokens"},
      {kChat,
       Completion({{"messages", {{{"role", "user"}, {"content", "x"}}}},
                   {"max_tokens", 1000}}),
       "messages"},
  };
  for (const Case& c : cases) {
    const Reply r = Post(c.path, c.body);
    ExpectError(r, 400, "invalid_request_error");
    EXPECT_EQ(r.parsed["error"]["param"], c.param) << c.body.dump();
  }
  // A model this server does not serve: 404, as OpenAI and vLLM answer.
  const Reply unknown =
      Post(kCompletions, json{{"model", "gpt-4"}, {"prompt", "x"}});
  ExpectError(unknown, 404, "not_found_error");
  EXPECT_EQ(unknown.parsed["error"]["param"], "model");
  EXPECT_TRUE(t_->workers->steps().empty());
  // Still serving.
  EXPECT_EQ(
      Post(kCompletions, Completion({{"prompt", "ok"}, {"max_tokens", 1}}))
          .status,
      200);
}

TEST_F(HttpFrontTest, EchoWithLogprobsCarriesThePromptsLogprobs) {
  const Reply r =
      Post("/v1/completions", Completion({{"prompt", {{5, 6, 7}, {8, 9}}},
                                          {"max_tokens", 1},
                                          {"logprobs", 2},
                                          {"echo", true}}));
  ASSERT_EQ(r.status, 200) << r.body;
  ASSERT_EQ(r.parsed["choices"].size(), 2u);
  for (int i = 0; i < 2; ++i) {
    const json& choice = r.parsed["choices"][i];
    EXPECT_EQ(choice["index"], i);
    const json& lp = choice["logprobs"];
    const size_t prompt = i == 0 ? 3 : 2;
    ASSERT_EQ(lp["tokens"].size(), prompt + 1) << r.body;
    EXPECT_TRUE(lp["token_logprobs"][0].is_null());
    for (size_t p = 1; p <= prompt; ++p) {
      EXPECT_TRUE(lp["token_logprobs"][p].is_number()) << r.body;
      EXPECT_GE(lp["top_logprobs"][p].size(), 1u) << r.body;
    }
  }
}

TEST_F(HttpFrontTest, ChatTopLogprobs) {
  const Reply r =
      Post("/v1/chat/completions",
           Completion({{"messages", {{{"role", "user"}, {"content", "x"}}}},
                       {"max_tokens", 3},
                       {"logprobs", true},
                       {"top_logprobs", 2}}));
  ASSERT_EQ(r.status, 200) << r.body;
  const json& content = r.parsed["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 3u) << r.body;
  for (const json& entry : content) {
    EXPECT_EQ(entry["top_logprobs"].size(), 2u) << r.body;
  }
}

TEST_F(HttpFrontTest, ApiKeyGuardsEverythingButLiveness) {
  HttpFrontOptions options = DefaultOptions();
  options.api_key = "sk-test-123";
  StartFront(options);
  const json body = Completion({{"prompt", "ok"}, {"max_tokens", 1}});
  ExpectError(Post("/v1/completions", body), 401, "invalid_request_error");
  httplib::Client client("127.0.0.1", front_->port());
  for (const char* wrong : {"Bearer sk-test-12", "Bearer sk-test-1234",
                            "sk-test-123", "Bearer  sk-test-123"}) {
    httplib::Result r =
        client.Post("/v1/completions", {{"Authorization", wrong}}, body.dump(),
                    "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 401) << wrong;
  }
  httplib::Result ok =
      client.Post("/v1/completions", {{"Authorization", "Bearer sk-test-123"}},
                  body.dump(), "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
  httplib::Result models = client.Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(models->status, 401);
  httplib::Result health = client.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
}

TEST_F(HttpFrontTest, ConcurrentRequestsBeyondTheLimitAre429) {
  HttpFrontOptions options = DefaultOptions();
  options.max_concurrent_requests = 1;
  StartFront(options);
  t_->workers->Pause();
  // One request holds the only slot (its step waits in the fake).
  std::thread first([this] {
    const Reply r = Post("/v1/completions",
                         Completion({{"prompt", "a"}, {"max_tokens", 2}}));
    EXPECT_EQ(r.status, 200) << r.body;
  });
  ASSERT_TRUE(t_->workers->AwaitPausedStep(absl::Seconds(30)));
  const Reply second =
      Post("/v1/completions", Completion({{"prompt", "b"}, {"max_tokens", 2}}));
  ExpectError(second, 429, "rate_limit_error");
  // Liveness is answered all the while.
  httplib::Client client("127.0.0.1", front_->port());
  httplib::Result health = client.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  t_->workers->Resume();
  first.join();
  EXPECT_EQ(
      Post("/v1/completions", Completion({{"prompt", "c"}, {"max_tokens", 1}}))
          .status,
      200);
}

TEST_F(HttpFrontTest, APortInUseIsRefused) {
  // Without SO_REUSEPORT a second front cannot share the port.
  HttpFrontOptions options = DefaultOptions();
  options.listen.port = front_->port();
  InflightGate gate;
  absl::StatusOr<std::unique_ptr<HttpFront>> second =
      HttpFront::Create(options, t_->engine.get(), t_->codec.get(), &gate);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(HttpFrontTest, AClientThatSendsNothingIsDisconnected) {
  HttpFrontOptions options = DefaultOptions();
  options.read_timeout = absl::Seconds(1);
  StartFront(options);
  const int fd = ConnectRaw();
  ASSERT_GE(fd, 0);
  // Half a request, then silence: the front hangs up after its read
  // deadline instead of holding a thread.
  const char partial[] = "POST /v1/completions HTTP/1.1\r\nHost: x";
  ASSERT_GT(send(fd, partial, sizeof(partial) - 1, 0), 0);
  timeval tv{};
  tv.tv_sec = 20;
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  // It may answer (400) before it closes; the connection ends either way.
  char buf[256];
  const absl::Time start = absl::Now();
  ssize_t n = 0;
  do {
    n = recv(fd, buf, sizeof(buf), 0);
  } while (n > 0);
  EXPECT_EQ(n, 0) << "no end of stream within the receive timeout";
  EXPECT_LT(absl::Now() - start, absl::Seconds(15));
  close(fd);
}

// A non-streaming request whose client hangs up is aborted, as a streaming
// one is: its choices stop and their KV blocks are freed.
TEST_F(HttpFrontTest, ANonStreamingClientThatLeavesAbortsItsRequest) {
  HttpFrontOptions options = DefaultOptions();
  options.keepalive_interval = absl::Milliseconds(20);
  StartFront(options);
  t_->workers->Pause();
  const int fd = ConnectRaw();
  ASSERT_GE(fd, 0);
  const std::string body =
      Completion({{"prompt", "hello"}, {"max_tokens", 100}}).dump();
  const std::string request = absl::StrCat(
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
      "Content-Type: application/json\r\nContent-Length: ",
      body.size(), "\r\n\r\n", body);
  ASSERT_EQ(send(fd, request.data(), request.size(), 0),
            static_cast<ssize_t>(request.size()));
  ASSERT_TRUE(t_->workers->AwaitPausedStep(absl::Seconds(30)));
  EXPECT_EQ(t_->engine->loads().running, 1);
  close(fd);
  // The steps stay held: only the front's abort can end the request.
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (t_->engine->loads().running + t_->engine->loads().waiting > 0 &&
         absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(t_->engine->loads().running, 0);
  EXPECT_EQ(t_->engine->loads().waiting, 0);
  t_->workers->Resume();
}

TEST(HttpFrontOptionsTest, BadLimitsAreRefused) {
  InflightGate gate;
  absl::StatusOr<std::unique_ptr<TestEngine>> t = TestEngine::Create();
  ASSERT_TRUE(t.ok()) << t.status();
  HttpFrontOptions options;
  options.listen = {"127.0.0.1", 0};
  options.threads = 4;
  options.max_concurrent_requests = 5;
  EXPECT_FALSE(
      HttpFront::Create(options, (*t)->engine.get(), (*t)->codec.get(), &gate)
          .ok());
  options.max_concurrent_requests = 0;
  options.max_queued_connections = 0;
  EXPECT_FALSE(
      HttpFront::Create(options, (*t)->engine.get(), (*t)->codec.get(), &gate)
          .ok());
  options.max_queued_connections = 8;
  options.read_timeout = absl::Milliseconds(10);
  EXPECT_FALSE(
      HttpFront::Create(options, (*t)->engine.get(), (*t)->codec.get(), &gate)
          .ok());
  (*t)->engine->Stop();
}

TEST_F(HttpFrontTest, UnknownPathIs404) {
  httplib::Client client("127.0.0.1", front_->port());
  httplib::Result res = client.Get("/v1/nothing");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 404);
  EXPECT_THAT(res->body, HasSubstr("no route"));
}

TEST_F(HttpFrontTest, ModelsListsTheServedModel) {
  httplib::Client client("127.0.0.1", front_->port());
  httplib::Result res = client.Get("/v1/models");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  const json models = json::parse(res->body);
  EXPECT_EQ(models["data"][0]["id"], "mneme");
  EXPECT_EQ(models["data"][0]["max_model_len"], 256);
}

// With a certificate and key the front speaks HTTPS only; a client that
// trusts the CA gets its answers, a plain HTTP client none. A bad pair is
// refused at start.
TEST_F(HttpFrontTest, HttpsWithACertificate) {
  absl::StatusOr<mneme::testing::TlsCerts> certs =
      mneme::testing::GenerateTlsCerts();
  ASSERT_TRUE(certs.ok()) << certs.status();
  HttpFrontOptions options = DefaultOptions();
  options.tls_cert_file = certs->server_cert;
  options.tls_key_file = certs->server_key;
  StartFront(options);
  httplib::SSLClient tls("127.0.0.1", front_->port());
  tls.set_ca_cert_path(certs->ca_cert);
  tls.enable_server_certificate_verification(true);
  httplib::Result res = tls.Get("/v1/models");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 200);
  httplib::Client plain("127.0.0.1", front_->port());
  plain.set_read_timeout(5, 0);
  httplib::Result refused = plain.Get("/v1/models");
  EXPECT_FALSE(refused && refused->status == 200);

  InflightGate gate;
  HttpFrontOptions bad = DefaultOptions();
  bad.tls_cert_file = certs->server_cert;
  EXPECT_EQ(HttpFront::Create(bad, t_->engine.get(), t_->codec.get(), &gate)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  bad.tls_key_file = certs->client_key;  // Not the certificate's key.
  absl::StatusOr<std::unique_ptr<HttpFront>> mismatched =
      HttpFront::Create(bad, t_->engine.get(), t_->codec.get(), &gate);
  EXPECT_EQ(mismatched.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(mismatched.status().message()),
              HasSubstr(certs->server_cert));
  bad.tls_key_file = "/nonexistent/key.pem";
  EXPECT_EQ(HttpFront::Create(bad, t_->engine.get(), t_->codec.get(), &gate)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(HttpFrontTest, Completion) {
  const Reply r = Post(
      "/v1/completions",
      Completion({{"prompt", {5, 6, 7}}, {"max_tokens", 4}, {"logprobs", 1}}));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_THAT(r.content_type, StartsWith("application/json"));
  const json& j = r.parsed;
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["model"], "mneme");
  EXPECT_THAT(j["id"].get<std::string>(), StartsWith("cmpl-"));
  ASSERT_EQ(j["choices"].size(), 1u);
  EXPECT_EQ(j["choices"][0]["text"], Text(Expected(3, 4)));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["choices"][0]["logprobs"]["token_logprobs"],
            json({-0.5, -0.5, -0.5, -0.5}));
  EXPECT_EQ(j["usage"], json({{"prompt_tokens", 3},
                              {"completion_tokens", 4},
                              {"total_tokens", 7}}));
  // The workers got the request as sent.
  const std::vector<worker::v1::StepRequest> steps = t_->workers->steps();
  ASSERT_FALSE(steps.empty());
  EXPECT_EQ(steps[0].chunks(0).token_ids_size(), 3);
  EXPECT_FLOAT_EQ(steps[0].chunks(0).sampling().temperature(), 0);
}

TEST_F(HttpFrontTest, ChatCompletion) {
  const Reply r =
      Post("/v1/chat/completions",
           Completion({{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                       {"max_completion_tokens", 3}}));
  ASSERT_EQ(r.status, 200) << r.body;
  const json& j = r.parsed;
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_THAT(j["id"].get<std::string>(), StartsWith("chatcmpl-"));
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_TRUE(j["choices"][0]["message"]["content"].is_string());
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], 3);
}

// The `data:` payloads of an SSE body, checking its framing: events end with
// a blank line, each is a data line or a keep-alive comment, and the last is
// [DONE].
std::vector<std::string> SseData(const std::string& body) {
  EXPECT_TRUE(absl::EndsWith(body, "\n\n")) << body;
  std::vector<std::string> events =
      absl::StrSplit(body, "\n\n", absl::SkipEmpty());
  std::vector<std::string> data;
  for (const std::string& e : events) {
    if (absl::StartsWith(e, ": ")) continue;  // Keep-alive.
    EXPECT_TRUE(absl::StartsWith(e, "data: ")) << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
    data.push_back(e.substr(6));
  }
  EXPECT_FALSE(data.empty());
  if (!data.empty()) {
    EXPECT_EQ(data.back(), "[DONE]");
  }
  return data;
}

TEST_F(HttpFrontTest, StreamedCompletionIsSseAndMatchesTheWholeAnswer) {
  const json body = Completion({{"prompt", {5, 6, 7}}, {"max_tokens", 5}});
  const Reply whole = Post("/v1/completions", body);
  ASSERT_EQ(whole.status, 200) << whole.body;

  json streamed_body = body;
  streamed_body["stream"] = true;
  streamed_body["stream_options"] = {{"include_usage", true}};
  const Reply r = Post("/v1/completions", streamed_body);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_THAT(r.content_type, StartsWith("text/event-stream"));
  const std::vector<std::string> data = SseData(r.body);
  ASSERT_GE(data.size(), 4u);  // Text, finish, usage, [DONE].
  std::string text;
  std::string finish;
  json usage;
  for (size_t i = 0; i + 1 < data.size(); ++i) {
    const json chunk = json::parse(data[i]);
    EXPECT_EQ(chunk["object"], "text_completion");
    EXPECT_EQ(chunk["id"], json::parse(data[0])["id"]);
    // With include_usage every chunk has "usage": null but the last, which
    // has the counts and no choices (as OpenAI streams them).
    ASSERT_TRUE(chunk.contains("usage")) << data[i];
    if (!chunk["usage"].is_null()) {
      EXPECT_TRUE(chunk["choices"].empty());
      usage = chunk["usage"];
      continue;
    }
    text += chunk["choices"][0]["text"].get<std::string>();
    if (!chunk["choices"][0]["finish_reason"].is_null()) {
      EXPECT_TRUE(finish.empty()) << "two finish chunks";
      finish = chunk["choices"][0]["finish_reason"];
    }
  }
  EXPECT_EQ(text, whole.parsed["choices"][0]["text"]);
  EXPECT_EQ(finish, "length");
  EXPECT_EQ(usage, whole.parsed["usage"]);
}

TEST_F(HttpFrontTest, StreamedChatStartsWithTheRole) {
  const Reply r =
      Post("/v1/chat/completions",
           Completion({{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                       {"max_tokens", 3},
                       {"stream", true}}));
  ASSERT_EQ(r.status, 200) << r.body;
  const std::vector<std::string> data = SseData(r.body);
  ASSERT_GE(data.size(), 3u);
  const json first = json::parse(data[0]);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  const json last = json::parse(data[data.size() - 2]);
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
  // No usage chunk unless asked.
  for (size_t i = 0; i + 1 < data.size(); ++i) {
    EXPECT_FALSE(json::parse(data[i]).contains("usage")) << data[i];
  }
}

TEST_F(HttpFrontTest, LostWorkerIs503) {
  t_->workers->FailNextSteps(absl::UnavailableError("worker 0 (h:0): gone"),
                             kMaxRecoveries + 1);
  const Reply r =
      Post("/v1/completions", Completion({{"prompt", {5}}, {"max_tokens", 2}}));
  ExpectError(r, 503, "service_unavailable");
}

TEST_F(HttpFrontTest, RefusedStepIs429) {
  t_->workers->FailNextSteps(absl::ResourceExhaustedError("KV cache full"));
  const Reply r =
      Post("/v1/completions", Completion({{"prompt", {5}}, {"max_tokens", 2}}));
  ExpectError(r, 429, "rate_limit_error");
}

TEST_F(HttpFrontTest, StreamedWorkerFailureSendsAnErrorEvent) {
  t_->workers->FailNextSteps(absl::UnavailableError("worker 0 (h:0): gone"),
                             kMaxRecoveries + 1);
  const Reply r =
      Post("/v1/completions",
           Completion({{"prompt", {5}}, {"max_tokens", 2}, {"stream", true}}));
  ASSERT_EQ(r.status, 200) << r.body;
  const std::vector<std::string> data = SseData(r.body);
  ASSERT_EQ(data.size(), 2u) << r.body;
  const json error = json::parse(data[0]);
  EXPECT_EQ(error["error"]["code"], 503);
}

}  // namespace
}  // namespace mneme::coordinator
