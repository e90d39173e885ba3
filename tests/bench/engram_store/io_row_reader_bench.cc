// Random 264-byte row reads (FP8 Engram rows) through the RowReaders: the
// pread pool and io_uring, page cache (buffered) vs O_DIRECT, for a decode
// step's worth of rows (48 per sequence, 1152 for 8 sequences x 6 tokens x
// 24 columns) and a prefill chunk's (8192 tokens x 24 columns).
//
// The table is a scratch file of random rows made before the first benchmark
// (MNEME_IO_BENCH_MB, default 512 MiB, under MNEME_IO_BENCH_DIR or /tmp),
// unlinked as soon as it is open. It was just written, so buffered reads are
// page-cache hits; O_DIRECT reads always go to the device. Row ids are uniform
// at random (never one repeated id), fresh for every iteration from a
// pregenerated set.
//
//   bazel run //tests/bench/engram_store:io_row_reader_bench --
//   --benchmark_min_time=0.5   (the build is -O2 by .bazelrc)

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "benchmark/benchmark.h"
#include "engram_store/io/pread_pool_reader.h"
#include "engram_store/io/row_file.h"
#include "engram_store/io/row_reader.h"
#include "engram_store/io/uring_row_reader.h"

namespace mneme::engram {
namespace {

constexpr uint64_t kRowBytes = 264;

// The scratch table file, made once, opened in every mode and unlinked at
// once: the open descriptors keep it alive, and nothing is left behind however
// the process ends.
class BenchFile {
 public:
  static const BenchFile& Get() {
    static const BenchFile* file = new BenchFile();
    return *file;
  }

  // Null (with `error` set) if the file could not be opened in `mode`, e.g.
  // O_DIRECT on a file system without it.
  const RowFile* file(OpenMode mode) const {
    return files_[static_cast<int>(mode)].get();
  }
  const std::string& error(OpenMode mode) const {
    return errors_[static_cast<int>(mode)];
  }
  uint64_t rows() const { return rows_; }

 private:
  BenchFile() {
    const char* dir = std::getenv("MNEME_IO_BENCH_DIR");
    const char* mb = std::getenv("MNEME_IO_BENCH_MB");
    const uint64_t size = (mb != nullptr ? std::strtoull(mb, nullptr, 10) : 512)
                          << 20;
    const std::string path = absl::StrCat(
        dir != nullptr ? dir : "/tmp", "/mneme_io_bench_", ::getpid(), ".bin");
    FILE* out = std::fopen(path.c_str(), "wb");
    if (out == nullptr) {
      std::perror(path.c_str());
      std::abort();
    }
    std::mt19937_64 rng(1);
    std::vector<uint64_t> chunk(1 << 17);
    for (uint64_t written = 0; written < size;
         written += chunk.size() * sizeof(uint64_t)) {
      for (uint64_t& v : chunk) v = rng();
      std::fwrite(chunk.data(), sizeof(uint64_t), chunk.size(), out);
    }
    // Written back, so that its cached pages are clean and can be dropped
    // (kNfs) and O_DIRECT reads need not flush them first.
    std::fflush(out);
    ::fsync(::fileno(out));
    std::fclose(out);
    rows_ = size / kRowBytes;
    for (OpenMode mode :
         {OpenMode::kBuffered, OpenMode::kDirect, OpenMode::kNfs}) {
      absl::StatusOr<std::unique_ptr<RowFile>> file = RowFile::Open(path, mode);
      if (file.ok()) {
        files_[static_cast<int>(mode)] = *std::move(file);
      } else {
        errors_[static_cast<int>(mode)] = file.status().ToString();
      }
    }
    ::unlink(path.c_str());
  }

