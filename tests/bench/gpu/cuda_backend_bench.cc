// The CUDA backend on one device, each figure side by side with its limit
// measured in the same run: decode GEMV (1 token) on checkpoint-format
// weights against a device memcpy of the same weight bytes, decode
// attention against a device memcpy of the KV bytes it reads, a decode
// step's attention for 1 and 16 sequences read in place from the pool in
// one call against gathered per sequence (decode_attention_case.h), the
// indexer's scores at decode against a device memcpy of the key bytes, a
// decode layer's choice and attention in one call against the choice
// coming back to the host first, and
// Linear of 16 and 512 tokens (the tiled kernel) against 1 token: how many
// times cheaper a token is when the weight is decoded once for many (1.0 = no
// gain), with prefill tokens per second; and a decode step of the tiny
// V4-Flash and V4.1-Flash checkpoints over the sum of its kernels' device
// times (launch overhead). Prints one JSON object.
//
//   cuda_backend_bench [--device=N] [--iters=N]
//
// Without a device it prints {"skipped": REASON} and exits 0.

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "formats/bf16.h"
#include "formats/exl3/exl3.h"
#include "formats/gridbook/gridbook.h"
#include "gpu/backend.h"
#include "gpu/cuda/cuda_backend.h"
#include "gpu/sampling.h"
#include "model/model.h"
#include "model/step_io.h"
#include "services/worker/local_model.h"
#include "tests/bench/gpu/decode_attention_case.h"
#include "tools/synthetic/release_checkpoint.h"

ABSL_FLAG(int, device, 0, "CUDA device index.");
ABSL_FLAG(int, iters, 50, "Timed repetitions of each measurement.");

namespace mneme::gpu {
namespace {

// Seconds per repetition of a device memcpy of `bytes` (each byte read
// once and written once, so the memcpy moves 2 * bytes); -1 when the
// device refuses.
double MemcpySeconds(int64_t bytes, int iters) {
  void* a = nullptr;
  void* b = nullptr;
  double s = -1.0;
  if (cudaMalloc(&a, bytes) == cudaSuccess &&
      cudaMalloc(&b, bytes) == cudaSuccess &&
      cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice) == cudaSuccess) {
    const absl::Time start = absl::Now();
    for (int i = 0; i < iters; ++i) {
      cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, nullptr);
    }
    if (cudaDeviceSynchronize() == cudaSuccess) {
      s = absl::ToDoubleSeconds(absl::Now() - start) / iters;
    }
  }
  (void)cudaGetLastError();
  if (a != nullptr) cudaFree(a);
  if (b != nullptr) cudaFree(b);
  return s;
}

// Bandwidth of an op that reads `bytes` in `seconds`, over the bandwidth of
// a device memcpy (bytes read + written per second); 1.0 = reading as fast
// as memcpy moves bytes.
double VsMemcpy(int64_t bytes, double seconds, int iters) {
  const double copy = MemcpySeconds(bytes, iters);
  if (copy <= 0.0 || seconds <= 0.0) return -1.0;
  return (static_cast<double>(bytes) / seconds) /
         (2.0 * static_cast<double>(bytes) / copy);
}

// The bench's EXL3 width (bits a weight).
constexpr int kExl3Bits = 4;

