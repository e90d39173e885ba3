#include "tools/cli/run_command.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <memory>
#include <random>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "model/generate.h"
#include "model/spec/dspark.h"
#include "model/spec/verify.h"
#include "nlohmann/json.hpp"
#include "services/worker/local_model.h"
#include "tools/cli/args.h"
#include "tools/cli/percentile.h"
#include "tools/cli/sampling_flags.h"

namespace mneme::cli {
namespace {

using worker::LocalModel;

// How the backend holds the weights: as the checkpoint stores them, or
// dequantized to fp32 at load (the yardstick of the quantized paths).
enum class WeightStorage { kAsStored, kFp32 };

absl::StatusOr<std::unique_ptr<LocalModel>> OpenModel(
    const std::string& dir, int threads, int max_speculative_tokens = 0,
    WeightStorage storage = WeightStorage::kAsStored) {
  worker::LocalModelOptions options;
  options.checkpoint_dir = dir;
  options.threads = threads;
  options.dequantize_weights = storage == WeightStorage::kFp32;
  options.model.max_speculative_tokens = max_speculative_tokens;
  return LocalModel::Create(options);
}

// log_softmax of one row, in double.
std::vector<double> LogSoftmax(const float* logits, int64_t n) {
  double max = logits[0];
  for (int64_t i = 1; i < n; ++i) max = std::max<double>(max, logits[i]);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(logits[i] - max);
  const double lse = max + std::log(sum);
  std::vector<double> out(n);
  for (int64_t i = 0; i < n; ++i) out[i] = logits[i] - lse;
  return out;
}

// Logits [tokens.size(), vocab] of every position of `tokens`.
absl::StatusOr<std::vector<float>> ScoreAll(
    model::Model& model, const std::vector<int64_t>& tokens) {
  model::StepInput in;
  model::SequenceChunk c;
  c.sequence_id = 1;
  c.tokens = tokens;
  c.logits = model::SequenceChunk::Logits::kAll;
  in.chunks.push_back(std::move(c));
  absl::StatusOr<model::StepOutput> out = model.Step(in);
  model.Release(1);
  if (!out.ok()) return out.status();
  return std::move(out->logits[0]);
}

// A log-probability, or null (the first prompt position has none).
nlohmann::ordered_json LogprobJson(float logprob) {
  return std::isnan(logprob) ? nlohmann::ordered_json(nullptr)
                             : nlohmann::ordered_json(logprob);
}

// [{"token_id", "logprob"}...]: one position's most likely tokens.
nlohmann::ordered_json TopJson(const model::PositionLogprobs& lp) {
  nlohmann::ordered_json top = nlohmann::ordered_json::array();
  for (size_t k = 0; k < lp.top_ids.size(); ++k) {
    top.push_back(
        {{"token_id", lp.top_ids[k]}, {"logprob", lp.top_logprobs[k]}});
  }
  return top;
}

model::DsparkOptions DsparkFor(const std::string& dir) {
  model::DsparkOptions o;
  o.checkpoint_dir = dir;
  return o;
}

}  // namespace

absl::Status RunRun(const std::vector<std::string>& argv, std::ostream& out) {
  ASSIGN_OR_RETURN(
      Args args,
      Args::Parse(
          argv,
          WithSamplingFlags({"checkpoint", "tokens", "max-new-tokens",
                             "chunk-tokens", "threads", "logprobs",
                             "top-logprobs", "num-speculative-tokens",
                             "spec-method", "spec-verify"}),
          {"json", "ignore-eos", "prompt-logprobs", "dequantize-weights"}));
  ASSIGN_OR_RETURN(std::string dir, args.Required("checkpoint"));
  if (!args.Has("tokens")) {
    return absl::InvalidArgumentError("--tokens is required");
  }
  ASSIGN_OR_RETURN(std::vector<int64_t> prompt, args.GetIntList("tokens"));
  if (prompt.empty()) return absl::InvalidArgumentError("--tokens is empty");
  model::GenerateOptions options;
  absl::StatusOr<int64_t> max_new =
      args.GetInt("max-new-tokens", 16, 0, 1 << 20);
  absl::StatusOr<int64_t> chunk = args.GetInt("chunk-tokens", 0, 0, 1 << 20);
  absl::StatusOr<int64_t> threads = args.GetInt("threads", 0, 0, 1024);
  if (args.Has("logprobs") && args.Has("top-logprobs")) {
    return absl::InvalidArgumentError(
        "--logprobs and --top-logprobs are the same flag; give one");
  }
  absl::StatusOr<int64_t> top =
      args.GetInt(args.Has("top-logprobs") ? "top-logprobs" : "logprobs", 0, 0,
                  model::kMaxTopLogprobs);
  absl::StatusOr<gpu::SamplingParams> sampling = SamplingFromArgs(args);
  for (const absl::Status& st :
       {max_new.status(), chunk.status(), threads.status(), top.status(),
        sampling.status()}) {
    if (!st.ok()) return st;
  }
  const bool prompt_logprobs = args.Has("prompt-logprobs");
  options.prompt_logprobs = prompt_logprobs ? static_cast<int>(*top) : -1;
  options.top_logprobs = static_cast<int>(*top);
  options.max_new_tokens = *max_new;
  options.sampling = *sampling;
  options.prefill_chunk_tokens = *chunk;
  options.stop_at_eos = !args.Has("ignore-eos");
  ASSIGN_OR_RETURN(int64_t k, args.GetInt("num-speculative-tokens", 0, 0, 64));
  if (const std::string method = args.Get("spec-method", "dspark");
      method != "dspark") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--spec-method=", method, ": the supported method is dspark"));
  }
  ASSIGN_OR_RETURN(options.verify_rule,
                   model::ParseVerifyRule(args.Get("spec-verify", "block")));

