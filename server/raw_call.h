// Typed handlers for tierd.v1 methods registered raw (v1::Tierd::WithRawCallbackMethod_X: gRPC
// hands over and takes grpc::ByteBuffer). gRPC's generated callback handlers answer a request
// that does not parse UNIMPLEMENTED with an empty message, and end a stream on one with OK; raw
// methods let the daemon parse requests itself and answer INVALID_ARGUMENT naming what could not
// be parsed (server/parse_failure.h). This is the one place requests are parsed and responses
// serialized for gRPC: UnaryCall for unary methods, ParseRequest and Serialize for the streams.
#ifndef TIERD_SERVER_RAW_CALL_H_
#define TIERD_SERVER_RAW_CALL_H_

#include <grpcpp/grpcpp.h>

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "google/protobuf/message.h"
#include "server/proto_convert.h"
#include "server/response_counters.h"

namespace tierd {

// Parses `raw` into `request`. INVALID_ARGUMENT naming the message and what could not be parsed
// ("the request is not a valid tierd.v1.PrefetchRequest: field keys is not valid UTF-8").
absl::Status ParseRequest(const grpc::ByteBuffer& raw, google::protobuf::Message& request);

// The value of string field `field` (its last occurrence, as parsing would keep) of the message
// serialized in `raw`, read without parsing the rest: the other fields are skipped, not built —
// a request's large parts cost nothing until it is parsed. "" when the field is absent;
// INVALID_ARGUMENT when the bytes are not a message.
absl::StatusOr<std::string> PeekStringField(const grpc::ByteBuffer& raw, int field);

// Replaces what `raw` holds with `message` as gRPC sends it; INTERNAL when it cannot be serialized
// (over 2 GiB).
absl::Status Serialize(const google::protobuf::Message& message, grpc::ByteBuffer& raw);

// One call of a raw unary method, served by a typed handler: Serve parses the request and hands
// the call to the handler, which fills response() and calls Answer once, on any thread, now or
// later. Owns the request and the response; deletes itself when gRPC is done with the call.
template <typename Request, typename Response>
class UnaryCall final : public grpc::ServerUnaryReactor {
 public:
  // Serves one call: `raw_request` is parsed and the call handed to `handle` (callable with
  // UnaryCall&); a request that does not parse is answered INVALID_ARGUMENT without it. Answers are
  // counted in `counters` (may be null). Returns the reactor for gRPC.
  template <typename Handle>
  static grpc::ServerUnaryReactor* Serve(const grpc::ByteBuffer& raw_request,
                                         grpc::ByteBuffer* raw_response, ResponseCounters* counters,
                                         Handle&& handle) {
    auto* call = new UnaryCall(raw_response, counters);
    if (absl::Status parsed = ParseRequest(raw_request, call->request_); !parsed.ok()) {
      call->Answer(parsed);
    } else {
      std::forward<Handle>(handle)(*call);
    }
    return call;
  }

  UnaryCall(const UnaryCall&) = delete;
  UnaryCall& operator=(const UnaryCall&) = delete;

  const Request& request() const { return request_; }
  Response* response() { return &response_; }

  // Ends the call with `status` (counted); on OK the response is what is sent. Call exactly once.
  void Answer(const absl::Status& status) {
    if (counters_ != nullptr) counters_->Count(status.code());
    if (!status.ok()) return Finish(ToGrpcStatus(status));
    if (absl::Status serialized = Serialize(response_, *raw_response_); !serialized.ok()) {
      return Finish(ToGrpcStatus(serialized));
    }
    Finish(grpc::Status::OK);
  }

  void OnDone() override { delete this; }

 private:
  UnaryCall(grpc::ByteBuffer* raw_response, ResponseCounters* counters)
      : raw_response_(raw_response), counters_(counters) {}

  grpc::ByteBuffer* const raw_response_;  // gRPC's, valid until OnDone
  ResponseCounters* const counters_;
  Request request_;
  Response response_;
};

}  // namespace tierd

#endif  // TIERD_SERVER_RAW_CALL_H_
