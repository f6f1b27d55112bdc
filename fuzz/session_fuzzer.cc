// Fuzzes the session state machine: random sequences of open, fetch, release, prefetch, reserve,
// commit, pin, unpin and evict, with keys and ids that are sometimes right and sometimes not,
// through SessionProtocol on the host-backend tiers. Checked on every input:
//   - every request but a quiet release gets exactly one answer;
//   - a lease's tensors hold the model file's bytes (never wrong bytes);
//   - once the session is closed nothing stays leased, reserved or pinned (nothing lost).
// Any violation aborts, which libFuzzer reports as a crash with the input that caused it.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "fuzz/fuzz_stack.h"
#include "wire/wire_format.h"

namespace tierd::fuzzing {
namespace {

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "session_fuzzer: %s\n", what.c_str());
  std::abort();
}

// Answers of one session, by request id.
class Answers {
 public:
  void Add(v1::SessionResponse response) {
    absl::MutexLock lock(&mu_);
    const uint64_t id = response.request_id();
    if (!answers_.emplace(id, std::move(response)).second) {
      Fail(absl::StrCat("request ", id, " was answered twice"));
    }
  }
  // The answer to `id`; aborts when none comes within 10 s.
  v1::SessionResponse Await(uint64_t id) {
    absl::MutexLock lock(&mu_);
    auto answered = [this, id]()
                        ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return answers_.count(id) > 0; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&answered), absl::Seconds(10))) {
      Fail(absl::StrCat("request ", id, " got no answer in 10 s"));
    }
    return answers_.at(id);
  }

 private:
  absl::Mutex mu_;
  std::map<uint64_t, v1::SessionResponse> answers_ ABSL_GUARDED_BY(mu_);
};

// Checks a granted lease's tensors against the file's bytes, after its ready event.
void CheckLease(FuzzStack& stack, const v1::Lease& lease) {
  if (absl::Status ready =
          stack.device->SynchronizeEvent(stack.tier->events().event(lease.ready_event_id()));
      !ready.ok()) {
    Fail(absl::StrCat("waiting for lease ", lease.lease_id(), ": ", ready.ToString()));
  }
  const uint8_t* base = stack.tier->pool().data({lease.slab_id(), lease.offset(), lease.length()});
  for (const v1::TensorInfo& tensor : lease.tensors()) {
    auto expected = stack.tensor_bytes.find(tensor.name());
    if (expected == stack.tensor_bytes.end()) continue;  // a stored object's tensor
    if (tensor.offset() + tensor.size() > lease.length() ||
        expected->second.size() != tensor.size() ||
        std::memcmp(base + tensor.offset(), expected->second.data(), tensor.size()) != 0) {
      Fail(absl::StrCat("lease of ", lease.key(), ": tensor ", tensor.name(),
                        " does not hold the file's bytes"));
    }
  }
}

class Driver {
 public:
  Driver(FuzzStack& stack, FuzzedDataProvider& input) : stack_(stack), input_(input) {}

  void Run() {
    session_ = std::make_shared<SessionProtocol>(
        *stack_.tier, stack_.session_options,
        [this](v1::SessionResponse response) { answers_.Add(std::move(response)); });
    if (input_.ConsumeBool()) {  // usually open first; sometimes not, which must be refused
      v1::SessionRequest open;
      open.mutable_open()->set_client_name(input_.ConsumeRandomLengthString(300));
      // Usually the daemon's protocol; sometimes another, which must be refused.
      open.mutable_open()->set_protocol(input_.ConsumeIntegralInRange<uint32_t>(0, 9) > 0
                                            ? SessionProtocolVersion()
                                            : input_.ConsumeIntegral<uint32_t>());
      Call(open);
    }
    for (int op = 0; op < 48 && input_.remaining_bytes() > 0; ++op) Step();
    session_->Close();
    stack_.ExpectNothingHeld();
  }

 private:
  std::string Key() {
    switch (input_.ConsumeIntegralInRange(0, 4)) {
      case 0:
      case 1:
        return stack_
            .model_keys[input_.ConsumeIntegralInRange<size_t>(0, stack_.model_keys.size() - 1)];
      case 2:
        return absl::StrCat("kv/", input_.ConsumeIntegralInRange(0, 3));
      case 3:
        return "m/";  // a prefix: only evict takes one
      default:
        return input_.ConsumeRandomLengthString(200);
    }
  }
  template <typename Id>
  uint64_t PickId(const std::set<Id>& known) {
    if (!known.empty() && input_.ConsumeIntegralInRange(0, 3) > 0) {
      auto it = known.begin();
      std::advance(it, input_.ConsumeIntegralInRange<size_t>(0, known.size() - 1));
      return *it;
    }
    return input_.ConsumeIntegral<uint64_t>();
  }

