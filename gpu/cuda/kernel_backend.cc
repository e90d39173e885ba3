#include "gpu/cuda/kernel_backend.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/status_macros.h"
#include "formats/gridbook/gridbook.h"
#include "glog/logging.h"
#include "gpu/backend.h"
#include "gpu/backend_checks.h"
#include "gpu/cuda/executor.h"
#include "gpu/cuda/kernel_ops.h"
#include "gpu/host_weight.h"
#include "gpu/sampling.h"

namespace mneme::gpu {
namespace {

namespace k = kernels;

// Every carved block starts on this boundary (bytes).
constexpr int64_t kAlign = 256;
constexpr int64_t RoundUp(int64_t bytes) {
  return (bytes + kAlign - 1) / kAlign * kAlign;
}

class KernelBuffer final : public Buffer {
 public:
  KernelBuffer(Executor* executor, void* data, int64_t size)
      : executor_(executor), data_(static_cast<float*>(data)), size_(size) {}
  ~KernelBuffer() override { executor_->Free(data_); }
  KernelBuffer(const KernelBuffer&) = delete;
  KernelBuffer& operator=(const KernelBuffer&) = delete;
  int64_t size() const override { return size_; }
  float* data() override { return data_; }
  const float* data() const override { return data_; }

 private:
  Executor* executor_;
  float* data_;
  int64_t size_;
};

// Backend::HostStaging in the executor's pinned memory.
class PinnedStaging final : public HostStaging {
 public:
  PinnedStaging(Executor* executor, void* data, int64_t size)
      : executor_(executor), data_(static_cast<float*>(data)), size_(size) {}
  ~PinnedStaging() override { executor_->FreePinned(data_); }
  PinnedStaging(const PinnedStaging&) = delete;
  PinnedStaging& operator=(const PinnedStaging&) = delete;
  int64_t size() const override { return size_; }
  float* data() override { return data_; }

 private:
  Executor* executor_;
  float* data_;
  int64_t size_;
};

class KernelWeight final : public Weight {
 public:
  KernelWeight(Executor* executor, WeightFormat format, void* device,
               int64_t bytes, const k::WeightView& view, float input_scale,
               uint64_t serial)
      : executor_(executor),
        format_(format),
        device_(device),
        bytes_(bytes),
        view_(view),
        input_scale_(input_scale),
        serial_(serial) {}
  ~KernelWeight() override { executor_->Free(device_); }
  KernelWeight(const KernelWeight&) = delete;
  KernelWeight& operator=(const KernelWeight&) = delete;

  int64_t rows() const override { return view_.rows; }
  int64_t cols() const override { return view_.cols; }
  WeightFormat format() const override { return format_; }
  int64_t bytes() const override { return bytes_; }
  const k::WeightView& view() const { return view_; }
  float input_scale() const { return input_scale_; }
  // Unique among the process's uploads (never reused, unlike an address).
  uint64_t serial() const { return serial_; }

 private:
  Executor* executor_;
  WeightFormat format_;
  void* device_;
  int64_t bytes_;
  k::WeightView view_;
  float input_scale_;
  uint64_t serial_;
};

// Upload serials, unique in the process (so among all backends too).
uint64_t NextWeightSerial() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

const KernelWeight& AsKernel(const Weight& w) {
  const auto* kw = dynamic_cast<const KernelWeight*>(&w);
  CHECK(kw != nullptr) << "weight of another backend";
  return *kw;
}

// A GridBook weight's scheme for the kernels and its tables (the sub-tables,
// then the two-tier table) to copy beside the weight.
k::GridbookScheme GridbookSchemeOf(const HostWeight& weight,
                                   std::vector<float>& tables) {
  namespace gb = formats::gridbook;
  const gb::Scheme& scheme = weight.gridbook_scheme;
  k::GridbookScheme g{
      .k = scheme.k,
      .n_sub = scheme.n_sub,
      .type_size = gb::TypeSize(scheme),
      .super_bias = scheme.super_bias,
      .is_signed = scheme.mode == gb::Mode::kSigned,
      .fp8 = scheme.grid == gb::Grid::kFp8,
      .two_tier = scheme.scale_coding == gb::ScaleCoding::kTwoTier,
      .width = {},
      .shift = {},
      .table_offset = {},
      .two_tier_offset = 0};
  tables.clear();
  for (int sub = 0; sub < scheme.n_sub; ++sub) {
    g.width[sub] = gb::BitWidth(scheme, sub);
    g.shift[sub] = sub == 0 ? 0 : g.shift[sub - 1] + g.width[sub - 1];
    g.table_offset[sub] = static_cast<int32_t>(tables.size());
    const std::vector<float>& table = weight.gridbook_books->tables[sub];
    tables.insert(tables.end(), table.begin(), table.end());
  }
  g.two_tier_offset = static_cast<int32_t>(tables.size());
  tables.insert(tables.end(), scheme.two_tier_table.begin(),
                scheme.two_tier_table.end());
  return g;
}

}  // namespace

class KernelBackend::Carver {
 public:
  Carver(KernelBackend& backend, int64_t bytes)
      : backend_(backend),
        base_(backend.Reserve(backend.work_, bytes)),
        bytes_(bytes) {}

  template <typename T>
  T* Take(int64_t count) {
    T* p = reinterpret_cast<T*>(base_ + offset_);
    offset_ += RoundUp(count * static_cast<int64_t>(sizeof(T)));
    // An op's budget covers all it takes (the arena may be larger).
    DCHECK_LE(offset_, bytes_);
    return p;
  }
  // A device copy of host values.
  template <typename T>
  const T* Stage(absl::Span<const T> host) {
    T* p = Take<T>(static_cast<int64_t>(host.size()));
    backend_.executor_->ToDevice(p, host.data(),
                                 static_cast<int64_t>(host.size() * sizeof(T)));
    return p;
  }

  template <typename T>
  static int64_t Bytes(int64_t count) {
    return RoundUp(count * static_cast<int64_t>(sizeof(T)));
  }

