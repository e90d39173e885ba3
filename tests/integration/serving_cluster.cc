#include "tests/integration/serving_cluster.h"

#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "proto/grpc/health/v1/health.grpc.pb.h"
#include "proto/worker/v1/worker.grpc.pb.h"
#include "tests/testing/command.h"

namespace mneme::testing {

namespace sv1 = ::mneme::serving::v1;

ServingCluster::ServingCluster(ServingClusterOptions options)
    : options_(std::move(options)) {
  ServingClusterOptions& o = const_cast<ServingClusterOptions&>(options_);
  if (o.checkpoint.empty()) o.checkpoint = TinyModelCheckpoint();
  StartStore("127.0.0.1:0");
  workers_.resize(options_.tp_size);
  for (int r = 0; r < options_.tp_size; ++r) StartWorker(r, "127.0.0.1:0");
  std::string addresses;
  for (const Daemon& w : workers_) {
    absl::StrAppend(&addresses, addresses.empty() ? "" : ",", w.address);
  }
  coordinator_.argv = {
      RunfilePath("mneme/services/coordinator/mneme_coordinator"),
      "--workers=" + addresses,
      "--listen=127.0.0.1:0",
      "--metrics_listen=none",
      "--step_timeout=" + options_.step_timeout,
      "--idle_check_interval=500ms"};
  Launch(coordinator_);
  channel_ = grpc::CreateChannel(coordinator_.address,
                                 grpc::InsecureChannelCredentials());
  stub_ = sv1::Serving::NewStub(channel_);
  EXPECT_TRUE(WaitServing(absl::Seconds(60))) << coordinator_.process->Stderr();
}

const std::string& ServingCluster::ShmSocket() {
  if (shm_socket_.empty()) {
    static int clusters = 0;
    shm_socket_ =
        absl::StrCat("/tmp/mneme-test-", getpid(), "-", clusters++, ".sock");
  }
  return shm_socket_;
}

void ServingCluster::StartStore(const std::string& listen) {
  store_.argv = {RunfilePath("mneme/services/engram/mneme_engram_store"),
                 "--checkpoint=" + options_.checkpoint,
                 "--listen=" + listen,
                 "--metrics_listen=none",
                 "--io_threads=2",
                 "--worker_threads=2"};
  if (options_.engram_shm) {
    store_.argv.push_back("--shm_socket=" + ShmSocket());
  }
  Launch(store_);
}

void ServingCluster::StartWorker(int rank, const std::string& listen) {
  Daemon& w = workers_.at(rank);
  w.argv = {RunfilePath("mneme/services/worker/mneme_worker"),
            "--checkpoint=" + options_.checkpoint,
            "--listen=" + listen,
            "--metrics_listen=none",
            absl::StrCat("--rank=", rank),
            absl::StrCat("--tp_size=", options_.tp_size),
            "--engram_store=" + store_.address,
            "--engram_timeout=" + options_.engram_timeout,
            "--threads=1",
            "--comm_timeout=" + options_.comm_timeout,
            "--kv_cache_bytes=33554432"};
  if (options_.engram_shm) {
    w.argv.push_back("--engram_shm_socket=" + ShmSocket());
  }
  if (rank > 0) w.argv.push_back("--group=" + workers_[0].address);
  Launch(w);
}

void ServingCluster::KillWorker(int rank) {
  Daemon& w = workers_.at(rank);
  w.process->Signal(SIGKILL);
  EXPECT_TRUE(w.process->Wait(absl::Seconds(10)).ok());
}

void ServingCluster::KillStore() {
  store_.process->Signal(SIGKILL);
  EXPECT_TRUE(store_.process->Wait(absl::Seconds(10)).ok());
}

void ServingCluster::RestartCoordinator() {
  coordinator_.process->Signal(SIGKILL);
  EXPECT_TRUE(coordinator_.process->Wait(absl::Seconds(10)).ok());
  for (std::string& arg : coordinator_.argv) {
    if (absl::StartsWith(arg, "--listen=")) {
      arg = "--listen=" + coordinator_.address;
    }
  }
  Launch(coordinator_);
}

bool ServingCluster::WaitServing(absl::Duration timeout) {
  auto health = grpc::health::v1::Health::NewStub(channel_);
  const absl::Time end = absl::Now() + timeout;
  while (absl::Now() < end) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    grpc::health::v1::HealthCheckResponse resp;
    if (health->Check(&ctx, {}, &resp).ok() &&
        resp.status() == grpc::health::v1::HealthCheckResponse::SERVING) {
      return true;
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  return false;
}

Outcome ServingCluster::Generate(const std::vector<int64_t>& prompt,
                                 int max_new, absl::Duration deadline) {
  sv1::GenerateRequest req;
  req.mutable_token_ids()->Add(prompt.begin(), prompt.end());
  req.set_max_new_tokens(max_new);
  Outcome o;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  auto reader = stub_->Generate(&ctx, req);
  sv1::GenerateResponse m;
  while (reader->Read(&m)) {
    o.tokens.insert(o.tokens.end(), m.token_ids().begin(), m.token_ids().end());
  }
  o.status = reader->Finish();
  return o;
}

Outcome ServingCluster::GenerateWhenBack(const std::vector<int64_t>& prompt,
                                         int max_new, absl::Duration timeout) {
  const absl::Time end = absl::Now() + timeout;
  Outcome o;
  do {
    o = Generate(prompt, max_new);
    if (o.status.ok()) return o;
    EXPECT_EQ(o.status.error_code(), grpc::StatusCode::UNAVAILABLE)
        << o.status.error_message();
    absl::SleepFor(absl::Milliseconds(200));
  } while (absl::Now() < end);
  return o;
}

void ServingCluster::ExpectWorkersRunning(const std::string& when) {
  for (size_t r = 0; r < workers_.size(); ++r) {
    const absl::StatusOr<int> exit =
        workers_[r].process->Wait(absl::ZeroDuration());
    EXPECT_FALSE(exit.ok())
        << "worker " << r << " exited (" << *exit << ") " << when << ":\n"
        << workers_[r].process->Stderr();
  }
}

int ServingCluster::ModelVocabSize() {
  grpc::ClientContext ctx;
  sv1::GetModelInfoResponse info;
  EXPECT_TRUE(stub_->GetModelInfo(&ctx, {}, &info).ok());
  return static_cast<int>(info.vocab_size());
}

std::vector<grpc::Status> ServingCluster::StepWorkers(
    const worker::v1::StepRequest& request) {
  std::vector<grpc::Status> out(workers_.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < workers_.size(); ++r) {
    threads.emplace_back([&, r] {
      auto stub = worker::v1::Worker::NewStub(grpc::CreateChannel(
          workers_[r].address, grpc::InsecureChannelCredentials()));
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
      worker::v1::StepResponse resp;
      out[r] = stub->Step(&ctx, request, &resp);
    });
  }
  for (std::thread& t : threads) t.join();
  return out;
}

int64_t ResidentBytes(int pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (absl::StartsWith(line, "VmRSS:")) {
      long kib = 0;  // NOLINT(google-runtime-int): sscanf's %ld.
      if (std::sscanf(line.c_str(), "VmRSS: %ld", &kib) != 1) return -1;
      return int64_t{kib} * 1024;
    }
  }
  return -1;
}

}  // namespace mneme::testing
