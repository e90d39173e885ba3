#include "tools/cli/sampling_flags.h"

#include <cstdint>

namespace mneme::cli {

std::set<std::string> WithSamplingFlags(std::set<std::string> flags) {
  flags.insert({"temperature", "top-p", "top-k", "min-p", "seed"});
  return flags;
}

absl::StatusOr<gpu::SamplingParams> SamplingFromArgs(const Args& args) {
  absl::StatusOr<double> temperature = args.GetDouble("temperature", 0, 0, 100);
  absl::StatusOr<double> top_p = args.GetDouble("top-p", 1, 0, 1);
  absl::StatusOr<double> min_p = args.GetDouble("min-p", 0, 0, 1);
  absl::StatusOr<int64_t> top_k = args.GetInt("top-k", 0, 0, 1 << 24);
  absl::StatusOr<int64_t> seed = args.GetInt("seed", 0, 0, INT64_MAX);
  for (const absl::Status& st :
       {temperature.status(), top_p.status(), min_p.status(), top_k.status(),
        seed.status()}) {
    if (!st.ok()) return st;
  }
  gpu::SamplingParams p;
  p.temperature = static_cast<float>(*temperature);
  p.top_p = static_cast<float>(*top_p);
  p.min_p = static_cast<float>(*min_p);
  p.top_k = static_cast<int32_t>(*top_k);
  p.seed = static_cast<uint64_t>(*seed);
  return p;
}

}  // namespace mneme::cli
