#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/types/span.h"
#include "glog/logging.h"
#include "gpu/backend.h"
#include "gpu/cpu/cpu_backend.h"
#include "gpu/cpu/cpu_backend_internal.h"
#include "gpu/cpu/cpu_kernels.h"
#include "gpu/sampling.h"

namespace mneme::gpu {
using cpu_backend_internal::Grain;

void CpuBackend::Sample(ConstMatrixView logits,
                        absl::Span<const SamplingParams> params,
                        absl::Span<int32_t> ids, absl::Span<float> logprobs) {
  const int64_t tokens = logits.rows;
  const int64_t vocab = logits.cols;
  CHECK_GT(vocab, 0);
  CHECK_EQ(static_cast<int64_t>(params.size()), tokens);
  CHECK_EQ(static_cast<int64_t>(ids.size()), tokens);
  CHECK_EQ(static_cast<int64_t>(logprobs.size()), tokens);
  pool_.ParallelFor(tokens, Grain(vocab * 20), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* row = logits.data + t * vocab;
      const int32_t id = SampleToken(row, vocab, params[t]);
      ids[t] = id;
      logprobs[t] = LogProbOf(row, vocab, id);
    }
  });
}

void CpuBackend::LogProbs(ConstMatrixView logits, absl::Span<const int32_t> ids,
                          absl::Span<float> logprobs) {
  const int64_t tokens = logits.rows;
  const int64_t vocab = logits.cols;
  CHECK_EQ(static_cast<int64_t>(ids.size()), tokens);
  CHECK_EQ(static_cast<int64_t>(logprobs.size()), tokens);
  pool_.ParallelFor(tokens, Grain(vocab * 10), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      CHECK(ids[t] >= 0 && ids[t] < vocab) << "id " << ids[t];
      const float* row = logits.data + t * vocab;
      logprobs[t] = LogProbOf(row, vocab, ids[t]);
    }
  });
}

}  // namespace mneme::gpu
