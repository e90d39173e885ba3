#include "gpu/device_info.h"

#include "gtest/gtest.h"

namespace mneme::gpu {
namespace {

// Skips (visibly, with the reason) where there is no CUDA build or device.
std::vector<DeviceInfo> DevicesOrSkip() {
  absl::StatusOr<std::vector<DeviceInfo>> devices = ListDevices();
  if (!devices.ok()) {
    EXPECT_EQ(devices.status().code(), absl::StatusCode::kUnavailable);
    return {};
  }
  return *devices;
}

TEST(DeviceInfoTest, WithoutCudaEverythingIsUnavailable) {
  if (BuiltWithCuda()) GTEST_SKIP() << "built with CUDA";
  EXPECT_EQ(ListDevices().status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(RunDeviceSelfTest(0).code(), absl::StatusCode::kUnavailable);
}

TEST(DeviceInfoTest, ListsDevicesWithMemory) {
  const std::vector<DeviceInfo> devices = DevicesOrSkip();
  if (devices.empty()) GTEST_SKIP() << "no CUDA device";
  for (const DeviceInfo& d : devices) {
    EXPECT_FALSE(d.name.empty());
    EXPECT_GT(d.total_memory_bytes, 0);
    EXPECT_GE(d.compute_major, 7);
  }
}

TEST(DeviceInfoTest, SelfTestPassesOnEveryDevice) {
  const std::vector<DeviceInfo> devices = DevicesOrSkip();
  if (devices.empty()) GTEST_SKIP() << "no CUDA device";
  for (const DeviceInfo& d : devices) {
    EXPECT_TRUE(RunDeviceSelfTest(d.index).ok()) << d.name;
  }
  EXPECT_EQ(RunDeviceSelfTest(static_cast<int>(devices.size())).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mneme::gpu
