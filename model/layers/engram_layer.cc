#include "model/layers/engram_layer.h"

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "checkpoint/engram_config_loader.h"
#include "common/status_macros.h"
#include "engram_store/hashing/column_split.h"

namespace mneme::model {
namespace {

// Most rows one Engram Lookup may ask for (RequestLimits' default); larger
// chunks use LookupStream.
constexpr int64_t kMaxRowsPerLookup = 65536;

}  // namespace

absl::StatusOr<EngramLayout> MakeEngramLayout(
    const checkpoint::ModelConfig& config, int tp_size) {
  ASSIGN_OR_RETURN(checkpoint::EngramConfig ec,
                   checkpoint::ParseEngramConfig(config));
  EngramLayout layout;
  layout.num_columns = ec.NumColumns();
  layout.row_dim = ec.head_dim;
  layout.context = ec.max_ngram_size - 1;
  for (int r = 0; r < tp_size; ++r) {
    ASSIGN_OR_RETURN(
        std::vector<int> cols,
        engram::RankColumns(engram::ColumnSplit::kStrided, ec.NumColumns(),
                            ec.n_heads, tp_size, r));
    layout.columns.push_back(std::move(cols));
  }
  // The ranks' rows are gathered as equal blocks and together fill every
  // column once.
  std::vector<int> seen(static_cast<size_t>(layout.num_columns), 0);
  for (const std::vector<int>& cols : layout.columns) {
    if (cols.size() != layout.columns[0].size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the Engram columns do not split evenly over ", tp_size, " ranks"));
    }
    for (int c : cols) {
      if (c < 0 || c >= layout.num_columns || seen[c]++ != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("Engram column ", c, " is not split once"));
      }
      layout.gathered_columns.push_back(c);
    }
  }
  for (size_t c = 0; c < seen.size(); ++c) {
    if (seen[c] == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("Engram column ", c, " is on no rank"));
    }
  }
  return layout;
}

absl::StatusOr<EngramWeights> LoadEngramWeights(WeightLoader& load,
                                                const std::string& prefix,
                                                const ModelDims& dims,
                                                const EngramLayout& layout) {
  const int64_t D = dims.hidden_size, hc = dims.hc_mult;
  EngramWeights w;
  ASSIGN_OR_RETURN(w.wkv,
                   load.Linear(prefix + "wkv", (hc + 1) * D,
                               int64_t{layout.num_columns} * layout.row_dim));
  ASSIGN_OR_RETURN(w.q, load.Vector(prefix + "q_weight", {hc, D}));
  ASSIGN_OR_RETURN(w.k, load.Vector(prefix + "k_weight", {hc, D}));
  return w;
}

int64_t EngramRowSlots(const EngramLayout& layout, int tp_rank,
                       int64_t tokens) {
  const auto ncols = static_cast<int64_t>(layout.columns[tp_rank].size());
  return (tokens * ncols * layout.row_dim + 1) / 2;
}

