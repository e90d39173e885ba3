#ifndef MNEME_MODEL_LAYERS_ENGRAM_LAYER_H_
#define MNEME_MODEL_LAYERS_ENGRAM_LAYER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "checkpoint/model_config.h"
#include "engram_store/client/engram_client.h"
#include "gpu/backend.h"
#include "model/layers/layer_context.h"
#include "model/step_io.h"
#include "model/weight_loader.h"
#include "model/workspace.h"

namespace mneme::model {

// Which Engram hash columns each tensor-parallel rank looks up (a strided
// split) and the shape of a row, from config.json.
struct EngramLayout {
  // Per rank, its columns, ascending.
  std::vector<std::vector<int>> columns;
  // Every rank's columns in rank order: the column of each row of the
  // all-gathered blocks (Backend::UnpackBf16Rows).
  std::vector<int32_t> gathered_columns;
  int num_columns = 0;
  // Values per row (the Engram head dim).
  int row_dim = 0;
  // Tokens of n-gram history a lookup needs (max n-gram order - 1).
  int context = 0;
};
// InvalidArgument for an Engram config that does not parse or split.
absl::StatusOr<EngramLayout> MakeEngramLayout(
    const checkpoint::ModelConfig& config, int tp_size);

// The reference's Engram module of one layer: the projection of the looked
// up rows to hc keys and a value, and the gate's q / k weights.
struct EngramWeights {
  std::unique_ptr<gpu::Weight> wkv;
  std::unique_ptr<gpu::Buffer> q, k;
};
// Loads `prefix` ("layers.<l>.engram.")wkv, q_weight and k_weight.
absl::StatusOr<EngramWeights> LoadEngramWeights(WeightLoader& load,
                                                const std::string& prefix,
                                                const ModelDims& dims,
                                                const EngramLayout& layout);

// Floats that hold a rank's bf16 rows of one Engram layer for a step of
// `tokens` tokens (two values a float, the last padded).
int64_t EngramRowSlots(const EngramLayout& layout, int tp_rank, int64_t tokens);

// This rank's rows of Engram layer `layer` for the step's tokens, written
// into `rows` (2 * EngramRowSlots values: the host staging memory they go
// to the device from): bf16 values, token-major (chunk order), this rank's
// columns in order. `histories[i]` holds the tokens chunk i's sequence
// already has (empty for a new one). No collectives, so a rank whose lookup
// fails can still agree with its peers before any of them enters a
// collective. Errors: the lookup's (code kept, message naming the layer),
// DataLoss for a response of the wrong size, Internal for `rows` of the
// wrong size.
absl::Status EngramLookup(
    const EngramLayout& layout, engram::EngramClient& client, int layer,
    int tp_rank, const StepInput& input,
    const std::vector<const std::vector<int64_t>*>& histories,
    absl::Span<uint16_t> rows);

// Hands this rank's rows of the step's `layers` Engram layers (in
// `staging`, EngramRowSlots floats a layer, from EngramLookup) to the
// device (Backend::StageFromHost) and returns where the ops read each
// layer's: a buffer taken from ctx.workspace (held until the caller's
// Workspace::Scope ends) that a copy started now fills while the layers
// before the Engram layers compute, or, on a backend that reads the
// staging in place (Backend::ReadsStagingInPlace: the CPU; a GPU sharing
// the host's memory), the staging itself, with nothing taken from the
// workspace. The staging stays unchanged until the
// backend synchronizes after the step. Internal for staging too small.
absl::StatusOr<std::vector<const float*>> StageEngramRows(
    const LayerContext& ctx, const EngramLayout& layout, int64_t tokens,
    int layers, gpu::HostStaging& staging);

// Gathers every rank's staged rows of the step (`staged`, this layer's from
// StageEngramRows), places them by column and widens them to fp32 on the
// device, projects them and gates them into the stream [T, hc * D] in
// place. Adds the time spent on rows (gather, unpacking) to `rows_time`.
// Errors: the communicator's.
absl::Status EngramForward(const LayerContext& ctx, const EngramLayout& layout,
                           const EngramWeights& w, const float* staged,
                           gpu::MatrixView stream, absl::Duration& rows_time);

// Asks the store to stage this rank's rows of the hinted tokens for every
// layer in `layers`. Best effort: errors are ignored.
void EngramPrefetch(const EngramLayout& layout, engram::EngramClient& client,
                    const std::vector<int>& layers, int tp_rank,
                    const std::vector<PrefetchHint>& hints);

}  // namespace mneme::model

#endif  // MNEME_MODEL_LAYERS_ENGRAM_LAYER_H_
