// The model on one process: config validation, load errors (a config that
// does not match the tensors, a missing shard, a TP size that does not
// divide the model), step validation that changes nothing, the KV cache
// budget, batching and chunking invariance, and weight slicing.

#include "model/model.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "checkpoint/model_config.h"
#include "checkpoint/safetensors_reader.h"
#include "checkpoint/safetensors_writer.h"
#include "checkpoint/sharded_checkpoint.h"
#include "engram_store/client/engram_client.h"
#include "engram_store/client/in_process_engram_client.h"
#include "engram_store/engram_store.h"
#include "formats/e4m3.h"
#include "gmock/gmock.h"
#include "gpu/cpu/cpu_backend.h"
#include "gpu/host_weight.h"
#include "gtest/gtest.h"
#include "model/layers/attention.h"
#include "model/model_config.h"
#include "model/weight_loader.h"
#include "nlohmann/json.hpp"
#include "services/worker/local_model.h"
#include "tools/quant/expert_caster.h"
#include "tools/synthetic/release_checkpoint.h"

namespace mneme::model {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using worker::LocalModel;
using worker::LocalModelOptions;

std::string TempDir(const std::string& name) {
  return absl::StrCat(getenv("TEST_TMPDIR"), "/", name);
}

std::string MakeTiny(synthetic::ReleaseArch arch, const std::string& name) {
  std::string dir = TempDir(name);
  synthetic::ReleaseCheckpointOptions o;
  o.out_dir = dir;
  o.arch = arch;
  o.seed = 3;
  o.threads = 1;
  const absl::Status st = synthetic::MakeReleaseCheckpoint(o);
  EXPECT_TRUE(st.ok()) << st;
  return dir;
}

// The tiny V4.1-Flash model, written once.
const std::string& TinyCheckpoint() {
  static const std::string* dir =
      new std::string(MakeTiny(synthetic::ReleaseArch::kV41Flash, "tiny-v41"));
  return *dir;
}

// The tiny V4-Flash model, written once.
const std::string& TinyV4Checkpoint() {
  static const std::string* dir =
      new std::string(MakeTiny(synthetic::ReleaseArch::kV4Flash, "tiny-v4"));
  return *dir;
}

// A copy of the tiny model whose config.json is edited by `edit`.
std::string EditedCopy(const std::string& name,
                       void (*edit)(nlohmann::json& text_config)) {
  std::string dir = TempDir(name);
  fs::remove_all(dir);
  fs::copy(TinyCheckpoint(), dir, fs::copy_options::recursive);
  nlohmann::json config;
  {
    std::ifstream in(dir + "/config.json");
    in >> config;
  }
  edit(config["text_config"]);
  std::ofstream(dir + "/config.json") << config.dump(2);
  return dir;
}

absl::StatusOr<std::unique_ptr<LocalModel>> Open(
    const std::string& dir, int64_t kv_bytes = 16 << 20,
    bool dequantize_weights = false) {
  LocalModelOptions o;
  o.checkpoint_dir = dir;
  o.threads = 1;
  o.dequantize_weights = dequantize_weights;
  o.model.kv_cache.budget_bytes = kv_bytes;
  return LocalModel::Create(o);
}

SequenceChunk Chunk(
    uint64_t id, std::vector<int64_t> tokens, int64_t start,
    SequenceChunk::Logits logits = SequenceChunk::Logits::kLast) {
  SequenceChunk c;
  c.sequence_id = id;
  c.tokens = std::move(tokens);
  c.start_position = start;
  c.logits = logits;
  return c;
}

std::vector<int64_t> Tokens(int n, int salt) {
  std::vector<int64_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = 3 + (i * 53 + salt * 17) % 600;
  return t;
}

float MaxDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    m = std::max(m, std::fabs(a[i] - b[i]));
  }
  return m;
}

// The logits (every row) of sequence `id`'s prompt fed one chunk a step,
// the chunks ending at `ends` (ascending, the last at tokens.size()).
absl::StatusOr<std::vector<float>> ChunkedLogits(
    Model& model, uint64_t id, const std::vector<int64_t>& tokens,
    const std::vector<int64_t>& ends) {
  std::vector<float> got;
  int64_t begin = 0;
  for (const int64_t end : ends) {
    if (end <= begin) continue;
    StepInput in;
    in.chunks.push_back(Chunk(
        id, std::vector<int64_t>(tokens.begin() + begin, tokens.begin() + end),
        begin, SequenceChunk::Logits::kAll));
    absl::StatusOr<StepOutput> o = model.Step(in);
    if (!o.ok()) return o.status();
    got.insert(got.end(), o->logits[0].begin(), o->logits[0].end());
    begin = end;
  }
  return got;
}

// ---- config ------------------------------------------------------------

absl::StatusOr<ModelDims> Dims(const std::string& text_config) {
  absl::StatusOr<std::unique_ptr<checkpoint::ModelConfig>> c =
      checkpoint::ModelConfig::Parse(text_config, "config.json");
  if (!c.ok()) return c.status();
  return LoadModelDims(**c);
}

// A V4 layout at miniature size (one window-only, one ratio-4 layer with an
// indexer, one MTP layer).
constexpr char kGoodConfig[] = R"({
  "model_type": "deepseek_v4",
  "vocab_size": 100, "hidden_size": 64, "num_hidden_layers": 2,
  "num_attention_heads": 8, "head_dim": 32, "qk_rope_head_dim": 8,
  "q_lora_rank": 32, "o_lora_rank": 32, "o_groups": 4, "hc_mult": 4,
  "sliding_window": 8, "n_routed_experts": 8, "num_experts_per_tok": 2,
  "n_shared_experts": 1, "moe_intermediate_size": 32,
  "num_nextn_predict_layers": 1, "compress_ratios": [0, 4, 0],
  "index_n_heads": 4, "index_head_dim": 16, "index_topk": 4,
  "num_hash_layers": 1, "rope_theta": 10000, "compress_rope_theta": 160000,
  "rope_scaling": {"type": "yarn", "factor": 16,
                   "original_max_position_embeddings": 65536,
                   "beta_fast": 32, "beta_slow": 1}})";

// The same in the official inference code's spelling.
constexpr char kInferenceConfig[] = R"({
  "vocab_size": 100, "dim": 64, "n_layers": 2,
  "n_heads": 8, "head_dim": 32, "rope_head_dim": 8,
  "q_lora_rank": 32, "o_lora_rank": 32, "o_groups": 4, "hc_mult": 4,
  "window_size": 8, "n_routed_experts": 8, "n_activated_experts": 2,
  "n_shared_experts": 1, "moe_inter_dim": 32,
  "n_mtp_layers": 1, "compress_ratios": [0, 4, 0],
  "index_n_heads": 4, "index_head_dim": 16, "index_topk": 4,
  "n_hash_layers": 1, "rope_theta": 10000, "compress_rope_theta": 160000,
  "original_seq_len": 65536, "rope_factor": 16, "beta_fast": 32,
  "beta_slow": 1})";