absl::Status EngramLookup(
    const EngramLayout& layout, engram::EngramClient& client, int layer,
    int tp_rank, const StepInput& input,
    const std::vector<const std::vector<int64_t>*>& histories,
    absl::Span<uint16_t> rows) {
  if (histories.size() != input.chunks.size()) {
    return absl::InternalError("one history per chunk is required");
  }
  const int64_t rd = layout.row_dim;
  const std::vector<int>& mine = layout.columns[tp_rank];
  const int64_t ncols = static_cast<int64_t>(mine.size());
  int64_t tokens = 0;
  for (const SequenceChunk& c : input.chunks) {
    tokens += static_cast<int64_t>(c.tokens.size());
  }
  // The rows stay bf16 (as the store sends them) until they are placed:
  // the all-gather moves half the bytes of fp32. Two bf16 values travel in
  // one float slot; a gather only copies bits.
  if (static_cast<int64_t>(rows.size()) !=
      2 * EngramRowSlots(layout, tp_rank, tokens)) {
    return absl::InternalError(absl::StrCat("Engram rows: room for ",
                                            rows.size(), " values for ", tokens,
                                            " tokens of ", ncols, " columns"));
  }
  int64_t t0 = 0;
  for (size_t i = 0; i < input.chunks.size(); ++i) {
    const SequenceChunk& c = input.chunks[i];
    const std::vector<int64_t>& history = *histories[i];
    const int64_t ctx_tokens =
        std::min<int64_t>(layout.context, static_cast<int64_t>(history.size()));
    engram::v1::LookupRequest req;
    req.set_layer_id(layer);
    for (int64_t k = static_cast<int64_t>(history.size()) - ctx_tokens;
         k < static_cast<int64_t>(history.size()); ++k) {
      req.add_token_ids(history[k]);
    }
    for (int64_t t : c.tokens) req.add_token_ids(t);
    req.set_context_token_count(static_cast<int32_t>(ctx_tokens));
    for (int col : mine) req.add_columns(col);
    req.set_encoding(engram::v1::ROW_ENCODING_BF16);
    const int64_t n_tokens = static_cast<int64_t>(c.tokens.size());
    // The rows land in place (bf16: 2 bytes a value).
    const size_t want = static_cast<size_t>(n_tokens * ncols * rd * 2);
    absl::StatusOr<int32_t> row_dim = client.LookupInto(
        req, /*stream=*/n_tokens * ncols > kMaxRowsPerLookup,
        absl::MakeSpan(
            reinterpret_cast<uint8_t*>(rows.data() + t0 * ncols * rd), want));
    if (!row_dim.ok()) {
      return absl::Status(row_dim.status().code(),
                          absl::StrCat("Engram layer ", layer, " lookup: ",
                                       row_dim.status().message()));
    }
    if (*row_dim != rd) {
      return absl::DataLossError(
          absl::StrCat("Engram layer ", layer, " lookup returned rows of ",
                       *row_dim, " values, expected ", rd));
    }
    t0 += n_tokens;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<const float*>> StageEngramRows(
    const LayerContext& ctx, const EngramLayout& layout, int64_t tokens,
    int layers, gpu::HostStaging& staging) {
  if (layers == 0) return std::vector<const float*>();
  const int64_t slots = EngramRowSlots(layout, ctx.tp_rank, tokens);
  if (staging.size() < layers * slots) {
    return absl::InternalError(absl::StrCat("Engram rows: ", staging.size(),
                                            " staged floats for ", layers,
                                            " layers of ", tokens, " tokens"));
  }
  const bool in_place = ctx.backend.ReadsStagingInPlace(staging);
  std::vector<const float*> staged;
  staged.reserve(static_cast<size_t>(layers));
  for (int e = 0; e < layers; ++e) {
    float* dst = nullptr;
    if (!in_place) {
      ASSIGN_OR_RETURN(WorkBuffer buffer, ctx.workspace.Take(slots));
      dst = buffer.data();
    }
    staged.push_back(
        ctx.backend.StageFromHost(staging, int64_t{e} * slots, slots, dst));
  }
  return staged;
}

absl::Status EngramForward(const LayerContext& ctx, const EngramLayout& layout,
                           const EngramWeights& w, const float* staged,
                           gpu::MatrixView stream, absl::Duration& rows_time) {
  const absl::Time start = absl::Now();
  const int n = ctx.tp_size;
  const int64_t tokens = stream.rows;
  const int64_t rd = layout.row_dim;
  const auto ncols = static_cast<int64_t>(layout.columns[ctx.tp_rank].size());
  const int64_t slots = EngramRowSlots(layout, ctx.tp_rank, tokens);
  ctx.backend.AwaitStaged();
  Workspace::Scope scope(ctx.workspace);
  // Every rank's block of rows (equal sizes: MakeEngramLayout), then each
  // row placed by its column, on the device.
  const float* packed = staged;
  if (n > 1) {
    ASSIGN_OR_RETURN(WorkBuffer recv, ctx.workspace.Take(n * slots));
    RETURN_IF_ERROR(ctx.comm->AllGather(staged, slots, recv.data()));
    packed = recv.data();
  }
  const int64_t width = int64_t{layout.num_columns} * rd;
  ASSIGN_OR_RETURN(WorkBuffer e, ctx.workspace.Take(tokens * width));
  ctx.backend.UnpackBf16Rows(packed, slots, layout.gathered_columns, ncols,
                             static_cast<int>(rd), e.view(tokens, width));
  rows_time += absl::Now() - start;
  const int64_t D = ctx.dims.hidden_size, hc = ctx.dims.hc_mult;
  ASSIGN_OR_RETURN(WorkBuffer kv, ctx.workspace.Take(tokens * (hc + 1) * D));
  ctx.backend.Linear(e.view(tokens, width), *w.wkv,
                     kv.view(tokens, (hc + 1) * D));
  ctx.backend.EngramGate(kv.view(tokens, (hc + 1) * D), w.q->data(),
                         w.k->data(), static_cast<int>(hc),
                         ctx.dims.rms_norm_eps, stream);
  return absl::OkStatus();
}

void EngramPrefetch(const EngramLayout& layout, engram::EngramClient& client,
                    const std::vector<int>& layers, int tp_rank,
                    const std::vector<PrefetchHint>& hints) {
  const std::vector<int>& mine = layout.columns[tp_rank];
  for (const PrefetchHint& h : hints) {
    if (h.tokens.empty()) continue;
    const size_t ctx = std::min<size_t>(h.context.size(), layout.context);
    for (int layer : layers) {
      engram::v1::PrefetchRequest req;
      req.set_layer_id(layer);
      for (size_t k = h.context.size() - ctx; k < h.context.size(); ++k) {
        req.add_token_ids(h.context[k]);
      }
      for (int64_t t : h.tokens) req.add_token_ids(t);
      req.set_context_token_count(static_cast<int32_t>(ctx));
      for (int col : mine) req.add_columns(col);
      // Best effort by design: a dropped or failed prefetch only means the
      // step that needs the rows reads them itself.
      (void)client.Prefetch(req);
    }
  }
}

}  // namespace mneme::model
