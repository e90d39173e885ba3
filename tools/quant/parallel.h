#ifndef MNEME_TOOLS_QUANT_PARALLEL_H_
#define MNEME_TOOLS_QUANT_PARALLEL_H_

#include <cstdint>
#include <functional>

#include "absl/status/status.h"

namespace mneme::quant {

// The worker count for a `threads` option: the value itself when > 0, else
// the number of cores (at least 1).
int ResolveThreads(int threads);

// Runs fn(i) for every i in [0, count) on min(threads, count) threads that
// take indices in increasing order from a shared counter (the calling
// thread is one of them). Returns OK, or the error of the lowest index that
// failed; after a failure no new index is started. Threads are started per
// call: callers hand it work of at least milliseconds.
absl::Status ParallelFor(int threads, int64_t count,
                         const std::function<absl::Status(int64_t)>& fn);

}  // namespace mneme::quant

#endif  // MNEME_TOOLS_QUANT_PARALLEL_H_