TEST(ModelDimsTest, ReadsKeysAndDefaults) {
  absl::StatusOr<ModelDims> d = Dims(kGoodConfig);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->arch, Arch::kV4);
  EXPECT_EQ(d->hidden_size, 64);
  EXPECT_EQ(d->compress_ratios, (std::vector<int>{0, 4}));
  EXPECT_EQ(d->draft_compress_ratios, (std::vector<int>{0}));
  EXPECT_EQ(d->hc_mult, 4);
  EXPECT_EQ(d->fp8_block_rows, 128);
  EXPECT_TRUE(d->HasIndexer(1));
  EXPECT_FALSE(d->HasIndexer(0));
  EXPECT_EQ(d->CacheSource(1), 1);
  EXPECT_EQ(d->CacheSource(0), -1);
  EXPECT_EQ(d->yarn.original_seq_len, 65536);
  EXPECT_TRUE(CheckTensorParallel(*d, 4).ok());
}

TEST(ModelDimsTest, TheInferenceSpellingReadsTheSame) {
  absl::StatusOr<ModelDims> hf = Dims(kGoodConfig);
  absl::StatusOr<ModelDims> inf = Dims(kInferenceConfig);
  ASSERT_TRUE(hf.ok() && inf.ok()) << inf.status();
  EXPECT_EQ(inf->hidden_size, hf->hidden_size);
  EXPECT_EQ(inf->num_layers, hf->num_layers);
  EXPECT_EQ(inf->sliding_window, hf->sliding_window);
  EXPECT_EQ(inf->experts_per_token, hf->experts_per_token);
  EXPECT_EQ(inf->num_hash_layers, hf->num_hash_layers);
  EXPECT_EQ(inf->num_draft_layers, hf->num_draft_layers);
  EXPECT_EQ(inf->yarn.original_seq_len, hf->yarn.original_seq_len);
  EXPECT_EQ(inf->RopeFrequencies(1), hf->RopeFrequencies(1));
}

// YaRN on compressed layers only, with the official correction range:
// V4-Flash (rope dim 64, base 160000) interpolates dims 15..25.
TEST(ModelDimsTest, YarnOnCompressedLayersOnly) {
  std::string text = kGoodConfig;
  auto replace = [&](const std::string& from, const std::string& to) {
    ASSERT_NE(text.find(from), std::string::npos) << from;
    text.replace(text.find(from), from.size(), to);
  };
  replace("\"qk_rope_head_dim\": 8", "\"qk_rope_head_dim\": 64");
  replace("\"head_dim\": 32", "\"head_dim\": 128");
  replace("\"index_head_dim\": 16", "\"index_head_dim\": 64");
  absl::StatusOr<ModelDims> d = Dims(text);
  ASSERT_TRUE(d.ok()) << d.status();
  const std::vector<double> plain = d->RopeFrequencies(0);
  const std::vector<double> yarn = d->RopeFrequencies(1);
  ASSERT_EQ(plain.size(), 32u);
  for (int i = 0; i < 32; ++i) {
    const double base = std::pow(160000.0, -2.0 * i / 64);
    EXPECT_DOUBLE_EQ(plain[i], std::pow(10000.0, -2.0 * i / 64));
    if (i <= 15) {
      EXPECT_NEAR(yarn[i], base, 1e-15) << i;
    }
    if (i >= 25) {
      EXPECT_NEAR(yarn[i], base / 16, 1e-15) << i;
    }
    if (i > 15 && i < 25) {
      EXPECT_LT(yarn[i], base);
      EXPECT_GT(yarn[i], base / 16);
    }
  }
}

TEST(ModelDimsTest, RejectsBadValuesNamingTheKey) {
  struct Case {
    std::string from, to, key;
  };
  const std::vector<Case> cases = {
      {"\"o_groups\": 4", "\"o_groups\": 3", "o_groups"},
      {"\"qk_rope_head_dim\": 8", "\"qk_rope_head_dim\": 40",
       "qk_rope_head_dim"},
      // One entry per main layer and one per draft layer.
      {"\"compress_ratios\": [0, 4, 0]", "\"compress_ratios\": [0, 4]",
       "compress_ratios"},
      {"\"compress_ratios\": [0, 4, 0]", "\"compress_ratios\": [0, 4, 4]",
       "compress_ratios"},
      {"\"num_experts_per_tok\": 2", "\"num_experts_per_tok\": 9",
       "num_experts_per_tok"},
      {"\"hidden_size\": 64", "\"hidden_size\": -1", "hidden_size"},
      {"\"vocab_size\": 100, ", "", "vocab_size"},
      {"\"hc_mult\": 4", "\"hc_mult\": 1", "hc_mult"},
      {"\"model_type\": \"deepseek_v4\"", "\"model_type\": \"llama\"",
       "model_type"},
      {"\"index_topk\": 4", "\"index_topk\": 0", "index_n_heads"},
      {"\"index_head_dim\": 16", "\"index_head_dim\": 64", "index_head_dim"},
      {"\"n_shared_experts\": 1", "\"n_shared_experts\": 2",
       "n_shared_experts"},
      {"\"type\": \"yarn\"", "\"type\": \"linear\"", "rope_scaling"},
      {"\"num_hash_layers\": 1", "\"num_hash_layers\": 3", "num_hash_layers"},
  };
  for (const Case& c : cases) {
    std::string text = kGoodConfig;
    ASSERT_NE(text.find(c.from), std::string::npos) << c.from;
    text.replace(text.find(c.from), c.from.size(), c.to);
    absl::StatusOr<ModelDims> d = Dims(text);
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument) << c.key;
    EXPECT_THAT(d.status().message(), HasSubstr(c.key));
  }
}

// V4.1: consumers read the latest kv source of the same ratio, reuse the
// latest index source's selection, and the candidate blocks must cover
// index_topk.
constexpr char kV41Config[] = R"({
  "model_type": "deepseek_v41", "text_config": {
  "vocab_size": 100, "hidden_size": 64, "num_hidden_layers": 6,
  "num_attention_heads": 8, "head_dim": 32, "qk_rope_head_dim": 8,
  "q_lora_rank": 32, "o_lora_rank": 32, "o_groups": 4, "hc_mult": 4,
  "sliding_window": 8, "n_routed_experts": 8, "num_experts_per_tok": 2,
  "n_shared_experts": 1, "moe_intermediate_size": 32,
  "compress_ratios": [0, 2, 2, 1, 1, 1],
  "kv_source_layer_ids": [1, 3], "index_source_layer_ids": [1, 3, 5],
  "candidate_source_layer_id": 3, "candidate_topk_blocks": 4,
  "candidate_block_size": 4, "index_n_heads": 4, "index_head_dim": 16,
  "index_topk": 8, "rms_norm_eps": 1e-20}})";

