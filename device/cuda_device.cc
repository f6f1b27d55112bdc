#include "device/cuda_device.h"

#include <cuda_runtime_api.h>

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "device/completion_thread.h"
#include "device/decode_arguments.h"
#include "device/detail/cuda_status.h"
#include "device/detail/exponent_decode.h"
#include "device/handle_format.h"

namespace tierd {
namespace {

// The bytes of a CUDA IPC handle, as wire/wire_format.h carries them.
template <typename IpcHandle>
absl::string_view BytesOf(const IpcHandle& ipc) {
  return absl::string_view(reinterpret_cast<const char*>(&ipc), sizeof(ipc));
}

// The mappings of imported slabs, shared by every Slab of this process that opened a handle: CUDA
// maps an IPC memory handle once per process, and two threads opening one handle at once fail in
// the driver (cudaErrorAlreadyMapped; two sessions of one process fetching at once did). Counted,
// opened and closed under one lock, so that a handle is never opened while its mapping closes.
class ImportedMappings {
 public:
  // The mapping of `ipc` on GPU `ordinal`, opened unless this process has it open; `key` names it
  // for Release.
  static absl::StatusOr<void*> Open(int ordinal, const cudaIpcMemHandle_t& ipc, std::string& key) {
    key = absl::StrCat(ordinal, ":",
                       absl::string_view(reinterpret_cast<const char*>(&ipc), sizeof(ipc)));
    absl::MutexLock lock(&mu_);
    auto it = Mappings().find(key);
    if (it != Mappings().end()) {
      ++it->second.users;
      return it->second.data;
    }
    RETURN_IF_ERROR(CudaStatus(cudaSetDevice(ordinal), "cudaSetDevice"));
    void* data = nullptr;
    RETURN_IF_ERROR(CudaStatus(cudaIpcOpenMemHandle(&data, ipc, cudaIpcMemLazyEnablePeerAccess),
                               "cudaIpcOpenMemHandle"));
    Mappings()[key] = Mapping{ordinal, data, 1};
    return data;
  }

  // One user of mapping `key` is done with it; the last closes it.
  static void Release(const std::string& key) {
    absl::MutexLock lock(&mu_);
    auto it = Mappings().find(key);
    if (it == Mappings().end() || --it->second.users > 0) return;
    cudaSetDevice(it->second.ordinal);
    if (absl::Status closed =
            CudaStatus(cudaIpcCloseMemHandle(it->second.data), "cudaIpcCloseMemHandle");
        !closed.ok()) {
      TIERD_LOG(WARNING) << "releasing an imported slab: " << closed;
    }
    Mappings().erase(it);
  }

 private:
  struct Mapping {
    int ordinal = 0;
    void* data = nullptr;
    int users = 0;
  };
  static std::map<std::string, Mapping>& Mappings() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    static auto* mappings = new std::map<std::string, Mapping>();
    return *mappings;
  }

  static inline absl::Mutex mu_{absl::kConstInit};
};

class CudaSlab final : public Slab {
 public:
  // A slab of this process's own (`imported` empty), or ImportedMappings' mapping `imported` of
  // another process's.
  CudaSlab(int ordinal, void* data, size_t size, std::string handle, std::string imported = "")
      : ordinal_(ordinal),
        data_(data),
        size_(size),
        handle_(std::move(handle)),
        imported_(std::move(imported)) {}
  ~CudaSlab() override {
    if (!imported_.empty()) {
      ImportedMappings::Release(imported_);
      return;
    }
    cudaSetDevice(ordinal_);
    if (absl::Status freed = CudaStatus(cudaFree(data_), "cudaFree"); !freed.ok()) {
      TIERD_LOG(WARNING) << "releasing a slab: " << freed;
    }
  }

  void* data() const override { return data_; }
  size_t size() const override { return size_; }
  const std::string& handle() const override { return handle_; }

