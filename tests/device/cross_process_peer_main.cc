// The other process of the cross-process tests, started with exec by the test:
//
//   cross_process_peer DEVICE SLAB_HANDLE_HEX EVENT_HANDLE_HEX BYTES SEED
//
// 1. Opens the slab and event, makes its own stream wait on the event, copies the slab out and
//    checks every byte against pattern SEED. Prints "verified BYTES" (or "mismatch at OFFSET" and
//    exits 1).
// 2. Stalls its stream, writes pattern SEED+1 into the slab, records the event on its stream, and
//    prints "recorded" at once — before the write has happened — so the owner must wait on the
//    event to see the new bytes.
// 3. Waits for its stream, then for the owner to close its stdin, and exits 0.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/time/clock.h"
#include "device/device_factory.h"
#include "device/pinned_host_buffer.h"
#include "tests/test_support.h"

namespace {

int Fail(const std::string& what, const absl::Status& status) {
  std::printf("error %s: %s\n", what.c_str(), status.ToString().c_str());
  std::fflush(stdout);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  size_t bytes = 0;
  uint64_t seed = 0;
  if (argc != 6 || !absl::SimpleAtoi(argv[4], &bytes) || !absl::SimpleAtoi(argv[5], &seed)) {
    std::fprintf(stderr, "usage: %s DEVICE SLAB_HEX EVENT_HEX BYTES SEED\n", argv[0]);
    return 2;
  }
  auto spec = tierd::ParseDeviceSpec(argv[1]);
  if (!spec.ok()) return Fail("device spec", spec.status());
  auto device = tierd::CreateDevice(*spec);
  if (!device.ok()) return Fail("creating device", device.status());
  auto slab = (*device)->OpenSlab(absl::HexStringToBytes(argv[2]));
  if (!slab.ok()) return Fail("opening slab", slab.status());
  auto event = (*device)->OpenEvent(absl::HexStringToBytes(argv[3]));
  if (!event.ok()) return Fail("opening event", event.status());
  if ((*slab)->size() < bytes) return Fail("slab size", absl::OutOfRangeError("slab too small"));
  auto stream = (*device)->CreateStream(tierd::StreamPriority::kNormal);
  if (!stream.ok()) return Fail("creating stream", stream.status());
  auto buffer = tierd::PinnedHostBuffer::Create(**device, bytes);
  if (!buffer.ok()) return Fail("pinned buffer", buffer.status());
  tierd::Device& dev = **device;

  // 1. Read what the owner wrote, ordered by its event alone.
  absl::Status status = dev.WaitEvent(**stream, **event);
  if (status.ok()) status = dev.CopyAsync(**stream, (*buffer)->data(), (*slab)->data(), bytes);
  if (status.ok()) status = dev.SynchronizeStream(**stream);
  if (!status.ok()) return Fail("reading the slab", status);
  const int64_t mismatch = tierd::testing::FirstPatternMismatch((*buffer)->data(), bytes, seed);
  if (mismatch >= 0) {
    std::printf("mismatch at %lld\n", static_cast<long long>(mismatch));
    return 1;
  }
  std::printf("verified %zu\n", bytes);
  std::fflush(stdout);

  // 2. Write back, announced through the same event.
  tierd::testing::FillPattern((*buffer)->data(), bytes, seed + 1);
  status = dev.LaunchHostFunction(**stream, [] { absl::SleepFor(absl::Milliseconds(300)); });
  if (status.ok()) status = dev.CopyAsync(**stream, (*slab)->data(), (*buffer)->data(), bytes);
  if (status.ok()) status = dev.RecordEvent(**event, **stream);
  if (!status.ok()) return Fail("writing the slab", status);
  std::printf("recorded\n");
  std::fflush(stdout);

  // 3. Stay alive until the owner has read the bytes.
  status = dev.SynchronizeStream(**stream);
  if (!status.ok()) return Fail("finishing the write", status);
  char ignored[64];
  while (::read(STDIN_FILENO, ignored, sizeof(ignored)) > 0) {
  }
  return 0;
}
