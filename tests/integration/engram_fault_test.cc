// Engram store faults are request faults: a TP 2 group of mneme_worker
// daemons and the coordinator keep running while their engram store daemon
// is killed and restarted, or stopped (SIGSTOP) and continued. The requests
// that need rows while the store is gone fail with UNAVAILABLE; later ones
// succeed with the tokens of an undisturbed run; no worker exits. Also:
// prompt ids past the tokenizer the Engram hashing maps are refused at
// admission with INVALID_ARGUMENT naming the field, and are a failed step,
// not a worker exit, when a worker gets them.

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "proto/grpc/health/v1/health.grpc.pb.h"
#include "proto/serving/v1/serving.grpc.pb.h"
#include "proto/worker/v1/worker.grpc.pb.h"
#include "tests/testing/command.h"
#include "tests/testing/daemon.h"

namespace mneme {
namespace {

using ::mneme::testing::Daemon;
using ::mneme::testing::Launch;
using ::mneme::testing::RunfilePath;
namespace sv1 = ::mneme::serving::v1;

const std::string& Checkpoint() { return testing::TinyModelCheckpoint(); }

// A copy of Checkpoint() whose tokenizer lacks its last token, so that
// vocab_size pads one id past it, as real checkpoints do (the Engram config's
// compressed vocabulary size follows the smaller tokenizer).
const std::string& PaddedCheckpoint() {
  static const std::string* dir = [] {
    auto* d = new std::string(absl::StrCat(getenv("TEST_TMPDIR"), "/padded"));
    std::filesystem::copy(Checkpoint(), *d,
                          std::filesystem::copy_options::recursive);
    const std::string tok_path = *d + "/tokenizer.json";
    std::ifstream tok_in(tok_path);
    nlohmann::ordered_json tok = nlohmann::ordered_json::parse(tok_in);
    tok_in.close();
    nlohmann::ordered_json& vocab = tok["model"]["vocab"];
    std::string last;
    int64_t last_id = -1;
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      if (it.value().get<int64_t>() > last_id) {
        last_id = it.value().get<int64_t>();
        last = it.key();
      }
    }
    vocab.erase(last);
    nlohmann::ordered_json merges = nlohmann::ordered_json::array();
    for (const auto& m : tok["model"]["merges"]) {
      std::string merged = m.get<std::string>();
      merged.erase(std::remove(merged.begin(), merged.end(), ' '),
                   merged.end());
      if (merged != last) merges.push_back(m);
    }
    tok["model"]["merges"] = merges;
    std::ofstream(tok_path) << tok.dump(1);
    const std::string cfg_path = *d + "/config.json";
    std::ifstream cfg_in(cfg_path);
    nlohmann::ordered_json cfg = nlohmann::ordered_json::parse(cfg_in);
    cfg_in.close();
    nlohmann::ordered_json& text =
        cfg.contains("text_config") ? cfg["text_config"] : cfg;
    text["engram_compressed_vocab_size"] =
        text["engram_compressed_vocab_size"].get<int64_t>() - 1;
    std::ofstream(cfg_path) << cfg.dump(1);
    return d;
  }();
  return *dir;
}

struct Outcome {
  grpc::Status status;
  std::vector<int64_t> tokens;
};

class Cluster {
 public:
  explicit Cluster(const std::string& checkpoint = Checkpoint())
      : checkpoint_(checkpoint) {
    StartStore("127.0.0.1:0");
    workers_.resize(2);
    for (int r = 0; r < 2; ++r) {
      Daemon& w = workers_[r];
      // A short lookup deadline so that a stalled store fails a step
      // quickly; the comm timeout is far above it.
      w.argv = {RunfilePath("mneme/services/worker/mneme_worker"),
                "--checkpoint=" + checkpoint_,
                "--listen=127.0.0.1:0",
                "--metrics_listen=none",
                absl::StrCat("--rank=", r),
                "--tp_size=2",
                "--engram_store=" + store_.address,
                "--engram_timeout=1s",
                "--threads=1",
                "--comm_timeout=30s",
                "--kv_cache_bytes=33554432"};
      if (r > 0) w.argv.push_back("--group=" + workers_[0].address);
      Launch(w);
    }
    coordinator_.argv = {
        RunfilePath("mneme/services/coordinator/mneme_coordinator"),
        "--workers=" + workers_[0].address + "," + workers_[1].address,
        "--listen=127.0.0.1:0", "--metrics_listen=none", "--step_timeout=20s"};
    Launch(coordinator_);
    channel_ = grpc::CreateChannel(coordinator_.address,
                                   grpc::InsecureChannelCredentials());
    stub_ = sv1::Serving::NewStub(channel_);
    EXPECT_TRUE(WaitServing(absl::Seconds(60)))
        << coordinator_.process->Stderr();
  }

  // Starts the store on `listen` (its old address after a restart).
  void StartStore(const std::string& listen) {
    store_.argv = {RunfilePath("mneme/services/engram/mneme_engram_store"),
                   "--checkpoint=" + checkpoint_,
                   "--listen=" + listen,
                   "--metrics_listen=none",
                   "--io_threads=2",
                   "--worker_threads=2"};
    Launch(store_);
  }