 private:
  int ordinal_;
  void* data_;
  size_t size_;
  std::string handle_;
  std::string imported_;
};

class CudaStream final : public Stream {
 public:
  CudaStream(int ordinal, cudaStream_t stream, int priority)
      : ordinal_(ordinal), stream_(stream), priority_(priority) {}
  ~CudaStream() override {
    cudaSetDevice(ordinal_);
    // Non-blocking: work still queued completes, and its host functions still run.
    for (cudaStream_t stream : {stream_, notify_stream_}) {
      if (stream == nullptr) continue;
      if (absl::Status s = CudaStatus(cudaStreamDestroy(stream), "cudaStreamDestroy"); !s.ok()) {
        TIERD_LOG(WARNING) << s;
      }
    }
    if (marker_ != nullptr) cudaEventDestroy(marker_);
  }
  cudaStream_t get() const { return stream_; }

  // Enqueues `fn` (a cudaHostFn_t and its argument) to run once the work enqueued so far has
  // completed, without holding up later work: a host function on the stream itself would stall
  // the stream until the driver's callback thread has run it, a gap between every two copies (it
  // cost warm 16 MiB fetches a fifth of their speed: bench/results/README.md). Instead a marker
  // event is recorded here, and a second stream that carries nothing else waits for it and runs the
  // function.
  absl::Status LaunchHostFunctionBeside(cudaHostFn_t fn, void* arg) {
    absl::MutexLock lock(&notify_mu_);
    if (notify_stream_ == nullptr) {
      RETURN_IF_ERROR(CudaStatus(
          cudaStreamCreateWithPriority(&notify_stream_, cudaStreamNonBlocking, priority_),
          "cudaStreamCreateWithPriority"));
      RETURN_IF_ERROR(CudaStatus(cudaEventCreateWithFlags(&marker_, cudaEventDisableTiming),
                                 "cudaEventCreateWithFlags"));
    }
    // The wait takes the record current at the call, so one marker serves every call: the lock
    // keeps each record and its wait together.
    RETURN_IF_ERROR(CudaStatus(cudaEventRecord(marker_, stream_), "cudaEventRecord"));
    RETURN_IF_ERROR(
        CudaStatus(cudaStreamWaitEvent(notify_stream_, marker_, 0), "cudaStreamWaitEvent"));
    return CudaStatus(cudaLaunchHostFunc(notify_stream_, fn, arg), "cudaLaunchHostFunc");
  }

 private:
  int ordinal_;
  cudaStream_t stream_;
  int priority_;
  absl::Mutex notify_mu_;
  cudaStream_t notify_stream_ ABSL_GUARDED_BY(notify_mu_) = nullptr;
  cudaEvent_t marker_ ABSL_GUARDED_BY(notify_mu_) = nullptr;
};

class CudaEvent final : public Event {
 public:
  CudaEvent(int ordinal, cudaEvent_t event, std::string handle)
      : ordinal_(ordinal), event_(event), handle_(std::move(handle)) {}
  ~CudaEvent() override {
    cudaSetDevice(ordinal_);
    if (absl::Status s = CudaStatus(cudaEventDestroy(event_), "cudaEventDestroy"); !s.ok()) {
      TIERD_LOG(WARNING) << s;
    }
  }
  const std::string& handle() const override { return handle_; }
  cudaEvent_t get() const { return event_; }

 private:
  int ordinal_;
  cudaEvent_t event_;
  std::string handle_;
};

// A local event that keeps timing.
class CudaTimeMark final : public TimeMark {
 public:
  CudaTimeMark(int ordinal, cudaEvent_t event) : ordinal_(ordinal), event_(event) {}
  ~CudaTimeMark() override {
    cudaSetDevice(ordinal_);
    if (absl::Status s = CudaStatus(cudaEventDestroy(event_), "cudaEventDestroy"); !s.ok()) {
      TIERD_LOG(WARNING) << s;
    }
  }
  cudaEvent_t get() const { return event_; }

