#include "model/dcp_merge.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/status_macros.h"

namespace mneme::model {

bool DcpLayout::OwnsEntry(int64_t index) const {
  return size == 1 || (index / interleave) % size == rank;
}

int64_t DcpLayout::OwnedEntriesBefore(int64_t count) const {
  if (size == 1) return count;
  const int64_t il = interleave;
  const int64_t cycle = size * il;
  const int64_t rest = count % cycle - rank * il;
  return (count / cycle) * il + std::clamp<int64_t>(rest, 0, il);
}

std::vector<float> GlobalLogSumExp(absl::Span<const float> lses, int ranks,
                                   int64_t th) {
  std::vector<float> global(static_cast<size_t>(th));
  for (int64_t i = 0; i < th; ++i) {
    float m = -std::numeric_limits<float>::infinity();
    for (int q = 0; q < ranks; ++q) m = std::max(m, lses[q * th + i]);
    double sum = 0;
    if (std::isfinite(m)) {
      for (int q = 0; q < ranks; ++q) sum += std::exp(lses[q * th + i] - m);
    }
    global[i] = std::isfinite(m) ? m + static_cast<float>(std::log(sum)) : m;
  }
  return global;
}

std::vector<float> WeightedPartsByOwner(absl::Span<const float> part,
                                        absl::Span<const float> lses,
                                        absl::Span<const float> global,
                                        int ranks, int rank, int64_t tokens,
                                        int64_t heads, int64_t head_dim) {
  const int64_t T = tokens, H = heads, hd = head_dim, hl = H / ranks;
  std::vector<float> send(part.size());
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      const float l = lses[rank * T * H + t * H + h];
      const float g = global[t * H + h];
      const float w = std::isfinite(l) ? std::exp(l - g) : 0.0f;
      const int64_t owner = h / hl, local = h % hl;
      float* dst = send.data() + ((owner * T + t) * hl + local) * hd;
      const float* src = part.data() + (t * H + h) * hd;
      for (int64_t k = 0; k < hd; ++k) dst[k] = w * src[k];
    }
  }
  return send;
}

absl::Status MergeAttention(gpu::Backend& backend, gpu::Communicator& comm,
                            Workspace& workspace, gpu::ConstMatrixView out_all,
                            gpu::ConstMatrixView lse_all, const float* sink,
                            gpu::MatrixView out) {
  const int n = comm.size(), rank = comm.rank();
  const int64_t T = out_all.rows, H = lse_all.cols;
  const int64_t hl = H / n, hd = out_all.cols / H;
  Workspace::Scope scope(workspace);
  // Every rank's log-sum-exp per token and head -> the global one.
  ASSIGN_OR_RETURN(WorkBuffer lse_recv, workspace.Take(n * T * H));
  RETURN_IF_ERROR(comm.AllGather(lse_all.data, T * H, lse_recv.data()));
  std::vector<float> lses(static_cast<size_t>(n * T * H));
  backend.CopyToHost(lse_recv.data(), absl::MakeSpan(lses));
  const std::vector<float> global = GlobalLogSumExp(lses, n, T * H);
  // This rank's share, weighted, for the reduce-scatter.
  std::vector<float> part(static_cast<size_t>(T * H * hd));
  backend.CopyToHost(out_all.data, absl::MakeSpan(part));
  const std::vector<float> send =
      WeightedPartsByOwner(part, lses, global, n, rank, T, H, hd);
  ASSIGN_OR_RETURN(WorkBuffer send_buf, workspace.Take(T * H * hd));
  backend.CopyFromHost(send, send_buf.data());
  RETURN_IF_ERROR(
      comm.ReduceScatterSum(send_buf.data(), T * hl * hd, out.data));
  // The sink once, with the global log-sum-exp of this rank's heads.
  std::vector<float> own(static_cast<size_t>(T * hl));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < hl; ++h)
      own[t * hl + h] = global[t * H + rank * hl + h];
  }
  ASSIGN_OR_RETURN(WorkBuffer own_buf, workspace.Take(T * hl));
  backend.CopyFromHost(own, own_buf.data());
  backend.ApplySink(own_buf.view(T, hl), sink, out);
  return absl::OkStatus();
}

}  // namespace mneme::model
