#include "model/dcp_merge.h"

#include <algorithm>

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

absl::Status MergeAttention(gpu::Backend& backend, gpu::Communicator& comm,
                            Workspace& workspace, gpu::ConstMatrixView out_all,
                            gpu::ConstMatrixView lse_all, const float* sink,
                            gpu::MatrixView out) {
  const int n = comm.size(), rank = comm.rank();
  const int64_t T = out_all.rows, H = lse_all.cols;
  const int64_t hl = H / n, hd = out_all.cols / H;
  Workspace::Scope scope(workspace);
  // Every rank's log-sum-exp per token and head; this rank's part weighted
  // by exp(lse_rank - lse_global) and laid out by the rank owning each head
  // (on the backend), for the reduce-scatter that sums the parts.
  ASSIGN_OR_RETURN(WorkBuffer lse_recv, workspace.Take(n * T * H));
  RETURN_IF_ERROR(comm.AllGather(lse_all.data, T * H, lse_recv.data()));
  ASSIGN_OR_RETURN(WorkBuffer send, workspace.Take(T * H * hd));
  ASSIGN_OR_RETURN(WorkBuffer own, workspace.Take(T * hl));
  backend.WeighDcpParts(lse_recv.view(n, T * H), out_all, rank, H,
                        send.view(n * T, hl * hd), own.view(T, hl));
  RETURN_IF_ERROR(comm.ReduceScatterSum(send.data(), T * hl * hd, out.data));
  // The sink once, with the global log-sum-exp of this rank's heads.
  backend.ApplySink(own.view(T, hl), sink, out);
  return absl::OkStatus();
}

}  // namespace mneme::model