 private:
  KernelBackend& backend_;
  uint8_t* base_;
  int64_t bytes_;
  int64_t offset_ = 0;
};

KernelBackend::KernelBackend(std::unique_ptr<Executor> executor,
                             Options options)
    : executor_(std::move(executor)), options_(options) {
  if (executor_->ReadsPinnedInPlace()) {
    LOG(INFO) << name()
              << ": the device reads pinned host staging in place (the "
                 "Engram rows are not copied)";
  }
}

KernelBackend::~KernelBackend() {
  (void)executor_->Synchronize();
  if (work_.data != nullptr) executor_->Free(work_.data);
  if (w4a4_.data != nullptr) executor_->Free(w4a4_.data);
  if (exl3_.data != nullptr) executor_->Free(exl3_.data);
  for (const ExpertTables& cached : expert_tables_) {
    executor_->Free(cached.device);
  }
}

uint8_t* KernelBackend::Reserve(Arena& arena, int64_t bytes) {
  if (arena.bytes < bytes) {
    if (arena.data != nullptr) executor_->Free(arena.data);
    arena = Arena{};
    // Room to grow without a reallocation per call.
    const int64_t want = std::max(RoundUp(bytes + bytes / 4), int64_t{1} << 20);
    absl::StatusOr<void*> block = executor_->Allocate(want);
    CHECK(block.ok()) << name() << ": workspace of " << want
                      << " bytes: " << block.status();
    arena = Arena{*block, want};
  }
  return static_cast<uint8_t*>(arena.data);
}

std::vector<float> KernelBackend::Fetch(const float* src, int64_t n) {
  std::vector<float> host(static_cast<size_t>(n));
  CopyToHost(src, absl::MakeSpan(host));
  return host;
}

absl::StatusOr<std::unique_ptr<Buffer>> KernelBackend::Allocate(
    int64_t elements) {
  CHECK_GE(elements, 0);
  ASSIGN_OR_RETURN(void* p, executor_->Allocate(elements * 4));
  return std::make_unique<KernelBuffer>(executor_.get(), p, elements);
}

absl::StatusOr<std::unique_ptr<HostStaging>> KernelBackend::AllocateHostStaging(
    int64_t floats) {
  if (floats < 0) {
    return absl::InvalidArgumentError("negative host staging size");
  }
  absl::StatusOr<void*> p = executor_->AllocatePinned(floats * 4);
  if (!p.ok()) {
    // Ordinary memory, copied in order with the ops (slower, still right).
    LOG(WARNING) << name() << ": no pinned memory for " << floats * 4
                 << " bytes of host staging (" << p.status()
                 << "); staging from ordinary memory";
    return std::make_unique<HostMemoryStaging>(floats);
  }
  return std::make_unique<PinnedStaging>(executor_.get(), *p, floats);
}

bool KernelBackend::ReadsStagingInPlace(const HostStaging& staging) const {
  return executor_->ReadsPinnedInPlace() &&
         dynamic_cast<const PinnedStaging*>(&staging) != nullptr;
}

bool KernelBackend::ReadsAllocatedStagingInPlace() const {
  return executor_->ReadsPinnedInPlace();
}

const float* KernelBackend::StageFromHost(HostStaging& staging, int64_t offset,
                                          int64_t floats, float* dst) {
  CheckStagingRange(staging, offset, floats);
  const float* src = staging.data() + offset;
  if (ReadsStagingInPlace(staging)) {
    return static_cast<const float*>(
        executor_->PinnedForDevice(src, floats * 4));
  }
  CHECK(dst != nullptr || floats == 0);
  if (dynamic_cast<PinnedStaging*>(&staging) == nullptr) {
    CopyFromHost(absl::MakeConstSpan(src, static_cast<size_t>(floats)), dst);
    return dst;
  }
  executor_->StageToDevice(dst, src, floats * 4);
  return dst;
}

void KernelBackend::AwaitStaged() { executor_->AwaitStaged(); }

void KernelBackend::CopyFromHost(absl::Span<const float> src, float* dst) {
  executor_->ToDevice(dst, src.data(),
                      static_cast<int64_t>(src.size() * sizeof(float)));
}

void KernelBackend::CopyToHost(const float* src, absl::Span<float> dst) {
  FetchBytes(dst.data(), src, static_cast<int64_t>(dst.size() * sizeof(float)));
}

void KernelBackend::FetchBytes(void* dst, const void* src, int64_t bytes) {
  executor_->ToHost(dst, src, bytes);
  // What leaves the device must be what the queued ops computed: a device
  // that failed cannot answer (the process restarts; the coordinator
  // requeues its work). ToHost waited, so its status is complete.
  const absl::Status status = executor_->status();
  CHECK(status.ok()) << name() << ": the device failed: " << status;
}

absl::Status KernelBackend::Synchronize() { return executor_->Synchronize(); }

absl::StatusOr<std::unique_ptr<Weight>> KernelBackend::UploadWeight(
    const HostWeight& weight) {
  RETURN_IF_ERROR(ValidateHostWeight(weight));
  k::WeightView view{.format = k::Format::kF32,
                     .rows = weight.rows,
                     .cols = weight.cols,
                     .block_rows = weight.block_rows,
                     .block_cols = weight.block_cols,
                     .global_scale = weight.global_scale,
                     .gridbook = {},
                     .tables = nullptr};
  // Every format stays as stored; beside it, a GridBook weight's tables
  // and an EXL3 weight's scales as fp32 (suh, then svh).
  std::vector<float> tables;
  std::vector<float> exl3_scales;
  absl::Span<const uint8_t> data = weight.data;
  absl::Span<const uint8_t> scale = weight.scale;
  view.format = static_cast<k::Format>(weight.format);
  if (weight.format == WeightFormat::kGridbook) {
    view.gridbook = GridbookSchemeOf(weight, tables);
  } else if (weight.format == WeightFormat::kExl3) {
    view.exl3_bits = weight.exl3_bits;
    view.exl3_codebook = static_cast<int32_t>(weight.exl3_codebook);
    exl3_scales.resize(scale.size() / 2);
    for (size_t i = 0; i < exl3_scales.size(); ++i) {
      uint16_t h;
      std::memcpy(&h, scale.data() + 2 * i, 2);
      exl3_scales[i] = k::Fp16Value(h);
    }
    scale = absl::Span<const uint8_t>(
        reinterpret_cast<const uint8_t*>(exl3_scales.data()),
        exl3_scales.size() * 4);
  }
  const int64_t data_bytes = RoundUp(static_cast<int64_t>(data.size()));
  const int64_t scale_bytes = RoundUp(static_cast<int64_t>(scale.size()));
  const int64_t table_bytes = static_cast<int64_t>(tables.size() * 4);
  const int64_t total = data_bytes + scale_bytes + table_bytes;
  absl::StatusOr<void*> device = executor_->Allocate(total);
  if (!device.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        name(), ": no room for a ", weight.rows, " x ", weight.cols, " ",
        WeightFormatName(weight.format), " weight (", total,
        " bytes): ", device.status().message()));
  }
  auto* bytes = static_cast<uint8_t*>(*device);
  executor_->ToDevice(bytes, data.data(), static_cast<int64_t>(data.size()));
  executor_->ToDevice(bytes + data_bytes, scale.data(),
                      static_cast<int64_t>(scale.size()));
  if (table_bytes > 0) {
    executor_->ToDevice(bytes + data_bytes + scale_bytes, tables.data(),
                        table_bytes);
  }
  view.data = bytes;
  view.scale = bytes + data_bytes;
  view.tables =
      reinterpret_cast<const float*>(bytes + data_bytes + scale_bytes);
  // The host copies (tables, scales) must outlive the queued copies.
  if (absl::Status status = executor_->Synchronize(); !status.ok()) {
    executor_->Free(bytes);
    return status;
  }
  return std::make_unique<KernelWeight>(
      executor_.get(), weight.format, bytes, total, view,
      weight.gridbook_input_scale, NextWeightSerial());
}

void KernelBackend::DequantizeWeight(const Weight& weight,
                                     absl::Span<float> out) {
  const KernelWeight& w = AsKernel(weight);
  const int64_t n = w.rows() * w.cols();
  CHECK_EQ(static_cast<int64_t>(out.size()), n);
  Carver carve(*this, Carver::Bytes<float>(n));
  float* values = carve.Take<float>(n);
  executor_->Run(k::DequantizeOp{.w = w.view(), .out = values}, n);
  if (w.view().format == k::Format::kExl3) {
    // values = What^T [n, k]; W^T = diag(svh) H_n What^T H_k diag(suh).
    const float* su = reinterpret_cast<const float*>(w.view().scale);
    const k::Hadamard128Op along{.src = values,
                                 .dst = values,
                                 .rows = w.rows(),
                                 .cols = w.cols(),
                                 .post = su};
    executor_->Run(along, along.Items());
    const k::Hadamard128Op across{.src = values,
                                  .dst = values,
                                  .rows = w.rows(),
                                  .cols = w.cols(),
                                  .across_rows = true,
                                  .post = su + w.cols()};
    executor_->Run(across, across.Items());
  }
  CopyToHost(values, out);
}

void KernelBackend::Gemm(const float* x, int64_t tokens, const Weight& weight,
                         float* y, bool accumulate) {
  const KernelWeight& w = AsKernel(weight);
  if (tokens == 0 || w.rows() == 0) return;
  if (w.view().format == k::Format::kExl3) {
    // y = x W, W = diag(suh) H What H diag(svh): the product with What
    // between the two transforms, on this call's own arena.
    const float* su = reinterpret_cast<const float*>(w.view().scale);
    const int64_t in = tokens * w.cols();
    auto* xs =
        reinterpret_cast<float*>(Reserve(exl3_, (in + tokens * w.rows()) * 4));
    float* ys = xs + in;
    const k::Hadamard128Op input{
        .src = x, .dst = xs, .rows = tokens, .cols = w.cols(), .pre = su};
    executor_->Run(input, input.Items());
    RunLinear(k::LinearOp{.w = w.view(), .x = xs, .y = ys, .tokens = tokens});
    const k::Hadamard128Op output{.src = ys,
                                  .dst = y,
                                  .rows = tokens,
                                  .cols = w.rows(),
                                  .post = su + w.cols(),
                                  .accumulate = accumulate};
    executor_->Run(output, output.Items());
    return;
  }
  if (const float g = w.input_scale(); g > 0.0f) {
    // The static W4A4 contract: the product takes the quantized activations.
    const int64_t n = tokens * w.cols();
    CHECK_EQ(n % 16, 0);
    auto* xq = reinterpret_cast<float*>(Reserve(w4a4_, n * 4));
    executor_->Run(k::QuantizeW4A4Op{.x = x, .xq = xq, .global_scale = g},
                   n / 16);
    x = xq;
  }
  // A prefill-sized call of a large enough weight goes by tiles (each
  // decoded weight serves up to 32 tokens); otherwise one warp per weight
  // row and chunk of up to 16 tokens (each decoded weight serves the
  // chunk), which gives more of the device's multiprocessors work when
  // the tiles would be few (a tile covers 64 rows and 32 tokens) or mostly
  // padding (the hyper-connection weights have a few rows). Where the
  // cut-over belongs is not yet measured on a GPU:
  // tests/bench/gpu:cuda_backend_bench reports both sides at 4096 rows.
  RunLinear(k::LinearOp{.w = w.view(),
                        .x = x,
                        .y = y,
                        .accumulate = accumulate,
                        .tokens = tokens});
}

void KernelBackend::RunLinear(const k::LinearOp& op) {
  if (k::TakesTiles(op.tokens, op.w.rows)) {
    const k::LinearTiledOp tiled{.args = op};
    executor_->Run(tiled, tiled.Tiles());
  } else {
    executor_->Run(op, op.Items());
  }
}

void KernelBackend::Linear(ConstMatrixView x, const Weight& w, MatrixView y,
                           Accumulate accumulate) {
  CHECK_EQ(x.cols, w.cols());
  CHECK_EQ(y.rows, x.rows);
  CHECK_EQ(y.cols, w.rows());
  Gemm(x.data, x.rows, w, y.data, accumulate == Accumulate::kYes);
}

void KernelBackend::RmsNorm(ConstMatrixView x, const float* weight, float eps,
                            MatrixView y) {
  CHECK_EQ(y.rows, x.rows);
  CHECK_EQ(y.cols, x.cols);
  if (x.cols == 0) return;
  executor_->Run(k::RmsNormOp{.x = x.data,
                              .weight = weight,
                              .y = y.data,
                              .cols = x.cols,
                              .eps = eps},
                 x.rows);
}

