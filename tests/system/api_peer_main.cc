// A tierd client in a process of its own, for api_test: several run against one daemon at once,
// and some are killed mid-lease.
//
//   api_peer verify SOCKET MODEL EXPECTED_DIR ROUNDS
//       every round: for each object of MODEL, prefetch the next one, fetch this one and compare
//       each of its tensors with EXPECTED_DIR/<tensor name>; exit 0 when all matched.
//   api_peer hold SOCKET KEY EXPECTED_DIR SECONDS
//       fetch KEY, print "holding", then re-read the leased bytes (slowly) for SECONDS and compare
//       them with the expected tensors each time; exit 0 when they never changed.
//   api_peer hold-forever SOCKET KEY
//       fetch KEY, print "holding" and sleep until killed.
//   api_peer hold-many SOCKET MODEL EXPECTED_DIR LEASES
//       fetch LEASES leases of MODEL's first objects, on two streams in turn, and compare each
//       with the expected tensors; print "holding", wait for a line on stdin, release them (each
//       on its stream), store an object and fetch it back; exit 0 when everything matched.
//   api_peer slow-read SOCKET KEY[,KEY...] EXPECTED_DIR DELAY_MS
//       fetch each KEY, enqueue a read of each that starts DELAY_MS later (on CUDA a kernel that
//       waits on the GPU, on the host backend a stalled stream), release the leases at once (more
//       than one: with one FetchMany, which names one done event for all) and print "released"
//       once the daemon has the releases; then wait for the reads and compare what they read with
//       the expected tensors.
//   api_peer host-lease SOCKET KEY
//       as a node's daemon does, on SOCKET's session socket: take a host lease on KEY, print
//       "held", wait for a line on stdin and exit holding it (its session ends with the process).
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/tierd_client.h"
#include "device/pinned_host_buffer.h"
#include "tests/storage_test_support.h"
#include "wire/session_socket.h"
#include "wire/wire_format.h"
#ifdef TIERD_TEST_CUDA_KERNELS
#include "device/cuda_device.h"
#include "tests/system/slow_copy_kernel.h"
#endif

