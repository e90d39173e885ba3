#include "engram_store/io/read_plan.h"

#include <algorithm>
#include <functional>
#include <limits>

#include "absl/strings/str_cat.h"

namespace mneme::engram {

absl::Status ValidateCoalesceOptions(const CoalesceOptions& options,
                                     absl::string_view prefix) {
  if (options.max_read_bytes == 0 ||
      options.max_read_bytes % RowFile::kDirectAlignment != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, ".max_read_bytes must be a positive multiple of ",
        RowFile::kDirectAlignment, ", got ", options.max_read_bytes));
  }
  if (options.max_gap_bytes > options.max_read_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, ".max_gap_bytes (", options.max_gap_bytes,
        ") must not exceed max_read_bytes (", options.max_read_bytes, ")"));
  }
  return absl::OkStatus();
}

namespace {

// Appends the ops of the (finished) last extent of `plan`.
void AddOps(const CoalesceOptions& options, uint64_t needed_end,
            ReadPlan& plan) {
  const uint32_t index = static_cast<uint32_t>(plan.extents.size() - 1);
  ReadPlan::Extent& extent = plan.extents.back();
  extent.first_op = static_cast<uint32_t>(plan.ops.size());
  const uint64_t needed = needed_end - extent.offset;
  for (uint64_t pos = 0; pos < extent.length; pos += options.max_read_bytes) {
    ReadPlan::Op op;
    op.extent = index;
    op.extent_offset = pos;
    op.length = std::min(options.max_read_bytes, extent.length - pos);
    // needed > pos: extents end at most one page after their last span.
    op.required = std::min(op.length, needed - pos);
    plan.ops.push_back(op);
  }
  extent.num_ops = static_cast<uint32_t>(plan.ops.size()) - extent.first_op;
}

}  // namespace

absl::StatusOr<ReadPlan> PlanReads(absl::Span<const ReadSpan> spans,
                                   const CoalesceOptions& options) {
  if (absl::Status s = ValidateCoalesceOptions(options, "CoalesceOptions");
      !s.ok()) {
    return s;
  }
  // Ops and copies are indexed with uint32_t.
  if (spans.size() > std::numeric_limits<uint32_t>::max() / 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("too many spans in one read: ", spans.size()));
  }
  std::vector<uint32_t> order;
  order.reserve(spans.size());
  for (size_t i = 0; i < spans.size(); ++i) {
    const ReadSpan& s = spans[i];
    if (s.length == 0) continue;
    if (s.file == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("span ", i, " has no file"));
    }
    if (s.dest == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "span ", i, " of '", s.file->path(), "' has no destination"));
    }
    if (s.length > options.max_read_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "span ", i, " of '", s.file->path(), "' is ", s.length,
          " bytes, more than max_read_bytes (", options.max_read_bytes, ")"));
    }
    if (s.offset > s.file->size() || s.length > s.file->size() - s.offset) {
      return absl::OutOfRangeError(absl::StrCat(
          "span ", i, " [", s.offset, ", +", s.length, ") is past the end of '",
          s.file->path(), "' (", s.file->size(), " bytes when opened)"));
    }
    order.push_back(static_cast<uint32_t>(i));
  }
  std::sort(order.begin(), order.end(), [&spans](uint32_t a, uint32_t b) {
    const ReadSpan& x = spans[a];
    const ReadSpan& y = spans[b];
    if (x.file != y.file) return std::less<const RowFile*>()(x.file, y.file);
    if (x.offset != y.offset) return x.offset < y.offset;
    return x.length < y.length;
  });

  ReadPlan plan;
  plan.spans = order.size();
  plan.copies.reserve(order.size());
  const ReadSpan* previous = nullptr;
  uint64_t extent_end = 0;  // Aligned end of the current extent.
  uint64_t needed_end = 0;  // End of the last byte a span of it needs.
  for (uint32_t index : order) {
    const ReadSpan& s = spans[index];
    const bool duplicate = previous != nullptr && previous->file == s.file &&
                           previous->offset == s.offset &&
                           previous->length == s.length;
    if (!duplicate) {
      ++plan.unique_spans;
      const uint64_t alignment = s.file->alignment();
      const uint64_t begin = AlignDown(s.offset, alignment);
      const uint64_t end = AlignUp(s.offset + s.length, alignment);
      bool merge = false;
      if (!plan.extents.empty() && plan.extents.back().file == s.file) {
        const ReadPlan::Extent& current = plan.extents.back();
        // Touching or overlapping: never read a byte (or page) twice.
        merge = begin <= extent_end ||
                (begin - extent_end <= options.max_gap_bytes &&
                 end - current.offset <= options.max_read_bytes);
      }
      if (merge) {
        extent_end = std::max(extent_end, end);
        needed_end = std::max(needed_end, s.offset + s.length);
      } else {
        if (!plan.extents.empty()) {
          plan.extents.back().length = extent_end - plan.extents.back().offset;
          AddOps(options, needed_end, plan);
        }
        ReadPlan::Extent extent;
        extent.file = s.file;
        extent.offset = begin;
        extent.first_copy = static_cast<uint32_t>(plan.copies.size());
        plan.extents.push_back(extent);
        extent_end = end;
        needed_end = s.offset + s.length;
      }
      previous = &s;
    }
    ReadPlan::Extent& current = plan.extents.back();
    plan.copies.push_back({s.offset - current.offset, s.length, s.dest});
    ++current.num_copies;
  }
  if (!plan.extents.empty()) {
    plan.extents.back().length = extent_end - plan.extents.back().offset;
    AddOps(options, needed_end, plan);
  }
  return plan;
}

std::vector<uint32_t> BatchExtents(const ReadPlan& plan, size_t ops_per_batch) {
  std::vector<uint32_t> bounds = {0};
  if (plan.extents.empty()) return bounds;
  size_t ops = 0;
  for (size_t i = 0; i < plan.extents.size(); ++i) {
    const size_t n = plan.extents[i].num_ops;
    if (ops > 0 && ops + n > ops_per_batch) {
      bounds.push_back(static_cast<uint32_t>(i));
      ops = 0;
    }
    ops += n;
  }
  bounds.push_back(static_cast<uint32_t>(plan.extents.size()));
  return bounds;
}

}  // namespace mneme::engram