TEST(ModelDimsTest, V41SourcesAndSelections) {
  absl::StatusOr<ModelDims> d = Dims(kV41Config);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->arch, Arch::kV41);
  EXPECT_EQ(d->rms_norm_eps, 1e-20f);
  EXPECT_EQ(d->CacheSource(0), -1);
  EXPECT_EQ(d->CacheSource(2), 1);
  EXPECT_EQ(d->CacheSource(4), 3);
  EXPECT_TRUE(d->HasCompressor(3));
  EXPECT_FALSE(d->HasCompressor(4));
  EXPECT_TRUE(d->HasIndexer(5));
  EXPECT_FALSE(d->HasIndexer(2));
  EXPECT_TRUE(d->OwnsIndexKeys(1));
  struct Case {
    std::string from, to, key;
  };
  const std::vector<Case> cases = {
      // Layer 2 (ratio 1) would read layer 1's ratio-2 cache.
      {"[0, 2, 2, 1, 1, 1]", "[0, 2, 1, 1, 1, 1]", "compress_ratios"},
      {"\"kv_source_layer_ids\": [1, 3]", "\"kv_source_layer_ids\": [3]",
       "kv_source_layer_ids"},
      {"\"index_source_layer_ids\": [1, 3, 5]",
       "\"index_source_layer_ids\": [3, 5]", "index_source_layer_ids"},
      {"\"candidate_topk_blocks\": 4", "\"candidate_topk_blocks\": 2",
       "candidate_topk_blocks"},
      {"\"candidate_source_layer_id\": 3", "\"candidate_source_layer_id\": 2",
       "candidate_source_layer_id"},
  };
  for (const Case& c : cases) {
    std::string text = kV41Config;
    ASSERT_NE(text.find(c.from), std::string::npos) << c.from;
    text.replace(text.find(c.from), c.from.size(), c.to);
    absl::StatusOr<ModelDims> bad = Dims(text);
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << c.key;
    EXPECT_THAT(bad.status().message(), HasSubstr(c.key));
  }
}

TEST(ModelDimsTest, TensorParallelMustDivideHeadsGroupsExperts) {
  absl::StatusOr<ModelDims> d = Dims(kGoodConfig);
  ASSERT_TRUE(d.ok());
  const absl::Status st = CheckTensorParallel(*d, 3);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("does not divide"));
  EXPECT_EQ(CheckTensorParallel(*d, 0).code(),
            absl::StatusCode::kInvalidArgument);
}

// ---- selection ---------------------------------------------------------

TEST(SelectionTest, TopKOfVisibleEntriesLowerIndexOnTies) {
  const std::vector<float> scores = {0.5f, 2.0f, 2.0f, -1.0f, 3.0f, 9.0f};
  // Entry 5 is not visible yet; 1 and 2 tie, 1 wins.
  EXPECT_EQ(SelectEntries(scores, 5, 2, nullptr, 1),
            (std::vector<int32_t>{1, 4}));
  EXPECT_EQ(SelectEntries(scores, 5, 3, nullptr, 1),
            (std::vector<int32_t>{1, 2, 4}));
  EXPECT_EQ(SelectEntries(scores, 2, 4, nullptr, 1),
            (std::vector<int32_t>{0, 1}));
  EXPECT_TRUE(SelectEntries(scores, 0, 4, nullptr, 1).empty());
  // Among candidate blocks of 2 only: block 0 and 2 (entries 0, 1, 4).
  const std::vector<int32_t> blocks = {0, 2};
  EXPECT_EQ(SelectEntries(scores, 5, 2, &blocks, 2),
            (std::vector<int32_t>{1, 4}));
}

TEST(SelectionTest, CandidateBlocksPinTheNewestAndDropUnreachable) {
  const std::vector<float> scores = {5, 1, 4, 0, -2, -3, 0, 0};
  // 7 visible entries in blocks of 2: block scores 5, 4, -2, pinned 3.
  EXPECT_EQ(SelectCandidateBlocks(scores, 7, 2, 2),
            (std::vector<int32_t>{0, 3}));
  EXPECT_EQ(SelectCandidateBlocks(scores, 7, 3, 2),
            (std::vector<int32_t>{0, 1, 3}));
  // Fewer reachable blocks than asked for.
  EXPECT_EQ(SelectCandidateBlocks(scores, 3, 8, 2),
            (std::vector<int32_t>{0, 1}));
  EXPECT_TRUE(SelectCandidateBlocks(scores, 0, 8, 2).empty());
}

// ---- load errors ---------------------------------------------------------

TEST(ModelLoadTest, ConfigThatDoesNotMatchTheTensors) {
  const std::string dir = EditedCopy(
      "wrong-q-lora", [](nlohmann::json& t) { t["q_lora_rank"] = 96; });
  absl::StatusOr<std::unique_ptr<LocalModel>> m = Open(dir);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(m.status().message(), HasSubstr("wq_a"));
  EXPECT_THAT(m.status().message(), HasSubstr("the config implies"));
}

TEST(ModelLoadTest, MissingShard) {
  const std::string dir = TempDir("missing-shard");
  fs::remove_all(dir);
  fs::copy(TinyCheckpoint(), dir, fs::copy_options::recursive);
  std::vector<fs::path> shards;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() == ".safetensors") shards.push_back(e.path());
  }
  std::sort(shards.begin(), shards.end());
  ASSERT_GE(shards.size(), 3u);
  fs::remove(shards.back());
  absl::StatusOr<std::unique_ptr<LocalModel>> m = Open(dir);
  EXPECT_FALSE(m.ok());
  EXPECT_THAT(m.status().message(),
              HasSubstr(shards.back().filename().string()));
}

TEST(ModelLoadTest, TensorParallelSizeThatDoesNotDivide) {
  absl::StatusOr<std::unique_ptr<gpu::CpuBackend>> backend =
      gpu::CpuBackend::Create({});
  ASSERT_TRUE(backend.ok());
  ModelOptions o;
  o.checkpoint_dir = TinyCheckpoint();
  o.tp_rank = 0;
  o.tp_size = 3;
  absl::StatusOr<std::unique_ptr<Model>> m =
      Model::Create(o, **backend, nullptr, nullptr);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(m.status().message(), HasSubstr("does not divide the 8"));
}

TEST(ModelLoadTest, EngramLayersNeedAClient) {
  absl::StatusOr<std::unique_ptr<gpu::CpuBackend>> backend =
      gpu::CpuBackend::Create({});
  ASSERT_TRUE(backend.ok());
  ModelOptions o;
  o.checkpoint_dir = TinyCheckpoint();
  absl::StatusOr<std::unique_ptr<Model>> m =
      Model::Create(o, **backend, nullptr, nullptr);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(m.status().message(), HasSubstr("Engram"));
}

