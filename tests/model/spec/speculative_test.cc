// Speculative decoding on the tiny real-layout models: rolling a sequence
// back (Model::Truncate), the DSpark drafter's state and batching, and
// generation with drafts against generation without.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/generate.h"
#include "model/model.h"
#include "model/spec/dspark.h"
#include "services/worker/local_model.h"
#include "tools/synthetic/release_checkpoint.h"

namespace mneme::model {
namespace {

using ::testing::HasSubstr;
using worker::LocalModel;

std::string MakeTiny(synthetic::ReleaseArch arch, const std::string& name,
                     bool aligned = false) {
  std::string dir = absl::StrCat(getenv("TEST_TMPDIR"), "/", name);
  synthetic::ReleaseCheckpointOptions o;
  o.out_dir = dir;
  o.arch = arch;
  o.seed = 5;
  o.threads = 1;
  o.aligned_draft = aligned;
  const absl::Status st = synthetic::MakeReleaseCheckpoint(o);
  EXPECT_TRUE(st.ok()) << st;
  return dir;
}

const std::string& TinyV41() {
  static const std::string* dir =
      new std::string(MakeTiny(synthetic::ReleaseArch::kV41Flash, "spec-v41"));
  return *dir;
}
const std::string& TinyV41Aligned() {
  static const std::string* dir = new std::string(
      MakeTiny(synthetic::ReleaseArch::kV41Flash, "spec-v41-aligned", true));
  return *dir;
}
const std::string& TinyV40731() {
  static const std::string* dir = new std::string(
      MakeTiny(synthetic::ReleaseArch::kV4Flash0731, "spec-v4-0731"));
  return *dir;
}
const std::string& TinyV4() {
  static const std::string* dir =
      new std::string(MakeTiny(synthetic::ReleaseArch::kV4Flash, "spec-v4"));
  return *dir;
}

std::unique_ptr<LocalModel> Open(const std::string& dir, int k) {
  worker::LocalModelOptions o;
  o.checkpoint_dir = dir;
  o.threads = 1;
  o.model.max_speculative_tokens = k;
  absl::StatusOr<std::unique_ptr<LocalModel>> m = LocalModel::Create(o);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? *std::move(m) : nullptr;
}

std::unique_ptr<DsparkDrafter> OpenDrafter(LocalModel& local) {
  DsparkOptions o;
  o.checkpoint_dir = local.model().checkpoint_dir();
  const Model& m = local.model();
  absl::StatusOr<std::unique_ptr<DsparkDrafter>> d = DsparkDrafter::Create(
      o, m.dims(), local.backend(), nullptr, m.embedding_head(), m.vocab());
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? *std::move(d) : nullptr;
}

// Deterministic tokens in [3, 320).
std::vector<int64_t> Tokens(int64_t n, uint64_t seed) {
  std::vector<int64_t> t;
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < n; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    t.push_back(3 + static_cast<int64_t>((x >> 33) % 317));
  }
  return t;
}

StepOutput StepChunk(Model& m, uint64_t id, std::vector<int64_t> tokens,
                     int64_t start, bool taps = false) {
  StepInput in;
  SequenceChunk c;
  c.sequence_id = id;
  c.tokens = std::move(tokens);
  c.start_position = start;
  c.logits = SequenceChunk::Logits::kAll;
  c.taps = taps;
  in.chunks.push_back(std::move(c));
  absl::StatusOr<StepOutput> out = m.Step(in);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *std::move(out) : StepOutput{};
}

double MaxAbsDiff(const float* a, const float* b, int64_t n) {
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    worst = std::max(worst, std::fabs(double{a[i]} - double{b[i]}));
  }
  return worst;
}

