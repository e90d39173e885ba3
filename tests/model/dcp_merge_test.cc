// The DCP policy: which rank keeps which compressed entry (the merge of the
// ranks' partial attention is Backend::WeighDcpParts, in the conformance
// suite).

#include "model/dcp_merge.h"

#include <vector>

#include "gtest/gtest.h"

namespace mneme::model {
namespace {

TEST(DcpLayoutTest, EveryEntryHasExactlyOneOwnerAndCountsAgree) {
  for (int size : {1, 2, 3, 4}) {
    for (int interleave : {1, 2, 5}) {
      std::vector<int64_t> owned(size, 0);
      for (int64_t e = 0; e < 200; ++e) {
        int owners = 0;
        for (int r = 0; r < size; ++r) {
          const DcpLayout l{.rank = r, .size = size, .interleave = interleave};
          EXPECT_EQ(l.OwnedEntriesBefore(e), owned[r])
              << "size " << size << " interleave " << interleave << " rank "
              << r << " count " << e;
          if (l.OwnsEntry(e)) {
            ++owners;
            ++owned[r];
          }
        }
        EXPECT_EQ(owners, 1) << "entry " << e;
      }
    }
  }
}

TEST(DcpLayoutTest, InterleaveKeepsRunsOnOneRank) {
  const DcpLayout r0{.rank = 0, .size = 2, .interleave = 3};
  const DcpLayout r1{.rank = 1, .size = 2, .interleave = 3};
  for (int64_t e : {0, 1, 2, 6, 7, 8}) EXPECT_TRUE(r0.OwnsEntry(e)) << e;
  for (int64_t e : {3, 4, 5, 9, 10, 11}) EXPECT_TRUE(r1.OwnsEntry(e)) << e;
  EXPECT_FALSE(r0.enabled() && r0.size == 1);
  EXPECT_FALSE((DcpLayout{}).enabled());
}

}  // namespace
}  // namespace mneme::model
