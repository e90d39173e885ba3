#include "tools/cli/plan_command.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "checkpoint/model_config.h"
#include "checkpoint/sharded_checkpoint.h"
#include "common/status_macros.h"
#include "gpu/cpu/cpu_backend.h"
#include "model/model.h"
#include "model/model_config.h"
#include "nlohmann/json.hpp"
#include "tools/cli/args.h"

namespace mneme::cli {
namespace {

using model::ModelDims;

constexpr int64_t kMaxBytes = int64_t{1} << 50;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

std::string Human(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (bytes >= 1024 && unit < 4) {
    bytes /= 1024;
    ++unit;
  }
  return unit == 0 ? absl::StrFormat("%.0f B", bytes)
                   : absl::StrFormat("%.2f %s", bytes, units[unit]);
}

// --- Weights -------------------------------------------------------------

// What a tensor is for the worker.
enum class WeightKind {
  kSplit,       // Loaded in parts, one per rank.
  kReplicated,  // Loaded whole by every rank.
  kDraft,       // mtp.*: checked by the worker, not loaded.
  kEngram,      // The Engram tables: served by the engram store.
  kUnloaded,    // Vision tower, image tokens, bias_vl: not loaded.
};

struct WeightShare {
  WeightKind kind = WeightKind::kReplicated;
  // Bytes of the tensor that rank `rank` reads (for kDraft: that it would
  // read if the stage were split like a main layer).
  uint64_t bytes = 0;
};

// The part [num / den] of `total` bytes, rounded down.
uint64_t Part(uint64_t total, int64_t num, int64_t den) {
  return static_cast<uint64_t>(
      (static_cast<unsigned __int128>(total) * static_cast<uint64_t>(num)) /
      static_cast<uint64_t>(den));
}

// The share of tensor `name` (`bytes` on disk) rank `rank` of `tp` loads,
// following the worker's loaders: model/layers/attention.cc (query heads,
// output groups, sink and indexer heads split), moe.cc (routed experts by
// owner, shared expert split when its width divides), embedding_head.cc
// (vocabulary rows in ceil(V / tp) shards), everything else whole.
WeightShare ShareOf(const std::string& name, uint64_t bytes, const ModelDims& d,
                    int rank, int tp) {
  WeightShare s;
  s.bytes = bytes;
  if (absl::StartsWith(name, "vision.") || absl::StartsWith(name, "aligner.") ||
      absl::StartsWith(name, "image_") ||
      absl::StrContains(name, ".gate.bias_vl")) {
    s.kind = WeightKind::kUnloaded;
    return s;
  }
  if (absl::StrContains(name, ".engram.embed.")) {
    s.kind = WeightKind::kEngram;
    return s;
  }
  if (absl::StartsWith(name, "embed.") || absl::StartsWith(name, "head.")) {
    const int64_t shard = CeilDiv(d.vocab_size, tp);
    const int64_t begin = std::min<int64_t>(rank * shard, d.vocab_size);
    const int64_t rows = std::min(shard, d.vocab_size - begin);
    s.kind = WeightKind::kSplit;
    s.bytes = Part(bytes, std::max<int64_t>(rows, 0), d.vocab_size);
    return s;
  }
  const bool draft = absl::StartsWith(name, "mtp.");
  if (!draft && !absl::StartsWith(name, "layers.")) return s;  // norm, hc_head
  // The part after "layers.<l>." / "mtp.<s>.".
  const size_t dot = name.find('.', name.find('.') + 1);
  const std::string rest =
      dot == std::string::npos ? std::string() : name.substr(dot + 1);
  auto finish = [&](WeightShare share) {
    if (draft) share.kind = WeightKind::kDraft;
    return share;
  };
  for (const char* split :
       {"attn.wq_b.", "attn.wo_a.", "attn.wo_b.", "attn.indexer.wq_b.",
        "attn.indexer.weights_proj."}) {
    if (absl::StartsWith(rest, split)) {
      s.kind = WeightKind::kSplit;
      s.bytes = Part(bytes, 1, tp);
      return finish(s);
    }
  }
  if (rest == "attn.attn_sink") {
    s.kind = WeightKind::kSplit;
    s.bytes = Part(bytes, 1, tp);
    return finish(s);
  }
  if (absl::StartsWith(rest, "ffn.experts.")) {
    const std::string tail = rest.substr(std::string("ffn.experts.").size());
    int expert = 0;
    const std::string id = tail.substr(0, tail.find('.'));
    const int experts =
        draft && d.dspark_block_size > 0 ? d.draft_num_experts : d.num_experts;
    s.kind = WeightKind::kSplit;
    if (!absl::SimpleAtoi(id, &expert) || experts < tp) return finish(s);
    const int local = experts / tp;
    s.bytes = expert / local == rank ? bytes : 0;
    return finish(s);
  }
  if (absl::StartsWith(rest, "ffn.shared_experts.")) {
    const int64_t width =
        int64_t{std::max(d.num_shared_experts, 1)} * d.moe_intermediate;
    s.kind = WeightKind::kSplit;
    s.bytes = width % tp == 0 ? Part(bytes, 1, tp) : (rank == 0 ? bytes : 0);
    return finish(s);
  }
  return finish(s);
}

struct RankWeights {
  uint64_t split = 0, replicated = 0, draft = 0;
  uint64_t loaded() const { return split + replicated; }
};

struct WeightPlan {
  std::vector<RankWeights> ranks;
  uint64_t on_disk = 0, draft = 0, engram = 0, unloaded = 0;
  int64_t tensors = 0;
};

WeightPlan PlanWeights(const checkpoint::ShardedCheckpoint& ckpt,
                       const ModelDims& d, int tp) {
  WeightPlan plan;
  plan.ranks.resize(tp);
  for (const auto& [name, location] : ckpt.tensors()) {
    const uint64_t bytes = location.info->byte_length;
    plan.on_disk += bytes;
    ++plan.tensors;
    for (int r = 0; r < tp; ++r) {
      const WeightShare s = ShareOf(name, bytes, d, r, tp);
      RankWeights& rw = plan.ranks[r];
      switch (s.kind) {
        case WeightKind::kSplit:
          rw.split += s.bytes;
          break;
        case WeightKind::kReplicated:
          rw.replicated += s.bytes;
          break;
        case WeightKind::kDraft:
          rw.draft += s.bytes;
          if (r == 0) plan.draft += bytes;
          break;
        case WeightKind::kEngram:
          if (r == 0) plan.engram += bytes;
          break;
        case WeightKind::kUnloaded:
          if (r == 0) plan.unloaded += bytes;
          break;
      }
    }
  }
  return plan;
}

// --- KV cache --------------------------------------------------------------

// The pool rows of a compressor's per-sequence state
// (model/layers/compressor.cc CompressorWeights::StateRows): kv and score
// rows of the incomplete block (and with overlap the previous one).
int64_t StateRows(int ratio, bool overlap) {
  if (ratio <= 1) return 0;
  const int64_t c = overlap ? 2 : 1;
  return 2 * c * ratio * c;
}

// Entries of [0, count) rank `rank` keeps (model/dcp_merge.cc).
int64_t OwnedEntriesBefore(int64_t count, int rank, int size, int il) {
  if (size == 1) return count;
  const int64_t cycle = int64_t{size} * il;
  const int64_t rest = count % cycle - int64_t{rank} * il;
  return (count / cycle) * il + std::clamp<int64_t>(rest, 0, il);
}

enum LayerType { kWindowOnly = 0, kSource, kReader, kNumTypes };
const char* const kTypeNames[] = {"window-only", "compressing source",
                                  "reader (consumer)"};

// One main layer's KV needs.
struct LayerKv {
  LayerType type = kWindowOnly;
  int ratio = 0;
  bool index_keys = false;
  // Pool rows of the compressor states (main and, V4, the indexer's).
  int64_t state_rows = 0, index_state_rows = 0;
  // Release bytes of those states (fp32 of the real widths).
  double state_bytes_compact = 0;
};

struct KvPlan {
  std::vector<LayerKv> layers;
  // Per token, all ranks together (the pool divides by dcp).
  double pool_entry[kNumTypes] = {}, pool_keys = 0;
  double compact_entry[kNumTypes] = {}, compact_keys = 0;
  int count[kNumTypes] = {};
  int key_layers = 0;
  // Compact row sizes.
  double entry_bytes = 0, key_bytes = 0, window_row_bytes = 0;
  std::string entry_format, key_format, window_format;
  // Per sequence, per rank.
  int64_t fixed_pool_bytes = 0, fixed_pool_blocks = 0;
  int64_t window_pool_bytes = 0, state_pool_bytes = 0;
  double fixed_compact_bytes = 0, window_compact_bytes = 0,
         state_compact_bytes = 0;
  double PoolPerToken() const {
    double s = pool_keys;
    for (double v : pool_entry) s += v;
    return s;
  }
  double CompactPerToken() const {
    double s = compact_keys;
    for (double v : compact_entry) s += v;
    return s;
  }
};

KvPlan PlanKv(const ModelDims& d, int br, int dcp_interleave) {
  KvPlan p;
  const int64_t hd = d.head_dim, dI = d.index_head_dim, rope = d.rope_dim;
  const double row = static_cast<double>(hd) * 4;
  if (d.IsV41()) {
    // MODEL_V41.md 1.2: entries FP4 e2m1 + E4M3 per 16, index keys FP4 +
    // E8M0 per 32, window fp8 e4m3 + UE8M0 per 32 over the whole vector.
    p.entry_bytes = hd / 2.0 + hd / 16.0;
    p.key_bytes = dI / 2.0 + dI / 32.0;
    p.window_row_bytes = hd + hd / 32.0;
    p.entry_format = "fp4 e2m1 + e4m3 per 16";
    p.key_format = "fp4 e2m1 + e8m0 per 32";
    p.window_format = "fp8 e4m3 + ue8m0 per 32";
  } else {
    // MODEL_V4.md 6 (b), 9.4: fp8 nope with ue8m0 per 64 + bf16 rope, one
    // pad byte (the 584-byte entry); index keys fp4 e2m1 + e8m0 per 32 as
    // the reference simulates them.
    p.entry_bytes = (hd - rope) + rope * 2.0 + (hd - rope) / 64.0 + 1;
    p.key_bytes = dI / 2.0 + dI / 32.0;
    p.window_row_bytes = p.entry_bytes;
    p.entry_format = "fp8 nope + ue8m0 per 64 + bf16 rope";
    p.key_format = "fp4 e2m1 + e8m0 per 32";
    p.window_format = p.entry_format;
  }
  int64_t fixed_rows = 0;
  for (int l = 0; l < d.num_layers; ++l) {
    LayerKv k;
    k.ratio = d.compress_ratios[l];
    if (d.HasCompressor(l)) {
      k.type = kSource;
    } else if (d.CacheSource(l) >= 0) {
      k.type = kReader;
    }
    k.index_keys = d.OwnsIndexKeys(l);
    if (d.HasCompressor(l)) {
      const bool overlap = !d.IsV41() && k.ratio == 4;
      k.state_rows = StateRows(k.ratio, overlap);
      k.state_bytes_compact =
          static_cast<double>(k.state_rows) * static_cast<double>(hd) * 4;
      if (!d.IsV41() && d.HasIndexer(l)) {
        k.index_state_rows = StateRows(k.ratio, k.ratio == 4);
        k.state_bytes_compact += static_cast<double>(k.index_state_rows) *
                                 static_cast<double>(dI) * 4;
      }
      p.pool_entry[kSource] += row / k.ratio;
      p.compact_entry[kSource] += p.entry_bytes / k.ratio;
      if (k.index_keys) {
        p.pool_keys += row / k.ratio;
        p.compact_keys += p.key_bytes / k.ratio;
        ++p.key_layers;
      }
    }
    ++p.count[k.type];
    // model/model.cc KvFixedBlocksPerSequence.
    p.fixed_pool_blocks += CeilDiv(d.sliding_window, br) +
                           CeilDiv(k.state_rows, br) +
                           CeilDiv(k.index_state_rows, br);
    if (k.type == kSource) {
      p.fixed_pool_blocks +=
          (k.index_keys ? 2 : 1) * (1 + CeilDiv(dcp_interleave, br));
    }
    fixed_rows += k.state_rows + k.index_state_rows;
    p.state_compact_bytes += k.state_bytes_compact;
    p.layers.push_back(k);
  }
  p.window_pool_bytes = int64_t{d.num_layers} * d.sliding_window * hd * 4;
  p.state_pool_bytes = fixed_rows * hd * 4;
  p.fixed_pool_bytes = p.fixed_pool_blocks * br * hd * 4;
  p.window_compact_bytes =
      static_cast<double>(d.num_layers) * d.sliding_window * p.window_row_bytes;
  p.fixed_compact_bytes = p.window_compact_bytes + p.state_compact_bytes;
  return p;
}

// Pool blocks rank `rank` needs for one sequence of `tokens` tokens
// (model/model.cc Admit).
int64_t SequenceBlocks(const ModelDims& d, const KvPlan& p, int64_t tokens,
                       int br, int rank, int dcp, int il) {
  int64_t blocks = 0;
  for (int l = 0; l < d.num_layers; ++l) {
    const LayerKv& k = p.layers[l];
    blocks += CeilDiv(d.sliding_window, br) + CeilDiv(k.state_rows, br) +
              CeilDiv(k.index_state_rows, br);
    if (k.type == kSource) {
      const int64_t own = OwnedEntriesBefore(tokens / k.ratio, rank, dcp, il);
      blocks += (k.index_keys ? 2 : 1) * CeilDiv(own, br);
    }
  }
  return blocks;
}

// The longest sequence whose blocks fit in `num_blocks` on every rank; -1
// when not even an empty one does.
int64_t LongestSequence(const ModelDims& d, const KvPlan& p, int64_t num_blocks,
                        int br, int dcp, int il) {
  auto fits = [&](int64_t tokens) {
    for (int r = 0; r < dcp; ++r) {
      if (SequenceBlocks(d, p, tokens, br, r, dcp, il) > num_blocks) {
        return false;
      }
    }
    return true;
  };
  if (!fits(0)) return -1;
  int64_t lo = 0, hi = 1;
  while (hi < (int64_t{1} << 52) && fits(hi)) {
    lo = hi;
    hi *= 2;
  }
  if (fits(hi)) return hi;
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

std::string ArchTitle(const ModelDims& d) {
  if (d.IsV41()) return "DeepSeek-V4.1-Flash (deepseek_v41)";
  return d.dspark_block_size > 0
             ? "DeepSeek-V4-Flash (deepseek_v4) with DSpark stages"
             : "DeepSeek-V4-Flash (deepseek_v4)";
}

}  // namespace

absl::StatusOr<int64_t> ParseByteCount(absl::string_view flag,
                                       absl::string_view text) {
  const std::string t(absl::StripAsciiWhitespace(text));
  size_t end = 0;
  while (end < t.size() &&
         (absl::ascii_isdigit(static_cast<unsigned char>(t[end])) ||
          t[end] == '.')) {
    ++end;
  }
  const std::string number = t.substr(0, end);
  const std::string unit = t.substr(end);
  static const std::map<std::string, double>* const kUnits =
      new std::map<std::string, double>{{"", 1},
                                        {"B", 1},
                                        {"KB", 1e3},
                                        {"MB", 1e6},
                                        {"GB", 1e9},
                                        {"TB", 1e12},
                                        {"KiB", 1024.0},
                                        {"MiB", 1048576.0},
                                        {"GiB", 1073741824.0},
                                        {"TiB", 1099511627776.0}};
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, "=", text, ": ", why,
                     " (a byte count such as 6442450944, 6GiB or 1.5GB)"));
  };
  const auto it = kUnits->find(unit);
  if (number.empty()) return bad("no number");
  if (it == kUnits->end())
    return bad(absl::StrCat("unknown unit '", unit, "'"));
  int64_t whole = 0;
  if (number.find('.') == std::string::npos) {
    if (!absl::SimpleAtoi(number, &whole) || whole > kMaxBytes) {
      return bad("out of range");
    }
    const double value = static_cast<double>(whole) * it->second;
    if (value > static_cast<double>(kMaxBytes)) return bad("more than 2^50");
    return static_cast<int64_t>(whole * static_cast<int64_t>(it->second));
  }
  double value = 0;
  if (std::count(number.begin(), number.end(), '.') > 1 ||
      !absl::SimpleAtod(number, &value) || !std::isfinite(value)) {
    return bad("not a number");
  }
  value *= it->second;
  if (value > static_cast<double>(kMaxBytes)) return bad("more than 2^50");
  return static_cast<int64_t>(std::floor(value));
}