void KernelBackend::Rope(MatrixView x, int head_dim, int rope_dim,
                         absl::Span<const double> inv_freq,
                         absl::Span<const int32_t> positions,
                         RopeDirection direction) {
  CheckRopeShapes(x, head_dim, rope_dim, positions);
  if (rope_dim == 0 || x.rows == 0) return;
  const int64_t half = rope_dim / 2;
  CHECK_EQ(static_cast<int64_t>(inv_freq.size()), half);
  Carver carve(*this,
               Carver::Bytes<double>(half) + Carver::Bytes<int32_t>(x.rows));
  const double* freq = carve.Stage(inv_freq);
  const int32_t* pos = carve.Stage(positions);
  executor_->Run(
      k::RopeOp{.x = x.data,
                .cols = x.cols,
                .head_dim = head_dim,
                .rope_dim = rope_dim,
                .inv_freq = freq,
                .positions = pos,
                .sign = direction == RopeDirection::kInverse ? -1.0 : 1.0},
      x.rows * (x.cols / head_dim) * half);
}

void KernelBackend::Add(ConstMatrixView a, ConstMatrixView b, MatrixView y) {
  CHECK_EQ(a.rows, y.rows);
  CHECK_EQ(a.cols, y.cols);
  CHECK_EQ(b.rows, y.rows);
  CHECK_EQ(b.cols, y.cols);
  executor_->Run(k::AddOp{.a = a.data, .b = b.data, .y = y.data},
                 y.rows * y.cols);
}

void KernelBackend::CopyColumns(ConstMatrixView x, int64_t src_col,
                                MatrixView y) {
  CHECK_EQ(y.rows, x.rows);
  CHECK_GE(src_col, 0);
  CHECK_LE(src_col + y.cols, x.cols);
  if (y.cols == 0) return;
  executor_->Run(k::CopyBlockOp{.src = x.data,
                                .src_cols = x.cols,
                                .src_col = src_col,
                                .dst = y.data,
                                .dst_cols = y.cols,
                                .dst_col = 0,
                                .width = y.cols},
                 y.rows * y.cols);
}

void KernelBackend::PlaceColumns(ConstMatrixView x, MatrixView y,
                                 int64_t dst_col) {
  CHECK_EQ(y.rows, x.rows);
  CHECK_GE(dst_col, 0);
  CHECK_LE(dst_col + x.cols, y.cols);
  if (x.cols == 0) return;
  executor_->Run(k::CopyBlockOp{.src = x.data,
                                .src_cols = x.cols,
                                .src_col = 0,
                                .dst = y.data,
                                .dst_cols = y.cols,
                                .dst_col = dst_col,
                                .width = x.cols},
                 x.rows * x.cols);
}

void KernelBackend::GatherRows(ConstMatrixView x,
                               absl::Span<const int32_t> rows, MatrixView y) {
  CHECK_EQ(static_cast<int64_t>(rows.size()), y.rows);
  CHECK_EQ(y.cols, x.cols);
  if (x.cols == 0 || rows.empty()) return;
  for (const int32_t r : rows) CHECK(r >= 0 && r < x.rows) << "row " << r;
  const auto n = static_cast<int64_t>(rows.size());
  Carver carve(*this, Carver::Bytes<int32_t>(n));
  const int32_t* staged = carve.Stage(rows);
  executor_->Run(k::MoveRowsOp{.src = x.data,
                               .src_rows = staged,
                               .dst = y.data,
                               .dst_rows = nullptr,
                               .cols = x.cols},
                 n * x.cols);
}

void KernelBackend::GatherColumns(ConstMatrixView x,
                                  absl::Span<const int32_t> cols,
                                  MatrixView y) {
  CheckGatherColumnsShapes(x, cols, y);
  if (y.rows == 0 || y.cols == 0) return;
  Carver carve(*this, Carver::Bytes<int32_t>(y.cols));
  const int32_t* staged = carve.Stage(cols);
  executor_->Run(k::GatherColumnsOp{.x = x.data,
                                    .x_cols = x.cols,
                                    .cols = staged,
                                    .y = y.data,
                                    .y_cols = y.cols},
                 y.rows * y.cols);
}

void KernelBackend::ScatterRows(ConstMatrixView src,
                                absl::Span<const int32_t> rows, MatrixView x) {
  CHECK_EQ(static_cast<int64_t>(rows.size()), src.rows);
  CHECK_EQ(src.cols, x.cols);
  if (x.cols == 0 || rows.empty()) return;
  for (const int32_t r : rows) CHECK(r >= 0 && r < x.rows) << "row " << r;
  // A row named twice gets its last source, as a sequential copy would: the
  // kernel then writes each destination row once.
  std::vector<int32_t>& from = scatter_from_;
  std::vector<int32_t>& to = scatter_to_;
  absl::flat_hash_set<int32_t>& seen = scatter_seen_;
  from.clear();
  to.clear();
  seen.clear();
  for (int64_t i = static_cast<int64_t>(rows.size()) - 1; i >= 0; --i) {
    if (seen.insert(rows[i]).second) {
      from.push_back(static_cast<int32_t>(i));
      to.push_back(rows[i]);
    }
  }
  const auto n = static_cast<int64_t>(from.size());
  Carver carve(*this, 2 * Carver::Bytes<int32_t>(n));
  const int32_t* src_rows = carve.Stage(absl::Span<const int32_t>(from));
  const int32_t* dst_rows = carve.Stage(absl::Span<const int32_t>(to));
  executor_->Run(k::MoveRowsOp{.src = src.data,
                               .src_rows = src_rows,
                               .dst = x.data,
                               .dst_rows = dst_rows,
                               .cols = x.cols},
                 n * x.cols);
}

void KernelBackend::Embedding(absl::Span<const int32_t> ids, int64_t first_id,
                              const Weight& table, MatrixView y) {
  const KernelWeight& w = AsKernel(table);
  CHECK(w.format() == WeightFormat::kF32 || w.format() == WeightFormat::kBf16)
      << "embedding tables are f32 or bf16, got "
      << WeightFormatName(w.format());
  CHECK_EQ(static_cast<int64_t>(ids.size()), y.rows);
  CHECK_EQ(y.cols, w.cols());
  if (ids.empty()) return;
  const auto n = static_cast<int64_t>(ids.size());
  Carver carve(*this, Carver::Bytes<int32_t>(n));
  const int32_t* staged = carve.Stage(ids);
  executor_->Run(
      k::EmbeddingOp{
          .table = w.view(), .ids = staged, .first_id = first_id, .y = y.data},
      n * w.cols());
}

void KernelBackend::ApplySink(ConstMatrixView lse, const float* sink,
                              MatrixView out) {
  CHECK_EQ(lse.rows, out.rows);
  CHECK_GT(lse.cols, 0);
  CHECK_EQ(out.cols % lse.cols, 0);
  executor_->Run(k::ApplySinkOp{.lse = lse.data,
                                .sink = sink,
                                .out = out.data,
                                .heads = lse.cols,
                                .hd = out.cols / lse.cols},
                 out.rows * out.cols);
}

void KernelBackend::WeighDcpParts(ConstMatrixView lses, ConstMatrixView part,
                                  int rank, int64_t heads, MatrixView send,
                                  MatrixView global_own) {
  CheckWeighDcpPartsShapes(lses, part, rank, heads, send, global_own);
  const int64_t th = part.rows * heads;
  if (th == 0) return;
  Carver carve(*this, Carver::Bytes<float>(th));
  float* global = carve.Take<float>(th);
  executor_->Run(k::DcpGlobalLseOp{.lses = lses.data,
                                   .ranks = lses.rows,
                                   .th = th,
                                   .heads = heads,
                                   .rank = rank,
                                   .global = global,
                                   .global_own = global_own.data},
                 th);
  executor_->Run(k::DcpWeighOp{.lses = lses.data,
                               .global = global,
                               .part = part.data,
                               .ranks = lses.rows,
                               .tokens = part.rows,
                               .heads = heads,
                               .hd = part.cols / heads,
                               .rank = rank,
                               .send = send.data},
                 send.rows * send.cols);
}

void KernelBackend::SparseAttention(ConstMatrixView q, ConstMatrixView kv,
                                    int heads, absl::Span<const int32_t> idx,
                                    int width, float scale, const float* sink,
                                    MatrixView out, MatrixView lse) {
  CheckSparseAttentionShapes(q, kv, heads, idx, width, out, lse);
  const int64_t tokens = q.rows;
  if (tokens == 0) return;
  Carver carve(*this, Carver::Bytes<int32_t>(tokens * width) +
                          AttendBytes(tokens, heads, width, kv.cols));
  Attend(carve, q, kv, heads, carve.Stage(idx), width, scale, sink, out, lse);
}

int64_t KernelBackend::AttendBytes(int64_t tokens, int64_t heads, int64_t width,
                                   int64_t hd) {
  if (hd > k::kAttentionWarpMaxDim) return 0;
  const int64_t groups =
      (heads + k::kAttentionBlockHeads - 1) / k::kAttentionBlockHeads;
  const k::AttentionSplit split =
      k::ChooseAttentionSplit(tokens * groups, width);
  if (split.splits == 1) return 0;
  const int64_t parts = tokens * heads * split.splits;
  return Carver::Bytes<float>(parts * hd) + Carver::Bytes<float>(parts);
}

