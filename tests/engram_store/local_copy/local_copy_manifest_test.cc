#include "engram_store/local_copy/local_copy_manifest.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/engram_store/local_copy/local_copy_test_util.h"

namespace mneme::engram {
namespace {

using ::mneme::engram::testing::OneRank;
using ::mneme::engram::testing::OpenCheckpoint;
using ::mneme::engram::testing::SharedCheckpointDir;
using ::testing::HasSubstr;

class LocalCopyManifestTest : public ::testing::Test {
 protected:
  void SetUp() override {
    checkpoint_ =
        OpenCheckpoint(SharedCheckpointDir(formats::RowFormat::kNvfp4));
    ASSERT_NE(checkpoint_, nullptr);
    absl::StatusOr<SourceIdentity> identity = IdentifySource(*checkpoint_);
    ASSERT_TRUE(identity.ok()) << identity.status();
    identity_ = *identity;
  }

  LocalCopyManifest Plan(const LocalCopyTarget& target,
                         uint64_t max_range_bytes = 1 << 20) {
    absl::StatusOr<LocalCopyManifest> plan =
        PlanLocalCopy(*checkpoint_, identity_, target, max_range_bytes);
    EXPECT_TRUE(plan.ok()) << plan.status();
    return plan.ok() ? *plan : LocalCopyManifest{};
  }

  // A plan with made-up checksums, as JSON.
  nlohmann::json PlanJson() {
    LocalCopyManifest plan = Plan(OneRank(4, 1, ColumnSplit::kStrided));
    uint32_t crc = 0x01234567;
    for (LocalCopyLayer& layer : plan.layers) {
      for (LocalCopyRange& range : layer.ranges) range.crc32c = crc++;
    }
    return nlohmann::json::parse(ManifestToJson(plan));
  }

