// arena_pin_bench: how long the host arena takes to pin, by number of pinning threads and way of
// faulting the pages in, beside one thread touching every page and then registering, in one run.
//
//   arena_pin_bench --bytes=64GiB --device=cuda:0 --threads=1,4,8,16 --prefault=populate,touch,none
//                   --json=out.json
//
// For each prefault and thread count it creates a HostArena of --bytes and reports the time until
// Create returned (when the daemon would serve), the time until the whole arena was pinned, the
// GiB/s that makes, and how long the arena took to go (unregistering). The reference maps the same
// bytes, touches one byte per page on one thread, then registers the region piece by piece: it
// splits the cost into faulting the pages in and the registration proper.
#include <sys/mman.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench/bench_support.h"
#include "common/byte_size.h"
#include "common/command_line.h"
#include "device/device_factory.h"
#include "device/pinned_host_buffer.h"
#include "storage/host/host_arena.h"

ABSL_FLAG(tierd::ByteSize, bytes, tierd::ByteSize{4ull << 30}, "Size of the arena to pin");
ABSL_FLAG(tierd::ByteSize, piece_bytes, tierd::ByteSize{1ull << 30},
          "Pinned one piece at a time (the daemon's piece size)");
ABSL_FLAG(std::string, device, "auto", "Device that pins the arena: auto, host or cuda:N");
ABSL_FLAG(std::vector<std::string>, threads, std::vector<std::string>({"1", "4", "8", "16"}),
          "Pinning thread counts to measure, comma-separated");
ABSL_FLAG(std::string, prefault, "touch",
          "Ways to fault pages in before registering, comma-separated: populate, touch, none");
ABSL_FLAG(bool, huge_pages, true, "Ask for transparent huge pages (MADV_HUGEPAGE)");
ABSL_FLAG(bool, reference, true, "Also time one thread touching, then registering");
ABSL_FLAG(std::string, json, "", "Write the results here as JSON");

namespace {

using tierd::bench::Die;

double Seconds(absl::Time since) { return absl::ToDoubleSeconds(absl::Now() - since); }
double GibPerSecond(uint64_t bytes, double seconds) { return bytes / seconds / (1ull << 30); }

std::vector<tierd::PagePrefault> ParsePrefaults(const std::string& text) {
  std::vector<tierd::PagePrefault> prefaults;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    std::optional<tierd::PagePrefault> prefault = tierd::ParsePagePrefault(part);
    if (!prefault) Die(absl::StrCat("--prefault: \"", part, "\" is not populate, touch or none"));
    prefaults.push_back(*prefault);
  }
  if (prefaults.empty()) Die("--prefault names no way");
  return prefaults;
}

// One thread: map, touch one byte per page, register piece by piece, unregister, unmap.
nlohmann::json TouchThenRegister(tierd::Device& device, uint64_t bytes, uint64_t piece) {
  void* mapped = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapped == MAP_FAILED) Die("cannot map the reference region");
  uint8_t* data = static_cast<uint8_t*>(mapped);
  if (absl::GetFlag(FLAGS_huge_pages)) ::madvise(data, bytes, MADV_HUGEPAGE);  // best effort
  const absl::Time touch_start = absl::Now();
  volatile uint8_t* pages = data;
  for (uint64_t offset = 0; offset < bytes; offset += tierd::PageSize()) pages[offset] = 0;
  const double touch_s = Seconds(touch_start);
  const absl::Time register_start = absl::Now();
  for (uint64_t offset = 0; offset < bytes; offset += piece) {
    const uint64_t size = std::min(piece, bytes - offset);
    if (absl::Status status = device.RegisterHostMemory(data + offset, size); !status.ok()) {
      Die(absl::StrCat("reference registration: ", status.ToString()));
    }
  }
  const double register_s = Seconds(register_start);
  for (uint64_t offset = 0; offset < bytes; offset += piece) {
    if (absl::Status status = device.UnregisterHostMemory(data + offset); !status.ok()) {
      Die(absl::StrCat("reference unregistration: ", status.ToString()));
    }
  }
  ::munmap(data, bytes);
  std::printf(
      "reference, 1 thread: touch %.2f s (%.2f GiB/s), then register %.2f s (%.2f GiB/s): "
      "%.2f GiB/s in all\n",
      touch_s, GibPerSecond(bytes, touch_s), register_s, GibPerSecond(bytes, register_s),
      GibPerSecond(bytes, touch_s + register_s));
  return {{"touch_s", touch_s},
          {"touch_gib_per_s", GibPerSecond(bytes, touch_s)},
          {"register_s", register_s},
          {"register_gib_per_s", GibPerSecond(bytes, register_s)},
          {"gib_per_s", GibPerSecond(bytes, touch_s + register_s)}};
}

