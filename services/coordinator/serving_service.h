#ifndef MNEME_SERVICES_COORDINATOR_SERVING_SERVICE_H_
#define MNEME_SERVICES_COORDINATOR_SERVING_SERVICE_H_

#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "common/inflight_gate.h"
#include "proto/serving/v1/serving.grpc.pb.h"
#include "services/coordinator/engine.h"
#include "services/coordinator/text_codec.h"

namespace mneme::coordinator {

// The public gRPC API (proto/serving/v1) over an Engine: Generate streams a
// request's tokens as the engine produces them (a client that goes away
// aborts its request), Abort, GetModelInfo, GetLoads. Reactors never block:
// the engine's thread pushes each request's messages into its stream's
// queue (coalesced while a write is in flight, so it stays a few messages
// long). Thread-safe; `engine` and `gate` are borrowed.
class ServingService final : public serving::v1::Serving::CallbackService {
 public:
  // `codec` (may be null: text and chat prompts are then
  // FAILED_PRECONDITION) tokenizes text prompts, renders chat prompts with
  // its chat template, and decodes the streamed text (split into
  // reasoning, content and tool calls for a chat).
  // `api_key`, when not empty, must come with every call as the metadata
  // "authorization: Bearer <api_key>" (UNAUTHENTICATED otherwise), the
  // HTTP API's key.
  static absl::StatusOr<std::unique_ptr<ServingService>> Create(
      Engine* engine, InflightGate* gate, TextCodec* codec = nullptr,
      std::string api_key = "");

  grpc::ServerWriteReactor<serving::v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context,
      const serving::v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* Abort(
      grpc::CallbackServerContext* context,
      const serving::v1::AbortRequest* request,
      serving::v1::AbortResponse* response) override;
  grpc::ServerUnaryReactor* GetModelInfo(
      grpc::CallbackServerContext* context,
      const serving::v1::GetModelInfoRequest* request,
      serving::v1::GetModelInfoResponse* response) override;
  grpc::ServerUnaryReactor* GetLoads(
      grpc::CallbackServerContext* context,
      const serving::v1::GetLoadsRequest* request,
      serving::v1::GetLoadsResponse* response) override;

 private:
  ServingService(Engine* engine, InflightGate* gate, TextCodec* codec,
                 std::string api_key)
      : engine_(engine),
        gate_(gate),
        codec_(codec),
        api_key_(std::move(api_key)) {}

  Engine* const engine_;
  InflightGate* const gate_;
  TextCodec* const codec_;
  const std::string api_key_;
};

// The request's GenerateParams, with the proto3 defaults resolved
// (max_new_tokens 0 -> 16).
GenerateParams ParamsFromProto(const serving::v1::GenerateRequest& request);

}  // namespace mneme::coordinator

#endif  // MNEME_SERVICES_COORDINATOR_SERVING_SERVICE_H_
