// A Device double for tests of host memory registration: it forwards to another device and
// records every registration (read-write and read-only) and unregistration by address. It can
// also refuse read-only registration as a device without support does (UNIMPLEMENTED), fail the
// next few registrations, and hold registrations at a gate until the test opens it.
#ifndef TIERD_TESTS_REGISTRATION_RECORDING_DEVICE_H_
#define TIERD_TESTS_REGISTRATION_RECORDING_DEVICE_H_

#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "device/device_wrapper.h"

namespace tierd::testing {

class RegistrationRecordingDevice : public DeviceWrapper {
 public:
  explicit RegistrationRecordingDevice(Device& target) : DeviceWrapper(target) {}

  // Read-only registration answers UNIMPLEMENTED, as on a GPU without support for it.
  void set_read_only_unsupported(bool unsupported) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    read_only_unsupported_ = unsupported;
  }
  // The next `count` registrations fail with RESOURCE_EXHAUSTED.
  void FailNextRegistrations(int count) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    failures_left_ = count;
  }
  // While closed, registrations wait at the gate (counted by waiting_at_gate()).
  void set_gate_closed(bool closed) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    gate_closed_ = closed;
  }
  // Sleeps this long in every registration, outside the lock.
  void set_delay(absl::Duration delay) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    delay_ = delay;
  }

  absl::Status RegisterHostMemory(void* data, size_t bytes) override ABSL_LOCKS_EXCLUDED(mu_) {
    return Register(data, bytes, /*read_only=*/false);
  }
  absl::Status RegisterReadOnlyHostMemory(const void* data, size_t bytes) override
      ABSL_LOCKS_EXCLUDED(mu_) {
    return Register(data, bytes, /*read_only=*/true);
  }
  absl::Status UnregisterHostMemory(void* data) override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::Status status = DeviceWrapper::UnregisterHostMemory(data);
    if (status.ok()) {
      absl::MutexLock lock(&mu_);
      ++unregistered_[data];
    }
    return status;
  }

  // Successful registrations of either kind, by address.
  std::map<const void*, int> registered() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    std::map<const void*, int> all = read_only_registered_;
    for (const auto& [data, count] : writable_registered_) all[data] += count;
    return all;
  }
  std::map<const void*, int> read_only_registered() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return read_only_registered_;
  }
  std::map<const void*, int> writable_registered() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return writable_registered_;
  }
  std::map<const void*, int> unregistered() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return unregistered_;
  }
  int waiting_at_gate() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return waiting_at_gate_;
  }

 private:
  absl::Status Register(const void* data, size_t bytes, bool read_only) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::Duration delay;
    {
      absl::MutexLock lock(&mu_);
      if (read_only && read_only_unsupported_) {
        return absl::UnimplementedError("read-only registration is not supported here");
      }
      ++waiting_at_gate_;
      mu_.Await(absl::Condition(
          +[](bool* closed) { return !*closed; }, &gate_closed_));
      --waiting_at_gate_;
      if (failures_left_ > 0) {
        --failures_left_;
        return absl::ResourceExhaustedError("registration failed on purpose");
      }
      delay = delay_;
    }
    absl::SleepFor(delay);
    absl::Status status = read_only
                              ? DeviceWrapper::RegisterReadOnlyHostMemory(data, bytes)
                              : DeviceWrapper::RegisterHostMemory(const_cast<void*>(data), bytes);
    if (status.ok()) {
      absl::MutexLock lock(&mu_);
      ++(read_only ? read_only_registered_ : writable_registered_)[data];
    }
    return status;
  }

  mutable absl::Mutex mu_;
  bool read_only_unsupported_ ABSL_GUARDED_BY(mu_) = false;
  int failures_left_ ABSL_GUARDED_BY(mu_) = 0;
  bool gate_closed_ ABSL_GUARDED_BY(mu_) = false;
  int waiting_at_gate_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Duration delay_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
  std::map<const void*, int> read_only_registered_ ABSL_GUARDED_BY(mu_);
  std::map<const void*, int> writable_registered_ ABSL_GUARDED_BY(mu_);
  std::map<const void*, int> unregistered_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tierd::testing

#endif  // TIERD_TESTS_REGISTRATION_RECORDING_DEVICE_H_