namespace {

// Copies `size` bytes at `data` (device memory in general) to host memory through the session's
// stream and compares each of `tensors` with its expected file. Returns an error naming the first
// mismatch.
absl::Status CheckBytes(tierd::Session& session, const std::string& key, const void* data,
                        uint64_t size, const std::vector<tierd::v1::TensorInfo>& tensors,
                        const std::string& expected_dir) {
  std::string copy(size, '\0');
  tierd::Device& device = session.device();
  tierd::Stream& stream = session.default_stream();
  absl::Status status = device.CopyAsync(stream, copy.data(), data, size);
  if (status.ok()) status = device.SynchronizeStream(stream);
  if (!status.ok()) return status;
  if (tensors.empty()) return absl::InternalError(key + " has no tensors");
  for (const tierd::v1::TensorInfo& tensor : tensors) {
    const std::string expected =
        tierd::testing::ReadWholeFile(absl::StrCat(expected_dir, "/", tensor.name()));
    if (expected.size() != tensor.size() ||
        copy.compare(tensor.offset(), tensor.size(), expected) != 0) {
      return absl::DataLossError(
          absl::StrCat(key, ": tensor ", tensor.name(), " differs from the file's bytes"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckLease(tierd::Session& session, tierd::Lease& lease,
                        const std::string& expected_dir) {
  return CheckBytes(session, lease.key(), lease.data(), lease.size(), lease.tensors(),
                    expected_dir);
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "api_peer: %s\n", status.ToString().c_str());
  return 1;
}

int HoldHostLease(const std::string& socket, const std::string& key) {
  const std::string path = tierd::SessionSocketPathFor(socket);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::snprintf(address.sun_path, sizeof(address.sun_path), "%s", path.c_str());
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    return Fail(absl::UnavailableError(absl::StrCat("connecting to ", path)));
  }
  tierd::v1::SessionRequest open;
  open.set_request_id(1);
  open.mutable_open()->set_client_name("api_peer host-lease");
  open.mutable_open()->set_protocol(tierd::SessionProtocolVersion());
  open.mutable_open()->set_node_daemon(true);
  tierd::v1::SessionRequest fetch;
  fetch.set_request_id(2);
  fetch.mutable_fetch()->set_key(key);
  fetch.mutable_fetch()->set_local_only(true);
  fetch.mutable_fetch()->set_host_lease(true);
  absl::Status status =
      tierd::SendAll(fd, absl::StrCat(tierd::SessionSocketHello(), tierd::EncodeFrame(open),
                                      tierd::EncodeFrame(fetch)));
  std::string greeting(tierd::SessionSocketHello().size(), '\0');
  if (status.ok()) status = tierd::ReadExactly(fd, greeting.data(), greeting.size());
  for (int answer = 0; status.ok() && answer < 2; ++answer) {
    std::string payload;
    status = tierd::ReadFrame(fd, payload);
    tierd::v1::SessionResponse response;
    if (status.ok() && (!response.ParseFromString(payload) || response.code() != 0)) {
      status = absl::InternalError(absl::StrCat("answer ", answer, ": ", response.message()));
    }
  }
  if (!status.ok()) return Fail(status);
  std::printf("held\n");
  std::fflush(stdout);
  char line[16];
  if (std::fgets(line, sizeof(line), stdin) == nullptr) return 1;
  return 0;  // exits holding the lease
}

int Verify(tierd::Client& client, const std::string& model, const std::string& expected_dir,
           int rounds) {
  absl::StatusOr<std::vector<tierd::v1::ObjectInfo>> objects = client.ListObjects(model);
  if (!objects.ok()) return Fail(objects.status());
  absl::StatusOr<std::unique_ptr<tierd::Session>> session = client.OpenSession();
  if (!session.ok()) return Fail(session.status());
  for (int round = 0; round < rounds; ++round) {
    for (size_t i = 0; i < objects->size(); ++i) {
      const std::string& next = (*objects)[(i + 1) % objects->size()].key();
      if (absl::Status status = (*session)->Prefetch({next}); !status.ok()) return Fail(status);
      absl::StatusOr<tierd::Lease> lease = (*session)->Fetch((*objects)[i].key());
      if (!lease.ok()) return Fail(lease.status());
      if (absl::Status status = CheckLease(**session, *lease, expected_dir); !status.ok()) {
        return Fail(status);
      }
    }
  }
  std::printf("verified %d round(s) of %zu objects\n", rounds, objects->size());
  return 0;
}

// A lease and the session it belongs to (declared first, so destroyed last).
struct Held {
  std::unique_ptr<tierd::Session> session;
  tierd::Lease lease;
};

// Opens a session, fetches `key` and prints "holding".
absl::StatusOr<Held> FetchAndHold(tierd::Client& client, const std::string& key) {
  Held held;
  absl::StatusOr<std::unique_ptr<tierd::Session>> session = client.OpenSession();
  if (!session.ok()) return session.status();
  held.session = *std::move(session);
  absl::StatusOr<tierd::Lease> lease = held.session->Fetch(key);
  if (!lease.ok()) return lease.status();
  held.lease = *std::move(lease);
  std::printf("holding\n");
  std::fflush(stdout);
  return held;
}

int Hold(tierd::Client& client, const std::string& key, const std::string& expected_dir,
         int seconds) {
  absl::StatusOr<Held> held = FetchAndHold(client, key);
  if (!held.ok()) return Fail(held.status());
  const absl::Time end = absl::Now() + absl::Seconds(seconds);
  int checks = 0;
  while (absl::Now() < end) {
    if (absl::Status status = CheckLease(*held->session, held->lease, expected_dir); !status.ok()) {
      return Fail(status);
    }
    ++checks;
    absl::SleepFor(absl::Milliseconds(20));  // a slow consumer
  }
  std::printf("unchanged over %d checks\n", checks);
  return 0;
}

int HoldForever(tierd::Client& client, const std::string& key) {
  absl::StatusOr<Held> held = FetchAndHold(client, key);
  if (!held.ok()) return Fail(held.status());
  while (true) ::pause();
}

int HoldMany(tierd::Client& client, const std::string& model, const std::string& expected_dir,
             int leases) {
  absl::StatusOr<std::vector<tierd::v1::ObjectInfo>> objects = client.ListObjects(model);
  if (!objects.ok()) return Fail(objects.status());
  absl::StatusOr<std::unique_ptr<tierd::Session>> session = client.OpenSession();
  if (!session.ok()) return Fail(session.status());
  tierd::Device& device = (*session)->device();
  absl::StatusOr<std::unique_ptr<tierd::Stream>> other =
      device.CreateStream(tierd::StreamPriority::kNormal);
  if (!other.ok()) return Fail(other.status());
  tierd::Stream* streams[] = {&(*session)->default_stream(), other->get()};
  // Few objects, so that the staging pool holds all of them while every lease is held.
  const size_t distinct = std::min<size_t>(objects->size(), 4);
  std::vector<tierd::Lease> held;
  for (int i = 0; i < leases; ++i) {
    tierd::Stream& stream = *streams[i % 2];
    absl::StatusOr<tierd::Lease> lease = (*session)->Fetch((*objects)[i % distinct].key(), stream);
    if (!lease.ok()) return Fail(lease.status());
    // The lease is readable on `stream` (it waits for the copy into staging); CheckLease reads on
    // the session's own stream, so it waits for `stream` first.
    absl::Status status = device.SynchronizeStream(stream);
    if (status.ok()) status = CheckLease(**session, *lease, expected_dir);
    if (!status.ok()) return Fail(status);
    held.push_back(*std::move(lease));
  }
  std::printf("holding\n");
  std::fflush(stdout);
  char line[16];
  if (std::fgets(line, sizeof(line), stdin) == nullptr) return Fail(absl::AbortedError("no go"));
  for (size_t i = 0; i < held.size(); ++i) held[i].Release(*streams[i % 2]);
  const std::string key = absl::StrCat("many/", ::getpid());
  const std::string bytes(64 << 10, static_cast<char>(::getpid()));
  tierd::StoreRequest store;
  store.key = key;
  store.data = bytes.data();
  store.size = bytes.size();
  absl::Status status = (*session)->StoreAsync(store);
  if (status.ok()) status = (*session)->Flush();
  if (!status.ok()) return Fail(status);
  absl::StatusOr<tierd::Lease> fetched = (*session)->Fetch(key);
  if (!fetched.ok()) return Fail(fetched.status());
  std::string copy(fetched->size(), '\0');
  status =
      device.CopyAsync((*session)->default_stream(), copy.data(), fetched->data(), fetched->size());
  if (status.ok()) status = device.SynchronizeStream((*session)->default_stream());
  if (!status.ok()) return Fail(status);
  if (copy != bytes) return Fail(absl::DataLossError(key + " came back different"));
  std::printf("released %d leases, stored and fetched %s\n", leases, key.c_str());
  return 0;
}

// Enqueues on `stream` a copy of `bytes` from `src` to `dst` that starts `delay` from now.
absl::Status EnqueueSlowCopy(tierd::Session& session, tierd::Stream& stream, void* dst,
                             const void* src, uint64_t bytes, absl::Duration delay) {
  if (session.info().backend() == "cuda") {
#ifdef TIERD_TEST_CUDA_KERNELS
    const std::string error =
        tierd::testing::LaunchSlowCopy(tierd::NativeCudaStream(stream), dst, src, bytes,
                                       static_cast<uint64_t>(absl::ToInt64Nanoseconds(delay)));
    return error.empty() ? absl::OkStatus() : absl::InternalError("slow copy kernel: " + error);
#else
    return absl::UnimplementedError("this api_peer was built without CUDA kernels");
#endif
  }
  tierd::Device& device = session.device();
  absl::Status status = device.LaunchHostFunction(stream, [delay] { absl::SleepFor(delay); });
  if (status.ok()) status = device.CopyAsync(stream, dst, src, bytes);
  return status;
}

int SlowRead(tierd::Client& client, const std::vector<std::string>& keys,
             const std::string& expected_dir, int delay_ms) {
  absl::StatusOr<std::unique_ptr<tierd::Session>> session = client.OpenSession();
  if (!session.ok()) return Fail(session.status());
  tierd::Device& device = (*session)->device();
  absl::StatusOr<std::unique_ptr<tierd::Stream>> stream =
      device.CreateStream(tierd::StreamPriority::kNormal);
  if (!stream.ok()) return Fail(stream.status());
  absl::StatusOr<std::vector<tierd::Lease>> leases = (*session)->FetchMany(keys, **stream);
  if (!leases.ok()) return Fail(leases.status());
  struct Read {
    std::unique_ptr<tierd::Slab> copy;
    uint64_t size;
    std::vector<tierd::v1::TensorInfo> tensors;
  };
  std::vector<Read> reads;
  for (tierd::Lease& lease : *leases) {
    absl::StatusOr<std::unique_ptr<tierd::Slab>> copy = device.AllocateSlab(lease.size());
    if (!copy.ok()) return Fail(copy.status());
    absl::Status status = EnqueueSlowCopy(**session, **stream, (*copy)->data(), lease.data(),
                                          lease.size(), absl::Milliseconds(delay_ms));
    if (!status.ok()) return Fail(status);
    reads.push_back({*std::move(copy), lease.size(), lease.tensors()});
  }
  // The done event completes only after the slow copies. One lease is released by itself;
  // several by one FetchMany, whose releases name one done event.
  if (leases->size() == 1) {
    leases->front().Release(**stream);
  } else {
    absl::StatusOr<std::vector<tierd::Lease>> none =
        (*session)->FetchMany({}, **stream, *std::move(leases));
    if (!none.ok()) return Fail(none.status());
  }
  // A release is sent without waiting for an answer; a request answered after it (one session's
  // requests are handled in order) says the daemon has it before "released" is printed.
  if (absl::Status barrier = (*session)->Unpin("barrier/never-pinned");
      barrier.code() != absl::StatusCode::kFailedPrecondition) {
    return Fail(barrier);
  }
  std::printf("released\n");
  std::fflush(stdout);
  if (absl::Status status = device.SynchronizeStream(**stream); !status.ok()) return Fail(status);
  for (size_t i = 0; i < keys.size(); ++i) {
    if (absl::Status status = CheckBytes(**session, keys[i], reads[i].copy->data(), reads[i].size,
                                         reads[i].tensors, expected_dir);
        !status.ok()) {
      return Fail(status);
    }
  }
  std::printf("read after the release matched\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() < 3) {
    std::fprintf(stderr,
                 "usage: api_peer verify|hold|hold-forever|hold-many|slow-read|host-lease SOCKET "
                 "...\n");
    return 2;
  }
  if (args[0] == "host-lease" && args.size() == 3) return HoldHostLease(args[1], args[2]);
  tierd::ClientOptions options;
  options.socket_path = args[1];
  options.client_name = absl::StrCat("api_peer ", args[0], " pid ", ::getpid());
  absl::StatusOr<std::unique_ptr<tierd::Client>> client = tierd::Client::Connect(options);
  if (!client.ok()) return Fail(client.status());
  int number = 0;
  if (args[0] == "verify" && args.size() == 5 && absl::SimpleAtoi(args[4], &number)) {
    return Verify(**client, args[2], args[3], number);
  }
  if (args[0] == "hold" && args.size() == 5 && absl::SimpleAtoi(args[4], &number)) {
    return Hold(**client, args[2], args[3], number);
  }
  if (args[0] == "hold-forever" && args.size() == 3) return HoldForever(**client, args[2]);
  if (args[0] == "hold-many" && args.size() == 5 && absl::SimpleAtoi(args[4], &number)) {
    return HoldMany(**client, args[2], args[3], number);
  }
  if (args[0] == "slow-read" && args.size() == 5 && absl::SimpleAtoi(args[4], &number)) {
    return SlowRead(**client, absl::StrSplit(args[2], ','), args[3], number);
  }
  std::fprintf(stderr, "api_peer: bad arguments\n");
  return 2;
}
