#include "tests/engram_store/io/io_test_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace mneme::engram::testing {

std::string TempPath(absl::string_view name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name);
}

absl::Status WriteRandomFile(const std::string& path, uint64_t size,
                             uint64_t seed) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return absl::ErrnoToStatus(errno, path);
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> chunk(1 << 16);
  uint64_t written = 0;
  while (written < size) {
    for (uint64_t& v : chunk) v = rng();
    const uint64_t n = std::min<uint64_t>(size - written, chunk.size() * 8);
    if (::pwrite(fd, chunk.data(), n, static_cast<off_t>(written)) !=
        static_cast<ssize_t>(n)) {
      const int err = errno;
      ::close(fd);
      return absl::ErrnoToStatus(err, path);
    }
    written += n;
  }
  ::fsync(fd);
  ::close(fd);
  return absl::OkStatus();
}

std::vector<uint8_t> PreadBytes(const std::string& path, uint64_t offset,
                                uint64_t length) {
  std::vector<uint8_t> bytes(length);
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return {};
  uint64_t done = 0;
  while (done < length) {
    const ssize_t n = ::pread(fd, bytes.data() + done, length - done,
                              static_cast<off_t>(offset + done));
    if (n <= 0) break;
    done += static_cast<uint64_t>(n);
  }
  ::close(fd);
  bytes.resize(done);
  return bytes;
}

namespace {

// Counts /proc/self/task entries whose comm does (io_uring_workers) or does
// not start with "iou-" (io_uring's io-wq and sqpoll threads).
int CountTasks(bool io_uring_workers, bool all) {
  DIR* dir = ::opendir("/proc/self/task");
  if (dir == nullptr) return -1;
  int count = 0;
  while (dirent* entry = ::readdir(dir)) {
    if (entry->d_name[0] == '.') continue;
    if (all) {
      ++count;
      continue;
    }
    std::ifstream comm(
        absl::StrCat("/proc/self/task/", entry->d_name, "/comm"));
    std::string name;
    std::getline(comm, name);
    if (absl::StartsWith(name, "iou-") == io_uring_workers) ++count;
  }
  ::closedir(dir);
  return count;
}

}  // namespace

int CountThreads(bool with_io_uring_workers) {
  return CountTasks(/*io_uring_workers=*/false, with_io_uring_workers);
}

int CountIoUringWorkers() {
  return CountTasks(/*io_uring_workers=*/true, /*all=*/false);
}

int WaitForThreadCount(int expected) {
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  int count = CountThreads();
  while (count != expected && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(1));
    count = CountThreads();
  }
  return count;
}

int64_t ResidentPages(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return -1;
  struct stat st;
  if (::fstat(fd, &st) != 0 || st.st_size == 0) {
    ::close(fd);
    return -1;
  }
  const size_t size = static_cast<size_t>(st.st_size);
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) return -1;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> vec((size + page - 1) / page);
  int64_t resident = -1;
  if (::mincore(map, size, vec.data()) == 0) {
    resident = 0;
    for (unsigned char v : vec) resident += v & 1;
  }
  ::munmap(map, size);
  return resident;
}

void DropPageCache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

void SpanBatch::Add(const RowFile* file, uint64_t offset, uint64_t length) {
  entries_.push_back({file, offset, length, end_});
  end_ += length + kGuardBytes;
}

void SpanBatch::AddWithDest(const RowFile* file, uint64_t offset,
                            uint64_t length, uint64_t dest_offset) {
  entries_.push_back({file, offset, length, dest_offset});
  end_ = std::max(end_, dest_offset + length + kGuardBytes);
}

void SpanBatch::Finish() {
  memory_.assign(end_, kGuard);
  for (const Entry& e : entries_) {
    std::fill_n(memory_.begin() + e.dest_offset, e.length, kFill);
  }
  fresh_ = memory_;
  spans_.clear();
  for (const Entry& e : entries_) {
    spans_.push_back(
        {e.file, e.offset, e.length, memory_.data() + e.dest_offset});
  }
}

void SpanBatch::Reset() { memory_ = fresh_; }

std::string SpanBatch::Verify() const {
  std::vector<uint8_t> expected = fresh_;
  for (const Entry& e : entries_) {
    const std::vector<uint8_t> bytes =
        PreadBytes(e.file->path(), e.offset, e.length);
    if (bytes.size() != e.length) {
      return absl::StrCat("test bug: cannot pread ", e.length, " bytes at ",
                          e.offset);
    }
    std::copy(bytes.begin(), bytes.end(), expected.begin() + e.dest_offset);
  }
  for (size_t i = 0; i < memory_.size(); ++i) {
    if (memory_[i] != expected[i]) {
      for (size_t k = 0; k < entries_.size(); ++k) {
        const Entry& e = entries_[k];
        if (i >= e.dest_offset && i < e.dest_offset + e.length) {
          return absl::StrCat("span ", k, " (offset ", e.offset, ", length ",
                              e.length, ") differs at byte ",
                              i - e.dest_offset);
        }
      }
      return absl::StrCat("guard byte ", i, " overwritten");
    }
  }
  return "";
}

bool SpanBatch::Untouched() const { return memory_ == fresh_; }

}  // namespace mneme::engram::testing