void KernelBackend::Attend(Carver& carve, ConstMatrixView q, ConstMatrixView kv,
                           int heads, const int32_t* idx, int64_t width,
                           float scale, const float* sink, MatrixView out,
                           MatrixView lse) {
  const int64_t tokens = q.rows;
  const int64_t hd = kv.cols;
  const k::SparseAttentionOp op{.q = q.data,
                                .kv = kv.data,
                                .idx = idx,
                                .width = width,
                                .heads = heads,
                                .hd = hd,
                                .scale = scale,
                                .sink = sink,
                                .out = out.data,
                                .lse = lse.data};
  // Heads larger than a warp's registers: one thread per (query, head).
  if (hd > k::kAttentionWarpMaxDim) {
    executor_->Run(op, tokens * heads);
    return;
  }
  // The others by warps, up to kAttentionBlockHeads of a query in a block
  // that reads each key once for all of them; a decode step's few blocks
  // split each list over more blocks, merged afterwards.
  k::SparseAttentionBlockOp block{
      .warp = {.args = op},
      .block_heads = static_cast<int32_t>(
          std::min<int64_t>(heads, k::kAttentionBlockHeads))};
  const k::AttentionSplit split =
      k::ChooseAttentionSplit(tokens * block.Groups(), op.width);
  if (split.splits == 1) {
    executor_->Run(block, block.Blocks(tokens));
    return;
  }
  const int64_t parts = tokens * heads * split.splits;
  block.splits = split.splits;
  block.split_keys = split.split_keys;
  block.part_out = carve.Take<float>(parts * hd);
  block.part_lse = carve.Take<float>(parts);
  executor_->Run(block, block.Blocks(tokens));
  executor_->Run(k::SparseAttentionMergeOp{.part_out = block.part_out,
                                           .part_lse = block.part_lse,
                                           .splits = split.splits,
                                           .heads = heads,
                                           .hd = hd,
                                           .sink = op.sink,
                                           .out = op.out,
                                           .lse = op.lse},
                 tokens * heads * hd);
}

void KernelBackend::IndexScores(ConstMatrixView q, ConstMatrixView w,
                                ConstMatrixView keys,
                                absl::Span<const int32_t> rows,
                                MatrixView out) {
  CheckIndexScoresShapes(q, w, keys, rows, out);
  const int64_t tokens = q.rows;
  const int64_t heads = w.cols;
  const int64_t d = q.cols / heads;
  const int64_t n = out.cols;
  if (tokens == 0 || n == 0) return;
  const auto count = static_cast<int64_t>(rows.size());
  Carver carve(*this, Carver::Bytes<int32_t>(count));
  const int32_t* staged = carve.Stage(rows);
  const k::IndexScoresOp op{.q = q.data,
                            .w = w.data,
                            .keys = keys.data,
                            .key_cols = keys.cols,
                            .rows = staged,
                            .rows_stride = count == n ? 0 : n,
                            .n = n,
                            .heads = heads,
                            .d = d,
                            .out = out.data};
  // Index heads whose keys fit a block's tile go by tiles; larger ones one
  // thread per score.
  if (d <= k::kScoreMaxDim) {
    const k::IndexScoresTiledOp tiled{.args = op};
    executor_->Run(tiled, tokens * tiled.EntryTiles());
  } else {
    executor_->Run(op, tokens * n);
  }
}

int64_t KernelBackend::TopKBytes(int64_t tokens, int64_t cols, int k) {
  const int64_t lanes = (cols + k::kRowLane - 1) / k::kRowLane;
  const int64_t items = tokens * lanes;
  return Carver::Bytes<int32_t>(items * k::kTopKBins) +
         2 * Carver::Bytes<int32_t>(items) + Carver::Bytes<uint32_t>(tokens) +
         2 * Carver::Bytes<int32_t>(tokens) +
         Carver::Bytes<int32_t>(tokens * (k + int64_t{1}));
}

int32_t* KernelBackend::ChooseTopK(Carver& carve, const k::TopKRows& rows,
                                   int64_t tokens, int k) {
  const int64_t lanes = (rows.cols + k::kRowLane - 1) / k::kRowLane;
  const int64_t items = tokens * lanes;
  const int64_t out = tokens * (k + int64_t{1});  // ids, then counts.
  auto* hist = carve.Take<int32_t>(items * k::kTopKBins);
  auto* above = carve.Take<int32_t>(items);
  auto* equal = carve.Take<int32_t>(items);
  auto* prefix = carve.Take<uint32_t>(tokens);
  auto* rank = carve.Take<int32_t>(tokens);
  auto* want = carve.Take<int32_t>(tokens);
  auto* chosen = carve.Take<int32_t>(out);
  int32_t* chosen_counts = chosen + tokens * k;
  for (int digit = 0; digit < k::kTopKDigits; ++digit) {
    const int shift = 32 - k::kTopKDigitBits * (digit + 1);
    executor_->Run(k::TopKHistOp{.rows = rows,
                                 .lanes = lanes,
                                 .shift = shift,
                                 .prefix = prefix,
                                 .hist = hist},
                   items);
    executor_->Run(k::TopKPickOp{.hist = hist,
                                 .lanes = lanes,
                                 .shift = shift,
                                 .k = k,
                                 .prefix = prefix,
                                 .rank = rank,
                                 .want = want,
                                 .ids = chosen,
                                 .counts = chosen_counts},
                   tokens);
  }
  executor_->Run(k::TopKCountOp{.rows = rows,
                                .lanes = lanes,
                                .prefix = prefix,
                                .want = want,
                                .above = above,
                                .equal = equal},
                 items);
  executor_->Run(k::TopKEmitOp{.rows = rows,
                               .lanes = lanes,
                               .k = k,
                               .prefix = prefix,
                               .rank = rank,
                               .want = want,
                               .above = above,
                               .equal = equal,
                               .ids = chosen},
                 items);
  return chosen;
}

void KernelBackend::RunTopK(Carver& carve, const k::TopKRows& rows,
                            int64_t tokens, int k, absl::Span<int32_t> ids,
                            absl::Span<int32_t> counts) {
  const int32_t* chosen = ChooseTopK(carve, rows, tokens, k);
  const int64_t out = tokens * (k + int64_t{1});  // ids, then counts.
  fetched_.resize(static_cast<size_t>(out));
  FetchBytes(fetched_.data(), chosen,
             out * static_cast<int64_t>(sizeof(int32_t)));
  std::copy(fetched_.begin(), fetched_.begin() + tokens * k, ids.begin());
  std::copy(fetched_.begin() + tokens * k, fetched_.end(), counts.begin());
}

void KernelBackend::SelectTopK(ConstMatrixView scores, float scale,
                               absl::Span<const int64_t> visible, int k,
                               absl::Span<const int32_t> candidate_blocks,
                               int blocks_per_row, int block_size,
                               absl::Span<int32_t> ids,
                               absl::Span<int32_t> counts) {
  CheckSelectTopKShapes(scores, visible, k, candidate_blocks, blocks_per_row,
                        block_size, ids, counts);
  const int64_t tokens = scores.rows;
  const int64_t cols = scores.cols;
  if (tokens == 0) return;
  if (cols == 0) {
    std::fill(ids.begin(), ids.end(), -1);
    std::fill(counts.begin(), counts.end(), 0);
    return;
  }
  Carver carve(*this,
               Carver::Bytes<int64_t>(tokens) +
                   Carver::Bytes<int32_t>(tokens * int64_t{blocks_per_row}) +
                   TopKBytes(tokens, cols, k));
  const k::TopKRows rows{
      .scores = scores.data,
      .cols = cols,
      .scale = scale,
      .visible = carve.Stage(visible),
      .blocks = blocks_per_row > 0 ? carve.Stage(candidate_blocks) : nullptr,
      .blocks_per_row = blocks_per_row,
      .block_size = block_size};
  RunTopK(carve, rows, tokens, k, ids, counts);
}

void KernelBackend::ChooseAndAttend(ConstMatrixView scores, float index_scale,
                                    absl::Span<const int64_t> visible, int k,
                                    absl::Span<const int32_t> entry_rows,
                                    ConstMatrixView q, ConstMatrixView kv,
                                    int heads, absl::Span<const int32_t> fixed,
                                    int fixed_width, float scale,
                                    const float* sink, MatrixView out,
                                    MatrixView lse) {
  CheckChooseAndAttendShapes(scores, visible, k, entry_rows, q, kv, heads,
                             fixed, fixed_width, out, lse);
  const int64_t tokens = q.rows;
  const int64_t cols = scores.cols;
  if (tokens == 0) return;
  const int64_t width = fixed_width + int64_t{k};
  Carver carve(*this, Carver::Bytes<int64_t>(tokens) +
                          TopKBytes(tokens, cols, k) +
                          Carver::Bytes<int32_t>(tokens * cols) +
                          Carver::Bytes<int32_t>(tokens * fixed_width) +
                          Carver::Bytes<int32_t>(tokens * width) +
                          AttendBytes(tokens, heads, width, kv.cols));
  const k::TopKRows rows{.scores = scores.data,
                         .cols = cols,
                         .scale = index_scale,
                         .visible = carve.Stage(visible),
                         .blocks = nullptr,
                         .blocks_per_row = 0,
                         .block_size = 1};
  const int32_t* chosen = ChooseTopK(carve, rows, tokens, k);
  auto* idx = carve.Take<int32_t>(tokens * width);
  executor_->Run(k::ChosenKeysOp{.fixed = carve.Stage(fixed),
                                 .fixed_width = fixed_width,
                                 .ids = chosen,
                                 .counts = chosen + tokens * k,
                                 .k = k,
                                 .entry_rows = carve.Stage(entry_rows),
                                 .entries = cols,
                                 .idx = idx},
                 tokens * width);
  Attend(carve, q, kv, heads, idx, width, scale, sink, out, lse);
}

