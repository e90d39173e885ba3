// The fault-injecting wrapper behaves as documented, so that tests of what is
// built on readers can rely on it: EIO, damaged short reads, stalls that end
// at the deadline without touching the caller's buffers, pass-through.

#include "tests/engram_store/io/fault_injecting_row_reader.h"

#include <memory>
#include <string>
#include <thread>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "engram_store/io/pread_pool_reader.h"
#include "engram_store/io/row_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engram_store/io/io_test_util.h"

namespace mneme::engram::testing {
namespace {

using ::testing::HasSubstr;

class FaultInjectingRowReaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = TempPath("faults.bin");
    ASSERT_TRUE(WriteRandomFile(path_, 1 << 20, 3).ok());
    file_ = *RowFile::Open(path_, OpenMode::kBuffered);
    PreadPoolReaderOptions options;
    options.threads = 2;
    reader_ = std::make_unique<FaultInjectingRowReader>(
        *PreadPoolReader::Create(options));
    batch_.Add(file_.get(), 100, 264);
    batch_.Add(file_.get(), 50000, 264);
    batch_.Finish();
  }

  absl::Status Read(absl::Time deadline = absl::InfiniteFuture()) {
    return reader_->Read(batch_.spans(), deadline);
  }

  std::string path_;
  std::unique_ptr<RowFile> file_;
  std::unique_ptr<FaultInjectingRowReader> reader_;
  SpanBatch batch_;
};

TEST_F(FaultInjectingRowReaderTest, PassesThroughWithoutFaults) {
  ASSERT_TRUE(Read().ok());
  EXPECT_EQ(batch_.Verify(), "");
  EXPECT_EQ(reader_->faults_injected(), 0);
}

TEST_F(FaultInjectingRowReaderTest, EioMatchesByPathAndRangeAndCount) {
  reader_->AddFault({ReadFault::kEio, path_, 50000, 50001, /*times=*/1});
  const absl::Status status = Read();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(status.message()), HasSubstr(path_));
  ASSERT_TRUE(Read().ok());  // Used up.
  EXPECT_EQ(batch_.Verify(), "");

  reader_->AddFault({ReadFault::kEio, "/other/file", 0, ~uint64_t{0}, -1});
  reader_->AddFault({ReadFault::kEio, path_, 200000, 300000, -1});
  EXPECT_TRUE(Read().ok());  // Neither matches.
  EXPECT_EQ(reader_->faults_injected(), 1);
}

TEST_F(FaultInjectingRowReaderTest, ShortReadLeavesGarbageAndDataLoss) {
  reader_->AddFault({ReadFault::kShortRead, "", 50000, 50001, 1});
  EXPECT_EQ(Read().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(batch_.Verify(), "");
}

TEST_F(FaultInjectingRowReaderTest, StallEndsAtTheDeadlineUntouched) {
  reader_->AddFault({ReadFault::kStall, "", 0, ~uint64_t{0}, 1});
  EXPECT_EQ(Read(absl::Now() + absl::Milliseconds(20)).code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(batch_.Untouched());
}

TEST_F(FaultInjectingRowReaderTest, ReleasedStallReadsNormally) {
  reader_->AddFault({ReadFault::kStall, "", 0, ~uint64_t{0}, 1});
  absl::Status status;
  std::thread caller([&] { status = Read(); });
  reader_->WaitForStalled(1);
  reader_->ReleaseStalls();
  caller.join();
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(batch_.Verify(), "");
}

}  // namespace
}  // namespace mneme::engram::testing
