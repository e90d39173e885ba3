#include "gpu/comm/in_memory_rendezvous_store.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"

namespace mneme::gpu {
namespace {

void RunAll(std::vector<std::pair<InMemoryRendezvousStore::GetCallback,
                                  absl::StatusOr<std::vector<std::string>>>>&
                completions) {
  for (auto& [done, result] : completions) done(std::move(result));
}

absl::Status Missing(const std::string& key, size_t missing) {
  return absl::DeadlineExceededError(absl::StrCat("rendezvous key \"", key,
                                                  "\" was not set in time (",
                                                  missing, " key(s) missing)"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<InMemoryRendezvousStore>>
InMemoryRendezvousStore::Create(const InMemoryRendezvousStoreOptions& options) {
  if (options.max_key_bytes < 1) {
    return absl::InvalidArgumentError("max_key_bytes must be >= 1");
  }
  if (options.max_value_bytes < 1) {
    return absl::InvalidArgumentError("max_value_bytes must be >= 1");
  }
  if (options.max_total_bytes < 1) {
    return absl::InvalidArgumentError("max_total_bytes must be >= 1");
  }
  if (options.max_keys_per_get < 1) {
    return absl::InvalidArgumentError("max_keys_per_get must be >= 1");
  }
  if (options.max_waiting_gets < 1) {
    return absl::InvalidArgumentError("max_waiting_gets must be >= 1");
  }
  std::unique_ptr<InMemoryRendezvousStore> store(
      new InMemoryRendezvousStore(options));
  store->timer_ = std::thread([s = store.get()] { s->TimerLoop(); });
  return store;
}

InMemoryRendezvousStore::~InMemoryRendezvousStore() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    timer_wake_ = true;
  }
  timer_.join();
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    while (!waiters_.empty()) {
      Waiter w = RemoveWaiter(waiters_.begin()->first);
      completions.emplace_back(
          std::move(w.done),
          absl::UnavailableError("the rendezvous store is shutting down"));
    }
  }
  RunAll(completions);
}

absl::Status InMemoryRendezvousStore::ValidateKey(absl::string_view key) const {
  if (key.empty()) return absl::InvalidArgumentError("empty rendezvous key");
  if (static_cast<int64_t>(key.size()) > options_.max_key_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("rendezvous key of ", key.size(), " bytes is over the ",
                     options_.max_key_bytes, "-byte limit"));
  }
  return absl::OkStatus();
}

std::vector<std::string> InMemoryRendezvousStore::ValuesOf(
    const std::vector<std::string>& keys) const {
  std::vector<std::string> values;
  values.reserve(keys.size());
  for (const std::string& key : keys) values.push_back(values_.at(key));
  return values;
}

InMemoryRendezvousStore::Waiter InMemoryRendezvousStore::RemoveWaiter(
    int64_t id) {
  auto it = waiters_.find(id);
  Waiter w = std::move(it->second);
  waiters_.erase(it);
  deadlines_.erase({w.deadline, id});
  for (const std::string& key : w.keys) {
    auto on = waiting_on_.find(key);
    if (on == waiting_on_.end()) continue;
    std::vector<int64_t>& ids = on->second;
    ids.erase(std::remove(ids.begin(), ids.end(), id), ids.end());
    if (ids.empty()) waiting_on_.erase(on);
  }
  return w;
}

absl::Status InMemoryRendezvousStore::Set(absl::string_view key,
                                          absl::string_view value) {
  RETURN_IF_ERROR(ValidateKey(key));
  if (static_cast<int64_t>(value.size()) > options_.max_value_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rendezvous value of ", value.size(), " bytes is over the ",
        options_.max_value_bytes, "-byte limit"));
  }
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    auto it = values_.find(key);
    const int64_t old_bytes =
        it == values_.end()
            ? 0
            : static_cast<int64_t>(key.size() + it->second.size());
    const int64_t new_total = total_bytes_ - old_bytes +
                              static_cast<int64_t>(key.size() + value.size());
    if (new_total > options_.max_total_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the rendezvous store's budget of ", options_.max_total_bytes,
          " bytes is exhausted (", total_bytes_, " bytes held)"));
    }
    total_bytes_ = new_total;
    if (it != values_.end()) {
      it->second.assign(value.data(), value.size());
      return absl::OkStatus();  // Nobody waits for a key that exists.
    }
    values_.emplace(key, std::string(value));
    auto on = waiting_on_.find(key);
    if (on == waiting_on_.end()) return absl::OkStatus();
    const std::vector<int64_t> ids = std::move(on->second);
    waiting_on_.erase(on);
    for (int64_t id : ids) {
      Waiter& w = waiters_.at(id);
      if (--w.missing > 0) continue;
      std::vector<std::string> values = ValuesOf(w.keys);
      Waiter done = RemoveWaiter(id);
      completions.emplace_back(std::move(done.done), std::move(values));
    }
  }
  RunAll(completions);
  return absl::OkStatus();
}

