#include "common/inflight_gate.h"

#include <utility>

#include "common/cluster_secret.h"
#include "glog/logging.h"

namespace mneme {

InflightGate::Pass& InflightGate::Pass::operator=(Pass&& other) noexcept {
  if (this != &other) {
    Release();
    gate_ = other.gate_;
    other.gate_ = nullptr;
  }
  return *this;
}

void InflightGate::Pass::Release() {
  if (gate_ == nullptr) return;
  absl::MutexLock lock(&gate_->mu_);
  --gate_->inflight_;
  gate_ = nullptr;
}

InflightGate::~InflightGate() {
  absl::MutexLock lock(&mu_);
  CHECK_EQ(inflight_, 0) << "InflightGate destroyed with work in flight";
}

void InflightGate::SetClusterSecrets(std::vector<std::string> secrets) {
  absl::MutexLock lock(&mu_);
  secrets_ = std::move(secrets);
}

absl::Status InflightGate::Authenticate(
    const grpc::ServerContextBase& context) const {
  std::vector<std::string> secrets;
  {
    absl::MutexLock lock(&mu_);
    if (secrets_.empty()) return absl::OkStatus();
    secrets = secrets_;
  }
  return CheckClusterSecret(context, secrets);
}

std::optional<InflightGate::Pass> InflightGate::Enter() {
  absl::MutexLock lock(&mu_);
  if (draining_) return std::nullopt;
  ++inflight_;
  return Pass(this);
}

void InflightGate::BeginDrain() {
  absl::MutexLock lock(&mu_);
  draining_ = true;
}

bool InflightGate::draining() const {
  absl::MutexLock lock(&mu_);
  return draining_;
}

bool InflightGate::WaitIdle(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto idle = [this]()
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return inflight_ == 0; };
  mu_.AwaitWithDeadline(absl::Condition(&idle), deadline);
  return inflight_ == 0;
}

int64_t InflightGate::inflight() const {
  absl::MutexLock lock(&mu_);
  return inflight_;
}

}  // namespace mneme