// ---- steps -----------------------------------------------------------------

class ModelStepTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<LocalModel>> m = Open(TinyCheckpoint());
    ASSERT_TRUE(m.ok()) << m.status();
    local_ = *std::move(m);
  }
  Model& model() { return local_->model(); }

  std::unique_ptr<LocalModel> local_;
};

TEST_F(ModelStepTest, InvalidStepsChangeNothing) {
  StepInput ok;
  ok.chunks.push_back(Chunk(1, Tokens(5, 0), 0));
  ASSERT_TRUE(model().Step(ok).ok());
  const int free_blocks = model().kv_cache().free_blocks();

  std::vector<StepInput> bad(6);
  bad[0].chunks.push_back(Chunk(1, {}, 5));  // No tokens.
  bad[1].chunks.push_back(
      Chunk(1, {3, model().dims().vocab_size}, 5));      // Past vocab.
  bad[2].chunks.push_back(Chunk(1, {3}, 7));             // Wrong start.
  bad[3].chunks.push_back(Chunk(2, {3}, 4));             // New, not at 0.
  bad[4].chunks = {Chunk(3, {3}, 0), Chunk(3, {4}, 0)};  // Repeated.
  bad[5].chunks.push_back(Chunk(3, {3}, 0));             // Bad sampling.
  bad[5].chunks[0].sample = true;
  bad[5].chunks[0].sampling.temperature = -1.0f;
  for (const StepInput& in : bad) {
    EXPECT_EQ(model().Step(in).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(model().SequenceLength(1), 5);
  EXPECT_EQ(model().SequenceLength(2), -1);
  EXPECT_EQ(model().SequenceLength(3), -1);
  EXPECT_EQ(model().num_sequences(), 1);
  EXPECT_EQ(model().kv_cache().free_blocks(), free_blocks);
  model().Release(1);
  EXPECT_EQ(model().kv_cache().free_blocks(), model().kv_cache().num_blocks());
}

// An Engram client that fails every call while `down` is set (a store that
// is down or stalled) and forwards to the store otherwise; its Prefetch
// takes `prefetch_delay` first (a slow store).
class FlakyEngramClient final : public engram::EngramClient {
 public:
  explicit FlakyEngramClient(engram::EngramClient* real) : real_(real) {}

  absl::StatusOr<engram::v1::LookupResponse> Lookup(
      const engram::v1::LookupRequest& request) override {
    if (down) return absl::DeadlineExceededError("the store stalled");
    return real_->Lookup(request);
  }
  absl::StatusOr<engram::v1::LookupResponse> LookupStream(
      const engram::v1::LookupRequest& request) override {
    if (down) return absl::UnavailableError("the store is down");
    return real_->LookupStream(request);
  }
  absl::StatusOr<engram::v1::PrefetchResponse> Prefetch(
      const engram::v1::PrefetchRequest& request) override {
    absl::SleepFor(prefetch_delay);
    ++prefetches;
    if (down) return absl::UnavailableError("the store is down");
    return real_->Prefetch(request);
  }
  absl::StatusOr<engram::v1::DescribeResponse> Describe() override {
    return real_->Describe();
  }

  std::atomic<bool> down{false};
  std::atomic<int> prefetches{0};
  absl::Duration prefetch_delay = absl::ZeroDuration();

 private:
  engram::EngramClient* const real_;
};

// A failed Engram lookup fails the step as "not run": nothing changes, and
// the same model serves the next steps with the logits of an undisturbed
// run. Prefetch hints never block the caller.
TEST(ModelEngramFaultTest, FailedLookupIsAStepThatDidNotRun) {
  absl::StatusOr<std::unique_ptr<LocalModel>> reference =
      Open(TinyCheckpoint());
  ASSERT_TRUE(reference.ok()) << reference.status();
  StepInput prefill, decode;
  prefill.chunks.push_back(Chunk(1, Tokens(6, 4), 0));
  decode.chunks.push_back(Chunk(1, {9}, 6));
  absl::StatusOr<StepOutput> want_prefill = (*reference)->model().Step(prefill);
  absl::StatusOr<StepOutput> want_decode = (*reference)->model().Step(decode);
  ASSERT_TRUE(want_prefill.ok() && want_decode.ok());

  engram::EngramStoreOptions so;
  so.checkpoint_dir = TinyCheckpoint();
  so.ram_cache_bytes = uint64_t{16} << 20;
  so.io_threads = 1;
  absl::StatusOr<std::unique_ptr<engram::EngramStore>> store =
      engram::EngramStore::Create(so);
  ASSERT_TRUE(store.ok()) << store.status();
  engram::InProcessEngramClient real(store->get(), engram::RequestLimits{});
  FlakyEngramClient client(&real);
  absl::StatusOr<std::unique_ptr<gpu::CpuBackend>> backend =
      gpu::CpuBackend::Create({.threads = 1});
  ASSERT_TRUE(backend.ok());
  ModelOptions o;
  o.checkpoint_dir = TinyCheckpoint();
  o.kv_cache.budget_bytes = 16 << 20;
  absl::StatusOr<std::unique_ptr<Model>> m =
      Model::Create(o, **backend, nullptr, &client);
  ASSERT_TRUE(m.ok()) << m.status();
  Model& model = **m;
  ASSERT_FALSE(model.dims().engram_layers.empty());
  const int free_blocks = model.kv_cache().free_blocks();

  client.down = true;
  absl::StatusOr<StepOutput> out = model.Step(prefill);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kUnavailable)
      << out.status();
  EXPECT_TRUE(IsStepNotRun(out.status())) << out.status();
  EXPECT_EQ(model.SequenceLength(1), -1);
  EXPECT_EQ(model.kv_cache().free_blocks(), free_blocks);

  client.down = false;
  out = model.Step(prefill);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_LE(MaxDiff(out->logits[0], want_prefill->logits[0]), 1e-6f);

  client.down = true;
  out = model.Step(decode);
  EXPECT_TRUE(IsStepNotRun(out.status())) << out.status();
  EXPECT_EQ(model.SequenceLength(1), 6);

  // A slow store: the hints are handed over, not waited for.
  client.prefetch_delay = absl::Seconds(1);
  PrefetchHint hint;
  hint.tokens = Tokens(4, 9);
  const absl::Time before = absl::Now();
  model.Prefetch({hint});
  model.Prefetch({hint});
  EXPECT_LT(absl::Now() - before, absl::Milliseconds(500));

  client.down = false;
  out = model.Step(decode);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_LE(MaxDiff(out->logits[0], want_decode->logits[0]), 1e-6f);
  EXPECT_EQ(model.SequenceLength(1), 7);
  // An invalid id is still InvalidArgument, not a step that did not run.
  StepInput bad;
  bad.chunks.push_back(Chunk(2, {3, model.dims().vocab_size}, 0));
  out = model.Step(bad);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(IsStepNotRun(out.status()));
  // The model's Engram vocabulary is the checkpoint's tokenizer.
  EXPECT_GT(model.engram_vocab_size(), 0);
  EXPECT_LE(model.engram_vocab_size(), model.dims().vocab_size);
}

// Prefill, chunked prefill and token-by-token decode compute the same
// function, at split points that cross the window, the compression blocks
// and the indexer's selection (index_topk 16 drops entries past 64 tokens at
// ratio 4, past 32 at ratio 2).
class ModelChunkingTest : public ::testing::TestWithParam<bool> {};

TEST_P(ModelChunkingTest, PrefillEqualsChunkedPrefillEqualsDecode) {
  const std::string& dir = GetParam() ? TinyV4Checkpoint() : TinyCheckpoint();
  absl::StatusOr<std::unique_ptr<LocalModel>> m = Open(dir, 64 << 20);
  ASSERT_TRUE(m.ok()) << m.status();
  Model& model = (*m)->model();
  const int64_t v = model.dims().vocab_size;
  const std::vector<int64_t> a = Tokens(150, 7);
  StepInput whole;
  whole.chunks.push_back(Chunk(1, a, 0, SequenceChunk::Logits::kAll));
  absl::StatusOr<StepOutput> want = model.Step(whole);
  ASSERT_TRUE(want.ok()) << want.status();
  model.Release(1);
  uint64_t id = 10;
  for (const std::vector<int>& splits :
       std::vector<std::vector<int>>{{1},
                                     {3, 4, 5},
                                     {15, 16, 17},
                                     {63, 64, 65},
                                     {127, 128, 129},
                                     {1, 2, 3, 4, 5, 6, 7, 8, 9, 100},
                                     {149}}) {
    SCOPED_TRACE(testing::Message() << "splits from " << splits[0]);
    ++id;
    std::vector<int64_t> ends(splits.begin(), splits.end());
    ends.push_back(static_cast<int64_t>(a.size()));
    absl::StatusOr<std::vector<float>> got = ChunkedLogits(model, id, a, ends);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->size(), a.size() * v);
    EXPECT_LE(MaxDiff(*got, want->logits[0]), 2e-4);
    model.Release(id);
  }
  // Decode token by token after a prefill of 60.
  ++id;
  std::vector<float> got;
  StepInput pre;
  pre.chunks.push_back(Chunk(id,
                             std::vector<int64_t>(a.begin(), a.begin() + 60), 0,
                             SequenceChunk::Logits::kAll));
  absl::StatusOr<StepOutput> o = model.Step(pre);
  ASSERT_TRUE(o.ok());
  got = o->logits[0];
  for (size_t p = 60; p < a.size(); ++p) {
    StepInput in;
    in.chunks.push_back(Chunk(id, {a[p]}, static_cast<int64_t>(p)));
    o = model.Step(in);
    ASSERT_TRUE(o.ok()) << o.status();
    got.insert(got.end(), o->logits[0].begin(), o->logits[0].end());
  }
  EXPECT_LE(MaxDiff(got, want->logits[0]), 2e-4);
}