void KernelBackend::SelectCandidateBlocks(ConstMatrixView scores, float scale,
                                          absl::Span<const int64_t> visible,
                                          int topk_blocks, int block_size,
                                          absl::Span<int32_t> blocks,
                                          absl::Span<int32_t> counts) {
  CheckSelectCandidateBlocksShapes(scores, visible, topk_blocks, block_size,
                                   blocks, counts);
  const int64_t tokens = scores.rows;
  const int64_t cols = scores.cols;
  if (tokens == 0) return;
  if (cols == 0) {
    std::fill(blocks.begin(), blocks.end(), -1);
    std::fill(counts.begin(), counts.end(), 0);
    return;
  }
  // Each row's blocks get a key (BlockKeyOp), then the same select.
  const int64_t per_row = (cols + block_size - 1) / block_size;
  std::vector<int64_t> all_blocks(static_cast<size_t>(tokens), per_row);
  Carver carve(*this, 2 * Carver::Bytes<int64_t>(tokens) +
                          Carver::Bytes<uint32_t>(tokens * per_row) +
                          TopKBytes(tokens, per_row, topk_blocks));
  const int64_t* staged_visible = carve.Stage(visible);
  auto* keys = carve.Take<uint32_t>(tokens * per_row);
  executor_->Run(k::BlockKeyOp{.scores = scores.data,
                               .cols = cols,
                               .scale = scale,
                               .visible = staged_visible,
                               .block_size = block_size,
                               .blocks = per_row,
                               .keys = keys},
                 tokens * per_row);
  const k::TopKRows rows{
      .cols = per_row,
      .visible = carve.Stage(absl::Span<const int64_t>(all_blocks)),
      .keys = keys};
  RunTopK(carve, rows, tokens, topk_blocks, blocks, counts);
}

void KernelBackend::SoftmaxPool(ConstMatrixView kv, ConstMatrixView score,
                                ConstMatrixView ape, MatrixView out) {
  const int64_t entries = out.rows;
  const int64_t d = kv.cols;
  CHECK_GT(entries, 0);
  CHECK_EQ(kv.rows % entries, 0);
  const int64_t r = kv.rows / entries;
  CHECK_GT(r, 0);
  CHECK_EQ(score.rows, kv.rows);
  CHECK_EQ(score.cols, d);
  CHECK_EQ(ape.rows, r);
  CHECK_EQ(ape.cols, d);
  CHECK_EQ(out.cols, d);
  executor_->Run(k::SoftmaxPoolOp{.kv = kv.data,
                                  .score = score.data,
                                  .ape = ape.data,
                                  .r = r,
                                  .d = d,
                                  .out = out.data},
                 entries * d);
}

void KernelBackend::HcMix(ConstMatrixView x_stream, const Weight& fn,
                          const float* base, const float* scale, int hc,
                          int sinkhorn_iters, float hc_eps, float norm_eps,
                          MatrixView pre, MatrixView post, MatrixView comb) {
  CheckHcMixShapes(x_stream, fn.rows(), fn.cols(), hc, sinkhorn_iters, pre,
                   post, comb);
  CHECK_LE(hc, k::kMaxHc);
  const int64_t tokens = x_stream.rows;
  const int64_t width = x_stream.cols;
  const int64_t num_mix = int64_t{2 + hc} * hc;
  if (tokens == 0) return;
  Carver carve(*this, Carver::Bytes<float>(tokens * num_mix));
  float* mix = carve.Take<float>(tokens * num_mix);
  Gemm(x_stream.data, tokens, fn, mix, false);
  executor_->Run(k::HcMixOp{.x_stream = x_stream.data,
                            .width = width,
                            .mix = mix,
                            .base = base,
                            .scale = scale,
                            .hc = hc,
                            .sinkhorn_iters = sinkhorn_iters,
                            .hc_eps = hc_eps,
                            .norm_eps = norm_eps,
                            .pre = pre.data,
                            .post = post.data,
                            .comb = comb.data},
                 tokens);
}

void KernelBackend::HcCollapse(ConstMatrixView x_stream, ConstMatrixView pre,
                               int hc, MatrixView x) {
  CheckHcCollapseShapes(x_stream, pre, hc, x);
  const int64_t tokens = x_stream.rows;
  const int64_t d = x.cols;
  if (d == 0) return;
  executor_->Run(k::HcCombineOp{.x_stream = x_stream.data,
                                .hc = hc,
                                .d = d,
                                .pre = pre.data,
                                .x = x.data},
                 tokens * d);
}

void KernelBackend::HcPost(ConstMatrixView a, ConstMatrixView post,
                           ConstMatrixView comb, int hc, MatrixView x_stream) {
  CheckHcPostShapes(a, post, comb, hc, x_stream);
  CHECK_LE(hc, k::kMaxHc);
  const int64_t tokens = x_stream.rows;
  const int64_t d = a.cols;
  if (d == 0) return;
  executor_->Run(k::HcPostOp{.a = a.data,
                             .post = post.data,
                             .comb = comb.data,
                             .hc = hc,
                             .d = d,
                             .x_stream = x_stream.data},
                 tokens * d);
}

void KernelBackend::HcHead(ConstMatrixView x_stream, const Weight& fn,
                           const float* base, const float* scale, int hc,
                           float eps, MatrixView x) {
  CHECK_GE(hc, 1);
  const int64_t tokens = x_stream.rows;
  const int64_t d = x.cols;
  const int64_t width = hc * d;
  CHECK_EQ(x_stream.cols, width);
  CHECK_EQ(x.rows, tokens);
  CHECK_EQ(fn.rows(), hc);
  CHECK_EQ(fn.cols(), width);
  if (tokens == 0 || d == 0) return;
  Carver carve(
      *this, Carver::Bytes<float>(tokens * hc) + Carver::Bytes<float>(tokens));
  float* mix = carve.Take<float>(tokens * hc);
  float* norm = carve.Take<float>(tokens);
  Gemm(x_stream.data, tokens, fn, mix, false);
  executor_->Run(
      k::RowRsqrtOp{
          .x = x_stream.data, .width = width, .eps = eps, .norm = norm},
      tokens);
  executor_->Run(k::HcCombineOp{.x_stream = x_stream.data,
                                .hc = hc,
                                .d = d,
                                .mix = mix,
                                .norm = norm,
                                .base = base,
                                .scale = scale,
                                .eps = eps,
                                .x = x.data},
                 tokens * d);
}

void KernelBackend::EngramGate(ConstMatrixView kv, const float* q_w,
                               const float* k_w, int hc, float eps,
                               MatrixView x_stream) {
  CHECK_GE(hc, 1);
  const int64_t tokens = x_stream.rows;
  CHECK_EQ(x_stream.cols % hc, 0);
  const int64_t d = x_stream.cols / hc;
  CHECK_EQ(kv.rows, tokens);
  CHECK_EQ(kv.cols, (hc + 1) * d);
  if (d == 0) return;
  executor_->Run(k::EngramGateOp{.kv = kv.data,
                                 .q_w = q_w,
                                 .k_w = k_w,
                                 .hc = hc,
                                 .d = d,
                                 .eps = eps,
                                 .x_stream = x_stream.data},
                 tokens * hc);
}

void KernelBackend::UnpackBf16Rows(const float* packed, int64_t block_floats,
                                   absl::Span<const int32_t> columns,
                                   int64_t cols_per_block, int row_dim,
                                   MatrixView y) {
  const int64_t blocks = CheckUnpackBf16RowsShapes(block_floats, columns,
                                                   cols_per_block, row_dim, y);
  const int64_t rows = y.rows * cols_per_block;
  if (blocks == 0 || rows == 0) return;
  Carver carve(*this,
               Carver::Bytes<int32_t>(static_cast<int64_t>(columns.size())));
  const int32_t* staged = carve.Stage(columns);
  executor_->Run(k::UnpackBf16RowsOp{.packed = packed,
                                     .block_floats = block_floats,
                                     .columns = staged,
                                     .cols_per_block = cols_per_block,
                                     .rows = rows,
                                     .row_dim = row_dim,
                                     .y = y.data,
                                     .y_cols = y.cols},
                 blocks * rows * row_dim);
}

int64_t KernelBackend::RouteBytes(int64_t tokens, int64_t experts) {
  return 2 * Carver::Bytes<float>(tokens * experts);
}

void KernelBackend::RouteByScore(Carver& carve, ConstMatrixView logits,
                                 const float* bias, int top_k,
                                 float routed_scaling, int32_t* expert_ids,
                                 float* weights) {
  const int64_t tokens = logits.rows;
  const int64_t experts = logits.cols;
  auto* score = carve.Take<float>(tokens * experts);
  auto* biased = carve.Take<float>(tokens * experts);
  executor_->Run(k::RouteScoresOp{.logits = logits.data,
                                  .bias = bias,
                                  .experts = experts,
                                  .score = score,
                                  .biased = biased},
                 tokens * experts);
  executor_->Run(k::MoeRouteOp{.score = score,
                               .biased = biased,
                               .experts = experts,
                               .top_k = top_k,
                               .routed_scaling = routed_scaling,
                               .expert_ids = expert_ids,
                               .weights = weights},
                 tokens);
}

