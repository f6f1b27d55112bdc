// A C interface to HostDevice's shared-memory events (device/shared_event.h) for the Python
// client, loaded with ctypes. `event` points at a SharedEvent inside an event table the caller has
// mapped. CPU tensors have no stream: the caller's work is done when it calls these.
#include <cstdint>

#include "absl/time/time.h"
#include "device/shared_event.h"

extern "C" {

// Records `event` and completes the record at once (the caller's reads or writes are finished).
// Returns the record's number.
__attribute__((visibility("default"))) uint64_t tierd_host_event_record(void* event) {
  auto* shared = static_cast<tierd::SharedEvent*>(event);
  const uint64_t n = shared->BeginRecord();
  shared->Complete(n);
  return n;
}

// Waits until the event's newest record has completed, or `timeout_ns` passes. Returns 1 when
// complete, 0 on timeout. Sleeps on a futex; burns no core.
__attribute__((visibility("default"))) int tierd_host_event_wait(void* event, int64_t timeout_ns) {
  auto* shared = static_cast<tierd::SharedEvent*>(event);
  return shared->WaitFor(shared->Newest(), absl::Nanoseconds(timeout_ns)) ? 1 : 0;
}

// 64: the size of one event in a table, which the caller checks its layout against.
__attribute__((visibility("default"))) uint64_t tierd_host_event_size() {
  return sizeof(tierd::SharedEvent);
}

}  // extern "C"