// A [rows, cols] weight of random valid codes in `format` (scales 1.0).
struct Bytes {
  std::vector<uint8_t> data;
  std::vector<uint8_t> scale;
  // GridBook (NVFP4_CB_K16, two-tier scales): the scheme and its tables.
  formats::gridbook::Scheme scheme;
  std::shared_ptr<const formats::gridbook::Codebooks> books;
};
Bytes RandomWeight(WeightFormat format, int64_t rows, int64_t cols,
                   std::mt19937& rng) {
  Bytes b;
  std::uniform_int_distribution<int> byte(0, 255);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  switch (format) {
    case WeightFormat::kBf16:
      b.data.resize(rows * cols * 2);
      for (int64_t i = 0; i < rows * cols; ++i) {
        const uint16_t v = formats::FloatToBf16(normal(rng));
        b.data[2 * i] = static_cast<uint8_t>(v);
        b.data[2 * i + 1] = static_cast<uint8_t>(v >> 8);
      }
      break;
    case WeightFormat::kFp8Block:
      b.data.resize(rows * cols);
      // No NaN codes (0x7F / 0xFF).
      for (uint8_t& c : b.data) c = static_cast<uint8_t>(byte(rng) & 0x7E);
      b.scale.assign(((rows + 127) / 128) * ((cols + 127) / 128), 127);
      break;
    case WeightFormat::kMxfp4:
      b.data.resize(rows * cols / 2);
      for (uint8_t& c : b.data) c = static_cast<uint8_t>(byte(rng));
      b.scale.assign(rows * cols / 32, 127);
      break;
    case WeightFormat::kNvfp4:
      b.data.resize(rows * cols / 2);
      for (uint8_t& c : b.data) c = static_cast<uint8_t>(byte(rng));
      b.scale.assign(rows * cols / 16, 0x38);  // e4m3 1.0
      break;
    case WeightFormat::kExl3: {
      // 4 bits a weight (kExl3Bits), scales +-0.05 in fp16.
      b.data.resize(rows * cols * kExl3Bits / 8);
      for (uint8_t& c : b.data) c = static_cast<uint8_t>(byte(rng));
      b.scale.resize(2 * (rows + cols));
      for (size_t i = 0; i < b.scale.size(); i += 2) {
        b.scale[i] = 0x66;  // 0x2A66: about 0.05
        b.scale[i + 1] = static_cast<uint8_t>(0x2A | (byte(rng) & 0x80));
      }
      break;
    }
    case WeightFormat::kGridbook: {
      namespace gb = formats::gridbook;
      b.scheme =
          *gb::SchemeForFormat("NVFP4_CB_K16", gb::ScaleCoding::kTwoTier);
      auto books = std::make_shared<gb::Codebooks>();
      for (int sub = 0; sub < b.scheme.n_sub; ++sub) {
        const int64_t count =
            gb::SubTableRows(b.scheme, sub) * gb::SubTableColumns(b.scheme);
        for (int64_t i = 0; i < count; ++i) {
          books->tables[sub].push_back(
              static_cast<float>(byte(rng) % 13) * 0.5f - 3.0f);
        }
      }
      b.books = books;
      const int type_size = gb::TypeSize(b.scheme);
      b.data.resize(rows * cols / gb::kSuperblock * type_size);
      for (uint8_t& c : b.data) c = static_cast<uint8_t>(byte(rng));
      for (size_t i = size_t{4} * b.scheme.k; i < b.data.size();
           i += type_size) {
        b.data[i] = 120;  // two-tier exponent 2^-7
      }
      break;
    }
    default:
      break;
  }
  return b;
}

// Seconds per call of fn (`n` calls after one warm-up); -1 on a device
// error.
template <typename Fn>
double SecondsPerCall(Backend& backend, int n, const Fn& fn) {
  fn();
  (void)backend.Synchronize();
  const absl::Time start = absl::Now();
  for (int i = 0; i < n; ++i) fn();
  if (!backend.Synchronize().ok()) return -1.0;
  return absl::ToDoubleSeconds(absl::Now() - start) / n;
}