nlohmann::json PinArena(tierd::Device& device, const tierd::HostArenaOptions& options) {
  const absl::Time start = absl::Now();
  auto arena = tierd::HostArena::Create(device, options);
  if (!arena.ok()) Die(arena.status().ToString());
  const double serving_s = Seconds(start);
  if (!(*arena)->WaitUntilFullyPinned(absl::InfiniteDuration())) {
    Die(absl::StrCat("pinning failed: ", (*arena)->pin_status().ToString()));
  }
  const double pinned_s = Seconds(start);
  const int threads = (*arena)->pin_threads();
  const absl::Time destroy_start = absl::Now();
  arena->reset();
  const double destroy_s = Seconds(destroy_start);
  const double gib_per_s = GibPerSecond(options.bytes, pinned_s);
  // The arena uses no more threads than there are pieces after the first.
  std::printf(
      "%-8s %2d thread(s): serving after %.3f s, pinned after %.2f s (%.2f GiB/s), "
      "gone in %.2f s\n",
      tierd::PagePrefaultName(options.prefault), threads, serving_s, pinned_s, gib_per_s,
      destroy_s);
  return {{"prefault", tierd::PagePrefaultName(options.prefault)},
          {"threads_asked", options.pin_threads},
          {"threads", threads},
          {"serving_s", serving_s},
          {"pinned_s", pinned_s},
          {"gib_per_s", gib_per_s},
          {"destroy_s", destroy_s}};
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "arena_pin_bench [--bytes=4GiB] [--device=auto] [--threads=1,4,8,16] "
      "[--prefault=populate,touch,none] [--json=PATH]");
  if (absl::StatusOr<std::vector<std::string>> parsed =
          tierd::ParseFlagsAndArguments(argc, argv, {__FILE__, {}});
      !parsed.ok()) {
    std::fprintf(stderr, "arena_pin_bench: %s\n", std::string(parsed.status().message()).c_str());
    return 2;
  }
  const uint64_t bytes = absl::GetFlag(FLAGS_bytes).bytes;
  const uint64_t piece = absl::GetFlag(FLAGS_piece_bytes).bytes;
  if (bytes == 0 || piece == 0) Die("--bytes and --piece-bytes must be more than 0");
  const std::vector<int> thread_counts =
      tierd::bench::ParseThreadCounts(absl::GetFlag(FLAGS_threads), "threads");
  const std::vector<tierd::PagePrefault> prefaults = ParsePrefaults(absl::GetFlag(FLAGS_prefault));

  auto spec = tierd::ParseDeviceSpec(absl::GetFlag(FLAGS_device));
  if (!spec.ok()) Die(spec.status().ToString());
  auto device = tierd::CreateDevice(*spec);
  if (!device.ok()) Die(device.status().ToString());
  std::printf("pinning %s in pieces of %s through %s\n", tierd::FormatByteSize(bytes).c_str(),
              tierd::FormatByteSize(piece).c_str(), (*device)->Describe().c_str());

  nlohmann::json result = {
      {"benchmark", "arena_pin"},
      {"date", tierd::bench::TodayUtc()},
      {"bytes", bytes},
      {"piece_bytes", piece},
      {"device", (*device)->Describe()},
      {"huge_pages", absl::GetFlag(FLAGS_huge_pages)},
  };
  if (absl::GetFlag(FLAGS_reference)) {
    result["reference_touch_then_register"] = TouchThenRegister(**device, bytes, piece);
  }
  nlohmann::json runs = nlohmann::json::array();
  for (tierd::PagePrefault prefault : prefaults) {
    for (int threads : thread_counts) {
      tierd::HostArenaOptions options;
      options.bytes = bytes;
      options.pin_piece_bytes = piece;
      options.pin_threads = threads;
      options.prefault = prefault;
      options.huge_pages = absl::GetFlag(FLAGS_huge_pages);
      runs.push_back(PinArena(**device, options));
    }
  }
  result["runs"] = runs;
  if (const std::string json = absl::GetFlag(FLAGS_json); !json.empty()) {
    std::ofstream(json) << result.dump(2) << "\n";
  }
  return 0;
}
