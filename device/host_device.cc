#include "device/host_device.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "codec/exponent_codec.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "device/decode_arguments.h"
#include "device/handle_format.h"
#include "device/host_stream.h"
#include "device/shared_event.h"

namespace tierd {
namespace {

constexpr size_t kEventsPerTable = 1024;  // 64 KiB of shared memory per table

class HostSlab final : public Slab {
 public:
  explicit HostSlab(std::unique_ptr<SharedMemory> memory)
      : memory_(std::move(memory)), handle_(EncodeHostSlabHandle(memory_->name())) {}
  HostSlab(std::unique_ptr<SharedMemory> memory, std::string handle)
      : memory_(std::move(memory)), handle_(std::move(handle)) {}

  void* data() const override { return memory_->data(); }
  size_t size() const override { return memory_->size(); }
  const std::string& handle() const override { return handle_; }

 private:
  std::unique_ptr<SharedMemory> memory_;
  std::string handle_;
};

class HostEvent final : public Event {
 public:
  HostEvent(std::shared_ptr<SharedMemory> table, size_t slot,
            absl::AnyInvocable<void() &&> on_destroy)
      : table_(std::move(table)),
        state_(static_cast<SharedEvent*>(table_->data()) + slot),
        handle_(EncodeHostEventHandle(table_->name(), slot)),
        on_destroy_(std::move(on_destroy)) {}
  ~HostEvent() override {
    if (on_destroy_) std::move(on_destroy_)();
  }

  const std::string& handle() const override { return handle_; }
  SharedEvent* state() const { return state_; }
  const std::shared_ptr<SharedMemory>& table() const { return table_; }

 private:
  std::shared_ptr<SharedMemory> table_;
  SharedEvent* state_;
  std::string handle_;
  absl::AnyInvocable<void() &&> on_destroy_;
};

// The stream's thread notes the time it reaches the mark; 0 until then.
class HostTimeMark final : public TimeMark {
 public:
  // Forgets an earlier record: the mark is unreached until the stream gets to the new one.
  void Begin() { reached_ns_.store(0, std::memory_order_release); }
  void Reach() {
    const auto now = std::chrono::steady_clock::now().time_since_epoch();
    reached_ns_.store(std::max<int64_t>(1, std::chrono::nanoseconds(now).count()),
                      std::memory_order_release);
  }
  int64_t reached_ns() const { return reached_ns_.load(std::memory_order_acquire); }