 private:
  int ordinal_;
  cudaEvent_t event_;
};

cudaStream_t Native(Stream& stream) { return static_cast<CudaStream&>(stream).get(); }
cudaEvent_t Native(Event& event) { return static_cast<CudaEvent&>(event).get(); }

void RunHostFunction(void* arg) {
  auto* fn = static_cast<absl::AnyInvocable<void() &&>*>(arg);
  std::move (*fn)();
  delete fn;
}

class CudaDevice final : public Device {
 public:
  CudaDevice(int ordinal, std::string description, int lowest_priority, int highest_priority,
             size_t max_pitch)
      : ordinal_(ordinal),
        description_(std::move(description)),
        lowest_priority_(lowest_priority),
        highest_priority_(highest_priority),
        max_pitch_(max_pitch) {}

  std::string Describe() const override { return description_; }
  const char* backend() const override { return "cuda"; }
  int ordinal() const override { return ordinal_; }

  absl::Status CheckHealth() override {
    RETURN_IF_ERROR(Activate());
    // A driver call that reaches the GPU without queueing work: it fails once the GPU is gone
    // (cudaErrorDevicesUnavailable and the like) and reports a sticky error left by any earlier
    // failure in this context.
    size_t free_bytes = 0;
    size_t total_bytes = 0;
    return CudaStatus(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  }

  absl::StatusOr<uint64_t> FreeMemoryBytes() override {
    RETURN_IF_ERROR(Activate());
    size_t free_bytes = 0;
    size_t total_bytes = 0;
    RETURN_IF_ERROR(CudaStatus(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo"));
    return static_cast<uint64_t>(free_bytes);
  }

  absl::StatusOr<std::unique_ptr<Slab>> AllocateSlab(size_t bytes) override {
    if (bytes == 0) return absl::InvalidArgumentError("slab of 0 bytes");
    RETURN_IF_ERROR(Activate());
    void* data = nullptr;
    RETURN_IF_ERROR(CudaStatus(cudaMalloc(&data, bytes), absl::StrCat("cudaMalloc ", bytes)));
    cudaIpcMemHandle_t ipc;
    if (absl::Status s = CudaStatus(cudaIpcGetMemHandle(&ipc, data), "cudaIpcGetMemHandle");
        !s.ok()) {
      cudaFree(data);
      return s;
    }
    return std::unique_ptr<Slab>(
        new CudaSlab(ordinal_, data, bytes, EncodeCudaSlabHandle(bytes, BytesOf(ipc))));
  }

  absl::Status RegisterHostMemory(void* data, size_t bytes) override {
    // Mapped too, so a kernel can store to it (DecodeAsync's verdict).
    return HostRegister(data, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped);
  }

  absl::Status RegisterReadOnlyHostMemory(const void* data, size_t bytes) override {
    RETURN_IF_ERROR(Activate());
    int supported = 0;
    RETURN_IF_ERROR(CudaStatus(
        cudaDeviceGetAttribute(&supported, cudaDevAttrHostRegisterReadOnlySupported, ordinal_),
        "cudaDeviceGetAttribute(cudaDevAttrHostRegisterReadOnlySupported)"));
    if (supported == 0) {
      return absl::UnimplementedError(
          absl::StrCat("cuda:", ordinal_,
                       " cannot register read-only host memory "
                       "(cudaDevAttrHostRegisterReadOnlySupported is 0)"));
    }
    // cudaHostRegisterReadOnly: the driver maps the pages for reading only, and never writes them.
    return HostRegister(const_cast<void*>(data), bytes,
                        cudaHostRegisterPortable | cudaHostRegisterReadOnly);
  }

  absl::Status UnregisterHostMemory(void* data) override {
    RETURN_IF_ERROR(Activate());
    return CudaStatus(cudaHostUnregister(data), "cudaHostUnregister");
  }

  absl::StatusOr<std::unique_ptr<Stream>> CreateStream(StreamPriority priority) override {
    RETURN_IF_ERROR(Activate());
    cudaStream_t stream;
    const int value = priority == StreamPriority::kHigh ? highest_priority_ : lowest_priority_;
    RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, value),
                               "cudaStreamCreateWithPriority"));
    return std::unique_ptr<Stream>(new CudaStream(ordinal_, stream, value));
  }

