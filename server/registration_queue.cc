#include "server/registration_queue.h"

#include <algorithm>

#include "common/checked_math.h"

namespace tierd {
namespace {

// A request's derived tensors take about this many times their serialized bytes while they are
// parsed and applied (measured: a 13.6 MB request of a million ranges peaked 400 MB above the
// daemon's resting size).
constexpr uint64_t kRequestExpansion = 32;
// A remote scan holds at most this much of headers read and not yet parsed
// (RemoteScanOptions::max_bytes_in_flight), besides what the headers parse into.
constexpr uint64_t kRemoteScanBytes = 64ull << 20;
// What any registration takes, however small its request: headers parsed, the model's
// description built and serialized.
constexpr uint64_t kBaseBytes = 16ull << 20;

}  // namespace

RegistrationQueue::RegistrationQueue(const RegistrationQueueOptions& options)
    : max_admitted_(std::max(1, options.max_admitted)),
      memory_(options.memory_bytes),
      local_(1),
      remote_(std::max(1, options.remote_threads)) {}

bool RegistrationQueue::Admit() {
  int admitted = admitted_.load();
  do {
    if (admitted >= max_admitted_) return false;
  } while (!admitted_.compare_exchange_weak(admitted, admitted + 1));
  return true;
}

void RegistrationQueue::Leave() { --admitted_; }

void RegistrationQueue::Post(bool remote, absl::AnyInvocable<void() &&> job) {
  (remote ? remote_ : local_).Post(std::move(job));
}

uint64_t RegistrationQueue::EstimatedBytes(uint64_t request_bytes, bool remote) {
  return SaturatingAdd(SaturatingMul(request_bytes, kRequestExpansion),
                       kBaseBytes + (remote ? kRemoteScanBytes : 0));
}

}  // namespace tierd
