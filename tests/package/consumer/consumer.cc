// consumer SOCKET: what a model server does with the installed client library, on a daemon of the
// host backend (whose leases are host memory the process can read): stores 1 MiB, fetches it back
// and compares every byte, then prints the daemon's version. Exits 0 when all of it worked.
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "client/tierd_client.h"

namespace {

int Fail(const std::string& what, const absl::Status& status) {
  std::fprintf(stderr, "consumer: %s: %s\n", what.c_str(), status.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: consumer SOCKET\n");
    return 2;
  }
  tierd::ClientOptions options;
  options.socket_path = argv[1];
  options.client_name = "package-consumer";
  absl::StatusOr<std::unique_ptr<tierd::Client>> client = tierd::Client::Connect(options);
  if (!client.ok()) return Fail("connect", client.status());
  absl::StatusOr<std::unique_ptr<tierd::Session>> session = (*client)->OpenSession();
  if (!session.ok()) return Fail("open session", session.status());

  std::vector<unsigned char> bytes(1 << 20);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<unsigned char>(i * 131 + 7);
  tierd::StoreRequest store;
  store.key = "consumer/bytes";
  store.data = bytes.data();
  store.size = bytes.size();
  if (absl::Status s = (*session)->StoreAsync(store); !s.ok()) return Fail("store", s);
  if (absl::Status s = (*session)->Flush(); !s.ok()) return Fail("flush", s);

  absl::StatusOr<tierd::Lease> lease = (*session)->Fetch(store.key);
  if (!lease.ok()) return Fail("fetch", lease.status());
  if (lease->size() != bytes.size() ||
      std::memcmp(lease->data(), bytes.data(), bytes.size()) != 0) {
    std::fprintf(stderr, "consumer: the fetched bytes differ from those stored\n");
    return 1;
  }
  lease->Release();

  absl::StatusOr<tierd::v1::Stats> stats = (*client)->GetStats();
  if (!stats.ok()) return Fail("stats", stats.status());
  std::printf("consumer: 1 MiB stored and fetched back intact from tierd %s on %s\n",
              stats->version().c_str(), stats->device().c_str());
  return 0;
}
