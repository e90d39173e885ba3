#include "tools/cli/draft_command.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "model/spec/dspark.h"
#include "nlohmann/json.hpp"
#include "services/worker/local_model.h"
#include "tools/cli/args.h"

namespace mneme::cli {

absl::Status RunDraft(const std::vector<std::string>& argv, std::ostream& out) {
  ASSIGN_OR_RETURN(
      Args args,
      Args::Parse(argv, {"checkpoint", "tokens", "chunk-tokens", "threads"},
                  {"json"}));
  ASSIGN_OR_RETURN(std::string dir, args.Required("checkpoint"));
  if (!args.Has("tokens")) {
    return absl::InvalidArgumentError("--tokens is required");
  }
  ASSIGN_OR_RETURN(std::vector<int64_t> prompt, args.GetIntList("tokens"));
  if (prompt.empty()) return absl::InvalidArgumentError("--tokens is empty");
  ASSIGN_OR_RETURN(int64_t chunk, args.GetInt("chunk-tokens", 0, 0, 1 << 20));
  ASSIGN_OR_RETURN(int64_t threads, args.GetInt("threads", 0, 0, 1024));
  worker::LocalModelOptions options;
  options.checkpoint_dir = dir;
  options.threads = static_cast<int>(threads);
  ASSIGN_OR_RETURN(std::unique_ptr<worker::LocalModel> local,
                   worker::LocalModel::Create(options));
  model::Model& target = local->model();
  model::DsparkOptions options_for_drafter;
  options_for_drafter.checkpoint_dir = dir;
  const model::ModelDims& dims = target.dims();
  ASSIGN_OR_RETURN(std::unique_ptr<model::DsparkDrafter> drafter,
                   model::DsparkDrafter::Create(
                       options_for_drafter, dims, local->backend(), nullptr,
                       target.embedding_head(), target.vocab()));
  constexpr uint64_t kSequence = 1;
  const int64_t n = static_cast<int64_t>(prompt.size());
  const int64_t step = chunk > 0 ? chunk : n;
  std::vector<float> last_logits;
  for (int64_t begin = 0; begin < n; begin += step) {
    const int64_t end = std::min(n, begin + step);
    model::StepInput in;
    model::SequenceChunk c;
    c.sequence_id = kSequence;
    c.tokens.assign(prompt.begin() + begin, prompt.begin() + end);
    c.start_position = begin;
    c.logits = end == n ? model::SequenceChunk::Logits::kLast
                        : model::SequenceChunk::Logits::kNone;
    c.taps = true;
    in.chunks.push_back(std::move(c));
    absl::StatusOr<model::StepOutput> step_out = target.Step(in);
    if (!step_out.ok()) {
      target.Release(kSequence);
      return step_out.status();
    }
    RETURN_IF_ERROR(
        drafter->Extend(kSequence, begin, end - begin, step_out->taps[0]));
    if (end == n) last_logits = std::move(step_out->logits[0]);
  }
  target.Release(kSequence);
  // The target's greedy token (lowest id on ties).
  const int64_t anchor =
      std::max_element(last_logits.begin(), last_logits.end()) -
      last_logits.begin();
  model::DraftRequest request;
  request.sequence_id = kSequence;
  request.anchor = anchor;
  ASSIGN_OR_RETURN(std::vector<model::DraftProposal> proposals,
                   drafter->Propose({request}));
  const model::DraftProposal& p = proposals[0];
  if (args.Has("json")) {
    nlohmann::ordered_json j;
    j["anchor"] = anchor;
    j["draft_token_ids"] = p.tokens;
    j["confidence"] = p.confidence;
    out << j.dump() << "\n";
  } else {
    out << "anchor: " << anchor << "\n"
        << "draft_token_ids: " << absl::StrJoin(p.tokens, ",") << "\n"
        << "confidence: " << absl::StrJoin(p.confidence, ",") << "\n";
  }
  return absl::OkStatus();
}

}  // namespace mneme::cli
