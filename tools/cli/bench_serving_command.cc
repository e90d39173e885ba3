#include "tools/cli/bench_serving_command.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"
#include "proto/serving/v1/serving.grpc.pb.h"
#include "tools/cli/args.h"
#include "tools/cli/percentile.h"
#include "tools/cli/serving_channel.h"

namespace mneme::cli {
namespace {

namespace sv1 = serving::v1;

}  // namespace

absl::Status RunBenchServing(const std::vector<std::string>& argv,
                             std::ostream& out) {
  ASSIGN_OR_RETURN(Args args,
                   Args::Parse(argv, {"server", "streams", "requests",
                                      "prompt-tokens", "max-new-tokens",
                                      "vocab-size", "seed", "api-key-file"}));
  ASSIGN_OR_RETURN(std::string server, args.Required("server"));
  absl::StatusOr<int64_t> streams = args.GetInt("streams", 4, 1, 4096);
  absl::StatusOr<int64_t> requests = args.GetInt("requests", 16, 1, 1 << 24);
  absl::StatusOr<int64_t> prompt = args.GetInt("prompt-tokens", 64, 1, 1 << 20);
  absl::StatusOr<int64_t> max_new =
      args.GetInt("max-new-tokens", 32, 1, 1 << 20);
  absl::StatusOr<int64_t> vocab = args.GetInt("vocab-size", 600, 4, 1 << 24);
  absl::StatusOr<int64_t> seed = args.GetInt("seed", 0, 0, INT64_MAX);
  for (const absl::Status& st :
       {streams.status(), requests.status(), prompt.status(), max_new.status(),
        vocab.status(), seed.status()}) {
    if (!st.ok()) return st;
  }
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                   ServingChannel(args, server));
  std::unique_ptr<sv1::Serving::Stub> stub = sv1::Serving::NewStub(channel);
  std::atomic<int64_t> next{0}, errors{0}, output_tokens{0};
  // Speculative decoding, summed over the requests.
  std::atomic<int64_t> drafts{0}, draft_tokens{0}, accepted{0};
  absl::Mutex mu;
  std::vector<double> ttft, itl, e2e;
  std::string first_error;
  const absl::Time start = absl::Now();
  std::vector<std::thread> threads;
  for (int64_t s = 0; s < *streams; ++s) {
    threads.emplace_back([&, s] {
      std::mt19937_64 rng(static_cast<uint64_t>(*seed) * 7919 + s);
      std::uniform_int_distribution<int64_t> pick(3, *vocab - 1);
      for (int64_t i = next++; i < *requests; i = next++) {
        sv1::GenerateRequest req;
        for (int64_t t = 0; t < *prompt; ++t) req.add_token_ids(pick(rng));
        req.set_max_new_tokens(static_cast<int32_t>(*max_new));
        req.set_ignore_eos(true);
        grpc::ClientContext ctx;
        ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Minutes(30)));
        const absl::Time t0 = absl::Now();
        auto reader = stub->Generate(&ctx, req);
        sv1::GenerateResponse m;
        absl::Time last = t0;
        std::vector<double> my_itl;
        double my_ttft = -1;
        int64_t n = 0;
        while (reader->Read(&m)) {
          if (m.has_speculative_decoding()) {
            drafts += m.speculative_decoding().num_drafts();
            draft_tokens += m.speculative_decoding().num_draft_tokens();
            accepted += m.speculative_decoding().num_accepted_tokens();
          }
          if (m.token_ids_size() == 0) continue;
          const absl::Time now = absl::Now();
          if (n == 0) {
            my_ttft = absl::ToDoubleMilliseconds(now - t0);
          } else {
            my_itl.push_back(absl::ToDoubleMilliseconds(now - last) /
                             m.token_ids_size());
          }
          last = now;
          n += m.token_ids_size();
        }
        const grpc::Status st = reader->Finish();
        absl::MutexLock lock(&mu);
        if (!st.ok()) {
          ++errors;
          if (first_error.empty()) first_error = st.error_message();
          continue;
        }
        output_tokens += n;
        if (my_ttft >= 0) ttft.push_back(my_ttft);
        itl.insert(itl.end(), my_itl.begin(), my_itl.end());
        e2e.push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  const int64_t ok = *requests - errors;
  nlohmann::ordered_json j = {
      {"streams", *streams},
      {"requests", *requests},
      {"errors", errors.load()},
      {"seconds", seconds},
      {"output_tokens_per_s", output_tokens / seconds},
      {"total_tokens_per_s", (output_tokens + ok * *prompt) / seconds},
      {"ttft_ms_p50", Percentile(ttft, 50)},
      {"ttft_ms_p99", Percentile(ttft, 99)},
      {"itl_ms_p50", Percentile(itl, 50)},
      {"itl_ms_p99", Percentile(itl, 99)},
      {"e2e_ms_p50", Percentile(e2e, 50)},
      {"e2e_ms_p99", Percentile(e2e, 99)},
  };
  if (drafts > 0) {
    // vLLM's figures: tokens a decode step with drafts produced on average
    // (accepted drafts + 1) and the share of drafts accepted.
    j["spec_decode"] = {
        {"num_drafts", drafts.load()},
        {"num_draft_tokens", draft_tokens.load()},
        {"num_accepted_tokens", accepted.load()},
        {"mean_acceptance_length",
         1.0 + static_cast<double>(accepted) / static_cast<double>(drafts)},
        {"draft_acceptance_rate",
         static_cast<double>(accepted) / static_cast<double>(draft_tokens)},
    };
  }
  if (!first_error.empty()) j["first_error"] = first_error;
  out << j.dump() << "\n";
  return absl::OkStatus();
}

}  // namespace mneme::cli