  std::unique_ptr<RowFile> files_[3];
  std::string errors_[3];
  uint64_t rows_ = 0;
};

enum class Engine { kPool, kPoolInline, kUring };

std::unique_ptr<RowReader> MakeReader(Engine engine, uint64_t max_gap_bytes,
                                      benchmark::State& state) {
  CoalesceOptions coalesce;
  coalesce.max_gap_bytes = max_gap_bytes;
  if (engine == Engine::kUring) {
    UringRowReaderOptions options;  // 4 rings, queue depth 128.
    options.coalesce = coalesce;
    absl::StatusOr<std::unique_ptr<UringRowReader>> reader =
        UringRowReader::Create(options);
    if (!reader.ok()) {
      state.SkipWithError(reader.status().ToString().c_str());
      return nullptr;
    }
    return *std::move(reader);
  }
  PreadPoolReaderOptions options;  // 16 threads, 16 reads per task.
  options.coalesce = coalesce;
  options.inline_max_spans = engine == Engine::kPoolInline ? 1 << 30 : 0;
  return *PreadPoolReader::Create(options);
}

void BM_RandomRows(benchmark::State& state, Engine engine, OpenMode mode) {
  const BenchFile& table = BenchFile::Get();
  const RowFile* file = table.file(mode);
  if (file == nullptr) {
    state.SkipWithError(table.error(mode).c_str());
    return;
  }
  if (mode == OpenMode::kNfs) {
    // As RowFile::Open does: the buffered runs before have cached the file.
    ::posix_fadvise(file->fd(), 0, 0, POSIX_FADV_DONTNEED);
  }
  std::unique_ptr<RowReader> reader =
      MakeReader(engine, static_cast<uint64_t>(state.range(1)), state);
  if (reader == nullptr) return;

  const size_t rows = static_cast<size_t>(state.range(0));
  constexpr int kBatches = 8;
  std::vector<uint8_t> out(rows * kRowBytes);
  std::vector<std::vector<ReadSpan>> batches(kBatches);
  std::mt19937_64 rng(7);
  for (std::vector<ReadSpan>& spans : batches) {
    spans.resize(rows);
    for (size_t i = 0; i < rows; ++i) {
      spans[i] = {file, (rng() % table.rows()) * kRowBytes, kRowBytes,
                  out.data() + i * kRowBytes};
    }
  }
  size_t next = 0;
  for (auto _ : state) {
    const absl::Status status =
        reader->Read(batches[next], absl::InfiniteFuture());
    if (!status.ok()) {
      state.SkipWithError(status.ToString().c_str());
      break;
    }
    next = (next + 1) % kBatches;
    benchmark::DoNotOptimize(out.data());
  }
  const RowReaderStats stats = reader->GetStats();
  state.counters["rows/s"] =
      benchmark::Counter(static_cast<double>(state.iterations() * rows),
                         benchmark::Counter::kIsRate);
  state.counters["reads/row"] =
      stats.spans > 0 ? static_cast<double>(stats.reads) / stats.spans : 0;
  state.counters["released/row"] =
      stats.spans > 0 ? static_cast<double>(stats.bytes_released) / stats.spans
                      : 0;
  state.SetBytesProcessed(
      static_cast<int64_t>(state.iterations() * rows * kRowBytes));
}

// Args: rows per Read(), CoalesceOptions::max_gap_bytes.
// 48 rows: one token's lookups of both layers (a decode step per sequence).
// 1152 rows: a decode batch of 8 sequences x 6 tokens x 24 columns.
// 196608 rows: an 8192-token prefill chunk x 24 columns, where neighbouring
// rows are ~2.7 KB apart in a 512 MiB table, so the gap setting matters.
#define MNEME_ROW_BENCH(name, engine, mode)            \
  BENCHMARK_CAPTURE(BM_RandomRows, name, engine, mode) \
      ->ArgNames({"rows", "gap"})                      \
      ->Args({48, 4096})                               \
      ->Args({1152, 4096})                             \
      ->Args({int64_t{8192} * 24, 0})                  \
      ->Args({int64_t{8192} * 24, 1024})               \
      ->Args({int64_t{8192} * 24, 4096})               \
      ->UseRealTime()                                  \
      ->Unit(benchmark::kMicrosecond)

MNEME_ROW_BENCH(pool_buffered, Engine::kPool, OpenMode::kBuffered);
MNEME_ROW_BENCH(pool_inline_buffered, Engine::kPoolInline, OpenMode::kBuffered);
MNEME_ROW_BENCH(uring_buffered, Engine::kUring, OpenMode::kBuffered);
MNEME_ROW_BENCH(pool_direct, Engine::kPool, OpenMode::kDirect);
MNEME_ROW_BENCH(uring_direct, Engine::kUring, OpenMode::kDirect);
MNEME_ROW_BENCH(pool_nfs_mode, Engine::kPool, OpenMode::kNfs);
MNEME_ROW_BENCH(uring_nfs_mode, Engine::kUring, OpenMode::kNfs);

}  // namespace
}  // namespace mneme::engram
