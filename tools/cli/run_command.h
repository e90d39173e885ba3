#ifndef MNEME_TOOLS_CLI_RUN_COMMAND_H_
#define MNEME_TOOLS_CLI_RUN_COMMAND_H_

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace mneme::cli {

// mneme run --checkpoint DIR --tokens T0,T1,... [--max-new-tokens N]
//     [--temperature X] [--top-p X] [--top-k N] [--min-p X] [--seed N]
//     [--chunk-tokens N] [--ignore-eos] [--threads N] [--json]
//     [--prompt-logprobs] [--top-logprobs N]
// Generates a continuation of the prompt with the whole model in this
// process (TP 1, CPU backend): the reference run distributed runs are
// checked against. With --json prints one object (public contract):
//   {"token_ids": [...], "finish_reason": "stop"|"length",
//    "logprobs": [...], "prompt_tokens": N, "seconds": S}
// otherwise `token_ids: a,b,c` and `finish_reason: ...` lines.
// --prompt-logprobs adds "prompt_logprobs": one entry per prompt token,
//   {"token_id": id, "logprob": log p(token | tokens before it)}, the
//   first with "logprob": null (text output: a `prompt_logprobs:` line),
//   computed as the workers do (model::RowLogprobs over the fp32 logits,
//   prefilled in --chunk-tokens chunks); with --max-new-tokens 0 only the
//   prompt runs. --top-logprobs N (0..20, default 0) adds to each entry but
//   the first "top_logprobs": [{"token_id", "logprob"} x N], most likely
//   first, and a top-level "top_logprobs" with one such entry per new
//   token (whose "logprob" then comes from the same computation).
absl::Status RunRun(const std::vector<std::string>& argv, std::ostream& out);

// mneme score --checkpoint A --reference B [--prompts FILE | --sequences N
//     --prompt-tokens P] [--completion-tokens C] [--seed N] [--threads N]
//     [--json]
// Teacher-forced comparison of checkpoint A against reference B (the
// quality gate of a quantized variant): B writes a greedy completion of C
// tokens for each prompt (FILE: one comma-separated token list per line;
// otherwise N pseudo-random prompts of P tokens from --seed); both models
// then score prompt + completion. Reports per model the mean logprob of the
// completion tokens, the argmax agreement of A with B over the completion
// positions, and KL(B || A) of the next-token distributions (mean, p50,
// p99, max). --json prints one object with those keys.
absl::Status RunScore(const std::vector<std::string>& argv, std::ostream& out);

}  // namespace mneme::cli

#endif  // MNEME_TOOLS_CLI_RUN_COMMAND_H_