  ASSIGN_OR_RETURN(
      std::unique_ptr<LocalModel> local,
      OpenModel(dir, static_cast<int>(*threads), static_cast<int>(k),
                args.Has("dequantize-weights") ? WeightStorage::kFp32
                                               : WeightStorage::kAsStored));
  std::unique_ptr<model::DsparkDrafter> drafter;
  if (k > 0) {
    const model::Model& m = local->model();
    ASSIGN_OR_RETURN(drafter, model::DsparkDrafter::Create(
                                  DsparkFor(dir), m.dims(), local->backend(),
                                  nullptr, m.embedding_head(), m.vocab()));
    if (k > drafter->block_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--num-speculative-tokens=", k, " exceeds the drafter's block of ",
          drafter->block_size()));
    }
    options.drafter = drafter.get();
    options.num_speculative_tokens = static_cast<int>(k);
  }
  const absl::Time start = absl::Now();
  ASSIGN_OR_RETURN(model::GenerateResult result,
                   model::Generate(local->model(), prompt, options));
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  if (args.Has("json")) {
    nlohmann::ordered_json j = {
        {"token_ids", result.token_ids},
        {"finish_reason", result.finish_reason},
        {"logprobs", result.logprobs},
        {"prompt_tokens", prompt.size()},
        {"seconds", seconds},
        // Model steps and the time they waited for Engram rows.
        {"steps", local->model().stats().steps},
        {"engram_seconds",
         absl::ToDoubleSeconds(local->model().stats().engram_time)},
        // The checkpoint bytes of the model's weights, and how much the
        // process's resident memory grew while they loaded.
        {"weight_bytes", local->model().weight_bytes()},
        {"weight_resident_bytes", local->model().weight_resident_bytes()},
    };
    if (result.token_seconds.size() >= 2 &&
        result.token_seconds.back() > result.token_seconds.front()) {
      // Tokens after the first per second of decoding (speculative steps
      // produce several at once).
      j["decode_tokens_per_s"] =
          static_cast<double>(result.token_seconds.size() - 1) /
          (result.token_seconds.back() - result.token_seconds.front());
    }
    if (result.token_seconds.size() >= 2) {
      // The median time between two new tokens (a decode step), as
      // `mneme bench serving` reports a server's inter-token latency.
      std::vector<double> gaps;
      for (size_t i = 1; i < result.token_seconds.size(); ++i) {
        gaps.push_back(result.token_seconds[i] - result.token_seconds[i - 1]);
      }
      std::nth_element(gaps.begin(), gaps.begin() + gaps.size() / 2,
                       gaps.end());
      j["itl_ms_p50"] = 1000 * gaps[gaps.size() / 2];
    }
    if (k > 0) {
      // What speculation did (vLLM's spec-decode counters) and the mean
      // tokens a step produced (accepted drafts + 1).
      const model::SpeculativeStats& s = result.speculative;
      j["speculative"] = {
          {"method", "dspark"},
          {"num_speculative_tokens", k},
          {"verify_steps", s.steps},
          {"num_drafts", s.drafts},
          {"num_draft_tokens", s.draft_tokens},
          {"num_accepted_tokens", s.accepted_tokens},
          {"num_accepted_tokens_per_pos", s.accepted_per_position},
          {"mean_acceptance_length",
           s.steps > 0 ? static_cast<double>(s.accepted_tokens + s.steps) /
                             static_cast<double>(s.steps)
                       : 0.0},
      };
    }
    if (*top > 0) {
      // Per generated token, its distribution's top N.
      nlohmann::ordered_json tops = nlohmann::ordered_json::array();
      for (const model::PositionLogprobs& lp : result.top_logprobs) {
        tops.push_back(TopJson(lp));
      }
      j["top_logprobs"] = std::move(tops);
    }
    if (prompt_logprobs) {
      // One number per prompt position: the log-probability of its token
      // given the tokens before it; null for the first.
      nlohmann::ordered_json values = nlohmann::ordered_json::array();
      nlohmann::ordered_json tops = nlohmann::ordered_json::array();
      for (size_t i = 0; i < result.prompt_logprobs.size(); ++i) {
        const model::PositionLogprobs& lp = result.prompt_logprobs[i];
        values.push_back(LogprobJson(lp.target_logprob));
        tops.push_back(i == 0 ? nlohmann::ordered_json(nullptr) : TopJson(lp));
      }
      j["prompt_logprobs"] = std::move(values);
      if (*top > 0) j["prompt_top_logprobs"] = std::move(tops);
    }
    out << j.dump() << "\n";
  } else {
    out << "token_ids: " << absl::StrJoin(result.token_ids, ",") << "\n"
        << "finish_reason: " << result.finish_reason << "\n";
    if (prompt_logprobs) {
      std::vector<std::string> values;
      for (const model::PositionLogprobs& lp : result.prompt_logprobs) {
        values.push_back(std::isnan(lp.target_logprob)
                             ? "null"
                             : absl::StrCat(lp.target_logprob));
      }
      out << "prompt_logprobs: " << absl::StrJoin(values, ",") << "\n";
    }
  }
  return absl::OkStatus();
}

