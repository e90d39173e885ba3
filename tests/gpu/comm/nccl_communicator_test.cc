// NcclCommunicator on real devices when the build has CUDA and a device is
// visible (one rank per device, as threads); otherwise the factory's
// Unavailable and skips with the reason.
#include "gpu/comm/nccl_communicator.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gpu/comm/in_memory_rendezvous_store.h"
#include "gpu/device_info.h"
#include "gtest/gtest.h"

#ifdef MNEME_TEST_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace mneme::gpu {
namespace {

std::unique_ptr<InMemoryRendezvousStore> MakeStore() {
  auto store = InMemoryRendezvousStore::Create({});
  EXPECT_TRUE(store.ok()) << store.status();
  return *std::move(store);
}

TEST(NcclCommunicatorTest, WithoutCudaIsUnavailable) {
  if (BuiltWithCuda()) GTEST_SKIP() << "built with CUDA";
  auto store = MakeStore();
  auto comm = CreateNcclCommunicator({}, *store);
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(comm.status().message(),
              ::testing::HasSubstr("built without CUDA"));
}

#ifdef MNEME_TEST_WITH_CUDA

// Number of visible devices, or a reason to skip.
absl::StatusOr<int> DeviceCount() {
  absl::StatusOr<std::vector<DeviceInfo>> devices = ListDevices();
  if (!devices.ok()) return devices.status();
  return static_cast<int>(devices->size());
}

// Host <-> device copies for the checks; CHECK-style failures end the test.
struct DeviceBuffer {
  explicit DeviceBuffer(int64_t count) : count(count) {
    EXPECT_EQ(cudaMalloc(&ptr, std::max<int64_t>(count, 1) * sizeof(float)),
              cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  void Upload(const std::vector<float>& host) {
    EXPECT_EQ(cudaMemcpy(ptr, host.data(), host.size() * sizeof(float),
                         cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  std::vector<float> Download() const {
    std::vector<float> host(count);
    EXPECT_EQ(cudaMemcpy(host.data(), ptr, count * sizeof(float),
                         cudaMemcpyDeviceToHost),
              cudaSuccess);
    return host;
  }
  float* ptr = nullptr;
  int64_t count;
};

float Value(int rank, int64_t i) {
  return static_cast<float>(i % 4093 + 10 * rank + 1);
}

// Runs every collective on `comm` (device comm->rank()) and checks it.
void CheckCollectives(Communicator& comm, int device, int64_t count) {
  ASSERT_EQ(cudaSetDevice(device), cudaSuccess);
  const int n = comm.size();
  const int r = comm.rank();
  auto sum = [n](int64_t i) {
    float s = 0;
    for (int q = 0; q < n; ++q) s += Value(q, i);
    return s;
  };
  std::vector<float> host(count);
  for (int64_t i = 0; i < count; ++i) host[i] = Value(r, i);

  DeviceBuffer data(count);
  data.Upload(host);
  ASSERT_TRUE(comm.AllReduceSum(data.ptr, count).ok());
  std::vector<float> got = data.Download();
  for (int64_t i = 0; i < count; ++i) ASSERT_EQ(got[i], sum(i)) << i;

  DeviceBuffer in(count), out(count * n);
  in.Upload(host);
  ASSERT_TRUE(comm.AllGather(in.ptr, count, out.ptr).ok());
  got = out.Download();
  for (int64_t j = 0; j < count * n; ++j) {
    ASSERT_EQ(got[j], Value(j / count, j % count)) << j;
  }

  std::vector<float> full(count * n);
  for (int64_t j = 0; j < count * n; ++j) full[j] = Value(r, j);
  DeviceBuffer full_d(count * n), scattered(count);
  full_d.Upload(full);
  ASSERT_TRUE(comm.ReduceScatterSum(full_d.ptr, count, scattered.ptr).ok());
  got = scattered.Download();
  for (int64_t i = 0; i < count; ++i) ASSERT_EQ(got[i], sum(r * count + i));

  for (int root = 0; root < n; ++root) {
    data.Upload(host);
    ASSERT_TRUE(comm.Broadcast(data.ptr, count, root).ok());
    got = data.Download();
    for (int64_t i = 0; i < count; ++i) ASSERT_EQ(got[i], Value(root, i));
  }
  ASSERT_TRUE(comm.Barrier().ok());
}

class NcclGroupTest : public ::testing::TestWithParam<int> {};

TEST_P(NcclGroupTest, EveryCollectiveIsExact) {
  const int size = GetParam();
  absl::StatusOr<int> devices = DeviceCount();
  if (!devices.ok()) GTEST_SKIP() << "no CUDA device: " << devices.status();
  if (*devices < size) {
    GTEST_SKIP() << size << " ranks need " << size << " devices; " << *devices
                 << " visible";
  }
  auto store = MakeStore();
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      NcclCommunicatorOptions options;
      options.rank = r;
      options.size = size;
      options.device = r;
      options.timeout = absl::Seconds(120);
      auto comm = CreateNcclCommunicator(options, *store);
      ASSERT_TRUE(comm.ok()) << comm.status();
      for (int64_t count : {int64_t{1}, int64_t{7}, int64_t{1} << 20}) {
        CheckCollectives(**comm, r, count);
      }
      EXPECT_EQ((*comm)->stats().calls, 3 * (4 + size));
    });
  }
  for (std::thread& t : threads) t.join();
}

INSTANTIATE_TEST_SUITE_P(Sizes, NcclGroupTest, ::testing::Values(1, 2),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "Ranks" + std::to_string(info.param);
                         });

TEST(NcclCommunicatorTest, MissingRankIsDeadlineExceeded) {
  absl::StatusOr<int> devices = DeviceCount();
  if (!devices.ok()) GTEST_SKIP() << "no CUDA device: " << devices.status();
  auto store = MakeStore();
  NcclCommunicatorOptions options;
  options.rank = 1;
  options.size = 2;
  options.timeout = absl::Milliseconds(200);
  // Rank 0 never publishes the unique id.
  auto comm = CreateNcclCommunicator(options, *store);
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(NcclCommunicatorTest, RejectsBadOptions) {
  absl::StatusOr<int> devices = DeviceCount();
  if (!devices.ok()) GTEST_SKIP() << "no CUDA device: " << devices.status();
  auto store = MakeStore();
  NcclCommunicatorOptions options;
  options.device = *devices;
  EXPECT_EQ(CreateNcclCommunicator(options, *store).status().code(),
            absl::StatusCode::kInvalidArgument);
  options = {};
  options.rank = 1;
  EXPECT_EQ(CreateNcclCommunicator(options, *store).status().code(),
            absl::StatusCode::kInvalidArgument);
}

#else

TEST(NcclCommunicatorTest, DeviceCollectives) {
  GTEST_SKIP() << "built without CUDA (--config=cuda): no NCCL to test";
}

#endif  // MNEME_TEST_WITH_CUDA

}  // namespace
}  // namespace mneme::gpu
