// Helpers of the engram service's integration tests: synthetic checkpoints,
// the real mneme_engram_store daemon on 127.0.0.1:0, gRPC clients, rows
// decoded directly from the checkpoint to compare against, and client load.

#ifndef MNEME_TESTS_INTEGRATION_ENGRAM_SERVICE_TEST_UTIL_H_
#define MNEME_TESTS_INTEGRATION_ENGRAM_SERVICE_TEST_UTIL_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "engram_store/client/grpc_engram_client.h"
#include "engram_store/engram_checkpoint.h"
#include "formats/row_format.h"
#include "tests/testing/daemon.h"

namespace mneme::engram::service_testing {

// A synthetic checkpoint with Engram tables in `format` (seed 5), made once
// per format per process under a temporary directory; its directory.
const std::string& Checkpoint(formats::RowFormat format);

// Starts mneme_engram_store on `checkpoint`, listening on 127.0.0.1:0 with
// no metrics, small thread pools and an 8 MiB RAM cache, plus `flags`.
mneme::testing::Daemon StartDaemon(const std::string& checkpoint,
                                   std::vector<std::string> flags = {});

// A plaintext client of `address` with a 30 s timeout; null (and a test
// failure) on an error.
std::unique_ptr<GrpcEngramClient> Client(const std::string& address,
                                         int max_attempts = 4);

// Direct reads of the checkpoint, decoded by the format library.
std::string Expected(const EngramCheckpoint& c, int layer,
                     const std::vector<int64_t>& ids, v1::RowEncoding enc);

// Row ids below `rows`: 0, rows - 1, `n` random ones and a duplicate.
std::vector<int64_t> RandomIds(int64_t rows, int n, uint64_t seed);

// `n` random tokens below `vocab`.
std::vector<int64_t> RandomTokens(int64_t vocab, int n, uint64_t seed);

// "1,2,3".
std::string Join(const std::vector<int64_t>& v);

// The whole content of a file ("" when it cannot be read).
std::string ReadFile(const std::string& path);

// Status codes seen by RunLoad's client loops.
struct LoadResult {
  absl::Mutex mu;
  std::map<absl::StatusCode, int64_t> codes ABSL_GUARDED_BY(mu);
  // Codes of the calls started before `signalled` was set.
  std::map<absl::StatusCode, int64_t> before_signal ABSL_GUARDED_BY(mu);
  std::atomic<bool> signalled = false;
};

// Runs `threads` client loops against `address` (decode steps on `layer`
// over tokens below `vocab`, every fourth call a streamed prefill chunk)
// until `stop`; records every status code seen in `result` and counts the
// calls in `calls`.
void RunLoad(const std::string& address, int threads, int layer, int64_t vocab,
             std::atomic<bool>& stop, LoadResult& result,
             std::atomic<int64_t>& calls);

}  // namespace mneme::engram::service_testing

#endif  // MNEME_TESTS_INTEGRATION_ENGRAM_SERVICE_TEST_UTIL_H_