  std::unique_ptr<EngramCheckpoint> checkpoint_;
  SourceIdentity identity_;
};

TEST_F(LocalCopyManifestTest, IdentityRecordsEngramKeysAndShards) {
  EXPECT_EQ(identity_.layer_ids, (std::vector<int>{1, 3}));
  EXPECT_EQ(identity_.num_embeddings, checkpoint_->config().num_embeddings);
  EXPECT_EQ(identity_.format, formats::RowFormat::kNvfp4);
  EXPECT_EQ(identity_.quant_block_size, 16);
  EXPECT_EQ(identity_.global_scales, checkpoint_->config().global_scales);
  ASSERT_EQ(identity_.shards.size(), 2u);
  for (const SourceShardIdentity& shard : identity_.shards) {
    EXPECT_EQ(shard.file.find('/'), std::string::npos) << shard.file;
    EXPECT_GT(shard.size_bytes, 0u);
    EXPECT_GT(shard.mtime_ns, 0);
  }
  EXPECT_LT(identity_.shards[0].file, identity_.shards[1].file);
  EXPECT_EQ(DescribeSourceMismatch(identity_, identity_), std::nullopt);
}

TEST_F(LocalCopyManifestTest, SourceMismatchesNameTheDifference) {
  SourceIdentity changed = identity_;
  changed.shards[1].size_bytes += 1;
  EXPECT_THAT(DescribeSourceMismatch(identity_, changed).value_or(""),
              HasSubstr(identity_.shards[1].file + " size"));
  changed = identity_;
  changed.shards[0].mtime_ns += 1;
  EXPECT_THAT(DescribeSourceMismatch(identity_, changed).value_or(""),
              HasSubstr("mtime"));
  changed = identity_;
  changed.shards.pop_back();
  EXPECT_THAT(DescribeSourceMismatch(identity_, changed).value_or(""),
              HasSubstr(identity_.shards[1].file));
  changed = identity_;
  changed.global_scales.begin()->second *= 2;
  EXPECT_THAT(DescribeSourceMismatch(identity_, changed).value_or(""),
              HasSubstr("engram_quant_global_scale"));
  changed = identity_;
  changed.vocab_size += 1;
  EXPECT_THAT(DescribeSourceMismatch(identity_, changed).value_or(""),
              HasSubstr("engram_vocab_size"));
  changed = identity_;
  changed.format = formats::RowFormat::kFp8;
  EXPECT_THAT(DescribeSourceMismatch(identity_, changed).value_or(""),
              HasSubstr("engram_quant"));
}

TEST_F(LocalCopyManifestTest, TargetRowRangesPartitionEveryTable) {
  const HashLayout& layout = checkpoint_->hasher().layout();
  for (ColumnSplit split : {ColumnSplit::kStrided, ColumnSplit::kContiguous}) {
    for (int tp : {1, 2, 4, 8}) {
      std::vector<std::vector<RowRange>> all(layout.layers().size());
      for (int rank = 0; rank < tp; ++rank) {
        absl::StatusOr<std::vector<std::vector<RowRange>>> ranges =
            TargetRowRanges(layout, OneRank(tp, rank, split));
        ASSERT_TRUE(ranges.ok()) << ranges.status();
        for (size_t i = 0; i < ranges->size(); ++i) {
          const std::vector<RowRange>& r = (*ranges)[i];
          // Coalesced: sorted and separated by rows of other ranks.
          for (size_t k = 1; k < r.size(); ++k)
            EXPECT_LT(r[k - 1].end, r[k].begin);
          if (tp == 1 || split == ColumnSplit::kContiguous) {
            EXPECT_EQ(r.size(), 1u) << tp;
          } else {
            EXPECT_EQ(r.size(), 24u / tp);
          }
          all[i].insert(all[i].end(), r.begin(), r.end());
        }
      }
      for (size_t i = 0; i < all.size(); ++i) {
        int64_t total = 0;
        for (const RowRange& r : all[i]) total += r.size();
        EXPECT_EQ(total, layout.layers()[i].num_rows);
        EXPECT_EQ(CoalesceRowRanges(all[i]),
                  (std::vector<RowRange>{{0, layout.layers()[i].num_rows}}));
      }
    }
  }
}

TEST_F(LocalCopyManifestTest, PlanSplitsRangesAndPacksThem) {
  const LocalCopyTarget target = OneRank(2, 0, ColumnSplit::kContiguous);
  const LocalCopyManifest plan = Plan(target, 10000);
  ASSERT_EQ(plan.layers.size(), 2u);
  for (size_t i = 0; i < plan.layers.size(); ++i) {
    const LocalCopyLayer& layer = plan.layers[i];
    EXPECT_EQ(layer.row_bytes(), 144u);
    EXPECT_EQ(layer.data_file, LocalCopyDataFileName(layer.layer));
    uint64_t offset = 0;
    for (const LocalCopyRange& range : layer.ranges) {
      EXPECT_EQ(range.offset, offset);
      EXPECT_LE(range.count, 10000 / 144);
      offset += range.count * 144;
    }
    // Contiguous rank 0 of 2: the first 12 columns.
    const LayerHashLayout& l = checkpoint_->hasher().layout().layers()[i];
    EXPECT_EQ(layer.ranges.front().first_row, 0);
    EXPECT_EQ(layer.ranges.back().end_row(), l.offsets[12]);
    EXPECT_EQ(layer.covered_rows(), l.offsets[12]);
  }
  // A single-row maximum still makes progress.
  EXPECT_EQ(Plan(target, 1).layers[0].ranges.size(),
            static_cast<size_t>(plan.layers[0].covered_rows()));
  EXPECT_EQ(PlanLocalCopy(*checkpoint_, identity_, target, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(LocalCopyManifestTest, JsonRoundTrips) {
  const nlohmann::json json = PlanJson();
  absl::StatusOr<LocalCopyManifest> parsed = ParseManifest(json.dump(), "m");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(nlohmann::json::parse(ManifestToJson(*parsed)), json);
  EXPECT_EQ(parsed->target, OneRank(4, 1, ColumnSplit::kStrided));
  EXPECT_EQ(parsed->layers[0].ranges[0].crc32c, 0x01234567u);
  EXPECT_EQ(parsed->source.global_scales, identity_.global_scales);
  EXPECT_EQ(parsed->source.shards, identity_.shards);
  EXPECT_EQ(ManifestToCompactJson(*parsed).find('\n'), std::string::npos);
}

TEST_F(LocalCopyManifestTest, CorruptManifestsAreDataLossNamingTheField) {
  struct Case {
    std::function<void(nlohmann::json&)> damage;
    std::string mentions;
  };
  const std::vector<Case> cases = {
      {[](nlohmann::json& j) { j.erase("layers"); }, "layers"},
      {[](nlohmann::json& j) { j["tp_size"] = "four"; }, "tp_size"},
      {[](nlohmann::json& j) { j["ranks"] = {7}; }, "ranks"},
      {[](nlohmann::json& j) { j["split"] = "diagonal"; }, "diagonal"},
      {[](nlohmann::json& j) { j["source"]["shards"][0]["file"] = "../x"; },
       "source.shards[0]"},
      {[](nlohmann::json& j) { j["layers"][0]["data_file"] = "/etc/passwd"; },
       "data_file"},
      {[](nlohmann::json& j) { j["layers"][0]["format"] = "fp4"; }, "fp4"},
      {[](nlohmann::json& j) { j["layers"][0]["weight_row_bytes"] = 256; },
       "layers[0]"},
      {[](nlohmann::json& j) { j["layers"][0]["ranges"][1]["offset"] = 1; },
       "layers[0].ranges[1]"},
      {[](nlohmann::json& j) {
         j["layers"][0]["ranges"][1]["first_row"] =
             j["layers"][0]["ranges"][0]["first_row"];
       },
       "overlapping"},
      {[](nlohmann::json& j) { j["layers"][1]["ranges"][0]["count"] = 0; },
       "layers[1].ranges[0]"},
      {[](nlohmann::json& j) {
         j["layers"][0]["ranges"].back()["count"] =
             j["layers"][0]["table_rows"];
       },
       "past the table"},
      {[](nlohmann::json& j) { j["layers"][0]["ranges"][0]["crc32c"] = "xyz"; },
       "crc32c"},
      {[](nlohmann::json& j) { j["layers"][0]["data_bytes"] = 5; },
       "data_bytes"},
      {[](nlohmann::json& j) { j["layers"][1]["layer"] = 1; }, "repeats"},
      {[](nlohmann::json& j) { j["checksum"] = "md5"; }, "md5"},
  };
  for (const Case& c : cases) {
    nlohmann::json json = PlanJson();
    c.damage(json);
    const absl::Status status =
        ParseManifest(json.dump(), "dir/m.json").status();
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << c.mentions;
    EXPECT_THAT(status.message(), HasSubstr(c.mentions));
    EXPECT_THAT(status.message(), HasSubstr("dir/m.json"));
  }
  EXPECT_EQ(ParseManifest("{\"kind\": ", "m").status().code(),
            absl::StatusCode::kDataLoss);
  const absl::Status deep =
      ParseManifest(absl::StrCat(R"({"kind": )", std::string(100000, '[')),
                    "dir/m.json")
          .status();
  EXPECT_EQ(deep.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(deep.message(),
            "local copy manifest 'dir/m.json' nests arrays / objects deeper "
            "than the limit of 128");
  EXPECT_EQ(ParseManifest("[]", "m").status().code(),
            absl::StatusCode::kDataLoss);
  nlohmann::json json = PlanJson();
  json["version"] = 2;
  EXPECT_EQ(ParseManifest(json.dump(), "m").status().code(),
            absl::StatusCode::kFailedPrecondition);
  json = PlanJson();
  json["kind"] = "something-else";
  EXPECT_EQ(ParseManifest(json.dump(), "m").status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(LocalCopyManifestTest, MatchingComparesSourceTargetAndCoverage) {
  const LocalCopyTarget target = OneRank(4, 1, ColumnSplit::kStrided);
  const LocalCopyManifest expected = Plan(target);
  // The same rows split into other entries match.
  EXPECT_TRUE(CheckManifestMatches(Plan(target, 5000), expected, "d").ok());

  for (const LocalCopyTarget& other :
       {OneRank(4, 0, ColumnSplit::kStrided),
        OneRank(2, 1, ColumnSplit::kStrided),
        OneRank(4, 1, ColumnSplit::kContiguous),
        LocalCopyTarget{.tp_size = 4, .ranks = {1, 2}}}) {
    const absl::Status status =
        CheckManifestMatches(Plan(other), expected, "d");
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(status.message(), HasSubstr(DescribeTarget(other)));
    EXPECT_THAT(status.message(), HasSubstr(DescribeTarget(target)));
  }

  LocalCopyManifest recorded = expected;
  recorded.source.shards[0].mtime_ns -= 5;
  absl::Status status = CheckManifestMatches(recorded, expected, "d");
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("different checkpoint"));

  recorded = expected;
  recorded.layers[1].ranges.pop_back();
  status = CheckManifestMatches(recorded, expected, "d");
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("layer 3"));

  recorded = expected;
  recorded.layers[0].global_scale *= 2;
  EXPECT_EQ(CheckManifestMatches(recorded, expected, "d").code(),
            absl::StatusCode::kFailedPrecondition);
  recorded = expected;
  recorded.layers.pop_back();
  EXPECT_EQ(CheckManifestMatches(recorded, expected, "d").code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(LocalCopyTargetTest, ValidationAndDescription) {
  EXPECT_TRUE(ValidateTarget(OneRank(4, 3, ColumnSplit::kStrided)).ok());
  EXPECT_EQ(DescribeTarget(OneRank(4, 3, ColumnSplit::kStrided)),
            "tp 4, rank 3, strided split");
  EXPECT_EQ(
      DescribeTarget(
          {.tp_size = 4, .ranks = {0, 1}, .split = ColumnSplit::kContiguous}),
      "tp 4, ranks 0,1, contiguous split");
  for (const LocalCopyTarget& bad :
       {LocalCopyTarget{.tp_size = 0, .ranks = {0}},
        LocalCopyTarget{.tp_size = 2, .ranks = {}},
        LocalCopyTarget{.tp_size = 2, .ranks = {2}},
        LocalCopyTarget{.tp_size = 2, .ranks = {-1}},
        LocalCopyTarget{.tp_size = 2, .ranks = {1, 1}},
        LocalCopyTarget{.tp_size = 2, .ranks = {1, 0}},
        LocalCopyTarget{
            .tp_size = 2, .ranks = {0}, .split = ColumnSplit::kUnspecified}}) {
    EXPECT_EQ(ValidateTarget(bad).code(), absl::StatusCode::kInvalidArgument)
        << DescribeTarget(bad);
  }
}

}  // namespace
}  // namespace mneme::engram
