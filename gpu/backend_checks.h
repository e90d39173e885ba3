#ifndef MNEME_GPU_BACKEND_CHECKS_H_
#define MNEME_GPU_BACKEND_CHECKS_H_

// The shape contracts of Backend ops (gpu/backend.h), checked the same way
// by every backend: a mismatch is a programming error (CHECK).

#include <cstdint>

#include "absl/types/span.h"
#include "glog/logging.h"
#include "gpu/backend.h"

namespace mneme::gpu {

// [offset, offset + floats) lies within `staging` (StageFromHost).
inline void CheckStagingRange(const HostStaging& staging, int64_t offset,
                              int64_t floats) {
  CHECK_GE(offset, 0);
  CHECK_GE(floats, 0);
  CHECK_LE(offset, staging.size());
  CHECK_LE(floats, staging.size() - offset);
}

// Rope: head_dim > 0, 0 <= rope_dim <= head_dim and even, x.cols a multiple
// of head_dim, one position per row.
inline void CheckRopeShapes(ConstMatrixView x, int head_dim, int rope_dim,
                            absl::Span<const int32_t> positions) {
  CHECK_GT(head_dim, 0);
  CHECK_GE(rope_dim, 0);
  CHECK_LE(rope_dim, head_dim);
  CHECK_EQ(rope_dim % 2, 0);
  CHECK_EQ(x.cols % head_dim, 0);
  CHECK_EQ(static_cast<int64_t>(positions.size()), x.rows);
}

// SparseAttention: shapes, and every key index in [-1, kv.rows).
inline void CheckSparseAttentionShapes(ConstMatrixView q, ConstMatrixView kv,
                                       int heads, absl::Span<const int32_t> idx,
                                       int width, ConstMatrixView out,
                                       ConstMatrixView lse) {
  CHECK_GT(heads, 0);
  CHECK_GE(width, 0);
  CHECK_EQ(q.cols, heads * kv.cols);
  CHECK_EQ(out.rows, q.rows);
  CHECK_EQ(out.cols, q.cols);
  CHECK_EQ(lse.rows, q.rows);
  CHECK_EQ(lse.cols, heads);
  CHECK_EQ(static_cast<int64_t>(idx.size()), q.rows * width);
  for (const int32_t i : idx) {
    CHECK_GE(i, -1);
    CHECK_LT(i, kv.rows);
  }
}

// IndexScores: shapes (rows: out.cols of them, or out.rows * out.cols), and
// every row -1 or in [0, keys.rows).
inline void CheckIndexScoresShapes(ConstMatrixView q, ConstMatrixView w,
                                   ConstMatrixView keys,
                                   absl::Span<const int32_t> rows,
                                   ConstMatrixView out) {
  CHECK_EQ(w.rows, q.rows);
  CHECK_GT(w.cols, 0);
  CHECK_EQ(q.cols % w.cols, 0);
  CHECK_LE(q.cols / w.cols, keys.cols);
  CHECK_EQ(out.rows, q.rows);
  const auto n = static_cast<int64_t>(rows.size());
  CHECK(n == out.cols || n == out.rows * out.cols)
      << "IndexScores: " << n << " rows for scores [" << out.rows << ", "
      << out.cols << "]";
  for (const int32_t r : rows) {
    CHECK_GE(r, -1);
    CHECK_LT(r, keys.rows);
  }
}

// HcMix with fn [fn_rows, fn_cols].
inline void CheckHcMixShapes(ConstMatrixView x_stream, int64_t fn_rows,
                             int64_t fn_cols, int hc, int sinkhorn_iters,
                             ConstMatrixView pre, ConstMatrixView post,
                             ConstMatrixView comb) {
  CHECK_GE(hc, 1);
  CHECK_GE(sinkhorn_iters, 1);
  const int64_t tokens = x_stream.rows;
  CHECK_EQ(x_stream.cols % hc, 0);
  CHECK_EQ(fn_rows, int64_t{2 + hc} * hc);
  CHECK_EQ(fn_cols, x_stream.cols);
  CHECK_EQ(pre.rows, tokens);
  CHECK_EQ(pre.cols, hc);
  CHECK_EQ(post.rows, tokens);
  CHECK_EQ(post.cols, hc);
  CHECK_EQ(comb.rows, tokens);
  CHECK_EQ(comb.cols, hc * hc);
}

// HcCollapse: x_stream [T, hc * d], pre [T, hc], x [T, d].
inline void CheckHcCollapseShapes(ConstMatrixView x_stream, ConstMatrixView pre,
                                  int hc, ConstMatrixView x) {
  CHECK_GE(hc, 1);
  CHECK_EQ(x_stream.cols, hc * x.cols);
  CHECK_EQ(x.rows, x_stream.rows);
  CHECK_EQ(pre.rows, x_stream.rows);
  CHECK_EQ(pre.cols, hc);
}

// HcPost: a [T, d], post [T, hc], comb [T, hc * hc], x_stream [T, hc * d].
inline void CheckHcPostShapes(ConstMatrixView a, ConstMatrixView post,
                              ConstMatrixView comb, int hc,
                              ConstMatrixView x_stream) {
  CHECK_GE(hc, 1);
  const int64_t tokens = x_stream.rows;
  CHECK_EQ(x_stream.cols, hc * a.cols);
  CHECK_EQ(a.rows, tokens);
  CHECK_EQ(post.rows, tokens);
  CHECK_EQ(post.cols, hc);
  CHECK_EQ(comb.rows, tokens);
  CHECK_EQ(comb.cols, hc * hc);
}

// SelectTopK: k >= 1, one visible count per row, k ids and one count per
// row; blocks_per_row >= 0 block ids per row, ascending, then -1 padding,
// block_size >= 1 when there are blocks.
inline void CheckSelectTopKShapes(ConstMatrixView scores,
                                  absl::Span<const int64_t> visible, int k,
                                  absl::Span<const int32_t> candidate_blocks,
                                  int blocks_per_row, int block_size,
                                  absl::Span<const int32_t> ids,
                                  absl::Span<const int32_t> counts) {
  const int64_t rows = scores.rows;
  CHECK_GE(k, 1);
  CHECK_GE(blocks_per_row, 0);
  CHECK_EQ(static_cast<int64_t>(visible.size()), rows);
  CHECK_EQ(static_cast<int64_t>(ids.size()), rows * k);
  CHECK_EQ(static_cast<int64_t>(counts.size()), rows);
  CHECK_EQ(static_cast<int64_t>(candidate_blocks.size()),
           rows * blocks_per_row);
  if (blocks_per_row == 0) return;
  CHECK_GE(block_size, 1);
  for (int64_t t = 0; t < rows; ++t) {
    const int32_t* row = candidate_blocks.data() + t * blocks_per_row;
    CHECK_GE(row[0], -1);
    for (int j = 1; j < blocks_per_row; ++j) {
      CHECK(row[j] == -1 || (row[j - 1] >= 0 && row[j] > row[j - 1]))
          << "candidate blocks of row " << t << " not ascending";
    }
  }
}

// ChooseAndAttend: the attention's shapes (lists of width fixed_width + k),
// one score row of N >= 1 entries and one visible count per query, k >= 1,
// fixed_width >= 0, entry_rows [T, N] and fixed [T, fixed_width] each -1 or
// a row of kv.
inline void CheckChooseAndAttendShapes(
    ConstMatrixView scores, absl::Span<const int64_t> visible, int k,
    absl::Span<const int32_t> entry_rows, ConstMatrixView q, ConstMatrixView kv,
    int heads, absl::Span<const int32_t> fixed, int fixed_width,
    ConstMatrixView out, ConstMatrixView lse) {
  CHECK_GE(k, 1);
  CHECK_GE(fixed_width, 0);
  CHECK_GE(scores.cols, 1);
  CHECK_EQ(scores.rows, q.rows);
  CHECK_EQ(static_cast<int64_t>(visible.size()), q.rows);
  CHECK_EQ(static_cast<int64_t>(entry_rows.size()), scores.rows * scores.cols);
  for (const int32_t r : entry_rows) {
    CHECK_GE(r, -1);
    CHECK_LT(r, kv.rows);
  }
  CHECK_EQ(static_cast<int64_t>(fixed.size()), q.rows * fixed_width);
  CheckSparseAttentionShapes(q, kv, heads, {}, 0, out, lse);
  for (const int32_t r : fixed) {
    CHECK_GE(r, -1);
    CHECK_LT(r, kv.rows);
  }
}

// SelectCandidateBlocks: topk_blocks >= 1 and block_size >= 1, one visible
// count, topk_blocks ids and one count per row.
inline void CheckSelectCandidateBlocksShapes(ConstMatrixView scores,
                                             absl::Span<const int64_t> visible,
                                             int topk_blocks, int block_size,
                                             absl::Span<const int32_t> blocks,
                                             absl::Span<const int32_t> counts) {
  CHECK_GE(topk_blocks, 1);
  CHECK_GE(block_size, 1);
  CHECK_EQ(static_cast<int64_t>(visible.size()), scores.rows);
  CHECK_EQ(static_cast<int64_t>(blocks.size()), scores.rows * topk_blocks);
  CHECK_EQ(static_cast<int64_t>(counts.size()), scores.rows);
}

// MoeRoute: 1 <= top_k <= experts, top_k outputs per token.
inline void CheckMoeRouteShapes(ConstMatrixView logits, int top_k,
                                absl::Span<const int32_t> expert_ids,
                                absl::Span<const float> weights) {
  CHECK_GE(top_k, 1);
  CHECK_LE(top_k, logits.cols);
  CHECK_EQ(static_cast<int64_t>(expert_ids.size()), logits.rows * top_k);
  CHECK_EQ(static_cast<int64_t>(weights.size()), logits.rows * top_k);
}

// ExpertForward: w1, w3 [inter, d], w2 [d, inter], one weight per row and
// every row inside x_all and y_all.
inline void CheckExpertForwardShapes(ConstMatrixView x_all,
                                     absl::Span<const int32_t> rows,
                                     absl::Span<const float> weights,
                                     const Weight& w1, const Weight& w2,
                                     const Weight& w3, ConstMatrixView y_all) {
  const int64_t d = x_all.cols;
  const int64_t inter = w1.rows();
  CHECK_EQ(w1.cols(), d);
  CHECK_EQ(w3.rows(), inter);
  CHECK_EQ(w3.cols(), d);
  CHECK_EQ(w2.rows(), d);
  CHECK_EQ(w2.cols(), inter);
  CHECK_EQ(y_all.cols, d);
  CHECK_EQ(rows.size(), weights.size());
  for (const int32_t r : rows) {
    CHECK(r >= 0 && r < x_all.rows && r < y_all.rows) << "row " << r;
  }
}

// GatherColumns: one column index per column of y, each inside x.
inline void CheckGatherColumnsShapes(ConstMatrixView x,
                                     absl::Span<const int32_t> cols,
                                     ConstMatrixView y) {
  CHECK_EQ(static_cast<int64_t>(cols.size()), y.cols);
  CHECK_EQ(y.rows, x.rows);
  for (const int32_t c : cols) {
    CHECK(c >= 0 && c < x.cols) << "column " << c << " of " << x.cols;
  }
}

// WeighDcpParts: heads split evenly over the ranks, every output sized.
inline void CheckWeighDcpPartsShapes(ConstMatrixView lses, ConstMatrixView part,
                                     int rank, int64_t heads,
                                     ConstMatrixView send,
                                     ConstMatrixView global_own) {
  const int64_t ranks = lses.rows;
  CHECK_GE(ranks, 1);
  CHECK(rank >= 0 && rank < ranks) << "rank " << rank << " of " << ranks;
  CHECK_GT(heads, 0);
  CHECK_EQ(heads % ranks, 0);
  CHECK_EQ(part.cols % heads, 0);
  CHECK_EQ(lses.cols, part.rows * heads);
  CHECK_EQ(send.rows, ranks * part.rows);
  CHECK_EQ(send.cols, part.cols / ranks);
  CHECK_EQ(global_own.rows, part.rows);
  CHECK_EQ(global_own.cols, heads / ranks);
}

// MoeExperts' and MoeLayer's experts: every weight present, each expert's
// as ExpertForward's, all of one shape; y_all rows as x_all's.
inline void CheckExpertSetShapes(ConstMatrixView x_all,
                                 absl::Span<const ExpertRef> experts,
                                 ConstMatrixView y_all) {
  CHECK_EQ(y_all.rows, x_all.rows);
  for (const ExpertRef& e : experts) {
    CHECK(e.w1 != nullptr && e.w2 != nullptr && e.w3 != nullptr);
    CheckExpertForwardShapes(x_all, {}, {}, *e.w1, *e.w2, *e.w3, y_all);
    CHECK_EQ(e.w1->rows(), experts[0].w1->rows());
  }
}

// MoeExperts: one weight per assignment, every expert's weights present and
// of one shape (checked as ExpertForward's).
inline void CheckMoeExpertsShapes(ConstMatrixView x_all,
                                  absl::Span<const int32_t> expert_ids,
                                  absl::Span<const float> weights, int top_k,
                                  absl::Span<const ExpertRef> experts,
                                  ConstMatrixView y_all) {
  CHECK_GE(top_k, 1);
  CHECK_EQ(expert_ids.size(), weights.size());
  CHECK_EQ(static_cast<int64_t>(expert_ids.size()), x_all.rows * top_k);
  CheckExpertSetShapes(x_all, experts, y_all);
}

// MoeLayer: one gate logit per expert and token, a routing MoeRoute
// accepts, hash listings (if any) one per assignment and each an expert,
// and the experts as MoeExperts'.
inline void CheckMoeLayerShapes(ConstMatrixView x_all, ConstMatrixView logits,
                                const MoeRouting& routing,
                                absl::Span<const ExpertRef> experts,
                                ConstMatrixView y_all) {
  CHECK_EQ(logits.rows, x_all.rows);
  CHECK_GE(routing.top_k, 1);
  CHECK_LE(routing.top_k, logits.cols);
  if (!routing.hash_experts.empty()) {
    CHECK_EQ(static_cast<int64_t>(routing.hash_experts.size()),
             logits.rows * routing.top_k);
    for (const int32_t e : routing.hash_experts) {
      CHECK(e >= 0 && e < logits.cols) << "hash-routed expert " << e;
    }
  }
  CheckExpertSetShapes(x_all, experts, y_all);
}

// UnpackBf16Rows: whole blocks, rows that fit them and columns inside y.
// Returns the number of blocks.
inline int64_t CheckUnpackBf16RowsShapes(int64_t block_floats,
                                         absl::Span<const int32_t> columns,
                                         int64_t cols_per_block, int row_dim,
                                         ConstMatrixView y) {
  CHECK_GT(row_dim, 0);
  CHECK_GT(cols_per_block, 0);
  CHECK_EQ(static_cast<int64_t>(columns.size()) % cols_per_block, 0);
  CHECK_EQ(y.cols % row_dim, 0);
  CHECK_GE(block_floats * 2, y.rows * cols_per_block * row_dim);
  const int64_t width = y.cols / row_dim;
  for (const int32_t c : columns) {
    CHECK(c >= 0 && c < width) << "column " << c << " of " << width;
  }
  return static_cast<int64_t>(columns.size()) / cols_per_block;
}

}  // namespace mneme::gpu

#endif  // MNEME_GPU_BACKEND_CHECKS_H_
