// Row cache lookups, all hits, next to a memcpy of the same output bytes in
// the same run (bytes_per_second = output bytes):
//   - RAM tier: a batch of 48 rows (one token's rows: 24 columns x 2 Engram
//     layers) and of 8192 x 24 / 8 = 24576 rows (an 8192-token prefill
//     chunk's rows of one layer, split 8 ways).
//   - the same rows gathered from random places of a plain array (the floor
//     for any random-access cache), and a contiguous memcpy.
//   - RocksDB tier: a batch of 48 rows (hits, then misses).
// FP8 rows (264 bytes). The RAM cache holds 1.5M rows (600 MiB budget) and
// batches walk through 1M random ids, so lookups mostly go to DRAM, as in
// serving. The RocksDB tier holds 1M rows (~280 MB of table files, read
// through the page cache after the first touch; 64 MiB block cache).
//
//   bazel run //tests/bench/engram_store:cache_bench --
//       --benchmark_min_time=0.2
// (the default configuration already compiles with -O2, see .bazelrc)

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "benchmark/benchmark.h"
#include "engram_store/cache/ram_row_cache.h"
#include "engram_store/cache/rocksdb_row_cache.h"
#include "formats/row_format.h"
#include "glog/logging.h"

namespace mneme::engram {
namespace {

constexpr size_t kRowBytes = formats::RowBytes(formats::RowFormat::kFp8);
constexpr uint32_t kTable = 1;
constexpr int64_t kRamRows = 1500000;
constexpr int64_t kRocksRows = 1000000;

std::vector<uint8_t> RowBytesOf(int64_t first, size_t n) {
  std::vector<uint8_t> rows(n * kRowBytes);
  for (size_t i = 0; i < n; ++i) {
    std::memset(rows.data() + i * kRowBytes,
                static_cast<int>((first + i) & 0xFF), kRowBytes);
  }
  return rows;
}

// A pool of random ids in [offset, offset + range): batches are consecutive
// windows of it, so successive batches touch different rows (a working set
// far larger than the CPU caches, as in serving) at no cost per iteration.
class IdPool {
 public:
  IdPool(int64_t range, int64_t offset, uint64_t seed) : ids_(kPoolIds) {
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int64_t> id(0, range - 1);
    for (int64_t& x : ids_) {
      x = offset + id(rng);
    }
  }

  absl::Span<const int64_t> Next(size_t n) {
    if (next_ + n > ids_.size()) {
      next_ = 0;
    }
    const absl::Span<const int64_t> batch(ids_.data() + next_, n);
    next_ += n;
    return batch;
  }

 private:
  static constexpr size_t kPoolIds = size_t{1} << 20;
  std::vector<int64_t> ids_;
  size_t next_ = 0;
};

RamRowCache& SharedRamCache() {
  static RamRowCache* cache = [] {
    if (std::getenv("MNEME_BENCH_ABSL_DEADLOCK_DETECTION") == nullptr) {
      // Debian's Abseil is built without NDEBUG, so every Mutex acquisition
      // also runs the deadlock detector (a global graph under a global
      // lock). Servers turn it off at startup; so does the benchmark.
      absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
    }
    RamRowCacheOptions options;
    options.row_bytes = kRowBytes;
    options.budget_bytes = uint64_t{600} << 20;
    absl::StatusOr<std::unique_ptr<RamRowCache>> c =
        RamRowCache::Create(options);
    CHECK(c.ok()) << c.status();
    CHECK_GT((*c)->capacity_rows(), uint64_t{kRamRows} * 11 / 10);
    constexpr size_t kChunk = 8192;
    std::vector<int64_t> ids(kChunk);
    for (int64_t first = 0; first < kRamRows; first += kChunk) {
      for (size_t i = 0; i < kChunk; ++i) {
        ids[i] = first + i;
      }
      {
        const absl::Status s =
            (*c)->InsertBatch(kTable, ids, RowBytesOf(first, kChunk));
        CHECK(s.ok()) << s;
      }
    }
    return c->release();
  }();
  return *cache;
}

void BM_RamCacheLookup(benchmark::State& state) {
  RamRowCache& cache = SharedRamCache();
  const size_t n = state.range(0);
  IdPool pool(kRamRows, 0, n);
  std::vector<uint8_t> dst(n * kRowBytes);
  std::vector<bool> hits;
  for (auto _ : state) {
    absl::StatusOr<size_t> found =
        cache.LookupBatch(kTable, pool.Next(n), absl::MakeSpan(dst), &hits);
    if (!found.ok() || *found != n) {
      state.SkipWithError("not all hits");
      break;
    }
    benchmark::DoNotOptimize(dst.data());
  }
  state.SetBytesProcessed(state.iterations() * n * kRowBytes);
  state.SetItemsProcessed(state.iterations() * n);
}

// The same rows copied from random places of a plain array as large as the
// cache's payload: what any random-access cache has to pay at least.
void BM_PlainArrayGather(benchmark::State& state) {
  static const std::vector<uint8_t>* table =
      new std::vector<uint8_t>(RowBytesOf(0, kRamRows));
  const size_t n = state.range(0);
  IdPool pool(kRamRows, 0, n);
  std::vector<uint8_t> dst(n * kRowBytes);
  for (auto _ : state) {
    const absl::Span<const int64_t> ids = pool.Next(n);
    for (size_t i = 0; i < n; ++i) {
      std::memcpy(dst.data() + i * kRowBytes,
                  table->data() + ids[i] * kRowBytes, kRowBytes);
    }
    benchmark::DoNotOptimize(dst.data());
  }
  state.SetBytesProcessed(state.iterations() * n * kRowBytes);
  state.SetItemsProcessed(state.iterations() * n);
}

// One memcpy of the output bytes (source and destination contiguous).
void BM_Memcpy(benchmark::State& state) {
  const size_t n = state.range(0);
  std::vector<uint8_t> src = RowBytesOf(0, n);
  std::vector<uint8_t> dst(n * kRowBytes);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), dst.size());
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * n * kRowBytes);
  state.SetItemsProcessed(state.iterations() * n);
}