void KernelBackend::MoeRoute(ConstMatrixView logits, const float* bias,
                             int top_k, float routed_scaling,
                             absl::Span<int32_t> expert_ids,
                             absl::Span<float> weights) {
  CheckMoeRouteShapes(logits, top_k, expert_ids, weights);
  const int64_t tokens = logits.rows;
  if (tokens == 0) return;
  const int64_t n = tokens * top_k;
  Carver carve(*this, RouteBytes(tokens, logits.cols) +
                          Carver::Bytes<int32_t>(n) + Carver::Bytes<float>(n));
  auto* ids = carve.Take<int32_t>(n);
  auto* w = carve.Take<float>(n);
  RouteByScore(carve, logits, bias, top_k, routed_scaling, ids, w);
  FetchBytes(expert_ids.data(), ids, n * static_cast<int64_t>(sizeof(int32_t)));
  FetchBytes(weights.data(), w, n * static_cast<int64_t>(sizeof(float)));
}

int64_t KernelBackend::GroupedGemmBytes(int64_t experts, int64_t n,
                                        int64_t cols) {
  // The group table (row op and tiles), the per-token scales and the
  // quantized activations.
  return Carver::Bytes<k::LinearGroup>(experts) + Carver::Bytes<float>(n) +
         Carver::Bytes<float>(n * cols);
}

void KernelBackend::GroupedGemm(Carver& carve,
                                absl::Span<const int64_t> offsets,
                                absl::Span<const ExpertRef> experts,
                                const Weight* ExpertRef::*which, const float* x,
                                float* y) {
  const auto count = static_cast<int64_t>(experts.size());
  const int64_t n = offsets[count];
  const int64_t cols = (experts[0].*which)->cols();
  // The row op's groups, then the tiles' (one table, one copy).
  std::vector<k::LinearGroup> rows_op;
  std::vector<k::LinearGroup> tiles;
  // Per-token input scales, only when an expert takes the W4A4 contract.
  std::vector<float> scales;
  int64_t row_items = 0;
  int64_t tile_items = 0;
  for (int64_t e = 0; e < count; ++e) {
    const int64_t tokens = offsets[e + 1] - offsets[e];
    const KernelWeight& w = AsKernel(*(experts[e].*which));
    if (tokens == 0 || w.rows() == 0) continue;
    if (w.view().format == k::Format::kExl3) {
      // Its transforms around the product: expert by expert.
      Gemm(x + offsets[e] * cols, tokens, w, y + offsets[e] * w.rows(), false);
      continue;
    }
    k::LinearGroup group{.w = w.view(),
                         .first_token = offsets[e],
                         .tokens = tokens,
                         .input_scale = w.input_scale()};
    if (group.input_scale > 0.0f) {
      if (scales.empty()) scales.assign(static_cast<size_t>(n), 0.0f);
      std::fill_n(scales.begin() + offsets[e], tokens, group.input_scale);
    }
    // Gemm's rule, expert by expert.
    const k::LinearOp op{.w = group.w, .tokens = tokens};
    if (k::TakesTiles(tokens, w.rows())) {
      group.first_item = tile_items;
      tile_items += k::LinearTiledOp{.args = op}.Tiles();
      tiles.push_back(group);
    } else {
      group.first_item = row_items;
      row_items += op.Items();
      rows_op.push_back(group);
    }
  }
  if (rows_op.empty() && tiles.empty()) return;
  const auto row_groups = static_cast<int64_t>(rows_op.size());
  const auto tile_groups = static_cast<int64_t>(tiles.size());
  rows_op.insert(rows_op.end(), tiles.begin(), tiles.end());
  const k::LinearGroup* staged = carve.Stage<k::LinearGroup>(rows_op);
  if (!scales.empty()) {
    CHECK_EQ(cols % 16, 0);
    const float* staged_scales = carve.Stage<float>(scales);
    float* xq = carve.Take<float>(n * cols);
    executor_->Run(
        k::GroupedQuantizeW4A4Op{
            .x = x, .xq = xq, .scales = staged_scales, .cols = cols},
        n * cols / 16);
    x = xq;
  }
  if (row_groups > 0) {
    int64_t most = 0;
    for (int64_t g = 0; g < row_groups; ++g) {
      most = std::max(most, rows_op[g].tokens);
    }
    executor_->Run(k::GroupedLinearOp{.groups = staged,
                                      .count = row_groups,
                                      .x = x,
                                      .y = y,
                                      .most_tokens = most},
                   row_items);
  }
  if (tile_groups > 0) {
    executor_->Run(
        k::GroupedLinearTiledOp{.args = {.groups = staged + row_groups,
                                         .count = tile_groups,
                                         .x = x,
                                         .y = y}},
        tile_items);
  }
}

int64_t KernelBackend::PlannedGemmBytes(int64_t n, int64_t cols) {
  // The per-slot scales and the quantized activations.
  return Carver::Bytes<float>(n) + Carver::Bytes<float>(n * cols);
}

void KernelBackend::PlannedGemm(Carver& carve, const k::LinearGroup* table,
                                int64_t experts, const int64_t* offsets,
                                int64_t n, int64_t most_tokens,
                                const WeightShape& shape, const float* x,
                                float* y) {
  if (shape.rows == 0) return;
  if (shape.w4a4) {
    CHECK_EQ(shape.cols % 16, 0);
    float* scales = carve.Take<float>(n);
    executor_->Run(k::ExpertTokenScalesOp{.groups = table,
                                          .offsets = offsets,
                                          .experts = experts,
                                          .scales = scales},
                   n);
    float* xq = carve.Take<float>(n * shape.cols);
    executor_->Run(
        k::GroupedQuantizeW4A4Op{
            .x = x, .xq = xq, .scales = scales, .cols = shape.cols},
        n * shape.cols / 16);
    x = xq;
  }
  // Launches sized for every slot on this rank: m experts with tokens (m <=
  // min(experts, n)) take sum ceil(t_e / 16) <= (n + 15 m) / 16 row chunks,
  // and at most 4 each when the tiles take those of 64 tokens or more.
  const int64_t m = std::min(experts, n);
  int64_t chunks = (n + (k::kLinearRowTokens - 1) * m) / k::kLinearRowTokens;
  if (shape.rows >= k::kTiledLinearRows) {
    chunks = std::min(
        chunks, m * ((k::kTiledLinearTokens - 1) / k::kLinearRowTokens + 1));
  }
  executor_->Run(k::GroupedLinearOp{.groups = table,
                                    .count = experts + 1,
                                    .x = x,
                                    .y = y,
                                    .most_tokens = most_tokens},
                 chunks * shape.rows);
  if (k::TakesTiles(n, shape.rows)) {
    // At most n / 64 experts take tiles, sum ceil(t_e / 32) token tiles.
    const int64_t tiled = std::min(experts, n / k::kTiledLinearTokens);
    const int64_t token_tiles =
        (n + (k::kTileTokens - 1) * tiled) / k::kTileTokens;
    const int64_t row_tiles = (shape.rows + k::kTileRows - 1) / k::kTileRows;
    executor_->Run(
        k::GroupedLinearTiledOp{.args = {.groups = table + experts + 1,
                                         .count = experts + 1,
                                         .x = x,
                                         .y = y}},
        row_tiles * token_tiles);
  }
}

void KernelBackend::ExpertForward(ConstMatrixView x_all,
                                  absl::Span<const int32_t> rows,
                                  absl::Span<const float> weights,
                                  const Weight& w1, const Weight& w2,
                                  const Weight& w3, float limit,
                                  MatrixView y_all) {
  CheckExpertForwardShapes(x_all, rows, weights, w1, w2, w3, y_all);
  const std::array<int64_t, 2> offsets = {0, static_cast<int64_t>(rows.size())};
  const ExpertRef expert{.w1 = &w1, .w2 = &w2, .w3 = &w3};
  GroupedOnHost(x_all, rows, weights, offsets, absl::MakeConstSpan(&expert, 1),
                limit, y_all);
}

void KernelBackend::MoeExperts(ConstMatrixView x_all,
                               absl::Span<const int32_t> expert_ids,
                               absl::Span<const float> weights, int top_k,
                               int64_t first_expert,
                               absl::Span<const ExpertRef> experts, float limit,
                               MatrixView y_all) {
  CheckMoeExpertsShapes(x_all, expert_ids, weights, top_k, experts, y_all);
  const ExpertGroups groups =
      GroupByExpert(expert_ids, weights, top_k, first_expert,
                    static_cast<int64_t>(experts.size()));
  GroupedOnHost(x_all, groups.rows, groups.weights, groups.offsets, experts,
                limit, y_all);
}

