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
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "proto/worker/v1/worker.pb.h"
#include "tests/integration/serving_cluster.h"
#include "tests/testing/command.h"

namespace mneme {
namespace {

using ::mneme::testing::Outcome;
using ::mneme::testing::ServingCluster;
using ::mneme::testing::ServingClusterOptions;

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

std::vector<int64_t> Prompt(int length, int salt) {
  std::vector<int64_t> p(length);
  for (int i = 0; i < length; ++i) p[i] = 3 + (i * 29 + salt * 71) % 600;
  return p;
}

// Both transports: gRPC, and the same-node shared memory (with gRPC as its
// fallback while the socket is unreachable).
class EngramTransportFaultTest : public ::testing::TestWithParam<bool> {};

TEST_P(EngramTransportFaultTest,
       StoreKilledRestartedAndStalledFailOnlyTheirRequests) {
  const absl::Time start = absl::Now();
  ServingClusterOptions options;
  options.engram_shm = GetParam();
  ServingCluster c(options);
  const std::vector<int64_t> prompt = Prompt(12, 3);
  const Outcome baseline = c.Generate(prompt, 6);
  ASSERT_TRUE(baseline.status.ok()) << baseline.status.error_message();
  ASSERT_FALSE(baseline.tokens.empty());

  // Killed: the requests fail with UNAVAILABLE, the workers keep their
  // weights and their group.
  c.KillStore();
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
  if (GetParam()) {
    // The lookups after the restart went through shared memory.
    const std::string log = c.store().process->Stderr();
    EXPECT_NE(log.find("shared-memory transport on " + c.ShmSocket()),
              std::string::npos)
        << log;
    EXPECT_NE(log.find("shared-memory Engram connection from pid"),
              std::string::npos)
        << log;
  }
}

INSTANTIATE_TEST_SUITE_P(Transports, EngramTransportFaultTest,
                         ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "SharedMemory" : "Grpc";
                         });

// Checkpoints pad vocab_size past their tokenizer. The reference indexes
// its compressed-id table with the token ids and cannot take such an id:
// the coordinator refuses it at admission, and a worker given one in a step
// fails that step with INVALID_ARGUMENT (every rank alike) and keeps
// serving.
TEST(EngramFaultTest, IdsPastTheEngramVocabularyAreRefusedNotFatal) {
  const std::string& dir = PaddedCheckpoint();
  ServingClusterOptions options;
  options.checkpoint = dir;
  ServingCluster c(options);
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