// Steps that carry rejected tokens and are rolled back leave the model
// exactly where steps of the kept tokens alone would: every later logit
// equals a plain run's. Covers the window ring, the compressors' partial
// blocks (V4's overlapping ratio 4 and ratio 128, V4.1's ratio 2 and 1 with
// the shared cache and the indexer) and the Engram history.
void CheckRollback(const std::string& dir) {
  constexpr int kK = 5;
  std::unique_ptr<LocalModel> plain = Open(dir, 0);
  std::unique_ptr<LocalModel> spec = Open(dir, kK);
  ASSERT_NE(plain, nullptr);
  ASSERT_NE(spec, nullptr);
  const int64_t V = plain->model().dims().vocab_size;
  const std::vector<int64_t> seq = Tokens(90, 11);
  const std::vector<int64_t> junk = Tokens(400, 12);
  const int64_t prompt = 9;
  StepOutput a =
      StepChunk(plain->model(), 1, {seq.begin(), seq.begin() + prompt}, 0);
  StepOutput b =
      StepChunk(spec->model(), 1, {seq.begin(), seq.begin() + prompt}, 0);
  ASSERT_EQ(a.logits[0].size(), b.logits[0].size());
  int64_t p = prompt;
  size_t j = 0;
  double worst = 0;
  for (int step = 0; p < static_cast<int64_t>(seq.size()) - kK - 1; ++step) {
    // Keep 1 + kept tokens of the sequence, then `rejected` junk ones.
    const int kept = step % (kK + 1);
    const int rejected = kK - kept;
    std::vector<int64_t> chunk(seq.begin() + p, seq.begin() + p + 1 + kept);
    for (int r = 0; r < rejected; ++r) chunk.push_back(junk[j++ % junk.size()]);
    const StepOutput got = StepChunk(spec->model(), 1, chunk, p);
    ASSERT_EQ(got.logits[0].size(), chunk.size() * V);
    ASSERT_TRUE(spec->model().Truncate(1, p + 1 + kept).ok());
    ASSERT_EQ(spec->model().SequenceLength(1), p + 1 + kept);
    for (int i = 0; i <= kept; ++i) {
      const StepOutput want = StepChunk(plain->model(), 1, {seq[p + i]}, p + i);
      ASSERT_EQ(want.logits[0].size(), V);
      worst = std::max(worst, MaxAbsDiff(want.logits[0].data(),
                                         got.logits[0].data() + i * V, V));
    }
    p += 1 + kept;
  }
  // Batched rows against one-token steps: fp32 accumulation order only.
  EXPECT_LT(worst, 2e-3) << dir;
}

TEST(RollbackTest, RolledBackStepsLeaveNoTraceV41) { CheckRollback(TinyV41()); }

TEST(RollbackTest, RolledBackStepsLeaveNoTraceV4) { CheckRollback(TinyV4()); }

TEST(RollbackTest, RefusesWhatItCannotUndo) {
  std::unique_ptr<LocalModel> m = Open(TinyV41(), 2);
  ASSERT_NE(m, nullptr);
  EXPECT_THAT(m->model().Truncate(7, 0).message(), HasSubstr("not known"));
  StepChunk(m->model(), 7, Tokens(10, 1), 0);
  // Past the end, and more than max_speculative_tokens back.
  EXPECT_FALSE(m->model().Truncate(7, 11).ok());
  EXPECT_THAT(m->model().Truncate(7, 7).message(),
              HasSubstr("max_speculative_tokens is 2"));
  EXPECT_EQ(m->model().SequenceLength(7), 10);
  // Two back is fine, and a second rollback may not go further than two
  // below the longest the sequence has been.
  EXPECT_TRUE(m->model().Truncate(7, 8).ok());
  EXPECT_FALSE(m->model().Truncate(7, 7).ok());
  EXPECT_TRUE(m->model().Truncate(7, 8).ok());
  // Out of range options.
  worker::LocalModelOptions o;
  o.checkpoint_dir = TinyV41();
  o.model.max_speculative_tokens = 65;
  EXPECT_FALSE(LocalModel::Create(o).ok());
}