 private:
  std::atomic<int64_t> reached_ns_{0};
};

HostStream& AsHost(Stream& stream) { return static_cast<HostStream&>(stream); }
HostEvent& AsHost(Event& event) { return static_cast<HostEvent&>(event); }

// Only objects named by tierd may be opened through a handle: a handle is client-supplied input.
bool IsTierdObjectName(absl::string_view name) {
  return absl::StartsWith(name, "/tierd.") && name.find('/', 1) == absl::string_view::npos &&
         name.find("..") == absl::string_view::npos;
}

std::string RandomNonce() {
  std::random_device random;
  return absl::StrFormat("%08x", static_cast<uint32_t>(random()));
}

}  // namespace

absl::StatusOr<std::unique_ptr<HostDevice>> HostDevice::Create() {
  if (int removed = RemoveStaleSharedMemory(); removed > 0) {
    TIERD_LOG(INFO) << "removed " << removed
                    << " shared memory objects left behind by exited tierd processes";
  }
  return std::unique_ptr<HostDevice>(
      new HostDevice(absl::StrCat(SharedMemoryPrefixForPid(::getpid()), RandomNonce(), ".")));
}

HostDevice::HostDevice(std::string name_prefix) : name_prefix_(std::move(name_prefix)) {}

HostDevice::~HostDevice() = default;

std::string HostDevice::NewObjectName(absl::string_view kind) {
  absl::MutexLock lock(&mu_);
  return absl::StrCat(name_prefix_, kind, ".", next_object_id_++);
}

absl::StatusOr<std::unique_ptr<Slab>> HostDevice::AllocateSlab(size_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("slab of 0 bytes");
  auto memory = SharedMemory::Create(NewObjectName("slab"), bytes);
  if (!memory.ok()) return memory.status();
  return std::unique_ptr<Slab>(new HostSlab(*std::move(memory)));
}

absl::Status HostDevice::RegisterHostMemory(void* data, size_t bytes) {
  return RegisterReadOnlyHostMemory(data, bytes);
}

absl::Status HostDevice::RegisterReadOnlyHostMemory(const void* data, size_t bytes) {
  if (data == nullptr || bytes == 0) {
    return absl::InvalidArgumentError("registering a null or empty host range");
  }
  absl::MutexLock lock(&mu_);
  if (!registered_host_ranges_.insert(data).second) {
    return absl::FailedPreconditionError("host range is already registered");
  }
  return absl::OkStatus();
}

absl::Status HostDevice::UnregisterHostMemory(void* data) {
  absl::MutexLock lock(&mu_);
  if (registered_host_ranges_.erase(data) == 0) {
    return absl::InvalidArgumentError("unregistering a host range that is not registered");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Stream>> HostDevice::CreateStream(StreamPriority) {
  ASSIGN_OR_RETURN(std::unique_ptr<HostStream> stream, HostStream::Create());
  return std::unique_ptr<Stream>(std::move(stream));
}

absl::StatusOr<std::unique_ptr<Event>> HostDevice::CreateEvent() {
  EventSlotRef ref;
  std::shared_ptr<SharedMemory> table;
  {
    absl::MutexLock lock(&mu_);
    if (free_event_slots_.empty()) {
      const std::string name = absl::StrCat(name_prefix_, "events.", event_tables_.size());
      auto created = SharedMemory::Create(name, kEventsPerTable * sizeof(SharedEvent));
      if (!created.ok()) return created.status();
      event_tables_.push_back(std::shared_ptr<SharedMemory>(*std::move(created)));
      for (size_t slot = kEventsPerTable; slot-- > 0;) {
        free_event_slots_.push_back({event_tables_.size() - 1, slot});
      }
    }
    ref = free_event_slots_.back();
    free_event_slots_.pop_back();
    table = event_tables_[ref.table];
  }
  return std::unique_ptr<Event>(
      new HostEvent(std::move(table), ref.slot, [this, ref] { ReleaseEventSlot(ref); }));
}

void HostDevice::ReleaseEventSlot(EventSlotRef ref) {
  absl::MutexLock lock(&mu_);
  free_event_slots_.push_back(ref);
}

absl::Status HostDevice::CopyAsync(Stream& stream, void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  if (dst == nullptr || src == nullptr)
    return absl::InvalidArgumentError("copy with a null pointer");
  AsHost(stream).Enqueue([dst, src, bytes] { std::memcpy(dst, src, bytes); });
  return absl::OkStatus();
}

absl::Status HostDevice::CopyAsync2D(Stream& stream, void* dst, size_t dst_pitch, const void* src,
                                     size_t src_pitch, size_t width, size_t rows) {
  if (width == 0 || rows == 0) return absl::OkStatus();
  if (dst == nullptr || src == nullptr) {
    return absl::InvalidArgumentError("copy with a null pointer");
  }
  if (rows > 1 && (dst_pitch < width || src_pitch < width)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "2-D copy of rows of ", width, " bytes with pitches ", dst_pitch, " and ", src_pitch));
  }
  AsHost(stream).Enqueue([dst, dst_pitch, src, src_pitch, width, rows] {
    auto* to = static_cast<uint8_t*>(dst);
    const auto* from = static_cast<const uint8_t*>(src);
    for (size_t r = 0; r < rows; ++r) std::memcpy(to + r * dst_pitch, from + r * src_pitch, width);
  });
  return absl::OkStatus();
}

absl::Status HostDevice::DecodeAsync(Stream& stream, const codec::CompressedLayout& layout,
                                     const codec::TileTables& tables, const void* tiles, void* dst,
                                     uint64_t first_tile, uint64_t tile_count, uint32_t* verdict) {
  RETURN_IF_ERROR(
      CheckDecodeArguments(layout, tables, tiles, dst, first_tile, tile_count, verdict));
  AsHost(stream).Enqueue([layout, tables, tiles, dst, first_tile, tile_count, verdict] {
    const absl::Status decoded =
        codec::DecodeTiles(layout, tables, static_cast<const uint8_t*>(tiles),
                           static_cast<uint8_t*>(dst), first_tile, tile_count);
    if (!decoded.ok()) __atomic_store_n(verdict, 1u, __ATOMIC_RELEASE);
  });
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<TimeMark>> HostDevice::CreateTimeMark() {
  return std::make_unique<HostTimeMark>();
}

absl::Status HostDevice::RecordTimeMark(TimeMark& mark, Stream& stream) {
  auto& host_mark = static_cast<HostTimeMark&>(mark);
  host_mark.Begin();
  AsHost(stream).Enqueue([&host_mark] { host_mark.Reach(); });
  return absl::OkStatus();
}

absl::StatusOr<absl::Duration> HostDevice::TimeBetween(TimeMark& start, TimeMark& end) {
  const int64_t from = static_cast<HostTimeMark&>(start).reached_ns();
  const int64_t to = static_cast<HostTimeMark&>(end).reached_ns();
  if (from == 0 || to == 0) {
    return absl::FailedPreconditionError("a time mark not yet reached by its stream");
  }
  return absl::Nanoseconds(to - from);
}

absl::Status HostDevice::RecordEvent(Event& event, Stream& stream) {
  HostEvent& host_event = AsHost(event);
  const uint64_t n = host_event.state()->BeginRecord();
  AsHost(stream).Enqueue(
      [table = host_event.table(), state = host_event.state(), n] { state->Complete(n); });
  return absl::OkStatus();
}

absl::Status HostDevice::WaitEvent(Stream& stream, Event& event) {
  HostEvent& host_event = AsHost(event);
  const uint64_t n = host_event.state()->Newest();
  if (host_event.state()->IsComplete(n)) return absl::OkStatus();
  AsHost(stream).EnqueueWait(host_event.table(), host_event.state(), n);
  return absl::OkStatus();
}

absl::StatusOr<bool> HostDevice::QueryEvent(Event& event) {
  SharedEvent* state = AsHost(event).state();
  return state->IsComplete(state->Newest());
}

absl::Status HostDevice::SynchronizeEvent(Event& event) {
  SharedEvent* state = AsHost(event).state();
  const uint64_t n = state->Newest();
  while (!state->WaitFor(n, absl::Seconds(1))) {
  }
  return absl::OkStatus();
}

absl::Status HostDevice::SynchronizeStream(Stream& stream) {
  AsHost(stream).Synchronize();
  return absl::OkStatus();
}

absl::StatusOr<bool> HostDevice::QueryStream(Stream& stream) { return AsHost(stream).Idle(); }

absl::Status HostDevice::LaunchHostFunction(Stream& stream, absl::AnyInvocable<void() &&> fn) {
  AsHost(stream).Enqueue(std::move(fn));
  return absl::OkStatus();
}

absl::Status HostDevice::NotifyWhenDone(Stream& stream, absl::AnyInvocable<void() &&> done) {
  AsHost(stream).Enqueue(
      [this, done = std::move(done)]() mutable { completions_.Post(std::move(done)); });
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Slab>> HostDevice::OpenSlab(absl::string_view handle) {
  absl::StatusOr<absl::string_view> name = ParseHostSlabHandle(handle);
  if (!name.ok() || !IsTierdObjectName(*name)) {
    return absl::InvalidArgumentError("not a host slab handle");
  }
  auto memory = SharedMemory::Open(std::string(*name));
  if (!memory.ok()) return memory.status();
  return std::unique_ptr<Slab>(new HostSlab(*std::move(memory), std::string(handle)));
}

absl::StatusOr<std::shared_ptr<SharedMemory>> HostDevice::MapEventTable(const std::string& name) {
  absl::MutexLock lock(&mu_);
  std::weak_ptr<SharedMemory>& cached = imported_event_tables_[name];
  if (std::shared_ptr<SharedMemory> table = cached.lock()) return table;
  auto opened = SharedMemory::Open(name);
  if (!opened.ok()) {
    imported_event_tables_.erase(name);
    return opened.status();
  }
  if ((*opened)->size() != kEventsPerTable * sizeof(SharedEvent)) {
    imported_event_tables_.erase(name);
    return absl::InvalidArgumentError(absl::StrCat("'", name, "' is not an event table"));
  }
  std::shared_ptr<SharedMemory> table(*std::move(opened));
  cached = table;
  return table;
}

absl::StatusOr<std::unique_ptr<Event>> HostDevice::OpenEvent(absl::string_view handle) {
  absl::StatusOr<HostEventHandle> parsed = ParseHostEventHandle(handle);
  if (!parsed.ok() || parsed->slot >= kEventsPerTable || !IsTierdObjectName(parsed->table_name)) {
    return absl::InvalidArgumentError("not a host event handle");
  }
  auto table = MapEventTable(std::string(parsed->table_name));
  if (!table.ok()) return table.status();
  return std::unique_ptr<Event>(new HostEvent(*std::move(table), parsed->slot, nullptr));
}

}  // namespace tierd
