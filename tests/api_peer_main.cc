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
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/tierd_client.h"
#include "device/pinned_host_buffer.h"

namespace {

std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

// Copies the lease's bytes to host memory through the lease's stream (the buffer is device memory
// in general) and compares each tensor with its expected file. Returns an error naming the first
// mismatch.
absl::Status CheckLease(tierd::Session& session, tierd::Lease& lease,
                        const std::string& expected_dir) {
  std::string copy(lease.size(), '\0');
  tierd::Device& device = session.device();
  tierd::Stream& stream = session.default_stream();
  absl::Status status = device.CopyAsync(stream, copy.data(), lease.data(), lease.size());
  if (status.ok()) status = device.SynchronizeStream(stream);
  if (!status.ok()) return status;
  if (lease.tensors().empty()) return absl::InternalError(lease.key() + " has no tensors");
  for (const tierd::v1::TensorInfo& tensor : lease.tensors()) {
    const std::string expected = ReadWholeFile(absl::StrCat(expected_dir, "/", tensor.name()));
    if (expected.size() != tensor.size() ||
        copy.compare(tensor.offset(), tensor.size(), expected) != 0) {
      return absl::DataLossError(absl::StrCat(lease.key(), ": tensor ", tensor.name(),
                                              " differs from the file's bytes"));
    }
  }
  return absl::OkStatus();
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "api_peer: %s\n", status.ToString().c_str());
  return 1;
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

int Hold(tierd::Client& client, const std::string& key, const std::string& expected_dir,
         int seconds) {
  absl::StatusOr<std::unique_ptr<tierd::Session>> session = client.OpenSession();
  if (!session.ok()) return Fail(session.status());
  absl::StatusOr<tierd::Lease> lease = (*session)->Fetch(key);
  if (!lease.ok()) return Fail(lease.status());
  std::printf("holding\n");
  std::fflush(stdout);
  const absl::Time end = absl::Now() + absl::Seconds(seconds);
  int checks = 0;
  while (absl::Now() < end) {
    if (absl::Status status = CheckLease(**session, *lease, expected_dir); !status.ok()) {
      return Fail(status);
    }
    ++checks;
    absl::SleepFor(absl::Milliseconds(20));  // a slow consumer
  }
  std::printf("unchanged over %d checks\n", checks);
  return 0;
}

int HoldForever(tierd::Client& client, const std::string& key) {
  absl::StatusOr<std::unique_ptr<tierd::Session>> session = client.OpenSession();
  if (!session.ok()) return Fail(session.status());
  absl::StatusOr<tierd::Lease> lease = (*session)->Fetch(key);
  if (!lease.ok()) return Fail(lease.status());
  std::printf("holding\n");
  std::fflush(stdout);
  while (true) ::pause();
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() < 3) {
    std::fprintf(stderr, "usage: api_peer verify|hold|hold-forever SOCKET ...\n");
    return 2;
  }
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
  std::fprintf(stderr, "api_peer: bad arguments\n");
  return 2;
}
