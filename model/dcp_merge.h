#ifndef MNEME_MODEL_DCP_MERGE_H_
#define MNEME_MODEL_DCP_MERGE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "gpu/backend.h"
#include "gpu/comm/communicator.h"
#include "model/workspace.h"

namespace mneme::model {

// Decode context parallelism (DCP): which compressed attention entries a rank
// keeps. Entry i lives on rank (i / interleave) % size; with size 1 every
// rank keeps every entry. Plain values; a pure policy.
struct DcpLayout {
  // This rank in [0, size). Default: 0.
  int rank = 0;
  // Ranks splitting the entries; 1 = off. Default: 1.
  int size = 1;
  // Entries in a row on one rank before the next. >= 1. Default: 1.
  int interleave = 1;

  bool enabled() const { return size > 1; }
  // Whether this rank keeps entry `index`.
  bool OwnsEntry(int64_t index) const;
  // How many of the entries [0, count) this rank keeps.
  int64_t OwnedEntriesBefore(int64_t count) const;
};

// DCP: merges every rank's partial attention (out_all [T, H * hd] and
// lse_all [T, H], each over the entries that rank keeps, without the sink)
// into this rank's heads of the output, out [T, H / size * hd], applying
// `sink` (this rank's heads, backend floats) once. Collective: every rank of
// `comm` calls it with the same shapes. Errors are the communicator's.
absl::Status MergeAttention(gpu::Backend& backend, gpu::Communicator& comm,
                            Workspace& workspace, gpu::ConstMatrixView out_all,
                            gpu::ConstMatrixView lse_all, const float* sink,
                            gpu::MatrixView out);

}  // namespace mneme::model

#endif  // MNEME_MODEL_DCP_MERGE_H_
