#ifndef MNEME_TESTS_INTEGRATION_SERVING_CLUSTER_H_
#define MNEME_TESTS_INTEGRATION_SERVING_CLUSTER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "proto/serving/v1/serving.grpc.pb.h"
#include "proto/worker/v1/worker.pb.h"
#include "tests/testing/daemon.h"

namespace mneme::testing {

// The outcome of one Generate call: its status and the tokens streamed
// before it ended.
struct Outcome {
  grpc::Status status;
  std::vector<int64_t> tokens;
};

struct ServingClusterOptions {
  // Default: the tiny model checkpoint (TinyModelCheckpoint()).
  std::string checkpoint;
  // Default: 2.
  int tp_size = 2;
  // Workers' Engram lookup deadline (short, so that a stalled store fails a
  // step quickly). Default: "1s".
  std::string engram_timeout = "1s";
  // Workers' comm timeout (group joining and each collective).
  // Default: "30s".
  std::string comm_timeout = "30s";
  // Coordinator's step deadline. Default: "20s".
  std::string step_timeout = "20s";
  // Workers reach the store through its shared-memory socket (gRPC stays
  // their fallback). Default: false (gRPC only).
  bool engram_shm = false;
};

// A real serving cluster on loopback, started daemon by daemon as systemd
// would: an engram store, tp_size mneme_worker ranks (rank 0 holds the
// rendezvous), and a coordinator; each daemon can be killed, stopped and
// restarted alone on its address. Failures to start fail the current test.
class ServingCluster {
 public:
  explicit ServingCluster(ServingClusterOptions options = {});

  // Starts the store on `listen` ("127.0.0.1:0" first, its old address
  // after a restart).
  void StartStore(const std::string& listen);
  // Starts worker `rank` on `listen` (its old address after a restart).
  void StartWorker(int rank, const std::string& listen);
  // SIGKILL and reap worker `rank` / the store.
  void KillWorker(int rank);
  void KillStore();
  // SIGKILL the coordinator and start it again on its address.
  void RestartCoordinator();

  // Waits until the coordinator's health is SERVING; false at `timeout`.
  bool WaitServing(absl::Duration timeout);
  // One streamed Generate of `prompt` (greedy, `max_new` tokens).
  Outcome Generate(const std::vector<int64_t>& prompt, int max_new,
                   absl::Duration deadline = absl::Seconds(30));
  // Retries `prompt` until it succeeds (the cluster coming back); the first
  // success, or the last failure after `timeout`. Every failure on the way
  // must be UNAVAILABLE.
  Outcome GenerateWhenBack(const std::vector<int64_t>& prompt, int max_new,
                           absl::Duration timeout);
  // Fails the test if a worker process has exited.
  void ExpectWorkersRunning(const std::string& when);
  // The coordinator's model vocabulary size.
  int ModelVocabSize();
  // Sends `request` to every rank at once (bypassing the coordinator);
  // their statuses.
  std::vector<grpc::Status> StepWorkers(const worker::v1::StepRequest& request);

  Daemon& store() { return store_; }
  // The store's shared-memory socket path (made on first use).
  const std::string& ShmSocket();
  Daemon& worker(int rank) { return workers_.at(rank); }
  Daemon& coordinator() { return coordinator_; }
  int tp_size() const { return static_cast<int>(workers_.size()); }
  serving::v1::Serving::Stub& stub() { return *stub_; }

 private:
  const ServingClusterOptions options_;
  Daemon store_;
  // The store's shared-memory socket (engram_shm); short, under /tmp, as
  // Unix socket paths are at most 107 bytes.
  std::string shm_socket_;
  std::vector<Daemon> workers_;
  Daemon coordinator_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<serving::v1::Serving::Stub> stub_;
};

// Resident memory of a process (VmRSS), in bytes; -1 if unknown.
int64_t ResidentBytes(int pid);

}  // namespace mneme::testing

#endif  // MNEME_TESTS_INTEGRATION_SERVING_CLUSTER_H_