// One rank's routed experts of a V4-Flash layer (4096 -> 2048 -> 4096,
// MXFP4; 64 of 256 experts, 6 a token) for a decode batch of 16 and a
// prefill chunk of 512 tokens: MoeExperts (grouped launches) against the
// same experts by ExpertForward one after another, and the grouped call's
// read of the weights it uses against a memcpy of those bytes. Returns an
// error or "".
std::string MoeFields(Backend& backend, int iters, std::mt19937& rng,
                      std::vector<std::string>& fields) {
  constexpr int64_t kDim = 4096;
  constexpr int64_t kInter = 2048;
  constexpr int64_t kLocal = 64;
  constexpr int kAllExperts = 256;
  constexpr int kTopK = 6;
  const Bytes up = RandomWeight(WeightFormat::kMxfp4, kInter, kDim, rng);
  const Bytes down = RandomWeight(WeightFormat::kMxfp4, kDim, kInter, rng);
  const int64_t expert_bytes =
      static_cast<int64_t>(2 * (up.data.size() + up.scale.size()) +
                           down.data.size() + down.scale.size());
  std::vector<std::unique_ptr<Weight>> owned;
  std::vector<ExpertRef> experts;
  for (int64_t e = 0; e < kLocal; ++e) {
    for (const Bytes* b : {&up, &down, &up}) {
      HostWeight h;
      h.format = WeightFormat::kMxfp4;
      h.rows = b == &up ? kInter : kDim;
      h.cols = b == &up ? kDim : kInter;
      h.data = b->data;
      h.scale = b->scale;
      absl::StatusOr<std::unique_ptr<Weight>> w = backend.UploadWeight(h);
      if (!w.ok()) return "expert upload";
      owned.push_back(*std::move(w));
    }
    experts.push_back(ExpertRef{.w1 = owned[3 * e].get(),
                                .w2 = owned[3 * e + 1].get(),
                                .w3 = owned[3 * e + 2].get()});
  }
  for (const int64_t tokens : {int64_t{16}, int64_t{512}}) {
    absl::StatusOr<std::unique_ptr<Buffer>> x = backend.Allocate(tokens * kDim);
    absl::StatusOr<std::unique_ptr<Buffer>> y = backend.Allocate(tokens * kDim);
    if (!x.ok() || !y.ok()) return "allocation";
    backend.CopyFromHost(std::vector<float>(tokens * kDim, 0.01f),
                         (*x)->data());
    // Distinct experts a token, uniform over all 256 (this rank holds the
    // first 64).
    std::vector<int32_t> ids(tokens * kTopK);
    std::vector<int32_t> all(kAllExperts);
    for (int i = 0; i < kAllExperts; ++i) all[i] = i;
    for (int64_t t = 0; t < tokens; ++t) {
      std::shuffle(all.begin(), all.end(), rng);
      std::copy_n(all.begin(), kTopK, ids.begin() + t * kTopK);
    }
    const std::vector<float> weights(ids.size(), 1.0f / kTopK);
    const ExpertGroups groups = GroupByExpert(ids, weights, kTopK, 0, kLocal);
    int64_t used = 0;
    for (int64_t e = 0; e < kLocal; ++e) used += groups.count(e) > 0 ? 1 : 0;
    const ConstMatrixView xv((*x)->data(), tokens, kDim);
    const MatrixView yv{(*y)->data(), tokens, kDim};
    const int n = tokens == 16 ? iters : 3;
    const double grouped = SecondsPerCall(backend, n, [&] {
      backend.MoeExperts(xv, ids, weights, kTopK, 0, experts, 0.0f, yv);
    });
    const double one_by_one = SecondsPerCall(backend, n, [&] {
      for (int64_t e = 0; e < kLocal; ++e) {
        const int64_t count = groups.count(e);
        if (count == 0) continue;
        const int64_t begin = groups.offsets[e];
        backend.ExpertForward(
            xv, absl::MakeConstSpan(groups.rows).subspan(begin, count),
            absl::MakeConstSpan(groups.weights).subspan(begin, count),
            *experts[e].w1, *experts[e].w2, *experts[e].w3, 0.0f, yv);
      }
    });
    // The whole layer from gate logits: routed and grouped on the device
    // (MoeLayer) against MoeRoute, whose ids come back to the host to be
    // grouped there, then MoeExperts.
    absl::StatusOr<std::unique_ptr<Buffer>> gate =
        backend.Allocate(tokens * kAllExperts);
    if (!gate.ok()) return "allocation";
    std::uniform_real_distribution<float> logit(-2.0f, 2.0f);
    std::vector<float> logits(tokens * kAllExperts);
    for (float& v : logits) v = logit(rng);
    backend.CopyFromHost(logits, (*gate)->data());
    const ConstMatrixView gv((*gate)->data(), tokens, kAllExperts);
    MoeRouting routing;
    routing.top_k = kTopK;
    const double layer = SecondsPerCall(backend, n, [&] {
      backend.MoeLayer(xv, gv, routing, 0, experts, 0.0f, yv);
    });
    std::vector<int32_t> routed(ids.size());
    std::vector<float> routed_weights(ids.size());
    const double parts = SecondsPerCall(backend, n, [&] {
      backend.MoeRoute(gv, nullptr, kTopK, 1.0f, absl::MakeSpan(routed),
                       absl::MakeSpan(routed_weights));
      backend.MoeExperts(xv, routed, routed_weights, kTopK, 0, experts, 0.0f,
                         yv);
    });
    if (grouped <= 0.0 || one_by_one <= 0.0 || layer <= 0.0 || parts <= 0.0) {
      return "moe experts";
    }
    fields.push_back(absl::StrCat(
        "\"moe", tokens, "_layer_over_route_then_experts\": ", parts / layer));
    fields.push_back(absl::StrCat(
        "\"moe", tokens, "_grouped_over_per_expert\": ", one_by_one / grouped));
    fields.push_back(
        absl::StrCat("\"moe", tokens, "_grouped_vs_memcpy\": ",
                     VsMemcpy(used * expert_bytes, grouped, iters)));
  }
  return "";
}

// A backend buffer of n values drawn from N(0, sd^2).
absl::StatusOr<std::unique_ptr<Buffer>> RandomBuffer(Backend& backend,
                                                     int64_t n, float sd,
                                                     std::mt19937& rng) {
  absl::StatusOr<std::unique_ptr<Buffer>> buffer = backend.Allocate(n);
  if (!buffer.ok()) return buffer;
  std::normal_distribution<float> normal(0.0f, sd);
  std::vector<float> host(n);
  for (float& v : host) v = normal(rng);
  backend.CopyFromHost(host, (*buffer)->data());
  return buffer;
}