// A chunk long enough that its compressors pool their entries in several
// passes (a pass pools and reads from the state at most 4096 rows: about
// 512 entries at ratio 4 with overlap, 2048 at ratio 2) computes what short
// chunks, each one pass, compute; and so do two such chunks of two sequences in
// one step, each after a prefill that ends inside a block, whose passes run
// from one chunk's entries into the other's (which read their sequence's
// state).
TEST_P(ModelChunkingTest, LongChunkPoolsItsEntriesInPasses) {
  const std::string& dir = GetParam() ? TinyV4Checkpoint() : TinyCheckpoint();
  absl::StatusOr<std::unique_ptr<LocalModel>> m = Open(dir, 256 << 20);
  ASSERT_TRUE(m.ok()) << m.status();
  Model& model = (*m)->model();
  const int64_t v = model.dims().vocab_size;
  const std::vector<int64_t> a = Tokens(4300, 5);
  StepInput whole;
  whole.chunks.push_back(Chunk(1, a, 0, SequenceChunk::Logits::kAll));
  absl::StatusOr<StepOutput> want = model.Step(whole);
  ASSERT_TRUE(want.ok()) << want.status();
  ASSERT_EQ(want->logits[0].size(), a.size() * v);
  std::vector<int64_t> ends;
  for (int64_t end = 700; end < static_cast<int64_t>(a.size()); end += 700) {
    ends.push_back(end);
  }
  ends.push_back(static_cast<int64_t>(a.size()));
  absl::StatusOr<std::vector<float>> got = ChunkedLogits(model, 2, a, ends);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_LE(MaxDiff(*got, want->logits[0]), 2e-4);
  model.Release(2);

  // Sequences 3 and 4: prompts a[0, 2132) and a[0, 2500) (their logits
  // are the first rows of `want`), prefilled to 101 and 103, the rest in
  // one step. At ratio 4 (V4) sequence 3's entries and sequence 4's first
  // fill a pass (508 entries of 8 rows and 10 state rows, then 8 rows and
  // 14 state rows: 4,096), so sequence 4's second entry starts the next
  // pass and reads there the state rows of positions before its chunk; at
  // other ratios a pass runs from one sequence's entries into the other's.
  const int64_t pre[2] = {101, 103}, len[2] = {2132, 2500};
  for (int s = 0; s < 2; ++s) {
    ASSERT_TRUE(ChunkedLogits(model, 3 + s, a, {pre[s]}).ok());
  }
  StepInput both;
  for (int s = 0; s < 2; ++s) {
    both.chunks.push_back(Chunk(
        3 + s, std::vector<int64_t>(a.begin() + pre[s], a.begin() + len[s]),
        pre[s], SequenceChunk::Logits::kAll));
  }
  absl::StatusOr<StepOutput> o = model.Step(both);
  ASSERT_TRUE(o.ok()) << o.status();
  for (int s = 0; s < 2; ++s) {
    SCOPED_TRACE(testing::Message() << "sequence " << 3 + s);
    EXPECT_LE(MaxDiff(o->logits[s],
                      std::vector<float>(want->logits[0].begin() + pre[s] * v,
                                         want->logits[0].begin() + len[s] * v)),
              2e-4);
  }
}