void KernelBackend::MoeLayer(ConstMatrixView x_all, ConstMatrixView logits,
                             const MoeRouting& routing, int64_t first_expert,
                             absl::Span<const ExpertRef> experts, float limit,
                             MatrixView y_all) {
  CheckMoeLayerShapes(x_all, logits, routing, experts, y_all);
  const int64_t tokens = x_all.rows;
  const int64_t d = x_all.cols;
  const auto local = static_cast<int64_t>(experts.size());
  if (tokens == 0 || d == 0 || local == 0) return;
  const auto is_exl3 = [](const Weight* w) {
    return AsKernel(*w).view().format == k::Format::kExl3;
  };
  for (const ExpertRef& e : experts) {
    if (is_exl3(e.w1) || is_exl3(e.w2) || is_exl3(e.w3)) {
      // Their transforms run expert by expert, sized on the host.
      MoeLayerByParts(*this, x_all, logits, routing, first_expert, experts,
                      limit, y_all);
      return;
    }
  }
  const int top_k = routing.top_k;
  const int64_t n = tokens * top_k;
  const int64_t inter = experts[0].w1->rows();
  const int64_t chunks = (n + k::kExpertChunk - 1) / k::kExpertChunk;
  const int64_t table = k::ExpertTableGroups(local);
  Carver carve(
      *this,
      RouteBytes(tokens, logits.cols) + 2 * Carver::Bytes<int32_t>(n) +
          2 * Carver::Bytes<float>(n) + Carver::Bytes<int32_t>(local * chunks) +
          Carver::Bytes<int32_t>(local) + Carver::Bytes<int64_t>(local + 1) +
          ExpertSlotsBytes(n, d, inter) + 2 * PlannedGemmBytes(n, d) +
          PlannedGemmBytes(n, inter));
  // The assignments, on the device.
  auto* ids = carve.Take<int32_t>(n);
  auto* assignment_weights = carve.Take<float>(n);
  if (routing.hash_experts.empty()) {
    RouteByScore(carve, logits, routing.bias, top_k, routing.routed_scaling,
                 ids, assignment_weights);
  } else {
    executor_->Run(k::HashRouteOp{.logits = logits.data,
                                  .experts = logits.cols,
                                  .listed = carve.Stage(routing.hash_experts),
                                  .top_k = top_k,
                                  .routed_scaling = routing.routed_scaling,
                                  .expert_ids = ids,
                                  .weights = assignment_weights},
                   tokens);
  }
  // Grouped by expert on the device (kernel_ops.h: the MoE assignments
  // grouped on the device), the tokens written into the experts' kept
  // tables (the stream orders this call's use of them before the next's).
  const ExpertTables& cached = TablesOf(experts);
  const std::array<WeightShape, k::kExpertTables> shapes = cached.shapes;
  auto* counts = carve.Take<int32_t>(local * chunks);
  auto* totals = carve.Take<int32_t>(local);
  auto* offsets = carve.Take<int64_t>(local + 1);
  auto* tables = static_cast<k::LinearGroup*>(cached.device);
  auto* rows = carve.Take<int32_t>(n);
  auto* weights = carve.Take<float>(n);
  executor_->Run(k::ExpertChunkCountOp{.ids = ids,
                                       .n = n,
                                       .first_expert = first_expert,
                                       .chunks = chunks,
                                       .counts = counts},
                 local * chunks);
  executor_->Run(
      k::ExpertChunkStartsOp{
          .counts = counts, .chunks = chunks, .totals = totals},
      local);
  executor_->Run(
      k::ExpertPlanOp{.totals = totals,
                      .experts = local,
                      .offsets = offsets,
                      .tables = {tables, tables + table, tables + 2 * table}},
      k::kExpertTables);
  const k::ExpertScatterOp scatter{.ids = ids,
                                   .assignment_weights = assignment_weights,
                                   .n = n,
                                   .top_k = top_k,
                                   .first_expert = first_expert,
                                   .experts = local,
                                   .chunks = chunks,
                                   .chunk_starts = counts,
                                   .offsets = offsets,
                                   .rows = rows,
                                   .weights = weights};
  executor_->Run(scatter, scatter.Items());
  // A token's experts are distinct, so none has more than `tokens` slots.
  RunExperts(
      carve, x_all, rows, weights, n, inter,
      [&](int j, const float* x, float* y) {
        PlannedGemm(carve, tables + j * table, local, offsets, n, tokens,
                    shapes[j], x, y);
      },
      limit, y_all);
}

const KernelBackend::ExpertTables& KernelBackend::TablesOf(
    absl::Span<const ExpertRef> experts) {
  const auto local = static_cast<int64_t>(experts.size());
  const std::array<const Weight * ExpertRef::*, k::kExpertTables> which = {
      &ExpertRef::w1, &ExpertRef::w3, &ExpertRef::w2};
  std::vector<uint64_t> serials;
  serials.reserve(static_cast<size_t>(k::kExpertTables * local));
  for (int j = 0; j < k::kExpertTables; ++j) {
    for (const ExpertRef& e : experts) {
      serials.push_back(AsKernel(*(e.*which[j])).serial());
    }
  }
  for (auto it = expert_tables_.begin(); it != expert_tables_.end(); ++it) {
    if (it->serials == serials) {
      expert_tables_.splice(expert_tables_.begin(), expert_tables_, it);
      return expert_tables_.front();
    }
  }
  const int64_t table = k::ExpertTableGroups(local);
  std::vector<k::LinearGroup> groups(
      static_cast<size_t>(k::kExpertTables * table));
  ExpertTables entry;
  for (int j = 0; j < k::kExpertTables; ++j) {
    entry.shapes[j] = WeightShape{.rows = (experts[0].*which[j])->rows(),
                                  .cols = (experts[0].*which[j])->cols()};
    for (int64_t e = 0; e < local; ++e) {
      const KernelWeight& w = AsKernel(*(experts[e].*which[j]));
      const k::LinearGroup group{.w = w.view(), .input_scale = w.input_scale()};
      groups[j * table + e] = group;
      groups[j * table + local + 1 + e] = group;
      entry.shapes[j].w4a4 = entry.shapes[j].w4a4 || group.input_scale > 0.0f;
    }
  }
  entry.serials = std::move(serials);
  entry.bytes = static_cast<int64_t>(groups.size() * sizeof(k::LinearGroup));
  absl::StatusOr<void*> block = executor_->Allocate(entry.bytes);
  CHECK(block.ok()) << name() << ": expert tables of " << entry.bytes
                    << " bytes: " << block.status();
  entry.device = *block;
  executor_->ToDevice(entry.device, groups.data(), entry.bytes);
  expert_table_bytes_ += entry.bytes;
  expert_tables_.push_front(std::move(entry));
  // The least recently used sets go past the bound (the new one stays).
  while (expert_table_bytes_ > options_.expert_table_bytes &&
         expert_tables_.size() > 1) {
    executor_->Free(expert_tables_.back().device);
    expert_table_bytes_ -= expert_tables_.back().bytes;
    expert_tables_.pop_back();
  }
  return expert_tables_.front();
}

void KernelBackend::GroupedOnHost(ConstMatrixView x_all,
                                  absl::Span<const int32_t> rows,
                                  absl::Span<const float> weights,
                                  absl::Span<const int64_t> offsets,
                                  absl::Span<const ExpertRef> experts,
                                  float limit, MatrixView y_all) {
  const auto local = static_cast<int64_t>(experts.size());
  const auto n = static_cast<int64_t>(rows.size());
  const int64_t d = x_all.cols;
  if (n == 0 || d == 0) return;
  const int64_t inter = experts[0].w1->rows();
  Carver carve(*this, Carver::Bytes<int32_t>(n) + Carver::Bytes<float>(n) +
                          ExpertSlotsBytes(n, d, inter) +
                          2 * GroupedGemmBytes(local, n, d) +
                          GroupedGemmBytes(local, n, inter));
  const int32_t* staged_rows = carve.Stage<int32_t>(rows);
  const float* staged_weights = carve.Stage<float>(weights);
  const std::array<const Weight * ExpertRef::*, k::kExpertTables> which = {
      &ExpertRef::w1, &ExpertRef::w3, &ExpertRef::w2};
  RunExperts(
      carve, x_all, staged_rows, staged_weights, n, inter,
      [&](int j, const float* x, float* y) {
        GroupedGemm(carve, offsets, experts, which[j], x, y);
      },
      limit, y_all);
}

int64_t KernelBackend::ExpertSlotsBytes(int64_t n, int64_t d, int64_t inter) {
  return 2 * Carver::Bytes<float>(n * d) + 2 * Carver::Bytes<float>(n * inter);
}

void KernelBackend::RunExperts(
    Carver& carve, ConstMatrixView x_all, const int32_t* rows,
    const float* weights, int64_t n, int64_t inter,
    absl::FunctionRef<void(int, const float*, float*)> project, float limit,
    MatrixView y_all) {
  const int64_t d = x_all.cols;
  float* x = carve.Take<float>(n * d);
  float* h1 = carve.Take<float>(n * inter);
  float* h3 = carve.Take<float>(n * inter);
  float* out = carve.Take<float>(n * d);
  // The assignments' rows of x, expert after expert; then every expert's
  // SwiGLU at once.
  executor_->Run(k::MoveRowsOp{.src = x_all.data,
                               .src_rows = rows,
                               .dst = x,
                               .dst_rows = nullptr,
                               .cols = d},
                 n * d);
  project(0, x, h1);
  project(1, x, h3);
  executor_->Run(k::SwiGluOp{.h1 = h1, .h3 = h3, .limit = limit}, n * inter);
  project(2, h1, out);
  // In assignment order within each expert, experts in ascending order:
  // ExpertForward's additions, one expert after another.
  executor_->Run(k::ScatterAddOp{.src = out,
                                 .rows = rows,
                                 .weights = weights,
                                 .n = n,
                                 .cols = d,
                                 .y = y_all.data},
                 d);
}

