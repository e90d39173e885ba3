#include "tests/engram_store/io/fault_injecting_row_reader.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace mneme::engram::testing {

namespace {

bool Overlaps(const ReadSpan& span, const FaultRule& rule) {
  if (span.length == 0 || span.file == nullptr) return false;
  if (!rule.path.empty() && span.file->path() != rule.path) return false;
  return span.offset < rule.end && rule.begin < span.offset + span.length;
}

}  // namespace

FaultInjectingRowReader::FaultInjectingRowReader(
    std::unique_ptr<RowReader> inner)
    : inner_(std::move(inner)) {}

void FaultInjectingRowReader::AddFault(const FaultRule& rule) {
  absl::MutexLock lock(&mu_);
  rules_.push_back(rule);
  if (rule.fault == ReadFault::kStall) released_ = false;
}

void FaultInjectingRowReader::ClearFaults() {
  absl::MutexLock lock(&mu_);
  rules_.clear();
}

void FaultInjectingRowReader::ReleaseStalls() {
  absl::MutexLock lock(&mu_);
  released_ = true;
}

void FaultInjectingRowReader::WaitForStalled(int n) {
  absl::MutexLock lock(&mu_);
  std::pair<FaultInjectingRowReader*, int> arg(this, n);
  mu_.Await(absl::Condition(
      +[](std::pair<FaultInjectingRowReader*, int>* a)
           ABSL_EXCLUSIVE_LOCKS_REQUIRED(a->first->mu_) {
             return a->first->stalled_ >= a->second;
           },
      &arg));
}

int FaultInjectingRowReader::faults_injected() const {
  absl::MutexLock lock(&mu_);
  return injected_;
}

bool FaultInjectingRowReader::Match(absl::Span<const ReadSpan> spans,
                                    FaultRule* matched, const ReadSpan** span) {
  for (FaultRule& rule : rules_) {
    if (rule.times == 0) continue;
    for (const ReadSpan& s : spans) {
      if (!Overlaps(s, rule)) continue;
      if (rule.times > 0) --rule.times;
      *matched = rule;
      *span = &s;
      ++injected_;
      return true;
    }
  }
  return false;
}

absl::Status FaultInjectingRowReader::Read(absl::Span<const ReadSpan> spans,
                                           absl::Time deadline) {
  FaultRule rule;
  const ReadSpan* hit = nullptr;
  bool matched;
  {
    absl::MutexLock lock(&mu_);
    matched = Match(spans, &rule, &hit);
    if (matched && rule.fault == ReadFault::kStall) {
      ++stalled_;
      const bool released = mu_.AwaitWithDeadline(
          absl::Condition(
              +[](FaultInjectingRowReader* self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(
                   self->mu_) { return self->released_; },
              this),
          deadline);
      --stalled_;
      if (!released) {
        return absl::DeadlineExceededError(
            absl::StrCat("row read: stalled reading '", hit->file->path(),
                         "' at offset ", hit->offset, " (injected)"));
      }
    }
  }
  if (!matched) return inner_->Read(spans, deadline);
  switch (rule.fault) {
    case ReadFault::kEio:
      return absl::DataLossError(absl::StrCat(
          "reading '", hit->file->path(), "' at offset ", hit->offset, " (",
          hit->length, " bytes): Input/output error (injected)"));
    case ReadFault::kShortRead:
      // Whatever the inner read says, the caller gets damaged rows.
      (void)inner_->Read(spans, deadline);
      for (const ReadSpan& s : spans) {
        if (Overlaps(s, rule)) {
          std::memset(s.dest + s.length / 2, 0xEE, s.length - s.length / 2);
        }
      }
      return absl::DataLossError(absl::StrCat(
          "unexpected end of '", hit->file->path(), "' at offset ",
          hit->offset + hit->length / 2, " (injected short read)"));
    case ReadFault::kStall:
      return inner_->Read(spans, deadline);
  }
  return absl::InternalError("unknown fault");
}

}  // namespace mneme::engram::testing
