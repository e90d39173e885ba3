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
  explicit HostExecutor(HostExecutorOptions options) : options_(options) {}

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
  absl::StatusOr<void*> AllocatePinned(int64_t bytes) override {
    return Allocate(bytes);
  }
  void FreePinned(void* p) override {
    AwaitStaged();
    CheckHeld();
    std::free(p);
  }
  bool ReadsPinnedInPlace() const override {
    return options_.reads_pinned_in_place;
  }
  // Pinned memory read in place must not change until Synchronize: it is
  // compared there with what it held here, and a change (a race with the
  // device's reads) stops the process.
  const void* PinnedForDevice(const void* src, int64_t bytes) override {
    CHECK(options_.reads_pinned_in_place)
        << "pinned memory read in place by a device that copies it";
    if (bytes > 0) held_.push_back(Snapshot(src, bytes));
    return src;
  }
  absl::Status Synchronize() override {
    CheckHeld();
    return absl::OkStatus();
  }
  absl::Status status() const override { return absl::OkStatus(); }
  // Staged copies land only at AwaitStaged, the latest a device's copy
  // queue may land them, from the source as it is then; until then their
  // blocks hold NaN bytes, so a read that is not ordered after AwaitStaged
  // fails loudly, and a write to one (a race with the copy on a device) or
  // to its source (which the copy may still be reading, until
  // Synchronize) stops the process.
  void StageToDevice(void* dst, const void* src, int64_t bytes) override {
    if (bytes <= 0) return;
    staged_.push_back(Staged{.dst = dst, .src = Snapshot(src, bytes)});
    std::memset(dst, kPoison, static_cast<size_t>(bytes));
  }
  void AwaitStaged() override {
    for (const Staged& s : staged_) {
      const auto* p = static_cast<const uint8_t*>(s.dst);
      CHECK(std::all_of(p, p + s.src.bytes.size(),
                        [](uint8_t b) { return b == kPoison; }))
          << "a block with a staged copy in flight was written before "
             "AwaitStaged";
      CHECK(s.src.Unchanged())
          << "the source of a staged copy was written before AwaitStaged";
    }
    for (Staged& s : staged_) {
      std::memcpy(s.dst, s.src.at, s.src.bytes.size());
      // A device's copy may still be reading it until Synchronize.
      held_.push_back(std::move(s.src));
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
  // Host bytes and what they held when the device was given them.
  struct Held {
    const void* at;
    std::vector<uint8_t> bytes;
    bool Unchanged() const {
      return std::memcmp(at, bytes.data(), bytes.size()) == 0;
    }
  };
  static Held Snapshot(const void* src, int64_t bytes) {
    const auto* from = static_cast<const uint8_t*>(src);
    return Held{.at = src, .bytes = std::vector<uint8_t>(from, from + bytes)};
  }
  struct Staged {
    void* dst;
    Held src;
  };
  // Pinned memory the device may still read (in place, or the source of a
  // landed copy) must be unchanged.
  void CheckHeld() {
    for (const Held& h : held_) {
      CHECK(h.Unchanged()) << "pinned memory the device may still read was "
                              "written before Synchronize";
    }
    held_.clear();
  }

  HostExecutorOptions options_;
  std::vector<Staged> staged_;
  std::vector<Held> held_;
};

}  // namespace

std::unique_ptr<Executor> MakeHostExecutor(HostExecutorOptions options) {
  return std::make_unique<HostExecutor>(options);
}

}  // namespace mneme::gpu
