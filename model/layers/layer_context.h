#ifndef MNEME_MODEL_LAYERS_LAYER_CONTEXT_H_
#define MNEME_MODEL_LAYERS_LAYER_CONTEXT_H_

#include <cstdint>

#include "absl/status/status.h"
#include "gpu/backend.h"
#include "gpu/comm/communicator.h"
#include "model/dcp_merge.h"
#include "model/model_config.h"
#include "model/workspace.h"

namespace mneme::model {

// What every layer of one tensor-parallel rank runs with: the model's shape,
// the backend, the step's workspace and the rank's place in its group. All
// borrowed from the step runner (model/model.h), which outlives the layers.
struct LayerContext {
  const ModelDims& dims;
  gpu::Backend& backend;
  Workspace& workspace;
  // This rank in [0, tp_size) and the group size.
  int tp_rank = 0;
  int tp_size = 1;
  // The group's collectives; null when tp_size == 1.
  gpu::Communicator* comm = nullptr;
  // Which compressed attention entries this rank keeps.
  DcpLayout dcp;
  // Tokens a sequence may be rolled back by (ModelOptions::
  // max_speculative_tokens): the window ring keeps that many positions more
  // than the window, so positions written and then rolled back never
  // overwrite a position still in the window.
  int rollback_tokens = 0;

  // Rows of a sequence's window ring: positions p live in slot p % ring.
  int64_t WindowRing() const {
    return int64_t{dims.sliding_window} + rollback_tokens;
  }

  // Sums m over the group in place (no-op without tensor parallelism).
  absl::Status AllReduce(gpu::MatrixView m) const {
    if (comm == nullptr || tp_size == 1) return absl::OkStatus();
    return comm->AllReduceSum(m.data, m.rows * m.cols);
  }
};

// Rows [begin, begin + count) of a matrix view.
inline gpu::MatrixView Rows(gpu::MatrixView m, int64_t begin, int64_t count) {
  return gpu::MatrixView{m.data + begin * m.cols, count, m.cols};
}
inline gpu::ConstMatrixView Rows(gpu::ConstMatrixView m, int64_t begin,
                                 int64_t count) {
  return gpu::ConstMatrixView{m.data + begin * m.cols, count, m.cols};
}

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace mneme::model

#endif  // MNEME_MODEL_LAYERS_LAYER_CONTEXT_H_
