#include "tests/gpu/comm/collective_checks.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace mneme::gpu::testing {
namespace {

// Internal naming the first element of `got` that differs from `want(i)`.
template <typename Want>
absl::Status Compare(absl::string_view what, int64_t count,
                     const std::vector<float>& got, Want want) {
  for (int64_t i = 0; i < static_cast<int64_t>(got.size()); ++i) {
    const float w = want(i);
    if (got[i] != w) {
      return absl::InternalError(absl::StrCat(what, " count=", count,
                                              ": element ", i, " is ", got[i],
                                              ", want ", w));
    }
  }
  return absl::OkStatus();
}

}  // namespace

float TestValue(int rank, int64_t i) {
  return static_cast<float>(i % 4093 + int64_t{10} * rank + 1);
}

absl::Status RunCollectiveChecks(Communicator& comm,
                                 const std::vector<int64_t>& counts) {
  const int n = comm.size();
  const int r = comm.rank();
  auto sum_over_ranks = [n](int64_t i) {
    float s = 0;
    for (int q = 0; q < n; ++q) s += TestValue(q, i);
    return s;
  };
  for (const int64_t count : counts) {
    // AllReduceSum.
    std::vector<float> data(count);
    for (int64_t i = 0; i < count; ++i) data[i] = TestValue(r, i);
    if (absl::Status s = comm.AllReduceSum(data.data(), count); !s.ok()) {
      return s;
    }
    if (absl::Status s = Compare("AllReduceSum", count, data, sum_over_ranks);
        !s.ok()) {
      return s;
    }

    // AllGather.
    std::vector<float> in(count);
    for (int64_t i = 0; i < count; ++i) in[i] = TestValue(r, i);
    std::vector<float> gathered(count * n, -1.0f);
    if (absl::Status s = comm.AllGather(in.data(), count, gathered.data());
        !s.ok()) {
      return s;
    }
    if (absl::Status s = Compare(
            "AllGather", count, gathered,
            [count](int64_t j) { return TestValue(j / count, j % count); });
        !s.ok()) {
      return s;
    }

    // ReduceScatterSum: element j of the full input is TestValue(rank, j).
    std::vector<float> full(count * n);
    for (int64_t j = 0; j < count * n; ++j) full[j] = TestValue(r, j);
    std::vector<float> scattered(count, -1.0f);
    if (absl::Status s =
            comm.ReduceScatterSum(full.data(), count, scattered.data());
        !s.ok()) {
      return s;
    }
    if (absl::Status s =
            Compare("ReduceScatterSum", count, scattered,
                    [&](int64_t i) { return sum_over_ranks(r * count + i); });
        !s.ok()) {
      return s;
    }

    // Broadcast from every root.
    for (int root = 0; root < n; ++root) {
      std::vector<float> b(count);
      for (int64_t i = 0; i < count; ++i) b[i] = TestValue(r, i);
      if (absl::Status s = comm.Broadcast(b.data(), count, root); !s.ok()) {
        return s;
      }
      if (absl::Status s =
              Compare(absl::StrCat("Broadcast root=", root), count, b,
                      [root](int64_t i) { return TestValue(root, i); });
          !s.ok()) {
        return s;
      }
    }
  }
  return comm.Barrier();
}

}  // namespace mneme::gpu::testing
