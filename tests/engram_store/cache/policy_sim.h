#ifndef MNEME_TESTS_ENGRAM_STORE_CACHE_POLICY_SIM_H_
#define MNEME_TESTS_ENGRAM_STORE_CACHE_POLICY_SIM_H_

#include <cstdint>
#include <list>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "engram_store/cache/row_key.h"
#include "engram_store/cache/s3_fifo_policy.h"
#include "glog/logging.h"

namespace mneme::engram::testing {

// Entry-count caches over abstract keys, for comparing eviction policies on
// traces. Access() returns whether the key was resident and admits it if
// not.

class S3FifoSim {
 public:
  explicit S3FifoSim(const S3FifoOptions& options)
      : policy_(*S3FifoPolicy::Create(options)), slot_key_(options.capacity) {}

  bool Access(uint64_t key) {
    auto it = slot_of_.find(key);
    if (it != slot_of_.end()) {
      policy_->Touch(it->second);
      return true;
    }
    const S3FifoPolicy::Admission a =
        policy_->Admit(static_cast<uint32_t>(MixRowKey(key)));
    if (a.evicted) {
      CHECK_EQ(slot_of_.erase(slot_key_[a.slot]), 1u);
    }
    slot_key_[a.slot] = key;
    slot_of_[key] = a.slot;
    return false;
  }

  const S3FifoPolicy& policy() const { return *policy_; }

 private:
  std::unique_ptr<S3FifoPolicy> policy_;
  std::vector<uint64_t> slot_key_;
  absl::flat_hash_map<uint64_t, uint32_t> slot_of_;
};

// Plain LRU (the baseline).
class LruSim {
 public:
  explicit LruSim(size_t capacity) : capacity_(capacity) {}

  bool Access(uint64_t key) {
    auto it = where_.find(key);
    if (it != where_.end()) {
      order_.splice(order_.begin(), order_, it->second);
      return true;
    }
    if (order_.size() == capacity_) {
      where_.erase(order_.back());
      order_.pop_back();
    }
    order_.push_front(key);
    where_[key] = order_.begin();
    return false;
  }

 private:
  size_t capacity_;
  std::list<uint64_t> order_;
  absl::flat_hash_map<uint64_t, std::list<uint64_t>::iterator> where_;
};

}  // namespace mneme::engram::testing

#endif  // MNEME_TESTS_ENGRAM_STORE_CACHE_POLICY_SIM_H_