// Backend::Sample over a decode batch of 16 rows of V4's vocabulary
// (129,280 logits): greedy against a memcpy of the logits' bytes, and draws
// at a temperature with top-k 50 and top-p 0.9 (the radix selects on the
// device) over the greedy call. Returns an error or "".
std::string SampleFields(Backend& backend, int iters, std::mt19937& rng,
                         std::vector<std::string>& fields) {
  constexpr int64_t kRows = 16;
  constexpr int64_t kVocab = 129280;
  absl::StatusOr<std::unique_ptr<Buffer>> logits =
      RandomBuffer(backend, kRows * kVocab, 3.0f, rng);
  if (!logits.ok()) return "allocation";
  const ConstMatrixView view((*logits)->data(), kRows, kVocab);
  std::vector<int32_t> ids(kRows);
  std::vector<float> logprobs(kRows);
  const std::vector<SamplingParams> greedy(kRows);
  std::vector<SamplingParams> drawn(
      kRows, SamplingParams{.temperature = 0.8f, .top_p = 0.9f, .top_k = 50});
  for (int64_t r = 0; r < kRows; ++r) drawn[r].seed = static_cast<uint64_t>(r);
  const double greedy_s = SecondsPerCall(backend, iters, [&] {
    backend.Sample(view, greedy, absl::MakeSpan(ids), absl::MakeSpan(logprobs));
  });
  const double drawn_s = SecondsPerCall(backend, iters, [&] {
    backend.Sample(view, drawn, absl::MakeSpan(ids), absl::MakeSpan(logprobs));
  });
  if (greedy_s <= 0.0 || drawn_s <= 0.0) return "sample";
  fields.push_back(
      absl::StrCat("\"sample16_greedy_vs_memcpy\": ",
                   VsMemcpy(kRows * kVocab * int64_t{4}, greedy_s, iters)));
  fields.push_back(
      absl::StrCat("\"sample16_top_p_over_greedy\": ", drawn_s / greedy_s));
  return "";
}

// A V4 decode layer's choice and attention at V4-Flash's sizes on one rank
// of TP 4 (16 heads of 512, 512 of 16,384 entries chosen: 64K tokens at
// ratio 4, a 128-token window), keys scattered in a 64 MiB pool, for 1 and
// 16 sequences: ChooseAndAttend (the choice stays on the device) over
// SelectTopK, the lists made on the host from the ids it brings back, then
// SparseAttention (what a decode layer did before), in the same run; below
// 1 = the fused call is faster. Each repetition is one layer's worth, so the
// round trip's wait for the ids counts once a layer, as in a step. Both are
// checked to agree first. Returns an error or "".
std::string ChooseFields(Backend& backend, int iters, std::mt19937& rng,
                         std::vector<std::string>& fields) {
  constexpr int kHeads = 16;
  constexpr int64_t kHeadDim = 512;
  constexpr int64_t kEntries = 16384;
  constexpr int kTopK = 512;
  constexpr int kWindow = 128;
  constexpr int64_t kPoolRows = 32768;
  absl::StatusOr<std::unique_ptr<Buffer>> pool =
      RandomBuffer(backend, kPoolRows * kHeadDim, 0.05f, rng);
  if (!pool.ok()) return "allocation";
  std::uniform_int_distribution<int32_t> row_of(0, kPoolRows - 1);
  const ConstMatrixView kv((*pool)->data(), kPoolRows, kHeadDim);
  const float scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
  for (const int64_t sequences : {int64_t{1}, int64_t{16}}) {
    absl::StatusOr<std::unique_ptr<Buffer>> scores =
        RandomBuffer(backend, sequences * kEntries, 1.0f, rng);
    absl::StatusOr<std::unique_ptr<Buffer>> q =
        RandomBuffer(backend, sequences * kHeads * kHeadDim, 1.0f, rng);
    absl::StatusOr<std::unique_ptr<Buffer>> out_a =
        backend.Allocate(sequences * kHeads * kHeadDim);
    absl::StatusOr<std::unique_ptr<Buffer>> out_b =
        backend.Allocate(sequences * kHeads * kHeadDim);
    absl::StatusOr<std::unique_ptr<Buffer>> lse_a =
        backend.Allocate(sequences * kHeads);
    absl::StatusOr<std::unique_ptr<Buffer>> lse_b =
        backend.Allocate(sequences * kHeads);
    if (!scores.ok() || !q.ok() || !out_a.ok() || !out_b.ok() || !lse_a.ok() ||
        !lse_b.ok()) {
      return "allocation";
    }
    std::vector<int32_t> entry_rows(sequences * kEntries);
    for (int32_t& r : entry_rows) r = row_of(rng);
    std::vector<int32_t> window(sequences * kWindow);
    for (int32_t& r : window) r = row_of(rng);
    const std::vector<int64_t> visible(sequences, kEntries);
    const ConstMatrixView sv((*scores)->data(), sequences, kEntries);
    const ConstMatrixView qv((*q)->data(), sequences, kHeads * kHeadDim);
    const auto fused = [&](Buffer& out, Buffer& lse) {
      backend.ChooseAndAttend(sv, 1.0f, visible, kTopK, entry_rows, qv, kv,
                              kHeads, window, kWindow, scale, nullptr,
                              out.view(sequences, kHeads * kHeadDim),
                              lse.view(sequences, kHeads));
    };
    std::vector<int32_t> ids(sequences * kTopK), counts(sequences);
    std::vector<int32_t> idx(sequences * (kWindow + kTopK));
    const auto round_trip = [&](Buffer& out, Buffer& lse) {
      backend.SelectTopK(sv, 1.0f, visible, kTopK, {}, 0, 1,
                         absl::MakeSpan(ids), absl::MakeSpan(counts));
      std::fill(idx.begin(), idx.end(), -1);
      for (int64_t t = 0; t < sequences; ++t) {
        int32_t* row = idx.data() + t * (kWindow + kTopK);
        std::copy_n(window.begin() + t * kWindow, kWindow, row);
        for (int32_t c = 0; c < counts[t]; ++c) {
          row[kWindow + c] = entry_rows[t * kEntries + ids[t * kTopK + c]];
        }
      }
      backend.SparseAttention(qv, kv, kHeads, idx, kWindow + kTopK, scale,
                              nullptr, out.view(sequences, kHeads * kHeadDim),
                              lse.view(sequences, kHeads));
    };
    const std::string name = absl::StrCat("decode_choose_b", sequences);
    fused(**out_a, **lse_a);
    round_trip(**out_b, **lse_b);
    // Outputs and log-sum-exps agree (a NaN on either side fails).
    float diff = 0.0f;
    float most = 0.0f;
    for (const auto& [x, y] :
         {std::pair<Buffer*, Buffer*>{out_a->get(), out_b->get()},
          std::pair<Buffer*, Buffer*>{lse_a->get(), lse_b->get()}}) {
      std::vector<float> a(x->size()), b(y->size());
      backend.CopyToHost(x->data(), absl::MakeSpan(a));
      backend.CopyToHost(y->data(), absl::MakeSpan(b));
      for (size_t i = 0; i < a.size(); ++i) {
        const float d = std::fabs(a[i] - b[i]);
        if (!(d <= diff)) diff = d;
        if (!(std::fabs(b[i]) <= most)) most = std::fabs(b[i]);
      }
    }
    if (!(diff <= 1e-4f * std::max(most, 1e-30f))) {
      fields.push_back(absl::StrCat("\"", name,
                                    "_error\": \"the fused call differs by ",
                                    diff, " of ", most, "\""));
      continue;
    }
    const double round_trip_s =
        SecondsPerCall(backend, iters, [&] { round_trip(**out_b, **lse_b); });
    const double fused_s =
        SecondsPerCall(backend, iters, [&] { fused(**out_a, **lse_a); });
    if (round_trip_s <= 0 || fused_s <= 0) return "choose: device error";
    fields.push_back(absl::StrCat(
        "\"", name, "_fused_over_round_trip\": ", fused_s / round_trip_s));
  }
  return "";
}

