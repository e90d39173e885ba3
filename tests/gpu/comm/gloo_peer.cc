// One rank of a Gloo group in its own process, for gloo_process_test: meets
// its peers through the test's Rendezvous server, then either runs the
// collective checks (--mode=check: prints "PASS" and exits 0, or prints the
// error and exits 1) or, after a Barrier, prints "READY" and waits to be
// killed (--mode=hang), or runs all-reduces until one fails, printing
// "LOOPING" after the first (--mode=loop).
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gpu/comm/gloo_communicator.h"
#include "gpu/comm/grpc_rendezvous_store.h"
#include "tests/gpu/comm/collective_checks.h"

ABSL_FLAG(std::string, target, "", "Rendezvous server, host:port.");
ABSL_FLAG(std::string, prefix, "", "Rendezvous key prefix of the group.");
ABSL_FLAG(int, rank, 0, "This process's rank.");
ABSL_FLAG(int, size, 2, "Ranks in the group.");
ABSL_FLAG(int, timeout_ms, 60000, "Communicator timeout.");
ABSL_FLAG(std::string, mode, "check", "check, hang or loop.");

namespace {

int Fail(const absl::Status& s) {
  std::printf("FAIL %s\n", s.ToString().c_str());
  std::fflush(stdout);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  mneme::gpu::GrpcRendezvousStoreOptions store_options;
  store_options.target = absl::GetFlag(FLAGS_target);
  store_options.key_prefix = absl::GetFlag(FLAGS_prefix);
  auto store = mneme::gpu::GrpcRendezvousStore::Create(store_options);
  if (!store.ok()) return Fail(store.status());

  mneme::gpu::GlooCommunicatorOptions options;
  options.rank = absl::GetFlag(FLAGS_rank);
  options.size = absl::GetFlag(FLAGS_size);
  options.timeout = absl::Milliseconds(absl::GetFlag(FLAGS_timeout_ms));
  auto comm = mneme::gpu::GlooCommunicator::Create(options, **store);
  if (!comm.ok()) return Fail(comm.status());

  if (absl::GetFlag(FLAGS_mode) == "hang") {
    if (absl::Status s = (*comm)->Barrier(); !s.ok()) return Fail(s);
    std::printf("READY\n");
    std::fflush(stdout);
    absl::SleepFor(absl::Hours(1));
    return 0;
  }
  if (absl::GetFlag(FLAGS_mode) == "loop") {
    std::vector<float> data(1 << 20, 1.0f);
    for (int64_t i = 0;; ++i) {
      absl::Status s = (*comm)->AllReduceSum(data.data(), data.size());
      if (!s.ok()) {
        std::printf("STOPPED %s\n", s.ToString().c_str());
        return 1;
      }
      if (i == 0) {
        std::printf("LOOPING\n");
        std::fflush(stdout);
      }
    }
  }
  if (absl::Status s = mneme::gpu::testing::RunCollectiveChecks(
          **comm, {1, 7, 1000, 1 << 20});
      !s.ok()) {
    return Fail(s);
  }
  std::printf("PASS calls=%lld\n",
              static_cast<long long>((*comm)->stats().calls));
  std::fflush(stdout);
  return 0;
}
