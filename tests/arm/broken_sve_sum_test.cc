// The Arm suites' own test: a Highway kernel with a deliberately broken
// SVE-only code path, which must pass natively (x86) and under NEON and
// 128-bit SVE, and fail under SVE at 256 and 512 bits (BUILD.bazel runs it
// with expect_test_failure there). The bug is the classic one of code written
// for 128-bit SIMD: on the SVE targets the tail after the vector loop is
// taken as `n % 4` elements, which is right only when a vector holds 4 floats.
// If the Arm runner ever stopped running the SVE targets at their lengths
// (a qemu CPU without SVE, a dispatch that falls back to NEON), the
// expected-failure targets would pass and report it.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "tests/arm/broken_sve_sum_test.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace mneme::arm_test {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

int64_t CurrentTarget() { return HWY_TARGET; }

float SumKernel(const float* HWY_RESTRICT x, int64_t count) {
  const hn::ScalableTag<float> d;
  const size_t n = static_cast<size_t>(count);
  const size_t lanes = hn::Lanes(d);
  auto acc = hn::Zero(d);
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) acc = hn::Add(acc, hn::LoadU(d, x + i));
#if HWY_TARGET == HWY_SVE || HWY_TARGET == HWY_SVE2 || \
    HWY_TARGET == HWY_SVE_256 || HWY_TARGET == HWY_SVE2_128
  i = n - n % 4;  // Deliberately wrong: assumes 4 lanes.
#endif
  float sum = hn::GetLane(hn::SumOfLanes(d, acc));
  for (; i < n; ++i) sum += x[i];
  return sum;
}

}  // namespace HWY_NAMESPACE
}  // namespace mneme::arm_test
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "gtest/gtest.h"

namespace mneme::arm_test {
namespace {

HWY_EXPORT(CurrentTarget);
HWY_EXPORT(SumKernel);

TEST(BrokenSveSumTest, SumsEveryLength) {
  // Small integers: every partial sum is exact in fp32.
  for (int64_t n = 0; n <= 70; ++n) {
    std::vector<float> x(static_cast<size_t>(n));
    int64_t expected = 0;
    for (int64_t i = 0; i < n; ++i) {
      x[static_cast<size_t>(i)] = static_cast<float>(i % 7 + 1);
      expected += i % 7 + 1;
    }
    const float sum = HWY_DYNAMIC_DISPATCH(SumKernel)(x.data(), n);
    EXPECT_EQ(sum, static_cast<float>(expected))
        << "n = " << n << " on "
        << hwy::TargetName(HWY_DYNAMIC_DISPATCH(CurrentTarget)());
  }
}

}  // namespace
}  // namespace mneme::arm_test
#endif  // HWY_ONCE