int64_t InMemoryRendezvousStore::StartGet(std::vector<std::string> keys,
                                          absl::Time deadline,
                                          GetCallback done) {
  std::optional<absl::StatusOr<std::vector<std::string>>> now;
  int64_t id = 0;
  if (keys.empty()) {
    now = absl::InvalidArgumentError("a rendezvous get needs at least one key");
  } else if (static_cast<int64_t>(keys.size()) > options_.max_keys_per_get) {
    now = absl::InvalidArgumentError(
        absl::StrCat("a rendezvous get of ", keys.size(),
                     " keys is over the limit of ", options_.max_keys_per_get));
  } else {
    for (const std::string& key : keys) {
      if (absl::Status s = ValidateKey(key); !s.ok()) {
        now = s;
        break;
      }
    }
  }
  if (!now.has_value()) {
    absl::MutexLock lock(&mu_);
    id = next_id_++;
    absl::flat_hash_set<absl::string_view> missing;
    for (const std::string& key : keys) {
      if (!values_.contains(key)) missing.insert(key);
    }
    if (missing.empty()) {
      now = ValuesOf(keys);
    } else if (deadline <= absl::Now()) {
      const std::string& first = *std::find_if(
          keys.begin(), keys.end(),
          [&](const std::string& k) { return missing.contains(k); });
      now = Missing(first, missing.size());
    } else if (static_cast<int64_t>(waiters_.size()) >=
               options_.max_waiting_gets) {
      now = absl::ResourceExhaustedError(absl::StrCat(
          "too many rendezvous gets are waiting (", waiters_.size(), ")"));
    } else if (stopping_) {
      now = absl::UnavailableError("the rendezvous store is shutting down");
    } else {
      for (absl::string_view key : missing) {
        waiting_on_[key].push_back(id);
      }
      Waiter w;
      w.missing = static_cast<int64_t>(missing.size());
      w.keys = std::move(keys);
      w.deadline = deadline;
      w.done = std::move(done);
      deadlines_.insert({deadline, id});
      waiters_.emplace(id, std::move(w));
      timer_wake_ = true;
      // The waiter owns `done` now: it runs when the get completes, times out
      // or is cancelled.
      return id;
    }
  }
  if (now.has_value()) done(*std::move(now));
  return id;
}

void InMemoryRendezvousStore::CancelGet(int64_t id,
                                        const absl::Status& status) {
  GetCallback done;
  {
    absl::MutexLock lock(&mu_);
    if (!waiters_.contains(id)) return;
    done = RemoveWaiter(id).done;
  }
  done(status.ok() ? absl::CancelledError("rendezvous get cancelled") : status);
}

absl::StatusOr<std::vector<std::string>> InMemoryRendezvousStore::Get(
    const std::vector<std::string>& keys, absl::Duration timeout) {
  absl::Notification finished;
  absl::StatusOr<std::vector<std::string>> result;
  StartGet(keys, absl::Now() + timeout,
           [&](absl::StatusOr<std::vector<std::string>> r) {
             result = std::move(r);
             finished.Notify();
           });
  finished.WaitForNotification();
  return result;
}

void InMemoryRendezvousStore::TimerLoop() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    const absl::Time next =
        deadlines_.empty() ? absl::InfiniteFuture() : deadlines_.begin()->first;
    mu_.AwaitWithDeadline(absl::Condition(&timer_wake_), next);
    timer_wake_ = false;
    if (stopping_) break;
    std::vector<Completion> completions;
    const absl::Time now = absl::Now();
    while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
      const int64_t id = deadlines_.begin()->second;
      Waiter w = RemoveWaiter(id);
      std::string first;
      absl::flat_hash_set<absl::string_view> missing;
      for (const std::string& key : w.keys) {
        if (values_.contains(key)) continue;
        if (first.empty()) first = key;
        missing.insert(key);
      }
      completions.emplace_back(std::move(w.done),
                               Missing(first, missing.size()));
    }
    if (completions.empty()) continue;
    mu_.Unlock();
    RunAll(completions);
    mu_.Lock();
  }
}

int64_t InMemoryRendezvousStore::EraseIf(
    absl::FunctionRef<bool(absl::string_view key)> erase) {
  absl::MutexLock lock(&mu_);
  int64_t erased = 0;
  for (auto it = values_.begin(); it != values_.end();) {
    if (erase(it->first)) {
      total_bytes_ -=
          static_cast<int64_t>(it->first.size() + it->second.size());
      values_.erase(it++);
      ++erased;
    } else {
      ++it;
    }
  }
  return erased;
}

int64_t InMemoryRendezvousStore::total_bytes() const {
  absl::MutexLock lock(&mu_);
  return total_bytes_;
}

int64_t InMemoryRendezvousStore::waiting_gets() const {
  absl::MutexLock lock(&mu_);
  return waiters_.size();
}

}  // namespace mneme::gpu
