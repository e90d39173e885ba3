// Prints the Highway target that dynamic dispatch picks on this CPU and that
// target's vector length in bytes ("SVE 64"), then every supported target.
// The qemu runner (qemu_run.sh) compares the first line with what the test
// expects, so an emulator that lacks a feature fails loudly instead of
// testing a lesser target.
#include <cstdint>
#include <cstdio>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "tests/arm/hwy_probe.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace mneme::arm_probe {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

int64_t CurrentTarget() { return HWY_TARGET; }

int64_t VectorBytes() { return hn::Lanes(hn::ScalableTag<uint8_t>()); }

}  // namespace HWY_NAMESPACE
}  // namespace mneme::arm_probe
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace mneme::arm_probe {

HWY_EXPORT(CurrentTarget);
HWY_EXPORT(VectorBytes);

int Probe() {
  std::printf("%s %lld\n",
              hwy::TargetName(HWY_DYNAMIC_DISPATCH(CurrentTarget)()),
              static_cast<long long>(HWY_DYNAMIC_DISPATCH(VectorBytes)()));
  std::printf("supported:");
  for (const int64_t target : hwy::SupportedAndGeneratedTargets()) {
    std::printf(" %s", hwy::TargetName(target));
  }
  std::printf("\n");
  return 0;
}

}  // namespace mneme::arm_probe

int main() { return mneme::arm_probe::Probe(); }
#endif  // HWY_ONCE