// The RocksDB tier's directory; deleted with the cache at exit.
std::string* rocks_dir = nullptr;
RocksDbRowCache* rocks_cache = nullptr;

void DeleteRocksCache() {
  delete rocks_cache;
  std::error_code ec;
  std::filesystem::remove_all(*rocks_dir, ec);
}

RocksDbRowCache& SharedRocksCache() {
  static RocksDbRowCache* cache = [] {
    const char* tmp = std::getenv("TEST_TMPDIR");
    rocks_dir =
        new std::string(std::string(tmp != nullptr ? tmp : "/tmp") +
                        "/mneme_cache_bench_" + std::to_string(getpid()));
    const std::string& dir = *rocks_dir;
    std::filesystem::remove_all(dir);
    RocksDbRowCacheOptions options;
    options.path = dir;
    options.source_id = "cache_bench";
    options.row_bytes = kRowBytes;
    options.budget_bytes = uint64_t{2} << 30;
    {
      absl::StatusOr<std::unique_ptr<RocksDbRowCache>> c =
          RocksDbRowCache::Create(options);
      CHECK(c.ok()) << c.status();
      constexpr size_t kChunk = 8192;
      std::vector<int64_t> ids(kChunk);
      int64_t first = 0;
      while (first < kRocksRows) {
        for (size_t i = 0; i < kChunk; ++i) {
          ids[i] = first + i;
        }
        const uint64_t dropped = (*c)->GetStats().dropped_inserts;
        {
          const absl::Status s =
              (*c)->InsertBatch(kTable, ids, RowBytesOf(first, kChunk));
          CHECK(s.ok()) << s;
        }
        if ((*c)->GetStats().dropped_inserts != dropped) {
          usleep(2000);  // write stall: retry
          continue;
        }
        first += kChunk;
      }
    }  // Close flushes: lookups below read table files.
    absl::StatusOr<std::unique_ptr<RocksDbRowCache>> c =
        RocksDbRowCache::Create(options);
    CHECK(c.ok()) << c.status();
    LOG(INFO) << "RocksDB tier: " << (*c)->GetStats().bytes_in_use
              << " bytes of table files in " << dir;
    rocks_cache = c->release();
    std::atexit(DeleteRocksCache);
    return rocks_cache;
  }();
  return *cache;
}

void RocksLookup(benchmark::State& state, bool hit) {
  RocksDbRowCache& cache = SharedRocksCache();
  const size_t n = state.range(0);
  IdPool pool(kRocksRows, hit ? 0 : kRocksRows * 2, hit ? n : n + 1);
  std::vector<uint8_t> dst(n * kRowBytes);
  std::vector<bool> hits;
  for (auto _ : state) {
    absl::StatusOr<size_t> found =
        cache.LookupBatch(kTable, pool.Next(n), absl::MakeSpan(dst), &hits);
    if (!found.ok() || *found != (hit ? n : 0)) {
      state.SkipWithError("unexpected hit count");
      break;
    }
    benchmark::DoNotOptimize(dst.data());
  }
  state.SetBytesProcessed(state.iterations() * n * kRowBytes);
  state.SetItemsProcessed(state.iterations() * n);
}

void BM_RocksDbCacheLookupHits(benchmark::State& state) {
  RocksLookup(state, true);
}
void BM_RocksDbCacheLookupMisses(benchmark::State& state) {
  RocksLookup(state, false);
}

constexpr int64_t kDecode = 48;
constexpr int64_t kPrefill = 8192 * 24 / 8;

BENCHMARK(BM_RamCacheLookup)->Arg(kDecode)->Arg(kPrefill);
BENCHMARK(BM_PlainArrayGather)->Arg(kDecode)->Arg(kPrefill);
BENCHMARK(BM_Memcpy)->Arg(kDecode)->Arg(kPrefill);
BENCHMARK(BM_RocksDbCacheLookupHits)->Arg(kDecode);
BENCHMARK(BM_RocksDbCacheLookupMisses)->Arg(kDecode);

}  // namespace
}  // namespace mneme::engram
