// How many interprocess events one process may create, and how many another process may open:
// the device's per-process limit that bounds tierd's --max-events (docs/DESIGN.md, "Interprocess
// events").
//
//   event_limit_bench --device=cuda:0 --max=200000 --handles=FILE [--json=PATH]
//       creates events until the device refuses one (or --max), writes the first
//       --handles_written of their handles to FILE (hex, one per line), then runs itself with
//       --open=FILE in a child process, which opens them until the device refuses one; reports
//       both counts and the errors.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench/bench_support.h"
#include "device/device_factory.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, device, "auto", "Device: auto, host or cuda:N");
ABSL_FLAG(int, max, 200000, "Stop creating (or opening) after this many events");
ABSL_FLAG(int, handles_written, 65536, "Handles written for the child to open");
ABSL_FLAG(std::string, handles, "/tmp/event_limit_bench.handles", "Where the handles go");
ABSL_FLAG(std::string, open, "", "Open the handles in this file instead (the child's part)");
ABSL_FLAG(std::string, json, "", "Write the results here as JSON");

namespace {

[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "event_limit_bench: %s\n", message.c_str());
  std::exit(1);
}

std::unique_ptr<tierd::Device> MakeDevice() {
  auto spec = tierd::ParseDeviceSpec(absl::GetFlag(FLAGS_device));
  if (!spec.ok()) Die(spec.status().ToString());
  auto device = tierd::CreateDevice(*spec);
  if (!device.ok()) Die(device.status().ToString());
  return *std::move(device);
}

// The child: opens the handles in `path` until one fails; prints "opened N: ERROR".
int OpenHandles(const std::string& path) {
  std::unique_ptr<tierd::Device> device = MakeDevice();
  std::ifstream in(path);
  std::vector<std::unique_ptr<tierd::Event>> opened;
  std::string line, error = "none";
  const absl::Time start = absl::Now();
  while (static_cast<int>(opened.size()) < absl::GetFlag(FLAGS_max) && std::getline(in, line)) {
    absl::StatusOr<std::unique_ptr<tierd::Event>> event =
        device->OpenEvent(absl::HexStringToBytes(line));
    if (!event.ok()) {
      error = event.status().ToString();
      break;
    }
    opened.push_back(*std::move(event));
  }
  std::printf("opened %zu in %.3f s: %s\n", opened.size(),
              absl::ToDoubleSeconds(absl::Now() - start), error.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (!absl::GetFlag(FLAGS_open).empty()) return OpenHandles(absl::GetFlag(FLAGS_open));
  std::unique_ptr<tierd::Device> device = MakeDevice();
  std::vector<std::unique_ptr<tierd::Event>> events;
  std::string error = "none";
  const absl::Time start = absl::Now();
  while (static_cast<int>(events.size()) < absl::GetFlag(FLAGS_max)) {
    absl::StatusOr<std::unique_ptr<tierd::Event>> event = device->CreateEvent();
    if (!event.ok()) {
      error = event.status().ToString();
      break;
    }
    events.push_back(*std::move(event));
  }
  const double create_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  std::printf("%s: created %zu interprocess events in %.3f s: %s\n", device->Describe().c_str(),
              events.size(), create_seconds, error.c_str());
  {
    std::ofstream out(absl::GetFlag(FLAGS_handles));
    const size_t written =
        std::min<size_t>(events.size(), absl::GetFlag(FLAGS_handles_written));
    for (size_t i = 0; i < written; ++i) out << absl::BytesToHexString(events[i]->handle()) << "\n";
  }
  // The child opens them while this process still holds them.
  const std::string command =
      absl::StrCat("'", argv[0], "' --device=", absl::GetFlag(FLAGS_device),
                   " --max=", absl::GetFlag(FLAGS_max), " --open=", absl::GetFlag(FLAGS_handles));
  std::string child_output;
  if (FILE* child = ::popen(command.c_str(), "r"); child != nullptr) {
    char buffer[512];
    while (std::fgets(buffer, sizeof(buffer), child) != nullptr) child_output += buffer;
    ::pclose(child);
  }
  std::printf("another process %s", child_output.c_str());
  if (const std::string path = absl::GetFlag(FLAGS_json); !path.empty()) {
    nlohmann::json result = {{"benchmark", "event_limit"},
                             {"date", tierd::bench::TodayUtc()},
                             {"device", device->Describe()},
                             {"created", events.size()},
                             {"create_seconds", create_seconds},
                             {"create_error", error},
                             {"child", child_output}};
    std::ofstream(path) << result.dump(2) << "\n";
  }
  return 0;
}
