#ifndef MNEME_SERVICES_COORDINATOR_GENERATE_PARAMS_H_
#define MNEME_SERVICES_COORDINATOR_GENERATE_PARAMS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "proto/worker/v1/worker.pb.h"

namespace mneme::coordinator {

// One generation request as the engine runs it, whichever front built it.
// request_validator.h states and checks its limits.
struct GenerateParams {
  // The client's id; empty = the engine assigns one.
  std::string request_id;
  // The prompt's token ids.
  std::vector<int64_t> prompt;
  // Sampling of every new token (its seed is the request's base: token i is
  // drawn with seed + i, as `mneme run` does).
  worker::v1::SamplingParams sampling;
  // Tokens to generate at most. Default: 16.
  int64_t max_new_tokens = 16;
  // Besides the model's eos token.
  std::vector<int64_t> stop_token_ids;
  bool ignore_eos = false;
  bool logprobs = false;
};

// What a client sees of the served model.
struct ModelInfo {
  std::string checkpoint;
  int64_t vocab_size = 0;
  int64_t eos_token_id = 0;
  int64_t max_context_tokens = 0;
  int tp_size = 0;
  int dcp_size = 0;
};

}  // namespace mneme::coordinator

#endif  // MNEME_SERVICES_COORDINATOR_GENERATE_PARAMS_H_
