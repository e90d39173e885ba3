#include "gpu/cuda/host_executor.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "gpu/cuda/executor.h"
#include "gpu/cuda/kernel_ops.h"

namespace mneme::gpu {
namespace {

// Requests above this are refused without asking the allocator.
constexpr int64_t kMaxBytes = int64_t{1} << 40;
constexpr int64_t kAlignment = 256;

class HostExecutor final : public Executor {
 public:
  std::string name() const override { return "host"; }

  absl::StatusOr<void*> Allocate(int64_t bytes) override {
    if (bytes < 0 || bytes > kMaxBytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat("a host block of ", bytes, " bytes is refused"));
    }
    // Aligned as cudaMalloc's blocks.
    const int64_t rounded = std::max<int64_t>(
        kAlignment, (bytes + kAlignment - 1) / kAlignment * kAlignment);
    void* p = std::aligned_alloc(kAlignment, static_cast<size_t>(rounded));
    if (p != nullptr) std::memset(p, 0, static_cast<size_t>(rounded));
    if (p == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("out of host memory for ", bytes, " bytes"));
    }
    return p;
  }
  void Free(void* p) override {
    AwaitStaged();  // A staged copy may still target it.
    std::free(p);
  }

  void ToDevice(void* dst, const void* src, int64_t bytes) override {
    if (bytes > 0) std::memcpy(dst, src, static_cast<size_t>(bytes));
  }
  void DeviceCopy(void* dst, const void* src, int64_t bytes) override {
    if (bytes > 0) std::memmove(dst, src, static_cast<size_t>(bytes));
  }
  void ToHost(void* dst, const void* src, int64_t bytes) override {
    if (bytes > 0) std::memcpy(dst, src, static_cast<size_t>(bytes));
  }
  absl::Status Synchronize() override { return absl::OkStatus(); }
  absl::Status status() const override { return absl::OkStatus(); }
  // Staged copies land only at AwaitStaged, the latest a device's copy
  // queue may land them; until then their blocks hold NaN bytes, so a read
  // that is not ordered after AwaitStaged fails loudly, and a write to one
  // (a race with the copy on a device) stops the process there.
  void StageToDevice(void* dst, const void* src, int64_t bytes) override {
    if (bytes <= 0) return;
    const auto* from = static_cast<const uint8_t*>(src);
    staged_.push_back(
        Staged{.dst = dst, .bytes = std::vector<uint8_t>(from, from + bytes)});
    std::memset(dst, kPoison, static_cast<size_t>(bytes));
  }
  void AwaitStaged() override {
    for (const Staged& s : staged_) {
      const auto* p = static_cast<const uint8_t*>(s.dst);
      CHECK(std::all_of(p, p + s.bytes.size(),
                        [](uint8_t b) { return b == kPoison; }))
          << "a block with a staged copy in flight was written before "
             "AwaitStaged";
    }
    for (const Staged& s : staged_) {
      std::memcpy(s.dst, s.bytes.data(), s.bytes.size());
    }
    staged_.clear();
  }

#define MNEME_HOST_RUN(Op)                                  \
  void Run(const kernels::Op& op, int64_t items) override { \
    for (int64_t i = 0; i < items; ++i) op(i);              \
  }
  MNEME_KERNEL_OPS(MNEME_HOST_RUN)
#undef MNEME_HOST_RUN

 private:
  // All ones: a NaN in every float.
  static constexpr uint8_t kPoison = 0xff;
  struct Staged {
    void* dst;
    std::vector<uint8_t> bytes;
  };
  std::vector<Staged> staged_;
};

}  // namespace

std::unique_ptr<Executor> MakeHostExecutor() {
  return std::make_unique<HostExecutor>();
}

}  // namespace mneme::gpu