// Decode-size chunks (at most max_speculative_tokens + 1 tokens) attend their
// keys where they are in the pool, every such chunk of a step in one call;
// longer chunks gather theirs. A step mixing both, at positions before and
// past the window, the compression blocks and the indexer's selection, and
// the steps after it (which read the ring slots it wrote), give each
// sequence the logits of its whole prompt in one prefill.
TEST_P(ModelChunkingTest, DecodeChunksOfAStepAttendInPlaceTogether) {
  LocalModelOptions o;
  o.checkpoint_dir = GetParam() ? TinyV4Checkpoint() : TinyCheckpoint();
  o.threads = 1;
  o.model.kv_cache.budget_bytes = 64 << 20;
  o.model.max_speculative_tokens = 3;
  absl::StatusOr<std::unique_ptr<LocalModel>> m = LocalModel::Create(o);
  ASSERT_TRUE(m.ok()) << m.status();
  Model& model = (*m)->model();
  const int64_t v = model.dims().vocab_size;
  // Sequence ids 1-4, their tokens, their prefills (0 = none).
  const std::vector<std::vector<int64_t>> seqs = {Tokens(48, 1), Tokens(84, 2),
                                                  Tokens(24, 3), Tokens(12, 4)};
  const std::vector<int> prefill = {40, 70, 20, 0};
  // Per step, per sequence: tokens to take (0 = not in the step).
  const std::vector<std::vector<int>> steps = {
      {1, 4, 1, 9}, {1, 1, 1, 1}, {3, 1, 1, 2}, {1, 5, 1, 0}};
  std::vector<std::vector<float>> want(seqs.size());
  for (size_t s = 0; s < seqs.size(); ++s) {
    StepInput whole;
    whole.chunks.push_back(
        Chunk(100 + s, seqs[s], 0, SequenceChunk::Logits::kAll));
    absl::StatusOr<StepOutput> out = model.Step(whole);
    ASSERT_TRUE(out.ok()) << out.status();
    want[s] = out->logits[0];
    model.Release(100 + s);
  }
  std::vector<int64_t> at(seqs.size(), 0);
  for (size_t s = 0; s < seqs.size(); ++s) {
    if (prefill[s] == 0) continue;
    StepInput in;
    in.chunks.push_back(Chunk(
        1 + s,
        std::vector<int64_t>(seqs[s].begin(), seqs[s].begin() + prefill[s]),
        0));
    ASSERT_TRUE(model.Step(in).ok());
    at[s] = prefill[s];
  }
  for (size_t i = 0; i < steps.size(); ++i) {
    SCOPED_TRACE(testing::Message() << "step " << i);
    StepInput in;
    std::vector<size_t> which;
    for (size_t s = 0; s < seqs.size(); ++s) {
      if (steps[i][s] == 0) continue;
      ASSERT_LE(at[s] + steps[i][s], static_cast<int64_t>(seqs[s].size()));
      const auto begin = seqs[s].begin() + at[s];
      in.chunks.push_back(
          Chunk(1 + s, std::vector<int64_t>(begin, begin + steps[i][s]), at[s],
                SequenceChunk::Logits::kAll));
      which.push_back(s);
    }
    absl::StatusOr<StepOutput> out = model.Step(in);
    ASSERT_TRUE(out.ok()) << out.status();
    for (size_t c = 0; c < which.size(); ++c) {
      const size_t s = which[c];
      const auto first = want[s].begin() + at[s] * v;
      EXPECT_LE(MaxDiff(out->logits[c],
                        std::vector<float>(first, first + steps[i][s] * v)),
                2e-4)
          << "sequence " << s + 1;
      at[s] += steps[i][s];
    }
  }
}

INSTANTIATE_TEST_SUITE_P(BothArchitectures, ModelChunkingTest,
                         ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? "V4Flash" : "V41Flash";
                         });

TEST_F(ModelStepTest, BatchingAndChunkingDoNotChangeLogits) {
  const std::vector<int64_t> a = Tokens(37, 1), b = Tokens(11, 2);
  StepInput alone_a, alone_b, both;
  alone_a.chunks.push_back(Chunk(1, a, 0));
  alone_b.chunks.push_back(Chunk(2, b, 0));
  both.chunks = {Chunk(3, a, 0), Chunk(4, b, 0)};
  absl::StatusOr<StepOutput> oa = model().Step(alone_a);
  absl::StatusOr<StepOutput> ob = model().Step(alone_b);
  absl::StatusOr<StepOutput> o2 = model().Step(both);
  ASSERT_TRUE(oa.ok() && ob.ok() && o2.ok());
  EXPECT_LE(MaxDiff(oa->logits[0], o2->logits[0]), 1e-4);
  EXPECT_LE(MaxDiff(ob->logits[0], o2->logits[1]), 1e-4);

  // The same prompt in chunks of 5.
  std::vector<float> last;
  for (size_t begin = 0; begin < a.size(); begin += 5) {
    const size_t end = std::min(a.size(), begin + 5);
    StepInput in;
    in.chunks.push_back(
        Chunk(5, std::vector<int64_t>(a.begin() + begin, a.begin() + end),
              static_cast<int64_t>(begin)));
    absl::StatusOr<StepOutput> o = model().Step(in);
    ASSERT_TRUE(o.ok()) << o.status();
    last = o->logits[0];
  }
  EXPECT_LE(MaxDiff(oa->logits[0], last), 1e-4);

  // kAll's last row is kLast's row (up to the GEMM's blocking).
  StepInput all;
  all.chunks.push_back(Chunk(6, a, 0, SequenceChunk::Logits::kAll));
  absl::StatusOr<StepOutput> oall = model().Step(all);
  ASSERT_TRUE(oall.ok());
  const int64_t v = model().dims().vocab_size;
  ASSERT_EQ(oall->logits[0].size(), a.size() * v);
  EXPECT_LE(MaxDiff(std::vector<float>(oall->logits[0].end() - v,
                                       oall->logits[0].end()),
                    oa->logits[0]),
            1e-4);
}

