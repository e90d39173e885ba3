#ifndef MNEME_TESTS_TESTING_HWY_TARGETS_H_
#define MNEME_TESTS_TESTING_HWY_TARGETS_H_

// Tests of Highway code that run once per SIMD target this binary carries
// and the CPU supports, each forced in turn (hwy::SetSupportedTargetsForTest),
// so one run covers e.g. SSE4, AVX2 and AVX-512, or NEON and SVE:
//
//   class MyKernelsTest : public mneme::testing::HwyTargetTest {};
//   TEST_P(MyKernelsTest, ...) { ... }
//   MNEME_INSTANTIATE_HWY_TARGETS(MyKernelsTest);

#include <cctype>
#include <cstdint>
#include <string>

#include "gtest/gtest.h"
#include "hwy/targets.h"

namespace mneme::testing {

class HwyTargetTest : public ::testing::TestWithParam<int64_t> {
 protected:
  void SetUp() override { hwy::SetSupportedTargetsForTest(GetParam()); }
  void TearDown() override { hwy::SetSupportedTargetsForTest(0); }
};

// The target's name as a test name ("AVX3", "SVE2_128").
inline std::string HwyTargetTestName(
    const ::testing::TestParamInfo<int64_t>& info) {
  std::string name = hwy::TargetName(info.param);
  for (char& c : name) {
    if (std::isalnum(static_cast<unsigned char>(c)) == 0) c = '_';
  }
  return name;
}

}  // namespace mneme::testing

#define MNEME_INSTANTIATE_HWY_TARGETS(suite)                    \
  INSTANTIATE_TEST_SUITE_P(                                     \
      Targets, suite,                                           \
      ::testing::ValuesIn(hwy::SupportedAndGeneratedTargets()), \
      ::mneme::testing::HwyTargetTestName)

#endif  // MNEME_TESTS_TESTING_HWY_TARGETS_H_
