#ifndef MNEME_TESTS_SERVICES_COMMON_ECHO_SERVICE_H_
#define MNEME_TESTS_SERVICES_COMMON_ECHO_SERVICE_H_

#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/inflight_gate.h"
#include "tests/services/common/echo.grpc.pb.h"

namespace mneme::testing {

// Echo over the callback API, admitting calls through an InflightGate the way
// every Mneme service does. Delayed answers are finished from a separate
// thread (reactors never block). Thread-safe.
class EchoService final : public mneme::testing::v1::Echo::CallbackService {
 public:
  explicit EchoService(InflightGate* gate) : gate_(gate) {}
  ~EchoService() override;

  grpc::ServerUnaryReactor* Echo(
      grpc::CallbackServerContext* context,
      const mneme::testing::v1::EchoRequest* request,
      mneme::testing::v1::EchoResponse* response) override;

 private:
  InflightGate* const gate_;
  absl::Mutex mu_;
  std::vector<std::thread> workers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mneme::testing

#endif  // MNEME_TESTS_SERVICES_COMMON_ECHO_SERVICE_H_