  absl::StatusOr<std::unique_ptr<Event>> CreateEvent() override {
    RETURN_IF_ERROR(Activate());
    cudaEvent_t event;
    RETURN_IF_ERROR(
        CudaStatus(cudaEventCreateWithFlags(&event, cudaEventInterprocess | cudaEventDisableTiming),
                   "cudaEventCreateWithFlags"));
    cudaIpcEventHandle_t ipc;
    if (absl::Status s = CudaStatus(cudaIpcGetEventHandle(&ipc, event), "cudaIpcGetEventHandle");
        !s.ok()) {
      cudaEventDestroy(event);
      return s;
    }
    return std::unique_ptr<Event>(
        new CudaEvent(ordinal_, event, EncodeCudaEventHandle(BytesOf(ipc))));
  }

  absl::Status CopyAsync(Stream& stream, void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return absl::OkStatus();
    RETURN_IF_ERROR(Activate());
    return CudaStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, Native(stream)),
                      "cudaMemcpyAsync");
  }

  absl::Status CopyAsync2D(Stream& stream, void* dst, size_t dst_pitch, const void* src,
                           size_t src_pitch, size_t width, size_t rows) override {
    if (width == 0 || rows == 0) return absl::OkStatus();
    if (dst == nullptr || src == nullptr) {
      return absl::InvalidArgumentError("copy with a null pointer");
    }
    if (rows == 1) return CopyAsync(stream, dst, src, width);
    if (dst_pitch < width || src_pitch < width) {
      return absl::InvalidArgumentError(absl::StrCat(
          "2-D copy of rows of ", width, " bytes with pitches ", dst_pitch, " and ", src_pitch));
    }
    RETURN_IF_ERROR(Activate());
    if (dst_pitch <= max_pitch_ && src_pitch <= max_pitch_) {
      return CudaStatus(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, rows,
                                          cudaMemcpyDefault, Native(stream)),
                        "cudaMemcpy2DAsync");
    }
    // Rows further apart than a 2-D copy may step: one copy each.
    for (size_t r = 0; r < rows; ++r) {
      RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(static_cast<uint8_t*>(dst) + r * dst_pitch,
                                                 static_cast<const uint8_t*>(src) + r * src_pitch,
                                                 width, cudaMemcpyDefault, Native(stream)),
                                 "cudaMemcpyAsync"));
    }
    return absl::OkStatus();
  }

  absl::Status DecodeAsync(Stream& stream, const codec::CompressedLayout& layout,
                           const codec::TileTables& tables, const void* tiles, void* dst,
                           uint64_t first_tile, uint64_t tile_count, uint32_t* verdict) override {
    RETURN_IF_ERROR(
        CheckDecodeArguments(layout, tables, tiles, dst, first_tile, tile_count, verdict));
    RETURN_IF_ERROR(Activate());
    void* device_verdict = nullptr;
    RETURN_IF_ERROR(CudaStatus(cudaHostGetDevicePointer(&device_verdict, verdict, 0),
                               "cudaHostGetDevicePointer (the verdict)"));
    return CudaStatus(LaunchExponentDecode(layout, tables, tiles, dst, first_tile, tile_count,
                                           static_cast<uint32_t*>(device_verdict), Native(stream)),
                      "the exponent decoder's launch");
  }

  absl::StatusOr<std::unique_ptr<TimeMark>> CreateTimeMark() override {
    RETURN_IF_ERROR(Activate());
    cudaEvent_t event;
    RETURN_IF_ERROR(
        CudaStatus(cudaEventCreateWithFlags(&event, cudaEventDefault), "cudaEventCreateWithFlags"));
    return std::unique_ptr<TimeMark>(new CudaTimeMark(ordinal_, event));
  }

  absl::Status RecordTimeMark(TimeMark& mark, Stream& stream) override {
    RETURN_IF_ERROR(Activate());
    return CudaStatus(cudaEventRecord(static_cast<CudaTimeMark&>(mark).get(), Native(stream)),
                      "cudaEventRecord");
  }

  absl::StatusOr<absl::Duration> TimeBetween(TimeMark& start, TimeMark& end) override {
    RETURN_IF_ERROR(Activate());
    float milliseconds = 0;
    const cudaError_t error =
        cudaEventElapsedTime(&milliseconds, static_cast<CudaTimeMark&>(start).get(),
                             static_cast<CudaTimeMark&>(end).get());
    if (error == cudaErrorNotReady || error == cudaErrorInvalidResourceHandle) {
      (void)cudaGetLastError();
      return absl::FailedPreconditionError("a time mark not yet reached by its stream");
    }
    RETURN_IF_ERROR(CudaStatus(error, "cudaEventElapsedTime"));
    return absl::Microseconds(static_cast<double>(milliseconds) * 1000.0);
  }

  absl::Status RecordEvent(Event& event, Stream& stream) override {
    RETURN_IF_ERROR(Activate());
    return CudaStatus(cudaEventRecord(Native(event), Native(stream)), "cudaEventRecord");
  }

  absl::Status WaitEvent(Stream& stream, Event& event) override {
    RETURN_IF_ERROR(Activate());
    return CudaStatus(cudaStreamWaitEvent(Native(stream), Native(event), 0), "cudaStreamWaitEvent");
  }

  absl::StatusOr<bool> QueryEvent(Event& event) override {
    RETURN_IF_ERROR(Activate());
    const cudaError_t error = cudaEventQuery(Native(event));
    if (error == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    RETURN_IF_ERROR(CudaStatus(error, "cudaEventQuery"));
    return true;
  }

  absl::Status SynchronizeEvent(Event& event) override {
    RETURN_IF_ERROR(Activate());
    return CudaStatus(cudaEventSynchronize(Native(event)), "cudaEventSynchronize");
  }

  absl::Status SynchronizeStream(Stream& stream) override {
    RETURN_IF_ERROR(Activate());
    return CudaStatus(cudaStreamSynchronize(Native(stream)), "cudaStreamSynchronize");
  }

  absl::StatusOr<bool> QueryStream(Stream& stream) override {
    RETURN_IF_ERROR(Activate());
    const cudaError_t error = cudaStreamQuery(Native(stream));
    if (error == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    RETURN_IF_ERROR(CudaStatus(error, "cudaStreamQuery"));
    return true;
  }

  absl::Status LaunchHostFunction(Stream& stream, absl::AnyInvocable<void() &&> fn) override {
    RETURN_IF_ERROR(Activate());
    auto* heap_fn = new absl::AnyInvocable<void() &&>(std::move(fn));
    absl::Status status = CudaStatus(cudaLaunchHostFunc(Native(stream), &RunHostFunction, heap_fn),
                                     "cudaLaunchHostFunc");
    if (!status.ok()) delete heap_fn;
    return status;
  }

  absl::Status NotifyWhenDone(Stream& stream, absl::AnyInvocable<void() &&> done) override {
    RETURN_IF_ERROR(Activate());
    // The driver thread only hands the callback over; it runs on completions_, where it may call
    // CUDA.
    auto* heap_fn = new absl::AnyInvocable<void() &&>(
        [this, done = std::move(done)]() mutable { completions_.Post(std::move(done)); });
    absl::Status status =
        static_cast<CudaStream&>(stream).LaunchHostFunctionBeside(&RunHostFunction, heap_fn);
    if (!status.ok()) delete heap_fn;
    return status;
  }

  absl::StatusOr<std::unique_ptr<Slab>> OpenSlab(absl::string_view handle) override {
    ASSIGN_OR_RETURN(const CudaSlabHandle parsed, ParseCudaSlabHandle(handle));
    const uint64_t size = parsed.size;
    cudaIpcMemHandle_t ipc;
    if (parsed.ipc_handle.size() != sizeof(ipc)) {
      return absl::InvalidArgumentError("not a CUDA slab handle");
    }
    std::memcpy(&ipc, parsed.ipc_handle.data(), sizeof(ipc));
    if (size == 0) return absl::InvalidArgumentError("CUDA slab handle of size 0");
    std::string key;
    ASSIGN_OR_RETURN(void* data, ImportedMappings::Open(ordinal_, ipc, key));
    return std::unique_ptr<Slab>(
        new CudaSlab(ordinal_, data, size, std::string(handle), std::move(key)));
  }

  absl::StatusOr<std::unique_ptr<Event>> OpenEvent(absl::string_view handle) override {
    ASSIGN_OR_RETURN(const absl::string_view ipc_bytes, ParseCudaEventHandle(handle));
    cudaIpcEventHandle_t ipc;
    if (ipc_bytes.size() != sizeof(ipc))
      return absl::InvalidArgumentError("not a CUDA event handle");
    std::memcpy(&ipc, ipc_bytes.data(), sizeof(ipc));
    RETURN_IF_ERROR(Activate());
    cudaEvent_t event;
    RETURN_IF_ERROR(CudaStatus(cudaIpcOpenEventHandle(&event, ipc), "cudaIpcOpenEventHandle"));
    return std::unique_ptr<Event>(new CudaEvent(ordinal_, event, std::string(handle)));
  }

 private:
  // cudaHostRegister with `flags`, its failures explained.
  absl::Status HostRegister(void* data, size_t bytes, unsigned int flags) {
    if (data == nullptr || bytes == 0) {
      return absl::InvalidArgumentError("registering a null or empty host range");
    }
    RETURN_IF_ERROR(Activate());
    absl::Status status = CudaStatus(cudaHostRegister(data, bytes, flags),
                                     absl::StrCat("cudaHostRegister ", bytes, " bytes"));
    if (status.code() == absl::StatusCode::kInternal ||
        status.code() == absl::StatusCode::kResourceExhausted) {
      // The usual cause is RLIMIT_MEMLOCK: say so, since the CUDA message does not.
      return absl::ResourceExhaustedError(
          absl::StrCat(status.message(), "; is the memlock limit (ulimit -l) high enough?"));
    }
    return status;
  }
  // The runtime's current device is per thread; every entry point selects ours first.
  absl::Status Activate() const { return CudaStatus(cudaSetDevice(ordinal_), "cudaSetDevice"); }

  const int ordinal_;
  const std::string description_;
  const int lowest_priority_;
  const int highest_priority_;
  const size_t max_pitch_;  // the most a 2-D copy's pitch may be (cudaDeviceProp::memPitch)
  CompletionThread completions_;
};

}  // namespace