// `text` as the inside of a JSON string: quotes and backslashes escaped,
// control characters as spaces.
std::string JsonText(absl::string_view text) {
  std::string out;
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else {
      out.push_back(static_cast<unsigned char>(c) < 0x20 ? ' ' : c);
    }
  }
  return out;
}

// A decode step of the tiny V4-Flash and V4.1-Flash checkpoints (made here,
// in a temporary folder) on the device: its time on the host (the step as
// served: the token drawn on the device, only it comes back) over the sum
// of its kernels' device times (the same number of steps timed kernel by
// kernel right after), and its launches. The tiny models do next to no
// arithmetic, so the ratio is the launch and host overhead a step pays
// beyond its kernels, which CUDA graphs remove. Returns an error or "".
std::string StepFields(int device, int steps,
                       std::vector<std::string>& fields) {
  if (steps < 1) return "fewer than one step to time";
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string base =
      absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/mneme-step-bench-XXXXXX");
  if (mkdtemp(base.data()) == nullptr) return "no temporary folder";
  struct Cleanup {
    std::string dir;
    ~Cleanup() {
      std::error_code ignored;
      std::filesystem::remove_all(dir, ignored);
    }
  } cleanup{base};
  for (const auto& [arch, name] :
       std::vector<std::pair<synthetic::ReleaseArch, const char*>>{
           {synthetic::ReleaseArch::kV4Flash, "v4flash"},
           {synthetic::ReleaseArch::kV41Flash, "v41flash"}}) {
    synthetic::ReleaseCheckpointOptions c;
    c.out_dir = absl::StrCat(base, "/", name);
    c.arch = arch;
    c.seed = 5;
    c.threads = 1;
    if (const absl::Status st = synthetic::MakeReleaseCheckpoint(c); !st.ok()) {
      return absl::StrCat(name, " checkpoint: ", st.message());
    }
    std::shared_ptr<KernelTimer> timer;
    worker::LocalModelOptions o;
    o.checkpoint_dir = c.out_dir;
    o.threads = 1;
    o.make_backend = [&]() { return CreateCudaBackend(device, &timer); };
    o.model.kv_cache.budget_bytes = 64 << 20;
    absl::StatusOr<std::unique_ptr<worker::LocalModel>> local =
        worker::LocalModel::Create(o);
    if (!local.ok()) return absl::StrCat(name, ": ", local.status().message());
    model::Model& m = (*local)->model();
    // A 96-token prompt, then one greedy token a step.
    model::StepInput prefill;
    model::SequenceChunk& chunk = prefill.chunks.emplace_back();
    chunk.sequence_id = 1;
    for (int i = 0; i < 96; ++i)
      chunk.tokens.push_back(3 + (i * 37 + 11) % 500);
    chunk.logits = model::SequenceChunk::Logits::kNone;
    chunk.sample = true;
    int64_t position = 0;
    int64_t next = 0;
    const auto step = [&](model::StepInput& in) -> absl::Status {
      absl::StatusOr<model::StepOutput> out = m.Step(in);
      if (!out.ok()) return out.status();
      if (out->sampled.size() != 1) {
        return absl::InternalError("no token drawn");
      }
      position += static_cast<int64_t>(in.chunks[0].tokens.size());
      next = out->sampled[0].id;
      return absl::OkStatus();
    };
    const auto decode = [&](int n) -> absl::Status {
      for (int i = 0; i < n; ++i) {
        model::StepInput in;
        model::SequenceChunk& c = in.chunks.emplace_back();
        c.sequence_id = 1;
        c.tokens = {next};
        c.start_position = position;
        c.logits = model::SequenceChunk::Logits::kNone;
        c.sample = true;
        if (absl::Status st = step(in); !st.ok()) return st;
      }
      return absl::OkStatus();
    };
    if (absl::Status st = step(prefill); !st.ok()) {
      return absl::StrCat(name, ": ", st.message());
    }
    if (absl::Status st = decode(3); !st.ok()) {  // warm-up
      return absl::StrCat(name, ": ", st.message());
    }
    const absl::Time start = absl::Now();
    if (absl::Status st = decode(steps); !st.ok()) {
      return absl::StrCat(name, ": ", st.message());
    }
    const double step_s = absl::ToDoubleSeconds(absl::Now() - start) / steps;
    timer->Reset();
    timer->Enable(true);
    const absl::Status timed = decode(steps);
    timer->Enable(false);
    const absl::StatusOr<double> kernel_s = timer->Seconds();
    const absl::StatusOr<std::vector<KernelTimer::OpTime>> ops = timer->ByOp();
    if (!timed.ok()) return absl::StrCat(name, ": ", timed.message());
    if (!kernel_s.ok()) {
      return absl::StrCat(name, ": ", kernel_s.status().message());
    }
    if (!ops.ok()) return absl::StrCat(name, ": ", ops.status().message());
    if (timer->Launches() >= KernelTimer::kMaxLaunches) {
      return absl::StrCat(name, ": more launches than the timer keeps");
    }
    const double per_step = *kernel_s / steps;
    fields.push_back(absl::StrCat("\"step_", name, "_over_kernels\": ",
                                  per_step > 0.0 ? step_s / per_step : -1.0));
    fields.push_back(absl::StrCat(
        "\"step_", name,
        "_launches\": ", static_cast<double>(timer->Launches()) / steps));
    fields.push_back(absl::StrCat("\"step_", name, "_ms\": ", step_s * 1e3));
    // Where the kernels' time goes: the 8 kinds of kernel that take the
    // most, each as its share of the kernels' time and launches a step.
    std::vector<std::string> top;
    for (size_t i = 0; i < ops->size() && i < 8; ++i) {
      const KernelTimer::OpTime& op = (*ops)[i];
      top.push_back(absl::StrCat(
          op.op, " ",
          absl::SixDigits(*kernel_s > 0.0 ? op.seconds / *kernel_s : 0.0), " x",
          absl::SixDigits(static_cast<double>(op.launches) / steps)));
    }
    fields.push_back(absl::StrCat("\"step_", name, "_ops\": \"",
                                  absl::StrJoin(top, ", "), "\""));
  }
  return "";
}

