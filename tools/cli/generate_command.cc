#include "tools/cli/generate_command.h"

#include <chrono>
#include <memory>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/grpc_channel.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"
#include "proto/serving/v1/serving.grpc.pb.h"
#include "tools/cli/args.h"
#include "tools/cli/sampling_flags.h"

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
    default:
      return "unspecified";
  }
}

}  // namespace

absl::Status RunGenerate(const std::vector<std::string>& argv,
                         std::ostream& out) {
  ASSIGN_OR_RETURN(
      Args args,
      Args::Parse(argv,
                  WithSamplingFlags({"server", "tokens", "prompt", "stop",
                                     "max-new-tokens", "stop-tokens",
                                     "request-id", "timeout-s"}),
                  {"json", "ignore-eos"}));
  ASSIGN_OR_RETURN(std::string server, args.Required("server"));
  if (args.Has("tokens") == args.Has("prompt")) {
    return absl::InvalidArgumentError(
        "give the prompt as --tokens T0,T1,... or as --prompt TEXT");
  }
  const bool text = args.Has("prompt");
  std::vector<int64_t> tokens;
  if (!text) {
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
  if (text) {
    request.set_prompt(args.Get("prompt", ""));
    if (args.Has("stop")) request.add_stop(args.Get("stop", ""));
  }
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
                   CreateClientChannel(server, ClientChannelOptions()));
  std::unique_ptr<sv1::Serving::Stub> stub = sv1::Serving::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(
      absl::ToChronoTime(absl::Now() + absl::Seconds(*timeout)));
  std::unique_ptr<grpc::ClientReader<sv1::GenerateResponse>> reader =
      stub->Generate(&context, request);
  const bool json = args.Has("json");
  std::vector<int64_t> ids;
  std::string generated;
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
    generated += message.text();
    if (!json && text) out << message.text() << std::flush;
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
    if (text) j["text"] = generated;
    out << j.dump() << "\n";
  } else {
    if (text) out << "\n";
    out << "finish_reason: " << ReasonName(last.finish_reason()) << "\n";
  }
  return absl::OkStatus();
}

}  // namespace mneme::cli