absl::Status RunPlan(const std::vector<std::string>& argv, std::ostream& out) {
  ASSIGN_OR_RETURN(Args args,
                   Args::Parse(argv,
                               {"checkpoint", "tp", "dcp", "kv-cache-bytes",
                                "kv-block-rows", "dcp-interleave"},
                               {"json"}));
  if (!args.positionals().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unexpected argument '", args.positionals()[0],
                     "' (usage: mneme plan --checkpoint DIR --tp N --dcp N "
                     "--kv-cache-bytes B [--json])"));
  }
  ASSIGN_OR_RETURN(const std::string dir, args.Required("checkpoint"));
  RETURN_IF_ERROR(args.Required("tp").status());
  ASSIGN_OR_RETURN(const std::string kv_text, args.Required("kv-cache-bytes"));
  ASSIGN_OR_RETURN(const int64_t tp64, args.GetInt("tp", 1, 1, 1024));
  ASSIGN_OR_RETURN(const int64_t dcp64, args.GetInt("dcp", 1, 1, 1024));
  ASSIGN_OR_RETURN(const int64_t br64,
                   args.GetInt("kv-block-rows", 16, 1, 4096));
  ASSIGN_OR_RETURN(const int64_t il64,
                   args.GetInt("dcp-interleave", 1, 1, int64_t{1} << 20));
  ASSIGN_OR_RETURN(const int64_t kv_bytes,
                   ParseByteCount("kv-cache-bytes", kv_text));
  const int tp = static_cast<int>(tp64), dcp = static_cast<int>(dcp64);
  const int br = static_cast<int>(br64), il = static_cast<int>(il64);
  if (kv_bytes <= 0) {
    return absl::InvalidArgumentError("--kv-cache-bytes must be positive");
  }
  if (dcp != 1 && dcp != tp) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--dcp=", dcp, " must be 1 or the --tp (", tp,
        "): decode context parallelism runs on the tensor-parallel ranks"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<checkpoint::ModelConfig> config,
                   checkpoint::ModelConfig::Create(
                       absl::StrCat(dir, "/", checkpoint::kConfigFileName)));
  ASSIGN_OR_RETURN(const ModelDims d, model::LoadModelDims(*config));
  RETURN_IF_ERROR(model::CheckTensorParallel(d, tp));
  if (CeilDiv(d.vocab_size, tp) * (tp - 1) >= d.vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tp=", tp, " leaves the last rank no rows of the ",
                     d.vocab_size, "-token vocabulary"));
  }
  // The checkpoint must load as the workers load it: every tensor they
  // read, checked against its header only (no data read).
  ASSIGN_OR_RETURN(std::unique_ptr<gpu::CpuBackend> backend,
                   gpu::CpuBackend::Create({.threads = 1}));
  RETURN_IF_ERROR(model::CheckCheckpointLoads(dir, tp, *backend));
  ASSIGN_OR_RETURN(std::unique_ptr<checkpoint::ShardedCheckpoint> ckpt,
                   checkpoint::ShardedCheckpoint::Create(dir));

  const WeightPlan w = PlanWeights(*ckpt, d, tp);
  const KvPlan kv = PlanKv(d, br, il);
  const int64_t block_bytes = int64_t{br} * d.head_dim * 4;
  const int64_t num_blocks = kv_bytes / block_bytes;
  const double pool_bytes = static_cast<double>(num_blocks * block_bytes);
  const double pool_per_token = kv.PoolPerToken();
  const double compact_per_token = kv.CompactPerToken();
  // Tokens the pool holds, all sequences together: every rank keeps
  // 1 / dcp of each sequence's entries.
  const int64_t pool_tokens =
      pool_per_token > 0
          ? static_cast<int64_t>(std::floor(pool_bytes * dcp / pool_per_token))
          : -1;
  const int64_t longest = LongestSequence(d, kv, num_blocks, br, dcp, il);
  const int64_t compact_tokens =
      compact_per_token > 0
          ? static_cast<int64_t>(std::floor(static_cast<double>(kv_bytes) *
                                            dcp / compact_per_token))
          : -1;
  const double compact_after_window =
      static_cast<double>(kv_bytes) - kv.fixed_compact_bytes;
  const int64_t compact_longest =
      compact_per_token > 0 && compact_after_window > 0
          ? static_cast<int64_t>(
                std::floor(compact_after_window * dcp / compact_per_token))
          : -1;
  uint64_t max_loaded = 0;
  for (const RankWeights& r : w.ranks)
    max_loaded = std::max(max_loaded, r.loaded());

  if (args.Has("json")) {
    nlohmann::json j;
    j["checkpoint"] = dir;
    j["architecture"] = ArchTitle(d);
    j["model_type"] = model::ArchName(d.arch);
    j["tp"] = tp;
    j["dcp"] = dcp;
    j["kv_cache_bytes"] = kv_bytes;
    j["kv_block_rows"] = br;
    j["dcp_interleave"] = il;
    nlohmann::json ranks = nlohmann::json::array();
    for (int r = 0; r < tp; ++r) {
      const RankWeights& rw = w.ranks[r];
      ranks.push_back({{"rank", r},
                       {"split_bytes", rw.split},
                       {"replicated_bytes", rw.replicated},
                       {"loaded_bytes", rw.loaded()},
                       {"draft_bytes_if_split", rw.draft}});
    }
    j["weights"] = {{"tensors", w.tensors},
                    {"on_disk_bytes", w.on_disk},
                    {"ranks", ranks},
                    {"max_rank_loaded_bytes", max_loaded},
                    {"draft_bytes", w.draft},
                    {"engram_table_bytes", w.engram},
                    {"not_loaded_bytes", w.unloaded}};
    nlohmann::json types = nlohmann::json::array();
    for (int t = 0; t < kNumTypes; ++t) {
      types.push_back(
          {{"type", kTypeNames[t]},
           {"layers", kv.count[t]},
           {"pool_bytes_per_token", kv.pool_entry[t]},
           {"pool_bytes_per_token_per_rank", kv.pool_entry[t] / dcp},
           {"compact_bytes_per_token", kv.compact_entry[t]}});
    }
    types.push_back({{"type", "index keys"},
                     {"layers", kv.key_layers},
                     {"pool_bytes_per_token", kv.pool_keys},
                     {"pool_bytes_per_token_per_rank", kv.pool_keys / dcp},
                     {"compact_bytes_per_token", kv.compact_keys}});
    j["kv_per_token"] = {{"by_type", types},
                         {"pool_bytes", pool_per_token},
                         {"pool_bytes_per_rank", pool_per_token / dcp},
                         {"compact_bytes", compact_per_token},
                         {"compact_bytes_per_rank", compact_per_token / dcp},
                         {"compact_entry_bytes", kv.entry_bytes},
                         {"compact_index_key_bytes", kv.key_bytes},
                         {"compact_window_row_bytes", kv.window_row_bytes}};
    j["kv_fixed_per_sequence"] = {
        {"pool_window_bytes", kv.window_pool_bytes},
        {"pool_state_bytes", kv.state_pool_bytes},
        {"pool_blocks", kv.fixed_pool_blocks},
        {"pool_bytes", kv.fixed_pool_bytes},
        {"compact_window_bytes", kv.window_compact_bytes},
        {"compact_state_bytes", kv.state_compact_bytes},
        {"compact_bytes", kv.fixed_compact_bytes}};
    j["kv_pool"] = {{"block_bytes", block_bytes},
                    {"blocks", num_blocks},
                    {"tokens", pool_tokens},
                    {"longest_sequence", longest},
                    {"compact_tokens", compact_tokens},
                    {"compact_longest_sequence", compact_longest}};
    out << j.dump(2) << "\n";
    return absl::OkStatus();
  }

  out << "plan " << dir << "\n";
  out << absl::StrFormat(
      "  %s, %d main layers, tp %d, dcp %d (interleave %d), KV cache %s "
      "(%d B) per rank, blocks of %d rows\n",
      ArchTitle(d), d.num_layers, tp, dcp, il, Human(kv_bytes), kv_bytes, br);
  out << "weights per rank (bytes as stored on disk)\n";
  out << absl::StrFormat("  %-6s %18s %18s %18s\n", "rank", "split",
                         "replicated", "loaded");
  for (int r = 0; r < tp; ++r) {
    const RankWeights& rw = w.ranks[r];
    out << absl::StrFormat("  %-6d %18d %18d %18d  (%s)\n", r, rw.split,
                           rw.replicated, rw.loaded(), Human(rw.loaded()));
  }
  out << absl::StrFormat(
      "  draft stages (mtp.*)      %d B (%s) on disk, %s per rank if split "
      "like a main layer; not loaded by the worker\n",
      w.draft, Human(w.draft), Human(w.ranks[0].draft));
  out << absl::StrFormat(
      "  Engram tables             %d B (%s), served by the engram store\n",
      w.engram, Human(w.engram));
  out << absl::StrFormat("  vision / image / bias_vl  %d B (%s), not loaded\n",
                         w.unloaded, Human(w.unloaded));
  out << absl::StrFormat("  checkpoint                %d B (%s), %d tensors\n",
                         w.on_disk, Human(w.on_disk), w.tensors);

  out << "KV bytes per token (main layers)\n";
  out << absl::StrFormat("  %-22s %6s %14s %14s %14s\n", "layer type", "layers",
                         "pool (fp32)", "pool per rank", "compact");
  for (int t = 0; t < kNumTypes; ++t) {
    out << absl::StrFormat("  %-22s %6d %14.2f %14.2f %14.2f\n", kTypeNames[t],
                           kv.count[t], kv.pool_entry[t],
                           kv.pool_entry[t] / dcp, kv.compact_entry[t]);
  }
  out << absl::StrFormat("  %-22s %6d %14.2f %14.2f %14.2f\n", "index keys",
                         kv.key_layers, kv.pool_keys, kv.pool_keys / dcp,
                         kv.compact_keys);
  out << absl::StrFormat("  %-22s %6s %14.2f %14.2f %14.2f\n", "total", "",
                         pool_per_token, pool_per_token / dcp,
                         compact_per_token);
  out << absl::StrFormat(
      "  pool rows: %d fp32 (%d B); compact: entry %.0f B (%s), index key "
      "%.0f B (%s), window row %.0f B (%s)\n",
      d.head_dim, d.head_dim * 4, kv.entry_bytes, kv.entry_format, kv.key_bytes,
      kv.key_format, kv.window_row_bytes, kv.window_format);
  out << "fixed bytes per sequence, per rank\n";
  out << absl::StrFormat(
      "  pool     window %d B + compressor state %d B; %d blocks with "
      "rounding = %d B (%s)\n",
      kv.window_pool_bytes, kv.state_pool_bytes, kv.fixed_pool_blocks,
      kv.fixed_pool_bytes, Human(kv.fixed_pool_bytes));
  out << absl::StrFormat(
      "  compact  window %.0f B + compressor state (fp32) %.0f B = %.0f B "
      "(%s)\n",
      kv.window_compact_bytes, kv.state_compact_bytes, kv.fixed_compact_bytes,
      Human(kv.fixed_compact_bytes));
  out << absl::StrFormat("KV pool for %d B per rank\n", kv_bytes);
  out << absl::StrFormat(
      "  pool     %d blocks of %d B; %d tokens (all sequences, %d ranks "
      "sharing the entries); longest single sequence %d tokens\n",
      num_blocks, block_bytes, pool_tokens, dcp, longest);
  out << absl::StrFormat(
      "  compact  %d tokens at %.2f B per token (%.3f per rank); longest "
      "single sequence %d tokens after the fixed bytes\n",
      compact_tokens, compact_per_token, compact_per_token / dcp,
      compact_longest);
  return absl::OkStatus();
}

}  // namespace mneme::cli