  void Step() {
    v1::SessionRequest request;
    bool quiet = false;
    switch (input_.ConsumeIntegralInRange(0, 8)) {
      case 0:
        request.mutable_fetch()->set_key(Key());
        break;
      case 1: {
        const uint64_t lease = PickId(leases_);
        request.mutable_release()->set_lease_id(lease);
        quiet = input_.ConsumeBool();
        request.mutable_release()->set_quiet(quiet);
        break;
      }
      case 2: {
        v1::PrefetchRequest* prefetch = request.mutable_prefetch();
        for (int n = input_.ConsumeIntegralInRange(0, 3); n > 0; --n) prefetch->add_keys(Key());
        prefetch->set_deadline_ms(input_.ConsumeIntegralInRange(0, 50));
        prefetch->set_host_only(input_.ConsumeBool());
        break;
      }
      case 3: {
        v1::ReserveRequest* reserve = request.mutable_reserve();
        reserve->set_key(Key());
        const uint64_t length = input_.ConsumeIntegralInRange<uint64_t>(0, 96 << 10);
        reserve->set_length(
            input_.ConsumeIntegralInRange(0, 9) == 0 ? input_.ConsumeIntegral<uint64_t>() : length);
        for (int n = input_.ConsumeIntegralInRange(0, 2); n > 0; --n) {
          v1::TensorInfo* tensor = reserve->add_tensors();
          tensor->set_name(input_.ConsumeRandomLengthString(20));
          tensor->set_dtype(input_.ConsumeBool() ? "F32" : input_.ConsumeRandomLengthString(5));
          tensor->add_shape(input_.ConsumeIntegralInRange<uint64_t>(0, 1 << 12));
          tensor->set_offset(input_.ConsumeIntegralInRange<uint64_t>(0, length));
          tensor->set_size(input_.ConsumeIntegralInRange<uint64_t>(0, length));
        }
        reserve->set_spillable(input_.ConsumeBool());
        break;
      }
      case 4:
        request.mutable_commit()->set_reservation_id(PickId(reservations_));
        request.mutable_commit()->set_abort(input_.ConsumeIntegralInRange(0, 3) == 0);
        break;
      case 5:
        request.mutable_pin()->set_key(Key());
        break;
      case 6:
        request.mutable_unpin()->set_key(Key());
        break;
      case 7:
        request.mutable_evict()->set_key(Key());
        request.mutable_evict()->set_tier(
            static_cast<v1::Tier>(input_.ConsumeIntegralInRange(0, 4)));
        break;
      default: {
        v1::SessionRequest open;  // a second open must be refused
        open.mutable_open()->set_protocol(SessionProtocolVersion());
        request = open;
        break;
      }
    }
    if (quiet) {
      request.set_request_id(++next_id_);
      session_->Handle(request);
      // A quiet release that succeeded is never answered; one that failed is.
      leases_.erase(request.release().lease_id());
      return;
    }
    Call(request);
  }

  void Call(v1::SessionRequest request) {
    request.set_request_id(++next_id_);
    session_->Handle(request);
    const v1::SessionResponse answer = answers_.Await(request.request_id());
    if (answer.code() != 0) return;
    if (answer.has_lease()) {
      CheckLease(stack_, answer.lease());
      leases_.insert(answer.lease().lease_id());
    } else if (answer.has_reservation()) {
      reservations_.insert(answer.reservation().reservation_id());
    } else if (request.has_release()) {
      leases_.erase(request.release().lease_id());
    } else if (request.has_commit()) {
      reservations_.erase(request.commit().reservation_id());
    }
  }

  FuzzStack& stack_;
  FuzzedDataProvider& input_;
  std::shared_ptr<SessionProtocol> session_;
  Answers answers_;
  uint64_t next_id_ = 0;
  std::set<uint64_t> leases_;
  std::set<uint64_t> reservations_;
};

}  // namespace
}  // namespace tierd::fuzzing

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider input(data, size);
  tierd::fuzzing::Driver(tierd::fuzzing::FuzzStack::Get(), input).Run();
  return 0;
}