// A token drawn in the step (SequenceChunk::sample) is the token drawn from
// the row the same step returns (the same batch, so the same logits), and
// with logits kNone no row comes back. Several draw-only chunks of one step
// are drawn in one call, each with its own parameters.
TEST_F(ModelStepTest, DrawsInTheStepEqualDrawsFromTheReturnedRow) {
  const std::vector<int64_t> a = Tokens(23, 4), b = Tokens(9, 5);
  gpu::SamplingParams greedy;
  gpu::SamplingParams warm{
      .temperature = 1.5f, .top_p = 0.9f, .top_k = 40, .seed = 11};
  gpu::SamplingParams hot{.temperature = 50.0f, .seed = 12};
  const uint64_t kFirst = 10;
  for (const bool batched : {false, true}) {
    SCOPED_TRACE(batched);
    // The rows, returned.
    StepInput rows;
    rows.chunks = {Chunk(kFirst, a, 0)};
    if (batched) rows.chunks.push_back(Chunk(kFirst + 1, b, 0));
    absl::StatusOr<StepOutput> with_rows = model().Step(rows);
    ASSERT_TRUE(with_rows.ok()) << with_rows.status();
    for (const gpu::SamplingParams& p : {greedy, warm, hot}) {
      StepInput draw;
      draw.chunks = {Chunk(kFirst + 2, a, 0, SequenceChunk::Logits::kNone)};
      if (batched) {
        draw.chunks.push_back(
            Chunk(kFirst + 3, b, 0, SequenceChunk::Logits::kNone));
        draw.chunks[1].sample = true;
        draw.chunks[1].sampling = hot;
      }
      draw.chunks[0].sample = true;
      draw.chunks[0].sampling = p;
      absl::StatusOr<StepOutput> drawn = model().Step(draw);
      ASSERT_TRUE(drawn.ok()) << drawn.status();
      for (size_t i = 0; i < draw.chunks.size(); ++i) {
        EXPECT_TRUE(drawn->logits[i].empty());
        absl::StatusOr<std::pair<int64_t, float>> want =
            model().SampleToken(with_rows->logits[i], draw.chunks[i].sampling);
        ASSERT_TRUE(want.ok()) << want.status();
        EXPECT_EQ(drawn->sampled[i].id, want->first) << i;
        EXPECT_EQ(drawn->sampled[i].logprob, want->second) << i;
      }
      for (const SequenceChunk& c : draw.chunks) model().Release(c.sequence_id);
    }
    for (const SequenceChunk& c : rows.chunks) model().Release(c.sequence_id);
  }
  // A chunk that draws and returns its rows: drawn from its last row.
  StepInput both;
  both.chunks = {Chunk(kFirst + 4, a, 0, SequenceChunk::Logits::kAll),
                 Chunk(kFirst + 5, b, 0)};
  both.chunks[0].sample = true;
  both.chunks[0].sampling = warm;
  absl::StatusOr<StepOutput> out = model().Step(both);
  ASSERT_TRUE(out.ok()) << out.status();
  const int64_t v = model().dims().vocab_size;
  ASSERT_EQ(out->logits[0].size(), a.size() * v);
  absl::StatusOr<std::pair<int64_t, float>> want = model().SampleToken(
      absl::MakeConstSpan(out->logits[0]).subspan((a.size() - 1) * v), warm);
  ASSERT_TRUE(want.ok());
  EXPECT_EQ(out->sampled[0].id, want->first);
  EXPECT_EQ(out->sampled[0].logprob, want->second);
  EXPECT_EQ(out->sampled[1].id, -1);  // No draw asked.
}

TEST(ModelCacheTest, FullCacheIsResourceExhaustedAndChangesNothing) {
  // Room for about one short sequence only.
  absl::StatusOr<std::unique_ptr<LocalModel>> m =
      Open(TinyCheckpoint(), 256 << 10);
  ASSERT_TRUE(m.ok()) << m.status();
  Model& model = (*m)->model();
  StepInput first;
  first.chunks.push_back(Chunk(1, Tokens(4, 0), 0));
  ASSERT_TRUE(model.Step(first).ok());
  const int free_blocks = model.kv_cache().free_blocks();
  StepInput second;
  second.chunks.push_back(Chunk(2, Tokens(300, 1), 0));
  const absl::Status st = model.Step(second).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(st.message(), HasSubstr("kv cache full"));
  EXPECT_EQ(model.kv_cache().free_blocks(), free_blocks);
  EXPECT_EQ(model.SequenceLength(2), -1);
  EXPECT_EQ(model.SequenceLength(1), 4);
}

TEST(ModelFormatsTest, NvFp4ExpertsFromTheLosslessCastGiveTheSameLogits) {
  quant::ExpertCastOptions cast;
  cast.checkpoint_dir = TinyCheckpoint();
  cast.out_dir = TempDir("nvfp4-experts");
  cast.input_scales = quant::InputScales::kUncalibrated;
  cast.threads = 1;
  ASSERT_TRUE(quant::CastExpertsCheckpoint(cast).ok());
  StepInput in;
  in.chunks.push_back(Chunk(1, Tokens(23, 4), 0, SequenceChunk::Logits::kAll));
  for (const bool dequantize : {true, false}) {
    SCOPED_TRACE(dequantize ? "fp32 copies" : "packed weights");
    absl::StatusOr<std::unique_ptr<LocalModel>> mx =
        Open(TinyCheckpoint(), 16 << 20, dequantize);
    absl::StatusOr<std::unique_ptr<LocalModel>> nv =
        Open(cast.out_dir, 16 << 20, dequantize);
    ASSERT_TRUE(mx.ok() && nv.ok()) << nv.status();
    absl::StatusOr<StepOutput> a = (*mx)->model().Step(in);
    absl::StatusOr<StepOutput> b = (*nv)->model().Step(in);
    ASSERT_TRUE(a.ok() && b.ok());
    if (dequantize) {
      // The cast is exact, so every dequantized weight and every logit is.
      EXPECT_EQ(a->logits[0], b->logits[0]);
    } else {
      // The same values, multiplied by the MXFP4 and the NVFP4 kernels,
      // which sum in different orders: equal up to fp32 rounding.
      ASSERT_EQ(a->logits[0].size(), b->logits[0].size());
      for (size_t i = 0; i < a->logits[0].size(); ++i) {
        EXPECT_NEAR(a->logits[0][i], b->logits[0][i], 1e-4) << i;
      }
    }
  }
}

// ---- weight slicing --------------------------------------------------------

