#include "engram_store/service/request_handler.h"

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "engram_store/engram_store.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"
#include "tools/synthetic/synthetic_checkpoint.h"

namespace mneme::engram {
namespace {

class RequestHandlerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    synthetic::SyntheticCheckpointOptions options;
    options.out_dir = mneme::testing::MakeTempDir("handler") + "/ckpt";
    options.seed = 3;
    options.threads = 2;
    ASSERT_TRUE(synthetic::MakeSyntheticCheckpoint(options).ok());
    EngramStoreOptions store_options;
    store_options.checkpoint_dir = options.out_dir;
    store_options.io_threads = 2;
    store_options.tp_size = 4;
    store_options.ranks = {1};
    store_options.ram_cache_bytes = 0;
    absl::StatusOr<std::unique_ptr<EngramStore>> store =
        EngramStore::Create(store_options);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = store->release();
  }
  static void TearDownTestSuite() { delete store_; }

  RequestHandler Handler() const {
    RequestLimits limits;
    limits.max_rows_per_request = 60;
    limits.max_rows_per_stream = 600;
    limits.max_stream_message_bytes = 1000;
    limits.max_response_bytes = 20000;
    return RequestHandler(store_, limits);
  }
  int Layer() const { return store_->checkpoint().tables()[0].layer; }
  v1::LookupRequest Tokens(int n, int context) const {
    v1::LookupRequest r;
    r.set_layer_id(Layer());
    for (int i = 0; i < n; ++i) r.add_token_ids(100 + i);
    r.set_context_token_count(context);
    return r;
  }

  static EngramStore* store_;
};

EngramStore* RequestHandlerTest::store_ = nullptr;

TEST_F(RequestHandlerTest, TokenWindowsResolveToTheServedColumns) {
  const RequestHandler h = Handler();
  absl::StatusOr<ResolvedRequest> r = h.ResolveLookup(Tokens(5, 3), 60);
  ASSERT_TRUE(r.ok()) << r.status();
  const std::vector<int>& cols = store_->columns();
  ASSERT_EQ(r->row_ids.size(), 2 * cols.size());
  const v1::LookupRequest req = Tokens(5, 3);
  std::vector<int64_t> all = *store_->checkpoint().hasher().RowIds(
      Layer(), std::span<const int64_t>(req.token_ids().data(), 3),
      std::span<const int64_t>(req.token_ids().data() + 3, 2));
  const int n = store_->checkpoint().hasher().num_columns();
  for (size_t p = 0; p < 2; ++p) {
    for (size_t i = 0; i < cols.size(); ++i) {
      EXPECT_EQ(r->row_ids[p * cols.size() + i], all[p * n + cols[i]]);
    }
  }
  EXPECT_EQ(r->encoding, RowEncoding::kBf16);
  EXPECT_EQ(r->row_bytes, 2u * formats::kRowDim);
}

TEST_F(RequestHandlerTest, BadRequestsGetSpecificCodes) {
  const RequestHandler h = Handler();
  auto code = [&](const v1::LookupRequest& r) {
    return h.ResolveLookup(r, 60).status().code();
  };
  v1::LookupRequest r = Tokens(4, 0);
  r.set_layer_id(12345);
  EXPECT_EQ(code(r), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(Tokens(3, 3)), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(Tokens(3, -2)), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(Tokens(0, 0)), absl::StatusCode::kInvalidArgument);
  // 11 tokens x 6 columns (TP 4) > 60 rows.
  EXPECT_EQ(code(Tokens(11, 0)), absl::StatusCode::kResourceExhausted);
  r = Tokens(4, 1);
  r.add_columns(store_->columns()[0]);
  EXPECT_TRUE(h.ResolveLookup(r, 60).ok());
  r.add_columns(store_->columns()[0]);
  EXPECT_EQ(code(r), absl::StatusCode::kInvalidArgument);
  r = Tokens(4, 1);
  r.add_columns(-1);
  EXPECT_EQ(code(r), absl::StatusCode::kInvalidArgument);
  r = Tokens(4, 1);
  r.add_columns(store_->columns()[0] == 0 ? 1 : 0);  // Not rank 1's.
  EXPECT_EQ(code(r), absl::StatusCode::kOutOfRange);
  r = Tokens(4, 1);
  r.add_row_ids(1);
  EXPECT_EQ(code(r), absl::StatusCode::kInvalidArgument);
  v1::LookupRequest ids;
  ids.set_layer_id(Layer());
  ids.add_row_ids(store_->served_ranges()[0][0].begin);
  EXPECT_TRUE(h.ResolveLookup(ids, 60).ok());
  ids.set_context_token_count(1);
  EXPECT_EQ(code(ids), absl::StatusCode::kInvalidArgument);
  ids.set_context_token_count(0);
  ids.set_encoding(static_cast<v1::RowEncoding>(9));
  EXPECT_EQ(code(ids), absl::StatusCode::kInvalidArgument);

  // Ids outside the served ranges are refused at lookup time.
  ids.set_encoding(v1::ROW_ENCODING_RAW);
  ids.set_row_ids(0, 0);
  if (!store_->Serves(Layer(), 0)) {
    v1::LookupResponse response;
    EXPECT_EQ(h.Lookup(ids, absl::Now() + absl::Seconds(10), &response).code(),
              absl::StatusCode::kOutOfRange);
  }
}

