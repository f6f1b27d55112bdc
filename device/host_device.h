// HostDevice: the Device semantics without a GPU. "Device" slabs are POSIX shared memory objects
// another process maps by name; streams are worker threads (HostStream); events live in shared
// memory event tables (SharedEvent) that any process can record, query and wait on.
//
// It exists so that the daemon, the protocol and the clients run and are tested end to end on a
// machine with no GPU; it is not meant to be fast.
#ifndef TIERD_DEVICE_HOST_DEVICE_H_
#define TIERD_DEVICE_HOST_DEVICE_H_

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "device/completion_thread.h"
#include "device/device.h"
#include "device/shared_memory.h"

namespace tierd {

class HostDevice final : public Device {
 public:
  // Also removes shared memory left behind by tierd processes that died without cleaning up.
  static absl::StatusOr<std::unique_ptr<HostDevice>> Create();
  ~HostDevice() override;

  std::string Describe() const override { return "host"; }
  const char* backend() const override { return "host"; }
  int ordinal() const override { return 0; }
  // Host memory and threads do not get lost.
  absl::Status CheckHealth() override { return absl::OkStatus(); }
  // Slabs are shared memory objects: the free space of /dev/shm.
  absl::StatusOr<uint64_t> FreeMemoryBytes() override { return SharedMemoryFreeBytes(); }

  absl::StatusOr<std::unique_ptr<Slab>> AllocateSlab(size_t bytes) override;
  absl::Status RegisterHostMemory(void* data, size_t bytes) override ABSL_LOCKS_EXCLUDED(mu_);
  // Tracked like RegisterHostMemory's ranges: the host backend copies with the CPU.
  absl::Status RegisterReadOnlyHostMemory(const void* data, size_t bytes) override
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status UnregisterHostMemory(void* data) override ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<std::unique_ptr<Stream>> CreateStream(StreamPriority priority) override;
  absl::StatusOr<std::unique_ptr<Event>> CreateEvent() override ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status CopyAsync(Stream& stream, void* dst, const void* src, size_t bytes) override;
  absl::Status CopyAsync2D(Stream& stream, void* dst, size_t dst_pitch, const void* src,
                           size_t src_pitch, size_t width, size_t rows) override;
  absl::Status DecodeAsync(Stream& stream, const codec::CompressedLayout& layout,
                           const codec::TileTables& tables, const void* tiles, void* dst,
                           uint64_t first_tile, uint64_t tile_count, uint32_t* verdict) override;
  absl::StatusOr<std::unique_ptr<TimeMark>> CreateTimeMark() override;
  absl::Status RecordTimeMark(TimeMark& mark, Stream& stream) override;
  absl::StatusOr<absl::Duration> TimeBetween(TimeMark& start, TimeMark& end) override;
  absl::Status RecordEvent(Event& event, Stream& stream) override;
  absl::Status WaitEvent(Stream& stream, Event& event) override;
  absl::StatusOr<bool> QueryEvent(Event& event) override;
  absl::Status SynchronizeEvent(Event& event) override;
  absl::Status SynchronizeStream(Stream& stream) override;
  absl::StatusOr<bool> QueryStream(Stream& stream) override;
  absl::Status LaunchHostFunction(Stream& stream, absl::AnyInvocable<void() &&> fn) override;
  absl::Status NotifyWhenDone(Stream& stream, absl::AnyInvocable<void() &&> done) override;

  absl::StatusOr<std::unique_ptr<Slab>> OpenSlab(absl::string_view handle) override;
  absl::StatusOr<std::unique_ptr<Event>> OpenEvent(absl::string_view handle) override
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct EventSlotRef {
    size_t table;
    size_t slot;
  };

  explicit HostDevice(std::string name_prefix);
  std::string NewObjectName(absl::string_view kind) ABSL_LOCKS_EXCLUDED(mu_);
  void ReleaseEventSlot(EventSlotRef ref) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<std::shared_ptr<SharedMemory>> MapEventTable(const std::string& name)
      ABSL_LOCKS_EXCLUDED(mu_);

  const std::string name_prefix_;  // "/tierd.<pid>.<nonce>."
  CompletionThread completions_;

  absl::Mutex mu_;
  uint64_t next_object_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::set<const void*> registered_host_ranges_ ABSL_GUARDED_BY(mu_);
  // Event tables this device owns, and the free slots in them.
  std::vector<std::shared_ptr<SharedMemory>> event_tables_ ABSL_GUARDED_BY(mu_);
  std::vector<EventSlotRef> free_event_slots_ ABSL_GUARDED_BY(mu_);
  // Event tables of other processes opened here, shared by every event opened from them.
  std::map<std::string, std::weak_ptr<SharedMemory>> imported_event_tables_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tierd

#endif  // TIERD_DEVICE_HOST_DEVICE_H_