// The drafts depend only on the committed positions, not on how they were
// handed to the drafter, and a batch proposes what each sequence alone
// would.
TEST(DsparkDrafterTest, ProposalsDoNotDependOnExtendPiecesOrBatching) {
  std::unique_ptr<LocalModel> local = Open(TinyV41(), 0);
  ASSERT_NE(local, nullptr);
  std::unique_ptr<DsparkDrafter> drafter = OpenDrafter(*local);
  ASSERT_NE(drafter, nullptr);
  const int64_t D = local->model().dims().hidden_size;
  const int64_t L =
      static_cast<int64_t>(local->model().dims().dspark_target_layers.size());
  const std::vector<int64_t> prompt = Tokens(40, 3);  // Longer than the window.
  const StepOutput whole = StepChunk(local->model(), 1, prompt, 0, true);
  // Only the window's worth of taps comes back (TapRows).
  ASSERT_EQ(local->model().TapRows(), local->model().dims().sliding_window);
  ASSERT_EQ(whole.taps[0].size(), local->model().TapRows() * L * D);
  ASSERT_TRUE(drafter->Extend(1, 0, 40, whole.taps[0]).ok());
  // Sequence 2: the same prompt prefilled in chunks of 7, each extending.
  for (int64_t b = 0; b < 40; b += 7) {
    const int64_t e = std::min<int64_t>(40, b + 7);
    const StepOutput part = StepChunk(
        local->model(), 2, {prompt.begin() + b, prompt.begin() + e}, b, true);
    ASSERT_TRUE(drafter->Extend(2, b, e - b, part.taps[0]).ok());
  }
  // Sequence 3: a shorter prompt, so the batch mixes ring fills.
  const StepOutput short_prompt =
      StepChunk(local->model(), 3, Tokens(5, 4), 0, true);
  ASSERT_TRUE(drafter->Extend(3, 0, 5, short_prompt.taps[0]).ok());
  std::vector<DraftRequest> requests(3);
  for (int i = 0; i < 3; ++i) {
    requests[i].sequence_id = i + 1;
    requests[i].anchor = 17 + i;
  }
  requests[1].anchor = 17;
  absl::StatusOr<std::vector<DraftProposal>> batch = drafter->Propose(requests);
  ASSERT_TRUE(batch.ok()) << batch.status();
  const int bs = drafter->block_size();
  const int64_t V = local->model().dims().vocab_size;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<std::vector<DraftProposal>> alone =
        drafter->Propose({requests[i]});
    ASSERT_TRUE(alone.ok());
    const DraftProposal& x = (*batch)[i];
    const DraftProposal& y = (*alone)[0];
    ASSERT_EQ(x.tokens.size(), bs);
    ASSERT_EQ(x.logits.size(), bs * V);
    ASSERT_EQ(x.confidence.size(), bs);
    EXPECT_EQ(x.tokens, y.tokens);
    EXPECT_LT(MaxAbsDiff(x.logits.data(), y.logits.data(), bs * V), 1e-4);
    EXPECT_LT(MaxAbsDiff(x.confidence.data(), y.confidence.data(), bs), 1e-4);
    for (int64_t t : x.tokens) EXPECT_TRUE(t >= 0 && t < V);
  }
  // Whole and in pieces: the same state (up to the fp32 sums of chunked
  // prefill).
  EXPECT_EQ((*batch)[0].tokens, (*batch)[1].tokens);
  EXPECT_LT(
      MaxAbsDiff((*batch)[0].logits.data(), (*batch)[1].logits.data(), bs * V),
      2e-3);
  EXPECT_EQ(drafter->SequenceLength(2), 40);
  drafter->Release(2);
  EXPECT_EQ(drafter->SequenceLength(2), -1);
}

TEST(DsparkDrafterTest, RefusesBadInput) {
  std::unique_ptr<LocalModel> local = Open(TinyV41(), 0);
  ASSERT_NE(local, nullptr);
  std::unique_ptr<DsparkDrafter> drafter = OpenDrafter(*local);
  ASSERT_NE(drafter, nullptr);
  const StepOutput out = StepChunk(local->model(), 1, Tokens(6, 9), 0, true);
  // A gap, a size that is not whole rows, an empty extension.
  EXPECT_THAT(drafter->Extend(1, 2, 6, out.taps[0]).message(),
              HasSubstr("holds 0 positions"));
  EXPECT_FALSE(
      drafter->Extend(1, 0, 6, absl::MakeConstSpan(out.taps[0]).subspan(1))
          .ok());
  EXPECT_FALSE(drafter->Extend(1, 0, 6, {}).ok());
  // Fewer taps than min(count, window), more than count.
  EXPECT_FALSE(drafter->Extend(1, 0, 7, out.taps[0]).ok());
  EXPECT_FALSE(drafter->Extend(1, 0, 5, out.taps[0]).ok());
  EXPECT_EQ(drafter->SequenceLength(1), -1);
  ASSERT_TRUE(drafter->Extend(1, 0, 6, out.taps[0]).ok());
  DraftRequest r;
  r.sequence_id = 1;
  r.anchor = local->model().dims().vocab_size;
  EXPECT_THAT(drafter->Propose({r}).status().message(),
              HasSubstr("outside the vocabulary"));
  r.anchor = 5;
  EXPECT_FALSE(drafter->Propose({r, r}).ok());  // Twice.
  r.sequence_id = 99;
  EXPECT_THAT(drafter->Propose({r}).status().message(),
              HasSubstr("no committed positions"));
}