  bool WaitServing(absl::Duration timeout) {
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

  Outcome Generate(const std::vector<int64_t>& prompt, int max_new) {
    sv1::GenerateRequest req;
    req.mutable_token_ids()->Add(prompt.begin(), prompt.end());
    req.set_max_new_tokens(max_new);
    Outcome o;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    auto reader = stub_->Generate(&ctx, req);
    sv1::GenerateResponse m;
    while (reader->Read(&m)) {
      o.tokens.insert(o.tokens.end(), m.token_ids().begin(),
                      m.token_ids().end());
    }
    o.status = reader->Finish();
    return o;
  }

  // Retries `prompt` until it succeeds (the store coming back); the first
  // success, or the last failure after `timeout`.
  Outcome GenerateWhenBack(const std::vector<int64_t>& prompt, int max_new,
                           absl::Duration timeout) {
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

  // Fails the test if a worker process has exited.
  void ExpectWorkersRunning(const std::string& when) {
    for (size_t r = 0; r < workers_.size(); ++r) {
      const absl::StatusOr<int> exit =
          workers_[r].process->Wait(absl::ZeroDuration());
      EXPECT_FALSE(exit.ok())
          << "worker " << r << " exited (" << *exit << ") " << when << ":\n"
          << workers_[r].process->Stderr();
    }
  }

  int ModelVocabSize() {
    grpc::ClientContext ctx;
    sv1::GetModelInfoResponse info;
    EXPECT_TRUE(stub_->GetModelInfo(&ctx, {}, &info).ok());
    return static_cast<int>(info.vocab_size());
  }

  // Sends `request` to both ranks at once; their statuses.
  std::vector<grpc::Status> StepWorkers(
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

  Daemon& store() { return store_; }
  sv1::Serving::Stub& stub() { return *stub_; }

 private:
  const std::string checkpoint_;
  Daemon store_;
  std::vector<Daemon> workers_;
  Daemon coordinator_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<sv1::Serving::Stub> stub_;
};

std::vector<int64_t> Prompt(int length, int salt) {
  std::vector<int64_t> p(length);
  for (int i = 0; i < length; ++i) p[i] = 3 + (i * 29 + salt * 71) % 600;
  return p;
}

TEST(EngramFaultTest, StoreKilledRestartedAndStalledFailOnlyTheirRequests) {
  const absl::Time start = absl::Now();
  Cluster c;
  const std::vector<int64_t> prompt = Prompt(12, 3);
  const Outcome baseline = c.Generate(prompt, 6);
  ASSERT_TRUE(baseline.status.ok()) << baseline.status.error_message();
  ASSERT_FALSE(baseline.tokens.empty());

  // Killed: the requests fail with UNAVAILABLE, the workers keep their
  // weights and their group.
  c.store().process->Signal(SIGKILL);
  ASSERT_TRUE(c.store().process->Wait(absl::Seconds(10)).ok());
  for (int i = 0; i < 2; ++i) {
    const Outcome o = c.Generate(Prompt(8, 10 + i), 4);
    EXPECT_EQ(o.status.error_code(), grpc::StatusCode::UNAVAILABLE)
        << o.status.error_message();
  }
  c.ExpectWorkersRunning("while the store is down");
  // Restarted on its address: the same request gives the same tokens.
  const std::string address = c.store().address;
  c.StartStore(address);
  ASSERT_EQ(c.store().address, address);
  Outcome o = c.GenerateWhenBack(prompt, 6, absl::Seconds(20));
  ASSERT_TRUE(o.status.ok()) << o.status.error_message();
  EXPECT_EQ(o.tokens, baseline.tokens);

  // Stalled: each lookup times out (1 s) and fails its step only.
  c.store().process->Signal(SIGSTOP);
  const absl::Time stalled = absl::Now();
  o = c.Generate(Prompt(8, 20), 4);
  EXPECT_EQ(o.status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << o.status.error_message();
  // Well within the workers' 30 s comm timeout: no rank waited it out.
  EXPECT_LT(absl::Now() - stalled, absl::Seconds(15));
  c.ExpectWorkersRunning("while the store is stopped");
  c.store().process->Signal(SIGCONT);
  o = c.GenerateWhenBack(prompt, 6, absl::Seconds(20));
  ASSERT_TRUE(o.status.ok()) << o.status.error_message();
  EXPECT_EQ(o.tokens, baseline.tokens);
  c.ExpectWorkersRunning("after the faults");
  EXPECT_LT(absl::Now() - start, absl::Seconds(60));
}

// Checkpoints pad vocab_size past their tokenizer. The reference indexes
// its compressed-id table with the token ids and cannot take such an id:
// the coordinator refuses it at admission, and a worker given one in a step
// fails that step with INVALID_ARGUMENT (every rank alike) and keeps
// serving.
TEST(EngramFaultTest, IdsPastTheEngramVocabularyAreRefusedNotFatal) {
  const std::string& dir = PaddedCheckpoint();
  Cluster c(dir);
  const int64_t padded = c.ModelVocabSize() - 1;
  ASSERT_GT(padded, 10);
  Outcome o = c.Generate({5, padded}, 2);
  EXPECT_EQ(o.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << o.status.error_message();
  EXPECT_NE(o.status.error_message().find("'token_ids'"), std::string::npos)
      << o.status.error_message();
  EXPECT_NE(o.status.error_message().find("tokenizer"), std::string::npos)
      << o.status.error_message();

  // Straight to the workers (as a coordinator without the check would).
  worker::v1::StepRequest step;
  step.set_step_id(1000000);
  worker::v1::SequenceChunk* chunk = step.add_chunks();
  chunk->set_sequence_id(1000000);
  chunk->add_token_ids(5);
  chunk->add_token_ids(padded);
  chunk->set_output(worker::v1::OUTPUT_NONE);
  for (const grpc::Status& st : c.StepWorkers(step)) {
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << st.error_message();
  }
  c.ExpectWorkersRunning("after an id past the Engram vocabulary");
  o = c.Generate(Prompt(6, 1), 2);
  EXPECT_TRUE(o.status.ok()) << o.status.error_message();
}

}  // namespace
}  // namespace mneme
