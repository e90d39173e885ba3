#ifndef MNEME_MODEL_WORKSPACE_H_
#define MNEME_MODEL_WORKSPACE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "gpu/backend.h"

namespace mneme::model {

// A run of workspace floats in backend memory, borrowed from a Workspace.
// Valid until the Workspace::Scope that was innermost when it was taken
// ends. Its contents are whatever the previous user left (see TakeZeroed).
class WorkBuffer {
 public:
  WorkBuffer() = default;
  WorkBuffer(float* data, int64_t size) : data_(data), size_(size) {}

  float* data() const { return data_; }
  int64_t size() const { return size_; }
  // The first rows * cols floats as a matrix (rows * cols <= size()).
  gpu::MatrixView view(int64_t rows, int64_t cols) const {
    return gpu::MatrixView{data_, rows, cols};
  }

 private:
  float* data_ = nullptr;
  int64_t size_ = 0;
};

// The model's scratch memory: one backend buffer allocated at load and
// handed out as sub-buffers for a step, stack-wise. A Scope marks the top of
// the stack and gives back everything taken after it when it ends, so a
// layer's scratch is reused by the next layer with no allocation on the hot
// path.
//
// Sizing: Create takes the arena size the model computes at load from its
// dimensions and the largest step (ModelOptions::max_step_tokens). What does
// not fit (the attention keys grow with the context, not the step) comes
// from an extra backend buffer; when the outermost Scope ends, the arena is
// replaced by one buffer as large as everything used, so later steps of that
// size allocate nothing. The arena never shrinks.
//
// Backend-agnostic: it only calls Backend::Allocate and CopyFromHost.
// Thread-compatible (the model's step loop owns it).
class Workspace {
 public:
  // Sub-buffers start on multiples of this many floats (256 bytes).
  static constexpr int64_t kAlignFloats = 64;

  // An arena of `floats` (>= 0) backend floats. ResourceExhausted when the
  // backend cannot hold it.
  static absl::StatusOr<std::unique_ptr<Workspace>> Create(
      gpu::Backend& backend, int64_t floats);

  // `floats` (>= 0) floats, not zero-filled. ResourceExhausted when the
  // arena is full and the backend cannot allocate more.
  absl::StatusOr<WorkBuffer> Take(int64_t floats);
  // As Take, zero-filled (for outputs that are accumulated into).
  absl::StatusOr<WorkBuffer> TakeZeroed(int64_t floats);

  // Gives back, when it ends, what was taken since it began. Scopes nest
  // (innermost ends first).
  class Scope {
   public:
    explicit Scope(Workspace& workspace);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Workspace& workspace_;
    size_t block_;
    int64_t used_;
  };

  // Floats the workspace holds (the arena plus any extra buffers).
  int64_t capacity_floats() const;
  // Backend allocations after Create (each a step outgrowing the arena).
  int64_t grow_count() const { return grow_count_; }

 private:
  struct Block {
    std::unique_ptr<gpu::Buffer> buffer;
    int64_t used = 0;  // Floats taken from the front.
  };

  explicit Workspace(gpu::Backend& backend) : backend_(backend) {}
  void EndScope(size_t block, int64_t used);

  gpu::Backend& backend_;
  std::vector<Block> blocks_;  // blocks_[0] is the arena.
  size_t current_ = 0;         // The block Take uses.
  int depth_ = 0;              // Open scopes.
  int64_t grow_count_ = 0;
  std::vector<float> zeros_;  // Host zeros for TakeZeroed.
};

// Floats `count` sub-buffers of `floats` each may take, alignment included
// (for sizing an arena).
inline int64_t WorkspaceFloats(int64_t floats, int64_t count = 1) {
  const int64_t a = Workspace::kAlignFloats;
  return count * ((floats + a - 1) / a * a + a);
}

}  // namespace mneme::model

#endif  // MNEME_MODEL_WORKSPACE_H_