TEST(DsparkDrafterTest, RefusesACheckpointWithoutDsparkStages) {
  std::unique_ptr<LocalModel> local = Open(TinyV4(), 0);
  ASSERT_NE(local, nullptr);
  DsparkOptions o;
  o.checkpoint_dir = TinyV4();
  const Model& m = local->model();
  absl::StatusOr<std::unique_ptr<DsparkDrafter>> d = DsparkDrafter::Create(
      o, m.dims(), local->backend(), nullptr, m.embedding_head(), m.vocab());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
}

// Greedy decoding with drafts is greedy decoding: the same tokens, whole
// and chunked prefill, on the random tiny models (drafts mostly rejected;
// V4.1 and V4-Flash-0731) and on the aligned one (drafts mostly accepted).
TEST(SpeculativeGenerateTest, GreedyOutputEqualsPlainGreedy) {
  for (const std::string* dir :
       {&TinyV41(), &TinyV40731(), &TinyV41Aligned()}) {
    std::unique_ptr<LocalModel> plain = Open(*dir, 0);
    std::unique_ptr<LocalModel> spec = Open(*dir, 5);
    ASSERT_NE(plain, nullptr);
    ASSERT_NE(spec, nullptr);
    std::unique_ptr<DsparkDrafter> drafter = OpenDrafter(*spec);
    ASSERT_NE(drafter, nullptr);
    for (const int64_t chunk : {int64_t{0}, int64_t{7}}) {
      GenerateOptions o;
      o.max_new_tokens = 40;
      o.stop_at_eos = false;
      o.prefill_chunk_tokens = chunk;
      o.top_logprobs = 2;
      absl::StatusOr<GenerateResult> want =
          Generate(plain->model(), Tokens(23, 8), o);
      ASSERT_TRUE(want.ok()) << want.status();
      o.drafter = drafter.get();
      for (const int k : {1, 3, 5}) {
        o.num_speculative_tokens = k;
        absl::StatusOr<GenerateResult> got =
            Generate(spec->model(), Tokens(23, 8), o);
        ASSERT_TRUE(got.ok()) << got.status();
        EXPECT_EQ(got->token_ids, want->token_ids) << *dir << " k=" << k;
        ASSERT_EQ(got->logprobs.size(), want->logprobs.size());
        for (size_t i = 0; i < want->logprobs.size(); ++i) {
          EXPECT_NEAR(got->logprobs[i], want->logprobs[i], 2e-3);
        }
        const SpeculativeStats& s = got->speculative;
        EXPECT_GT(s.steps, 0);
        EXPECT_LE(s.accepted_tokens, s.draft_tokens);
        EXPECT_EQ(s.accepted_per_position.size(), k);
        // Every step commits accepted + 1 tokens (the last may be cut).
        EXPECT_GE(s.accepted_tokens + s.steps + 1, 40);
        if (dir == &TinyV41Aligned() && k == 5) {
          // The aligned drafter is mostly right.
          EXPECT_GT(s.accepted_tokens, s.draft_tokens / 4);
        }
      }
      EXPECT_EQ(spec->model().num_sequences(), 0);
      EXPECT_EQ(drafter->SequenceLength(1), -1);
    }
  }
}

TEST(SpeculativeGenerateTest, RefusesMoreDraftsThanTheModelCanRollBack) {
  std::unique_ptr<LocalModel> spec = Open(TinyV41(), 2);
  ASSERT_NE(spec, nullptr);
  std::unique_ptr<DsparkDrafter> drafter = OpenDrafter(*spec);
  ASSERT_NE(drafter, nullptr);
  GenerateOptions o;
  o.drafter = drafter.get();
  o.num_speculative_tokens = 3;
  EXPECT_EQ(Generate(spec->model(), Tokens(5, 1), o).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mneme::model