void* NativeCudaStream(Stream& stream) { return Native(stream); }

absl::StatusOr<int> CudaDeviceCount() {
  int count = 0;
  RETURN_IF_ERROR(CudaStatus(cudaGetDeviceCount(&count), "cudaGetDeviceCount"));
  if (count == 0) return absl::UnavailableError("no CUDA device is visible");
  return count;
}

absl::StatusOr<std::unique_ptr<Device>> CreateCudaDevice(int ordinal) {
  ASSIGN_OR_RETURN(const int count, CudaDeviceCount());
  if (ordinal < 0 || ordinal >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda:", ordinal, " does not exist; ", count, " GPU(s) visible"));
  }
  // Host waits sleep instead of spinning a core. The flags can only be chosen while the primary
  // context does not exist yet; a process that already made one (a client embedding this) keeps
  // its own setting.
  const cudaError_t init = cudaInitDevice(ordinal, cudaDeviceScheduleBlockingSync, 0);
  if (init != cudaSuccess && init != cudaErrorSetOnActiveProcess) {
    return CudaStatus(init, "cudaInitDevice");
  }
  (void)cudaGetLastError();
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(ordinal), "cudaSetDevice"));
  RETURN_IF_ERROR(CudaStatus(cudaFree(nullptr), "creating the CUDA context"));
  cudaDeviceProp properties;
  RETURN_IF_ERROR(
      CudaStatus(cudaGetDeviceProperties(&properties, ordinal), "cudaGetDeviceProperties"));
  int lowest = 0;
  int highest = 0;
  RETURN_IF_ERROR(CudaStatus(cudaDeviceGetStreamPriorityRange(&lowest, &highest),
                             "cudaDeviceGetStreamPriorityRange"));
  return std::unique_ptr<Device>(
      new CudaDevice(ordinal, absl::StrCat("cuda:", ordinal, " (", properties.name, ")"), lowest,
                     highest, properties.memPitch));
}

}  // namespace tierd