TEST(WeightLoaderTest, UnalignedSlicesEqualTheDequantizedRows) {
  absl::StatusOr<std::unique_ptr<checkpoint::ShardedCheckpoint>> ckpt =
      checkpoint::ShardedCheckpoint::Create(TinyCheckpoint());
  ASSERT_TRUE(ckpt.ok());
  absl::StatusOr<std::unique_ptr<gpu::CpuBackend>> backend =
      gpu::CpuBackend::Create({});
  ASSERT_TRUE(backend.ok());
  WeightLoader load(**ckpt, **backend, 32, 32);
  const std::string name = "layers.0.ffn.shared_experts.w2";
  // [256, 128] FP8 (V4.1: 32 x 32 blocks); columns [16, 32) split a
  // 32-wide scale block. Only the first 64 columns are compared.
  absl::StatusOr<std::unique_ptr<gpu::Weight>> full =
      load.Linear(name, 256, 128, {}, Slice{0, 64});
  absl::StatusOr<std::unique_ptr<gpu::Weight>> part =
      load.Linear(name, 256, 128, {}, Slice{16, 16});
  absl::StatusOr<std::unique_ptr<gpu::Weight>> rows =
      load.Linear(name, 256, 128, Slice{32, 64}, Slice{0, 64});
  ASSERT_TRUE(full.ok() && part.ok() && rows.ok());
  EXPECT_EQ((*part)->format(), gpu::WeightFormat::kF32);
  EXPECT_EQ((*rows)->format(), gpu::WeightFormat::kFp8Block);
  // x = unit vectors pick columns: Linear(e_j) = column j of W.
  gpu::Backend& b = **backend;
  auto x = b.Allocate(int64_t{64} * 64);
  auto xs = b.Allocate(int64_t{16} * 16);
  ASSERT_TRUE(x.ok() && xs.ok());
  std::vector<float> eye(size_t{64} * 64, 0), eye16(size_t{16} * 16, 0);
  for (int i = 0; i < 64; ++i) eye[i * 64 + i] = 1;
  for (int i = 0; i < 16; ++i) eye16[i * 16 + i] = 1;
  b.CopyFromHost(eye, (*x)->data());
  b.CopyFromHost(eye16, (*xs)->data());
  auto y = b.Allocate(int64_t{64} * 256);
  auto ys = b.Allocate(int64_t{16} * 256);
  auto yr = b.Allocate(int64_t{64} * 64);
  ASSERT_TRUE(y.ok() && ys.ok() && yr.ok());
  b.Linear((*x)->view(64, 64), **full, (*y)->view(64, 256));
  b.Linear((*xs)->view(16, 16), **part, (*ys)->view(16, 256));
  b.Linear((*x)->view(64, 64), **rows, (*yr)->view(64, 64));
  std::vector<float> hy(size_t{64} * 256), hys(size_t{16} * 256),
      hyr(size_t{64} * 64);
  b.CopyToHost((*y)->data(), absl::MakeSpan(hy));
  b.CopyToHost((*ys)->data(), absl::MakeSpan(hys));
  b.CopyToHost((*yr)->data(), absl::MakeSpan(hyr));
  for (int j = 0; j < 16; ++j) {
    for (int r = 0; r < 256; ++r) {
      ASSERT_EQ(hys[j * 256 + r], hy[(16 + j) * 256 + r]) << j << "," << r;
    }
  }
  for (int j = 0; j < 64; ++j) {
    for (int r = 0; r < 64; ++r) {
      ASSERT_EQ(hyr[j * 64 + r], hy[j * 256 + 32 + r]) << j << "," << r;
    }
  }
  // A slice outside the tensor and a wrong shape are refused.
  EXPECT_EQ(load.Linear(name, 256, 128, Slice{250, 10}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(load.Linear(name, 128, 64).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(load.Linear("layers.0.attn.nope", 1, 1).status().code(),
            absl::StatusCode::kNotFound);
}

// FP8 weights with float32 block scales (the V4-Flash Base release's
// experts) load as the same numbers as with UE8M0 scales of equal value, and
// a scale that is not a power of two scales exactly.
TEST(WeightLoaderTest, Fp8WithFloat32Scales) {
  const std::string path = TempDir("fp8-f32-scales.safetensors");
  const int64_t rows = 64, cols = 64;
  std::vector<uint8_t> codes(rows * cols);
  for (size_t i = 0; i < codes.size(); ++i) {
    codes[i] = static_cast<uint8_t>((i * 37 + 11) % 256);
    if ((codes[i] & 0x7F) == 0x7F) codes[i] = 0x3C;  // No NaN codes.
  }
  const std::vector<uint8_t> e8m0 = {127, 128, 126, 130};  // 1, 2, 1/2, 8
  const std::vector<float> f32 = {1.0f, 2.0f, 0.5f, 8.0f};
  const std::vector<float> f32_odd = {1.0f, 2.0f, 0.5f, 0.3f};
  auto bytes = [](const std::vector<float>& v) {
    return std::vector<uint8_t>(
        reinterpret_cast<const uint8_t*>(v.data()),
        reinterpret_cast<const uint8_t*>(v.data()) + v.size() * 4);
  };
  using checkpoint::DType;
  {
    auto w = checkpoint::SafetensorsWriter::Create(
        path, {{"a.weight", DType::kF8E4M3, {rows, cols}},
               {"a.scale", DType::kF8E8M0, {2, 2}},
               {"b.weight", DType::kF8E4M3, {rows, cols}},
               {"b.scale", DType::kF32, {2, 2}},
               {"c.weight", DType::kF8E4M3, {rows, cols}},
               {"c.scale", DType::kF32, {2, 2}}});
    ASSERT_TRUE(w.ok()) << w.status();
    for (const char* n : {"a.weight", "b.weight", "c.weight"}) {
      ASSERT_TRUE((*w)->Append(n, codes).ok());
    }
    ASSERT_TRUE((*w)->Append("a.scale", e8m0).ok());
    ASSERT_TRUE((*w)->Append("b.scale", bytes(f32)).ok());
    ASSERT_TRUE((*w)->Append("c.scale", bytes(f32_odd)).ok());
    ASSERT_TRUE((*w)->Finish().ok());
  }
  absl::StatusOr<std::unique_ptr<checkpoint::SafetensorsReader>> reader =
      checkpoint::SafetensorsReader::Create(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  absl::StatusOr<std::unique_ptr<gpu::CpuBackend>> backend =
      gpu::CpuBackend::Create({});
  ASSERT_TRUE(backend.ok());
  WeightLoader load(**reader, **backend, 32, 32);
  gpu::Backend& b = **backend;
  auto x = b.Allocate(cols * cols);
  ASSERT_TRUE(x.ok());
  std::vector<float> eye(cols * cols, 0.0f);
  for (int64_t i = 0; i < cols; ++i) eye[i * cols + i] = 1.0f;
  b.CopyFromHost(eye, (*x)->data());
  // Row j of Linear(I) is column j of W.
  auto columns = [&](const std::string& name) {
    const int64_t out_features = rows, in_features = cols;
    absl::StatusOr<std::unique_ptr<gpu::Weight>> wt =
        load.Linear(name, out_features, in_features);
    EXPECT_TRUE(wt.ok()) << wt.status();
    const int64_t tokens = in_features;  // One unit vector per input.
    auto y = b.Allocate(tokens * out_features);
    b.Linear((*x)->view(tokens, in_features), **wt,
             (*y)->view(tokens, out_features));
    std::vector<float> out(tokens * out_features);
    b.CopyToHost((*y)->data(), absl::MakeSpan(out));
    return out;
  };
  const std::vector<float> a = columns("a"), bw = columns("b"),
                           c = columns("c");
  EXPECT_EQ(a, bw);
  for (int64_t col = 0; col < cols; ++col) {
    for (int64_t r = 0; r < rows; ++r) {
      const float want = static_cast<float>(
          double{formats::E4m3ToFloat(codes[r * cols + col])} *
          f32_odd[(r / 32) * 2 + col / 32]);
      ASSERT_EQ(c[col * rows + r], want) << r << "," << col;
    }
  }
}

}  // namespace
}  // namespace mneme::model