absl::Status RunScore(const std::vector<std::string>& argv, std::ostream& out) {
  ASSIGN_OR_RETURN(
      Args args,
      Args::Parse(argv,
                  {"checkpoint", "reference", "prompts", "sequences",
                   "prompt-tokens", "completion-tokens", "seed", "threads"},
                  {"json"}));
  ASSIGN_OR_RETURN(std::string dir, args.Required("checkpoint"));
  ASSIGN_OR_RETURN(std::string ref_dir, args.Required("reference"));
  absl::StatusOr<int64_t> sequences = args.GetInt("sequences", 8, 1, 100000);
  absl::StatusOr<int64_t> prompt_tokens =
      args.GetInt("prompt-tokens", 32, 1, 1 << 20);
  absl::StatusOr<int64_t> completion =
      args.GetInt("completion-tokens", 32, 1, 1 << 20);
  absl::StatusOr<int64_t> seed = args.GetInt("seed", 0, 0, INT64_MAX);
  absl::StatusOr<int64_t> threads = args.GetInt("threads", 0, 0, 1024);
  for (const absl::Status& st :
       {sequences.status(), prompt_tokens.status(), completion.status(),
        seed.status(), threads.status()}) {
    if (!st.ok()) return st;
  }
  ASSIGN_OR_RETURN(std::unique_ptr<LocalModel> cand,
                   OpenModel(dir, static_cast<int>(*threads)));
  ASSIGN_OR_RETURN(std::unique_ptr<LocalModel> ref,
                   OpenModel(ref_dir, static_cast<int>(*threads)));
  const int64_t vocab = ref->model().dims().vocab_size;
  if (cand->model().dims().vocab_size != vocab) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the checkpoints have different vocabularies (",
        cand->model().dims().vocab_size, " vs ", vocab, " tokens)"));
  }

  // Prompts.
  std::vector<std::vector<int64_t>> prompts;
  if (args.Has("prompts")) {
    const std::string path = args.Get("prompts", "");
    std::ifstream in(path);
    if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
    std::string line;
    for (int line_no = 1; std::getline(in, line); ++line_no) {
      absl::string_view text = absl::StripAsciiWhitespace(line);
      if (text.empty()) continue;
      std::vector<int64_t> p;
      for (absl::string_view part : absl::StrSplit(text, ',')) {
        int64_t id = 0;
        if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &id) ||
            id < 0 || id >= vocab) {
          return absl::InvalidArgumentError(
              absl::StrCat(path, ":", line_no, ": '", part,
                           "' is not a token id in [0, ", vocab, ")"));
        }
        p.push_back(id);
      }
      prompts.push_back(std::move(p));
    }
    if (prompts.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(path, " has no prompts"));
    }
  } else {
    std::mt19937_64 rng(static_cast<uint64_t>(*seed));
    // Ids above the special tokens (bos, eos, pad).
    std::uniform_int_distribution<int64_t> pick(3, vocab - 1);
    for (int64_t s = 0; s < *sequences; ++s) {
      std::vector<int64_t> p(*prompt_tokens);
      for (int64_t& t : p) t = pick(rng);
      prompts.push_back(std::move(p));
    }
  }

  double sum_cand = 0, sum_ref = 0;
  int64_t positions = 0, agree = 0;
  std::vector<double> kls;
  for (const std::vector<int64_t>& prompt : prompts) {
    model::GenerateOptions gen;
    gen.max_new_tokens = *completion;
    gen.stop_at_eos = false;
    ASSIGN_OR_RETURN(model::GenerateResult completed,
                     model::Generate(ref->model(), prompt, gen));
    std::vector<int64_t> seq = prompt;
    seq.insert(seq.end(), completed.token_ids.begin(),
               completed.token_ids.end());
    // The last token is never an input whose prediction is scored.
    const std::vector<int64_t> inputs(seq.begin(), seq.end() - 1);
    ASSIGN_OR_RETURN(std::vector<float> lc, ScoreAll(cand->model(), inputs));
    ASSIGN_OR_RETURN(std::vector<float> lr, ScoreAll(ref->model(), inputs));
    for (size_t pos = prompt.size() - 1; pos < inputs.size(); ++pos) {
      const std::vector<double> a = LogSoftmax(lc.data() + pos * vocab, vocab);
      const std::vector<double> b = LogSoftmax(lr.data() + pos * vocab, vocab);
      const int64_t target = seq[pos + 1];
      sum_cand += a[target];
      sum_ref += b[target];
      const int64_t arg_a = std::max_element(a.begin(), a.end()) - a.begin();
      const int64_t arg_b = std::max_element(b.begin(), b.end()) - b.begin();
      agree += arg_a == arg_b;
      double kl = 0;
      for (int64_t v = 0; v < vocab; ++v) kl += std::exp(b[v]) * (b[v] - a[v]);
      kls.push_back(std::max(kl, 0.0));
      ++positions;
    }
  }
  double kl_mean = 0;
  for (double k : kls) kl_mean += k;
  kl_mean /= std::max<int64_t>(positions, 1);
  nlohmann::ordered_json j = {
      {"checkpoint", dir},
      {"reference", ref_dir},
      {"sequences", prompts.size()},
      {"scored_tokens", positions},
      {"mean_logprob", sum_cand / std::max<int64_t>(positions, 1)},
      {"reference_mean_logprob", sum_ref / std::max<int64_t>(positions, 1)},
      {"argmax_agreement",
       static_cast<double>(agree) / std::max<int64_t>(positions, 1)},
      {"kl_mean", kl_mean},
      {"kl_p50", Percentile(kls, 50)},
      {"kl_p99", Percentile(kls, 99)},
      {"kl_max", kls.empty() ? 0.0 : *std::max_element(kls.begin(), kls.end())},
  };
  if (args.Has("json")) {
    out << j.dump() << "\n";
  } else {
    for (auto it = j.begin(); it != j.end(); ++it) {
      out << it.key() << ": " << it.value().dump() << "\n";
    }
  }
  return absl::OkStatus();
}

}  // namespace mneme::cli
