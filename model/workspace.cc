#include "model/workspace.h"

#include <algorithm>
#include <utility>

#include "common/status_macros.h"

namespace mneme::model {
namespace {

int64_t Aligned(int64_t floats) {
  const int64_t a = Workspace::kAlignFloats;
  return std::max<int64_t>((floats + a - 1) / a * a, a);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Workspace>> Workspace::Create(
    gpu::Backend& backend, int64_t floats) {
  std::unique_ptr<Workspace> ws(new Workspace(backend));
  ASSIGN_OR_RETURN(std::unique_ptr<gpu::Buffer> arena,
                   backend.Allocate(Aligned(floats)));
  ws->blocks_.push_back(Block{std::move(arena), 0});
  return ws;
}

absl::StatusOr<WorkBuffer> Workspace::Take(int64_t floats) {
  const int64_t size = Aligned(floats);
  // The current block, else a later one with room (free: the stack is
  // above the current block), else a new one.
  for (size_t b = current_; b < blocks_.size(); ++b) {
    Block& block = blocks_[b];
    if (block.buffer->size() - block.used >= size) {
      current_ = b;
      float* data = block.buffer->data() + block.used;
      block.used += size;
      return WorkBuffer(data, floats);
    }
  }
  ASSIGN_OR_RETURN(std::unique_ptr<gpu::Buffer> extra,
                   backend_.Allocate(std::max(size, capacity_floats())));
  ++grow_count_;
  blocks_.push_back(Block{std::move(extra), size});
  current_ = blocks_.size() - 1;
  return WorkBuffer(blocks_.back().buffer->data(), floats);
}

absl::StatusOr<WorkBuffer> Workspace::TakeZeroed(int64_t floats) {
  ASSIGN_OR_RETURN(WorkBuffer buffer, Take(floats));
  if (static_cast<int64_t>(zeros_.size()) < floats) {
    zeros_.assign(static_cast<size_t>(floats), 0.0f);
  }
  backend_.CopyFromHost(
      absl::MakeConstSpan(zeros_.data(), static_cast<size_t>(floats)),
      buffer.data());
  return buffer;
}

int64_t Workspace::capacity_floats() const {
  int64_t total = 0;
  for (const Block& b : blocks_) total += b.buffer->size();
  return total;
}

Workspace::Scope::Scope(Workspace& workspace)
    : workspace_(workspace),
      block_(workspace.current_),
      used_(workspace.blocks_[workspace.current_].used) {
  ++workspace_.depth_;
}

Workspace::Scope::~Scope() { workspace_.EndScope(block_, used_); }

void Workspace::EndScope(size_t block, int64_t used) {
  --depth_;  // Scopes are RAII: one end per begin.
  for (size_t b = block + 1; b < blocks_.size(); ++b) blocks_[b].used = 0;
  blocks_[block].used = used;
  current_ = block;
  if (depth_ > 0 || blocks_.size() == 1) return;
  // Outgrown: one arena as large as all the blocks. If the backend cannot
  // hold it the blocks stay (the next step reuses them as they are).
  absl::StatusOr<std::unique_ptr<gpu::Buffer>> arena =
      backend_.Allocate(capacity_floats());
  if (!arena.ok()) return;
  blocks_.clear();
  blocks_.push_back(Block{*std::move(arena), 0});
  current_ = 0;
}

}  // namespace mneme::model