TEST_F(RequestHandlerTest, StreamMessagesAreBounded) {
  const RequestHandler h = Handler();
  absl::StatusOr<ResolvedRequest> r = h.ResolveLookup(Tokens(50, 3), 600);
  ASSERT_TRUE(r.ok()) << r.status();
  // 1000 bytes per message, 512-byte bf16 rows.
  EXPECT_EQ(h.RowsPerStreamMessage(*r), 1u);
  v1::LookupRequest fp32 = Tokens(4, 0);
  fp32.set_encoding(v1::ROW_ENCODING_RAW);
  r = h.ResolveLookup(fp32, 600);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(h.RowsPerStreamMessage(*r), 1000u / 264u);
}

// A Lookup whose rows in the asked encoding would pass the response limit
// is refused before any read, naming LookupStream; the same rows in a
// smaller encoding are served.
TEST_F(RequestHandlerTest, LookupResponsesStayWithinTheirByteLimit) {
  const RequestHandler h = Handler();
  const int columns = static_cast<int>(store_->columns().size());
  ASSERT_GT(columns, 0);
  const int tokens = (40 + columns - 1) / columns;  // >= 40 rows.
  ASSERT_LE(tokens * columns, 60);
  v1::LookupRequest bf16 = Tokens(tokens, 0);  // 512-byte rows.
  v1::LookupResponse response;
  const absl::Status refused =
      h.Lookup(bf16, absl::Now() + absl::Seconds(30), &response);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_NE(refused.message().find("LookupStream"), absl::string_view::npos);
  EXPECT_NE(refused.message().find("20000"), absl::string_view::npos);
  v1::LookupRequest raw = bf16;  // 264-byte rows: within the limit.
  raw.set_encoding(v1::ROW_ENCODING_RAW);
  const absl::Status served =
      h.Lookup(raw, absl::Now() + absl::Seconds(30), &response);
  ASSERT_TRUE(served.ok()) << served;
  EXPECT_EQ(response.row_ids_size(), tokens * columns);
}

TEST_F(RequestHandlerTest, DescribeListsTheLayout) {
  v1::DescribeResponse d;
  Handler().Describe(&d);
  EXPECT_EQ(d.tp_size(), 4);
  ASSERT_EQ(d.ranks_size(), 1);
  EXPECT_EQ(d.ranks(0), 1);
  EXPECT_EQ(d.columns_size(), static_cast<int>(store_->columns().size()));
  ASSERT_EQ(d.tables_size(),
            static_cast<int>(store_->checkpoint().tables().size()));
  EXPECT_EQ(d.tables(0).primes_size(), d.num_columns());
  EXPECT_EQ(d.tables(0).served_ranges_size(),
            static_cast<int>(store_->served_ranges()[0].size()));
  EXPECT_EQ(d.max_rows_per_request(), 60);
  EXPECT_EQ(d.max_response_bytes(), 20000);
  EXPECT_EQ(d.context_size(), 3);
}

}  // namespace
}  // namespace mneme::engram
