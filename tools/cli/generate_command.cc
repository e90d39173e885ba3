#include "tools/cli/generate_command.h"

#include <array>
#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/file_io.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"
#include "proto/serving/v1/serving.grpc.pb.h"
#include "tools/cli/args.h"
#include "tools/cli/chat_json.h"
#include "tools/cli/sampling_flags.h"
#include "tools/cli/serving_channel.h"

namespace mneme::cli {
namespace {

namespace sv1 = serving::v1;

const char* ReasonName(sv1::FinishReason r) {
  switch (r) {
    case sv1::FINISH_REASON_STOP:
      return "stop";
    case sv1::FINISH_REASON_LENGTH:
      return "length";
    case sv1::FINISH_REASON_ABORT:
      return "abort";
    case sv1::FINISH_REASON_TOOL_CALLS:
      return "tool_calls";
    default:
      return "unspecified";
  }
}

// A chat answer as it streams in: reasoning, content and tool calls.
struct ChatAnswer {
  std::string reasoning;
  std::string content;
  // In call order: id, name, arguments.
  std::vector<std::array<std::string, 3>> calls;
  // What was printed last (0 none, 1 reasoning, 2 content).
  int printing = 0;

  // Adds a message's pieces; without --json prints the reasoning and the
  // content as they arrive, each after a heading line.
  void Add(const sv1::GenerateResponse& m, bool print, std::ostream& out) {
    auto section = [&](int kind, const char* heading) {
      if (!print || printing == kind) return;
      if (printing != 0) out << "\n";
      out << heading << "\n";
      printing = kind;
    };
    if (!m.reasoning_text().empty()) {
      section(1, "[reasoning]");
      reasoning += m.reasoning_text();
      if (print) out << m.reasoning_text() << std::flush;
    }
    if (!m.text().empty()) {
      section(2, "[content]");
      content += m.text();
      if (print) out << m.text() << std::flush;
    }
    for (const sv1::ToolCallDelta& d : m.tool_calls()) {
      if (d.index() < 0 || d.index() > static_cast<int>(calls.size())) {
        continue;  // Not the next call: the server never sends this.
      }
      if (d.index() == static_cast<int>(calls.size())) calls.emplace_back();
      std::array<std::string, 3>& c = calls[static_cast<size_t>(d.index())];
      if (!d.id().empty()) c[0] = d.id();
      if (!d.name().empty()) c[1] = d.name();
      c[2] += d.arguments();
    }
  }

  void PrintCalls(std::ostream& out) {
    if (printing != 0) out << "\n";
    for (const std::array<std::string, 3>& c : calls) {
      out << "[tool_call " << c[0] << "] " << c[1] << " " << c[2] << "\n";
    }
  }

  nlohmann::ordered_json CallsJson() const {
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const std::array<std::string, 3>& c : calls) {
      list.push_back({{"id", c[0]},
                      {"type", "function"},
                      {"function", {{"name", c[1]}, {"arguments", c[2]}}}});
    }
    return list;
  }
};

}  // namespace