std::string Run(Backend& backend, int device, int iters) {
  std::mt19937 rng(1);
  std::vector<std::string> fields;
  constexpr int64_t kRows = 4096;
  constexpr int64_t kCols = 4096;
  absl::StatusOr<std::unique_ptr<Buffer>> x = backend.Allocate(512 * kCols);
  absl::StatusOr<std::unique_ptr<Buffer>> y = backend.Allocate(512 * kRows);
  if (!x.ok() || !y.ok()) return "{\"error\": \"allocation\"}";
  std::vector<float> ones(512 * kCols, 0.01f);
  backend.CopyFromHost(ones, (*x)->data());
  for (const auto& [format, name] :
       std::vector<std::pair<WeightFormat, const char*>>{
           {WeightFormat::kBf16, "bf16"},
           {WeightFormat::kFp8Block, "fp8"},
           {WeightFormat::kMxfp4, "mxfp4"},
           {WeightFormat::kNvfp4, "nvfp4"},
           {WeightFormat::kExl3, "exl3"},
           {WeightFormat::kGridbook, "gridbook"}}) {
    const Bytes bytes = RandomWeight(format, kRows, kCols, rng);
    HostWeight h;
    h.format = format;
    h.rows = kRows;
    h.cols = kCols;
    h.data = bytes.data;
    h.scale = bytes.scale;
    h.block_rows = 128;
    h.block_cols = 128;
    if (format == WeightFormat::kExl3) {
      h.exl3_bits = kExl3Bits;
      h.exl3_codebook = formats::exl3::Codebook::kMcg;
    }
    h.gridbook_scheme = bytes.scheme;
    h.gridbook_books = bytes.books;
    absl::StatusOr<std::unique_ptr<Weight>> w = backend.UploadWeight(h);
    if (!w.ok()) return absl::StrCat("{\"error\": \"", name, " upload\"}");
    const int64_t weight_bytes =
        static_cast<int64_t>(bytes.data.size() + bytes.scale.size());
    double gemv_seconds = -1.0;
    for (const int64_t tokens : {int64_t{1}, int64_t{16}, int64_t{512}}) {
      const ConstMatrixView xv((*x)->data(), tokens, kCols);
      const MatrixView yv{(*y)->data(), tokens, kRows};
      backend.Linear(xv, **w, yv);
      (void)backend.Synchronize();
      const absl::Time start = absl::Now();
      const int n = tokens == 1 ? iters : 3;
      for (int i = 0; i < n; ++i) backend.Linear(xv, **w, yv);
      const absl::Status st = backend.Synchronize();
      if (!st.ok()) return absl::StrCat("{\"error\": \"", st.ToString(), "\"}");
      const double s = absl::ToDoubleSeconds(absl::Now() - start) / n;
      if (tokens == 1) {
        gemv_seconds = s;
        fields.push_back(absl::StrCat("\"gemv_", name, "_vs_memcpy\": ",
                                      VsMemcpy(weight_bytes, s, iters)));
        continue;
      }
      // Seconds of `tokens` GEMVs over seconds of one call of `tokens`.
      fields.push_back(absl::StrCat(
          "\"linear", tokens, "_", name, "_per_token_over_gemv\": ",
          s > 0.0 ? gemv_seconds * static_cast<double>(tokens) / s : -1.0));
      if (tokens == 512) {
        fields.push_back(absl::StrCat("\"prefill_", name, "_tokens_per_s\": ",
                                      static_cast<double>(tokens) / s));
      }
    }
  }
  // Decode attention: 64 heads of 512 over 640 keys (window + selected).
  constexpr int kHeads = 64;
  constexpr int64_t kDim = 512;
  constexpr int kKeys = 640;
  constexpr int64_t kQueryWidth = int64_t{kHeads} * kDim;
  absl::StatusOr<std::unique_ptr<Buffer>> q = backend.Allocate(kQueryWidth);
  absl::StatusOr<std::unique_ptr<Buffer>> kv =
      backend.Allocate(int64_t{kKeys} * kDim);
  absl::StatusOr<std::unique_ptr<Buffer>> out = backend.Allocate(kQueryWidth);
  absl::StatusOr<std::unique_ptr<Buffer>> lse = backend.Allocate(kHeads);
  if (!q.ok() || !kv.ok() || !out.ok() || !lse.ok()) {
    return "{\"error\": \"allocation\"}";
  }
  std::vector<int32_t> idx(kKeys);
  for (int i = 0; i < kKeys; ++i) idx[i] = i;
  auto attend = [&] {
    backend.SparseAttention(
        ConstMatrixView((*q)->data(), 1, kQueryWidth),
        ConstMatrixView((*kv)->data(), kKeys, kDim), kHeads, idx, kKeys, 0.04f,
        nullptr, (*out)->view(1, kQueryWidth), (*lse)->view(1, kHeads));
  };
  attend();
  (void)backend.Synchronize();
  const absl::Time start = absl::Now();
  for (int i = 0; i < iters; ++i) attend();
  if (const absl::Status st = backend.Synchronize(); !st.ok()) {
    return absl::StrCat("{\"error\": \"", st.ToString(), "\"}");
  }
  const double s = absl::ToDoubleSeconds(absl::Now() - start) / iters;
  fields.push_back(absl::StrCat("\"attention_vs_memcpy\": ",
                                VsMemcpy(int64_t{kKeys} * kDim * 4, s, iters)));
  // A decode step's attention for 1 and 16 sequences: keys read in place
  // from the pool in one call over keys gathered per sequence (time ratio,
  // below 1 = in place is faster), and in place against a memcpy of the key
  // bytes.
  for (const int sequences : {1, 16}) {
    absl::StatusOr<std::unique_ptr<bench::DecodeAttentionCase>> step =
        bench::DecodeAttentionCase::Create(backend, sequences, 5);
    if (!step.ok()) {
      return absl::StrCat("{\"error\": \"", JsonText(step.status().ToString()),
                          "\"}");
    }
    const std::string name = absl::StrCat("decode_attention_b", sequences);
    if (const absl::Status st = (*step)->Matches(1e-4f); !st.ok()) {
      fields.push_back(absl::StrCat("\"", name, "_error\": \"",
                                    JsonText(st.ToString()), "\""));
      continue;
    }
    const double gathered =
        SecondsPerCall(backend, iters, [&] { (*step)->Gathered(); });
    const double in_place =
        SecondsPerCall(backend, iters, [&] { (*step)->InPlace(); });
    if (gathered <= 0 || in_place <= 0) {
      return "{\"error\": \"decode attention: device error\"}";
    }
    fields.push_back(absl::StrCat(
        "\"", name, "_in_place_over_gathered\": ", in_place / gathered));
    fields.push_back(
        absl::StrCat("\"", name, "_in_place_vs_memcpy\": ",
                     VsMemcpy((*step)->key_bytes(), in_place, iters)));
  }
  // The indexer's scores at decode: one query, 64 index heads of 128,
  // against 16384 compressed entries (64K tokens at ratio 4), keys read in
  // place from a pool: the same ratio for the key bytes it reads.
  constexpr int kIndexHeads = 64;
  constexpr int64_t kIndexDim = 128;
  constexpr int64_t kEntries = 16384;
  absl::StatusOr<std::unique_ptr<Buffer>> iq =
      backend.Allocate(kIndexHeads * kIndexDim);
  absl::StatusOr<std::unique_ptr<Buffer>> iw = backend.Allocate(kIndexHeads);
  absl::StatusOr<std::unique_ptr<Buffer>> pool =
      backend.Allocate(kEntries * kIndexDim);
  absl::StatusOr<std::unique_ptr<Buffer>> scores = backend.Allocate(kEntries);
  if (!iq.ok() || !iw.ok() || !pool.ok() || !scores.ok()) {
    return "{\"error\": \"allocation\"}";
  }
  std::vector<int32_t> entries(kEntries);
  for (int64_t e = 0; e < kEntries; ++e) entries[e] = static_cast<int32_t>(e);
  auto score = [&] {
    backend.IndexScores(
        ConstMatrixView((*iq)->data(), 1, kIndexHeads * kIndexDim),
        ConstMatrixView((*iw)->data(), 1, kIndexHeads),
        ConstMatrixView((*pool)->data(), kEntries, kIndexDim), entries,
        (*scores)->view(1, kEntries));
  };
  score();
  (void)backend.Synchronize();
  const absl::Time index_start = absl::Now();
  for (int i = 0; i < iters; ++i) score();
  if (const absl::Status st = backend.Synchronize(); !st.ok()) {
    return absl::StrCat("{\"error\": \"", st.ToString(), "\"}");
  }
  const double index_s =
      absl::ToDoubleSeconds(absl::Now() - index_start) / iters;
  fields.push_back(
      absl::StrCat("\"index_scores_vs_memcpy\": ",
                   VsMemcpy(kEntries * kIndexDim * 4, index_s, iters)));
  if (const std::string error = MoeFields(backend, iters, rng, fields);
      !error.empty()) {
    return absl::StrCat("{\"error\": \"", error, "\"}");
  }
  if (const std::string error = SampleFields(backend, iters, rng, fields);
      !error.empty()) {
    return absl::StrCat("{\"error\": \"", error, "\"}");
  }
  if (const std::string error = ChooseFields(backend, iters, rng, fields);
      !error.empty()) {
    return absl::StrCat("{\"error\": \"", error, "\"}");
  }
  // A failed step measurement keeps the other fields.
  if (const std::string error = StepFields(device, iters, fields);
      !error.empty()) {
    fields.push_back(absl::StrCat("\"step_error\": \"", JsonText(error), "\""));
  }
  return absl::StrCat("{", absl::StrJoin(fields, ", "), "}");
}

}  // namespace
}  // namespace mneme::gpu

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  absl::StatusOr<std::unique_ptr<mneme::gpu::Backend>> backend =
      mneme::gpu::CreateCudaBackend(absl::GetFlag(FLAGS_device));
  if (!backend.ok()) {
    std::printf("{\"skipped\": \"%s\"}\n",
                std::string(backend.status().message()).c_str());
    return 0;
  }
  std::printf("%s\n", mneme::gpu::Run(**backend, absl::GetFlag(FLAGS_device),
                                      absl::GetFlag(FLAGS_iters))
                          .c_str());
  return 0;
}