void KernelBackend::RowStats(ConstMatrixView logits,
                             absl::Span<const int32_t> ids,
                             absl::Span<int32_t> argmax, absl::Span<float> max,
                             absl::Span<float> logprob,
                             absl::Span<double> lse) {
  const int64_t tokens = logits.rows;
  const int64_t vocab = logits.cols;
  CHECK(lse.empty() || static_cast<int64_t>(lse.size()) == tokens);
  const int64_t lanes = (vocab + k::kRowLane - 1) / k::kRowLane;
  const int64_t partials = tokens * lanes;
  // The results side by side, so they come back in one copy: each row's
  // log-sum-exp, then its argmax, max and log-probability.
  const int64_t result_bytes =
      Carver::Bytes<double>(tokens) + Carver::Bytes<int32_t>(3 * tokens);
  Carver carve(*this, Carver::Bytes<float>(partials) +
                          Carver::Bytes<int32_t>(partials) +
                          Carver::Bytes<double>(partials) +
                          Carver::Bytes<int32_t>(tokens) + result_bytes);
  const int32_t* staged_ids = ids.empty() ? nullptr : carve.Stage(ids);
  auto* lane_max = carve.Take<float>(partials);
  auto* lane_arg = carve.Take<int32_t>(partials);
  auto* lane_sum = carve.Take<double>(partials);
  auto* row_lse = carve.Take<double>(tokens);
  auto* triple = carve.Take<int32_t>(3 * tokens);
  int32_t* row_arg = triple;
  auto* row_max = reinterpret_cast<float*>(triple + tokens);
  auto* row_logprob = reinterpret_cast<float*>(triple + 2 * tokens);
  executor_->Run(k::RowMaxPartialOp{.x = logits.data,
                                    .cols = vocab,
                                    .lanes = lanes,
                                    .max = lane_max,
                                    .arg = lane_arg},
                 partials);
  executor_->Run(k::RowMaxOp{.lane_max = lane_max,
                             .lane_arg = lane_arg,
                             .lanes = lanes,
                             .max = row_max,
                             .arg = row_arg},
                 tokens);
  executor_->Run(k::RowExpSumPartialOp{.x = logits.data,
                                       .cols = vocab,
                                       .lanes = lanes,
                                       .max = row_max,
                                       .sum = lane_sum},
                 partials);
  executor_->Run(k::RowLogProbOp{.x = logits.data,
                                 .cols = vocab,
                                 .lanes = lanes,
                                 .max = row_max,
                                 .lane_sum = lane_sum,
                                 .ids = staged_ids,
                                 .arg = row_arg,
                                 .logprob = row_logprob,
                                 .row_lse = lse.empty() ? nullptr : row_lse},
                 tokens);
  // Rows' log-sum-exps only when asked for: the copy starts at them.
  const int64_t skip = lse.empty() ? Carver::Bytes<double>(tokens) : 0;
  fetched_.resize(static_cast<size_t>((result_bytes - skip) / 4));
  FetchBytes(fetched_.data(), reinterpret_cast<const uint8_t*>(row_lse) + skip,
             result_bytes - skip);
  const int32_t* back = fetched_.data();
  if (!lse.empty()) {
    std::memcpy(lse.data(), back, static_cast<size_t>(tokens) * sizeof(double));
    back += Carver::Bytes<double>(tokens) / 4;
  }
  const auto bytes = static_cast<size_t>(tokens) * sizeof(int32_t);
  std::memcpy(argmax.data(), back, bytes);
  std::memcpy(max.data(), back + tokens, bytes);
  std::memcpy(logprob.data(), back + 2 * tokens, bytes);
}

void KernelBackend::Sample(ConstMatrixView logits,
                           absl::Span<const SamplingParams> params,
                           absl::Span<int32_t> ids,
                           absl::Span<float> logprobs) {
  const int64_t tokens = logits.rows;
  const int64_t vocab = logits.cols;
  CHECK_GT(vocab, 0);
  CHECK_EQ(static_cast<int64_t>(params.size()), tokens);
  CHECK_EQ(static_cast<int64_t>(ids.size()), tokens);
  CHECK_EQ(static_cast<int64_t>(logprobs.size()), tokens);
  if (tokens == 0) return;
  argmax_.resize(static_cast<size_t>(tokens));
  max_.resize(static_cast<size_t>(tokens));
  lse_.resize(static_cast<size_t>(tokens));
  RowStats(logits, {}, absl::MakeSpan(argmax_), absl::MakeSpan(max_), logprobs,
           absl::MakeSpan(lse_));
  // Greedy rows (as SampleToken decides it) take the device's argmax and
  // log-prob; drawn rows are drawn on the device, and their log-probs are
  // their logits less the rows' log-sum-exps (as RowLogProbOp computes it).
  std::vector<k::SampleRow> drawn;
  for (int64_t t = 0; t < tokens; ++t) {
    const SamplingParams& p = params[t];
    ids[t] = argmax_[t];
    if (!(p.temperature > 0.0f) || !std::isfinite(max_[t])) continue;
    drawn.push_back(k::SampleRow{
        .row = t,
        .max = max_[t],
        .inv_temperature = 1.0 / double{p.temperature},
        .top_k = p.top_k > 0 && p.top_k < vocab ? int64_t{p.top_k} : 0,
        .top_p = p.top_p < 1.0f ? p.top_p : 1.0f,
        .min_p = p.min_p,
        .uniform = SamplingUniform(p.seed),
        .k_cut = {.key = 0, .id = vocab},
        .p_cut = {.key = 0, .id = vocab}});
  }
  if (drawn.empty()) return;
  const int64_t per_pass =
      std::max<int64_t>(1, options_.sample_weight_bytes / (vocab * int64_t{8}));
  for (size_t first = 0; first < drawn.size();
       first += static_cast<size_t>(per_pass)) {
    DrawRows(logits, absl::MakeSpan(drawn).subspan(
                         first, static_cast<size_t>(per_pass)));
  }
  for (const k::SampleRow& s : drawn) {
    if (s.id < 0) continue;
    ids[s.row] = s.id;
    logprobs[s.row] = static_cast<float>(double{s.logit} - lse_[s.row]);
  }
}

void KernelBackend::DrawRows(ConstMatrixView logits,
                             absl::Span<k::SampleRow> drawn) {
  const auto count = static_cast<int64_t>(drawn.size());
  const int64_t vocab = logits.cols;
  const int64_t lanes = (vocab + k::kRowLane - 1) / k::kRowLane;
  const int64_t partials = count * lanes;
  const int64_t bins = partials * k::kSampleBins;
  Carver carve(*this, Carver::Bytes<k::SampleRow>(count) +
                          Carver::Bytes<double>(count * vocab) +
                          Carver::Bytes<int32_t>(bins) +
                          Carver::Bytes<double>(bins) +
                          Carver::Bytes<int32_t>(partials) +
                          Carver::Bytes<double>(partials));
  const int64_t row_bytes = count * static_cast<int64_t>(sizeof(k::SampleRow));
  auto* rows = carve.Take<k::SampleRow>(count);
  executor_->ToDevice(rows, drawn.data(), row_bytes);
  auto* weights = carve.Take<double>(count * vocab);
  auto* hist_count = carve.Take<int32_t>(bins);
  auto* hist_mass = carve.Take<double>(bins);
  auto* ties = carve.Take<int32_t>(partials);
  auto* mass = carve.Take<double>(partials);
  executor_->Run(
      k::SampleWeightsOp{
          .x = logits.data, .cols = vocab, .rows = rows, .weights = weights},
      count * vocab);
  // Top-k (stage 0), then top-p (stage 1), for the rows that ask.
  for (int32_t stage = 0; stage < 2; ++stage) {
    if (std::none_of(drawn.begin(), drawn.end(),
                     [&](const k::SampleRow& s) { return s.Selects(stage); })) {
      continue;
    }
    for (int32_t shift = 64 - k::kSampleDigitBits; shift >= 0;
         shift -= k::kSampleDigitBits) {
      executor_->Run(k::SampleHistOp{.weights = weights,
                                     .cols = vocab,
                                     .lanes = lanes,
                                     .rows = rows,
                                     .stage = stage,
                                     .shift = shift,
                                     .count = hist_count,
                                     .mass = hist_mass},
                     partials);
      executor_->Run(k::SamplePickOp{.count = hist_count,
                                     .mass = hist_mass,
                                     .lanes = lanes,
                                     .stage = stage,
                                     .shift = shift,
                                     .rows = rows},
                     count);
    }
    executor_->Run(k::SampleTieCountOp{.weights = weights,
                                       .cols = vocab,
                                       .lanes = lanes,
                                       .rows = rows,
                                       .stage = stage,
                                       .ties = ties},
                   partials);
    executor_->Run(k::SampleCutOp{.weights = weights,
                                  .cols = vocab,
                                  .lanes = lanes,
                                  .ties = ties,
                                  .stage = stage,
                                  .rows = rows},
                   count);
  }
  executor_->Run(k::SampleMassOp{.weights = weights,
                                 .cols = vocab,
                                 .lanes = lanes,
                                 .rows = rows,
                                 .mass = mass},
                 partials);
  executor_->Run(k::SampleDrawOp{.x = logits.data,
                                 .weights = weights,
                                 .cols = vocab,
                                 .lanes = lanes,
                                 .mass = mass,
                                 .rows = rows},
                 count);
  FetchBytes(drawn.data(), rows, row_bytes);
}

void KernelBackend::LogProbs(ConstMatrixView logits,
                             absl::Span<const int32_t> ids,
                             absl::Span<float> logprobs) {
  const int64_t tokens = logits.rows;
  const int64_t vocab = logits.cols;
  CHECK_EQ(static_cast<int64_t>(ids.size()), tokens);
  CHECK_EQ(static_cast<int64_t>(logprobs.size()), tokens);
  if (tokens == 0) return;
  for (int64_t t = 0; t < tokens; ++t) {
    CHECK(ids[t] >= 0 && ids[t] < vocab) << "id " << ids[t];
  }
  argmax_.resize(static_cast<size_t>(tokens));
  max_.resize(static_cast<size_t>(tokens));
  RowStats(logits, ids, absl::MakeSpan(argmax_), absl::MakeSpan(max_),
           logprobs);
}

}  // namespace mneme::gpu