absl::Status RunGenerate(const std::vector<std::string>& argv,
                         std::ostream& out) {
  ASSIGN_OR_RETURN(Args args,
                   Args::Parse(argv,
                               WithSamplingFlags(
                                   {"server", "tokens", "prompt", "chat-json",
                                    "stop", "max-new-tokens", "stop-tokens",
                                    "request-id", "timeout-s", "api-key-file"}),
                               {"json", "ignore-eos"}));
  ASSIGN_OR_RETURN(std::string server, args.Required("server"));
  const int forms = (args.Has("tokens") ? 1 : 0) +
                    (args.Has("prompt") ? 1 : 0) +
                    (args.Has("chat-json") ? 1 : 0);
  if (forms != 1) {
    return absl::InvalidArgumentError(
        "give the prompt as --tokens T0,T1,..., as --prompt TEXT or as "
        "--chat-json FILE");
  }
  const bool chat = args.Has("chat-json");
  const bool text = args.Has("prompt") || chat;
  std::vector<int64_t> tokens;
  sv1::Chat chat_proto;
  if (chat) {
    const std::string path = args.Get("chat-json", "");
    ASSIGN_OR_RETURN(const std::string body,
                     ReadSmallFile(path, kMaxChatJsonBytes));
    absl::StatusOr<sv1::Chat> parsed = ChatFromOpenAiJson(body);
    if (!parsed.ok()) {
      return absl::Status(parsed.status().code(),
                          absl::StrCat(path, ": ", parsed.status().message()));
    }
    chat_proto = *std::move(parsed);
  } else if (!text) {
    ASSIGN_OR_RETURN(std::vector<int64_t> ids, args.GetIntList("tokens"));
    tokens = std::move(ids);
  }
  absl::StatusOr<int64_t> max_new =
      args.GetInt("max-new-tokens", 16, 1, 1 << 24);
  absl::StatusOr<int64_t> timeout = args.GetInt("timeout-s", 600, 1, 86400);
  absl::StatusOr<gpu::SamplingParams> sampling = SamplingFromArgs(args);
  for (const absl::Status& st :
       {max_new.status(), timeout.status(), sampling.status()}) {
    if (!st.ok()) return st;
  }
  sv1::GenerateRequest request;
  request.set_request_id(args.Get("request-id", ""));
  request.mutable_token_ids()->Add(tokens.begin(), tokens.end());
  if (chat) {
    *request.mutable_chat() = std::move(chat_proto);
  } else if (text) {
    request.set_prompt(args.Get("prompt", ""));
  }
  if (text && args.Has("stop")) request.add_stop(args.Get("stop", ""));
  request.set_max_new_tokens(static_cast<int32_t>(*max_new));
  sv1::SamplingParams* s = request.mutable_sampling();
  s->set_temperature(sampling->temperature);
  s->set_top_p(sampling->top_p);
  s->set_top_k(sampling->top_k);
  s->set_min_p(sampling->min_p);
  s->set_seed(sampling->seed);
  if (args.Has("stop-tokens")) {
    ASSIGN_OR_RETURN(std::vector<int64_t> stops,
                     args.GetIntList("stop-tokens"));
    request.mutable_stop_token_ids()->Add(stops.begin(), stops.end());
  }
  request.set_ignore_eos(args.Has("ignore-eos"));
  request.set_logprobs(true);

  ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                   ServingChannel(args, server));
  std::unique_ptr<sv1::Serving::Stub> stub = sv1::Serving::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(
      absl::ToChronoTime(absl::Now() + absl::Seconds(*timeout)));
  std::unique_ptr<grpc::ClientReader<sv1::GenerateResponse>> reader =
      stub->Generate(&context, request);
  const bool json = args.Has("json");
  std::vector<int64_t> ids;
  std::string generated;
  ChatAnswer answer;
  std::vector<float> logprobs;
  std::string request_id;
  sv1::GenerateResponse last;
  sv1::GenerateResponse message;
  while (reader->Read(&message)) {
    if (!message.request_id().empty()) request_id = message.request_id();
    for (int i = 0; i < message.token_ids_size(); ++i) {
      ids.push_back(message.token_ids(i));
      if (!json && !text) out << message.token_ids(i) << "\n" << std::flush;
    }
    if (chat) {
      answer.Add(message, !json, out);
    } else {
      generated += message.text();
      if (!json && text) out << message.text() << std::flush;
    }
    logprobs.insert(logprobs.end(), message.logprobs().begin(),
                    message.logprobs().end());
    if (message.finish_reason() != sv1::FINISH_REASON_UNSPECIFIED) {
      last = message;
    }
  }
  const grpc::Status status = reader->Finish();
  if (!status.ok()) {
    const absl::Status st = FromGrpcStatus(status);
    return absl::Status(st.code(), absl::StrCat(server, ": ", st.message()));
  }
  if (json) {
    nlohmann::ordered_json j = {
        {"token_ids", ids},
        {"finish_reason", ReasonName(last.finish_reason())},
        {"logprobs", logprobs},
        {"prompt_tokens", last.prompt_tokens()},
        {"request_id", request_id},
    };
    if (chat) {
      j["text"] = answer.content;
      j["reasoning_content"] = answer.reasoning;
      j["tool_calls"] = answer.CallsJson();
    } else if (text) {
      j["text"] = generated;
    }
    out << j.dump() << "\n";
  } else {
    if (chat) {
      answer.PrintCalls(out);
    } else if (text) {
      out << "\n";
    }
    out << "finish_reason: " << ReasonName(last.finish_reason()) << "\n";
  }
  return absl::OkStatus();
}

}  // namespace mneme::cli
