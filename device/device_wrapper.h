// A Device that forwards every call to another one, in the spirit of leveldb's EnvWrapper. Subclass
// it and override the calls to slow down or fail (fault injection in tests).
#ifndef TIERD_DEVICE_DEVICE_WRAPPER_H_
#define TIERD_DEVICE_DEVICE_WRAPPER_H_

#include <utility>

#include "device/device.h"

namespace tierd {

class DeviceWrapper : public Device {
 public:
  // `target` must outlive the wrapper.
  explicit DeviceWrapper(Device& target) : target_(target) {}

  Device& target() const { return target_; }

  std::string Describe() const override { return target_.Describe(); }
  const char* backend() const override { return target_.backend(); }
  int ordinal() const override { return target_.ordinal(); }
  absl::Status CheckHealth() override { return target_.CheckHealth(); }
  absl::StatusOr<uint64_t> FreeMemoryBytes() override { return target_.FreeMemoryBytes(); }
  absl::StatusOr<std::unique_ptr<Slab>> AllocateSlab(size_t bytes) override {
    return target_.AllocateSlab(bytes);
  }
  absl::Status RegisterHostMemory(void* data, size_t bytes) override {
    return target_.RegisterHostMemory(data, bytes);
  }
  absl::Status RegisterReadOnlyHostMemory(const void* data, size_t bytes) override {
    return target_.RegisterReadOnlyHostMemory(data, bytes);
  }
  absl::Status UnregisterHostMemory(void* data) override {
    return target_.UnregisterHostMemory(data);
  }
  absl::StatusOr<std::unique_ptr<Stream>> CreateStream(StreamPriority priority) override {
    return target_.CreateStream(priority);
  }
  absl::StatusOr<std::unique_ptr<Event>> CreateEvent() override { return target_.CreateEvent(); }
  absl::Status CopyAsync(Stream& stream, void* dst, const void* src, size_t bytes) override {
    return target_.CopyAsync(stream, dst, src, bytes);
  }
  absl::Status CopyAsync2D(Stream& stream, void* dst, size_t dst_pitch, const void* src,
                           size_t src_pitch, size_t width, size_t rows) override {
    return target_.CopyAsync2D(stream, dst, dst_pitch, src, src_pitch, width, rows);
  }
  absl::Status DecodeAsync(Stream& stream, const codec::CompressedLayout& layout,
                           const codec::TileTables& tables, const void* tiles, void* dst,
                           uint64_t first_tile, uint64_t tile_count, uint32_t* verdict) override {
    return target_.DecodeAsync(stream, layout, tables, tiles, dst, first_tile, tile_count, verdict);
  }
  absl::StatusOr<std::unique_ptr<TimeMark>> CreateTimeMark() override {
    return target_.CreateTimeMark();
  }
  absl::Status RecordTimeMark(TimeMark& mark, Stream& stream) override {
    return target_.RecordTimeMark(mark, stream);
  }
  absl::StatusOr<absl::Duration> TimeBetween(TimeMark& start, TimeMark& end) override {
    return target_.TimeBetween(start, end);
  }
  absl::Status RecordEvent(Event& event, Stream& stream) override {
    return target_.RecordEvent(event, stream);
  }
  absl::Status WaitEvent(Stream& stream, Event& event) override {
    return target_.WaitEvent(stream, event);
  }
  absl::StatusOr<bool> QueryEvent(Event& event) override { return target_.QueryEvent(event); }
  absl::Status SynchronizeEvent(Event& event) override { return target_.SynchronizeEvent(event); }
  absl::Status SynchronizeStream(Stream& stream) override {
    return target_.SynchronizeStream(stream);
  }
  absl::StatusOr<bool> QueryStream(Stream& stream) override { return target_.QueryStream(stream); }
  absl::Status LaunchHostFunction(Stream& stream, absl::AnyInvocable<void() &&> fn) override {
    return target_.LaunchHostFunction(stream, std::move(fn));
  }
  absl::Status NotifyWhenDone(Stream& stream, absl::AnyInvocable<void() &&> done) override {
    return target_.NotifyWhenDone(stream, std::move(done));
  }
  absl::StatusOr<std::unique_ptr<Slab>> OpenSlab(absl::string_view handle) override {
    return target_.OpenSlab(handle);
  }
  absl::StatusOr<std::unique_ptr<Event>> OpenEvent(absl::string_view handle) override {
    return target_.OpenEvent(handle);
  }

 private:
  Device& target_;
};

}  // namespace tierd

#endif  // TIERD_DEVICE_DEVICE_WRAPPER_H_
