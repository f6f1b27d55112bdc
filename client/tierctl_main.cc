// tierctl: talk to a tierd from the command line.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/health.h"
#include "client/tierctl_format.h"
#include "client/tierctl_transfer.h"
#include "client/tierd_client.h"
#include "common/command_line.h"

ABSL_FLAG(std::string, socket, "/run/tierd/gpu0.sock", "Unix socket of the tierd to talk to");
ABSL_FLAG(int, timeout_ms, 5000,
          "Deadline of each call; of the whole of load and get only when given (they may take "
          "long: none by default)");
ABSL_FLAG(bool, json, false, "Print one JSON document on stdout instead of text");
// Per-command flags: empty or false means "not given", so a flag given to the wrong command is
// caught instead of silently ignored.
ABSL_FLAG(std::string, group, "",
          "load: how tensors are grouped into objects: tensor, block (default) or phase");
ABSL_FLAG(bool, verify, false,
          "load: read every object now and record its checksum, so that even its first read from "
          "disk is checked (takes as long as reading the model once)");
ABSL_FLAG(bool, keep_raw, false,
          "load: keep the model's objects raw in host memory (no compression; "
          "docs/COMPRESSION.md)");
ABSL_FLAG(std::string, output, "", "get: the file to write, - for stdout (also -o FILE)");
ABSL_FLAG(bool, no_spill, false, "put: the object must stay in host memory, never spill to disk");
ABSL_FLAG(bool, durable, false,
          "put: the object survives a restart of the daemon (written and fsynced before put "
          "returns)");
ABSL_FLAG(std::string, tier, "", "evict: the tier to drop from: gpu (default), host or all");
ABSL_FLAG(std::string, ttl, "",
          "retain: release the set once this long (e.g. 30m, 2h) has passed since its last lease "
          "ended; default: kept until unretained");
ABSL_FLAG(std::string, client_group, "",
          "retain, unretain, sleep, wake, retained: the client group whose retained sets to act "
          "on (tierd --client-groups); default: the main sockets' group");
ABSL_FLAG(std::string, shard, "",
          "get, prefetch: a tensor-parallel shard of each object, DIM:INDEX/COUNT (part INDEX of "
          "COUNT along dimension DIM, as torch.tensor_split gives it), or "
          "DIM:INDEX/COUNT:SEGMENT,... for a fused tensor (each segment split alike)");

namespace {

constexpr int kExitFailure = 1;
constexpr int kExitBadUsage = 2;
constexpr char kUsage[] =
    "tierctl [--socket=PATH] [--timeout-ms=N] [--json] COMMAND [ARGS]\n"
    "commands:\n"
    "  health                     print the daemon's serving status; exit 0 only when SERVING\n"
    "  load NAME DIR [--group=tensor|block|phase] [--verify] [--keep-raw]\n"
    "                             register the .safetensors files in DIR (or under\n"
    "                             s3://BUCKET/PREFIX/, through tierd --s3-endpoint) as NAME;\n"
    "                             --verify: hash every object now, so first reads are checked;\n"
    "                             --keep-raw: never hold its objects compressed\n"
    "  ls [NAME]                  list the models, or the objects of model NAME\n"
    "  stats                      print the daemon's tiers and counters\n"
    "  prefetch KEY... [--shard=DIM:INDEX/COUNT[:SEGMENT,...]]\n"
    "                             start bringing objects (or a shard of each) to the GPU\n"
    "  get KEY -o FILE [--shard=DIM:INDEX/COUNT[:SEGMENT,...]]\n"
    "                             write an object's bytes (or a shard's) to FILE (- for stdout)\n"
    "  put KEY FILE [--no-spill] [--durable]\n"
    "                             store the bytes of FILE (- for stdin) as object KEY; --durable:\n"
    "                             it survives a restart of the daemon\n"
    "  evict KEY|PREFIX/ [--tier=gpu|host|all]\n"
    "                             drop an object, or every one under PREFIX/, from a tier\n"
    "  retain TARGET [--ttl=DURATION] [--client-group=NAME]\n"
    "                             keep a model (NAME), the stored objects under NAMESPACE/, or\n"
    "                             one KEY on the GPU beyond the sessions that use them\n"
    "  unretain TARGET            let a retained set go\n"
    "  sleep TARGET               give a retained set's GPU memory back (it stays in host memory)\n"
    "  wake TARGET                bring a sleeping set back to the GPU\n"
    "  retained                   list the retained sets and the budget they count against\n"
    "--timeout-ms (default 5000) bounds each call; load and get, which may take long, only when\n"
    "it is given, and then the whole command. With --json a command prints one JSON document on\n"
    "stdout. A failure prints STATUS: message on stderr and exits 1; bad usage exits 2.\n";

using tierd::Json;

// `text` with its control characters (newlines, escapes a terminal would obey) written as \xNN:
// a message may carry a store's or a client's words.
std::string Printable(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte == 0x7f) {
      absl::StrAppendFormat(&out, "\\x%02x", byte);
    } else {
      out.push_back(c);
    }
  }
  return out;
}

void PrintError(const absl::Status& status) {
  std::fprintf(stderr, "%s: %s\n", absl::StatusCodeToString(status.code()).c_str(),
               Printable(status.message()).c_str());
}

// Whether --timeout-ms was given on the command line (main sets it).
bool timeout_given = false;

// The deadline --timeout-ms sets for the whole of a long command (load, get): only when it is
// given.
std::optional<absl::Duration> CommandTimeout() {
  if (!timeout_given) return std::nullopt;
  return absl::Milliseconds(absl::GetFlag(FLAGS_timeout_ms));
}

// Ends the process (exit status 1, having said DEADLINE_EXCEEDED) should `command` still run at
// `timeout`: a session's fetch has no deadline of its own.
class Watchdog {
 public:
  Watchdog(std::optional<absl::Duration> timeout, std::string command) {
    if (!timeout) return;
    thread_ = std::thread([this, deadline = absl::Now() + *timeout, timeout = *timeout,
                           command = std::move(command)] {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithDeadline(absl::Condition(&done_), deadline)) return;
      tierd::RemoveUnfinishedOutput();
      PrintError(absl::DeadlineExceededError(absl::StrCat(
          command, " did not finish within --timeout-ms=", absl::ToInt64Milliseconds(timeout))));
      std::fflush(stderr);
      std::_Exit(kExitFailure);
    });
  }
  ~Watchdog() {
    if (!thread_.joinable()) return;
    {
      absl::MutexLock lock(&mu_);
      done_ = true;
    }
    thread_.join();
  }

 private:
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

int Fail(const absl::Status& status) {
  PrintError(status);
  return kExitFailure;
}

int BadUsage(const std::string& why) {
  std::fprintf(stderr, "tierctl: %s\n%s", why.c_str(), kUsage);
  return kExitBadUsage;
}

// A client of `client_group` ("": the main sockets' group).
absl::StatusOr<std::unique_ptr<tierd::Client>> Connect(const std::string& client_group = "") {
  tierd::ClientOptions options;
  options.socket_path = absl::GetFlag(FLAGS_socket);
  options.client_name = absl::StrCat("tierctl pid ", ::getpid());
  options.call_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_timeout_ms));
  options.client_group = client_group;
  return tierd::Client::Connect(options);
}

std::optional<tierd::v1::Grouping> ParseGrouping(absl::string_view name) {
  if (name == "tensor") return tierd::v1::GROUPING_TENSOR;
  if (name.empty() || name == "block") return tierd::v1::GROUPING_BLOCK;
  if (name == "phase") return tierd::v1::GROUPING_PHASE;
  return std::nullopt;
}

std::optional<tierd::v1::Tier> ParseTier(absl::string_view name) {
  if (name.empty() || name == "gpu") return tierd::v1::TIER_GPU;
  if (name == "host") return tierd::v1::TIER_HOST;
  if (name == "all") return tierd::v1::TIER_ALL;
  return std::nullopt;
}

using Args = std::vector<std::string>;

int Health(const Args&) {
  absl::StatusOr<std::string> serving = tierd::CheckHealth(
      absl::GetFlag(FLAGS_socket), absl::Milliseconds(absl::GetFlag(FLAGS_timeout_ms)));
  if (!serving.ok()) return Fail(serving.status());
  if (absl::GetFlag(FLAGS_json)) {
    tierd::PrintJson(Json{{"status", *serving}});
  } else {
    std::printf("%s\n", serving->c_str());
  }
  return *serving == "SERVING" ? 0 : kExitFailure;
}

int Load(const Args& args) {
  const std::optional<tierd::v1::Grouping> grouping = ParseGrouping(absl::GetFlag(FLAGS_group));
  if (!grouping) return BadUsage("--group must be tensor, block or phase");
  absl::StatusOr<std::unique_ptr<tierd::Client>> client = Connect();
  if (!client.ok()) return Fail(client.status());

  const bool json = absl::GetFlag(FLAGS_json);
  std::optional<tierd::RegisterProgress> progress;
  if (!json) progress.emplace();
  tierd::v1::RegisterModelRequest request;
  request.set_name(args[0]);
  request.set_directory(args[1]);
  request.set_grouping(*grouping);
  request.set_verify(absl::GetFlag(FLAGS_verify));
  request.set_keep_raw(absl::GetFlag(FLAGS_keep_raw));
  absl::StatusOr<tierd::v1::ModelSummary> summary = (*client)->RegisterModel(
      std::move(request),
      [&progress](const tierd::v1::RegisterModelProgress& update) {
        if (progress) progress->Update(update);
      },
      CommandTimeout().value_or(absl::InfiniteDuration()));
  // Clears the progress bar before anything else is printed.
  progress.reset();
  if (!summary.ok()) return Fail(summary.status());
  if (json) {
    tierd::PrintJson(tierd::ProtoToJson(*summary));
  } else {
    std::fputs(tierd::FormatModelSummary(*summary).c_str(), stdout);
  }
  return 0;
}

int List(const Args& args) {
  absl::StatusOr<std::unique_ptr<tierd::Client>> client = Connect();
  if (!client.ok()) return Fail(client.status());
  const bool json = absl::GetFlag(FLAGS_json);
  if (args.empty()) {
    absl::StatusOr<std::vector<tierd::v1::ModelSummary>> models = (*client)->ListModels();
    if (!models.ok()) return Fail(models.status());
    if (json) {
      Json list = Json::array();
      for (const auto& model : *models) list.push_back(tierd::ProtoToJson(model));
      tierd::PrintJson(Json{{"models", std::move(list)}});
    } else if (models->empty()) {
      std::fputs("no models registered\n", stderr);
    } else {
      std::fputs(tierd::FormatModels(*models).c_str(), stdout);
    }
    return 0;
  }
  absl::StatusOr<std::vector<tierd::v1::ObjectInfo>> objects = (*client)->ListObjects(args[0]);
  if (!objects.ok()) return Fail(objects.status());
  if (json) {
    Json list = Json::array();
    for (const auto& object : *objects) list.push_back(tierd::ProtoToJson(object));
    tierd::PrintJson(Json{{"model", args[0]}, {"objects", std::move(list)}});
  } else {
    std::fputs(tierd::FormatObjects(*objects).c_str(), stdout);
  }
  return 0;
}

int Stats(const Args&) {
  absl::StatusOr<std::unique_ptr<tierd::Client>> client = Connect();
  if (!client.ok()) return Fail(client.status());
  absl::StatusOr<tierd::v1::Stats> stats = (*client)->GetStats();
  if (!stats.ok()) return Fail(stats.status());
  if (absl::GetFlag(FLAGS_json)) {
    tierd::PrintJson(tierd::ProtoToJson(*stats));
  } else {
    std::fputs(tierd::FormatStats(*stats).c_str(), stdout);
  }
  return 0;
}

// `key`, or its shard when --shard is given (the daemon checks the spec).
std::string KeyOrShard(const std::string& key) {
  const std::string shard = absl::GetFlag(FLAGS_shard);
  return shard.empty() ? key : absl::StrCat(key, "@", shard);
}

int Prefetch(const Args& args) {
  Args keys;
  for (const std::string& key : args) keys.push_back(KeyOrShard(key));
  absl::StatusOr<std::unique_ptr<tierd::Client>> client = Connect();
  if (!client.ok()) return Fail(client.status());
  absl::StatusOr<tierd::v1::PrefetchResponse> response = (*client)->Prefetch(keys);
  if (!response.ok()) return Fail(response.status());
  if (absl::GetFlag(FLAGS_json)) {
    tierd::PrintJson(Json{{"keys", keys.size()}, {"started", response->started()}});
  } else {
    std::printf("%u of %zu keys started towards the GPU%s\n", response->started(), keys.size(),
                response->started() < keys.size() ? "; the rest are there already" : "");
  }
  return 0;
}

int Get(const Args& args) {
  const std::string output = absl::GetFlag(FLAGS_output);
  if (output.empty()) return BadUsage("get needs -o FILE (- for stdout)");
  const bool json = absl::GetFlag(FLAGS_json);
  if (json && output == "-") return BadUsage("--json and -o - would both write stdout");
  absl::StatusOr<std::unique_ptr<tierd::Client>> client = Connect();
  if (!client.ok()) return Fail(client.status());
  const std::string key = KeyOrShard(args[0]);
  absl::StatusOr<uint64_t> bytes;
  {
    Watchdog watchdog(CommandTimeout(), absl::StrCat("get ", Printable(key)));
    bytes = tierd::GetObjectToFile(**client, key, output);
  }
  if (!bytes.ok()) return Fail(bytes.status());
  if (json) {
    tierd::PrintJson(Json{{"key", key}, {"bytes", *bytes}, {"file", output}});
  } else {
    // stderr: stdout may be carrying the bytes themselves.
    std::fprintf(stderr, "%s: %llu bytes → %s\n", key.c_str(),
                 static_cast<unsigned long long>(*bytes),
                 output == "-" ? "stdout" : output.c_str());
  }
  return 0;
}

int Put(const Args& args) {
  tierd::PutOptions policy;
  policy.spillable = !absl::GetFlag(FLAGS_no_spill);
  policy.durable = absl::GetFlag(FLAGS_durable);
  absl::StatusOr<std::unique_ptr<tierd::Client>> client = Connect();
  if (!client.ok()) return Fail(client.status());
  absl::StatusOr<uint64_t> bytes = tierd::PutFileAsObject(**client, args[0], args[1], policy);
  if (!bytes.ok()) return Fail(bytes.status());
  if (absl::GetFlag(FLAGS_json)) {
    tierd::PrintJson(Json{{"key", args[0]},
                          {"bytes", *bytes},
                          {"file", args[1]},
                          {"spillable", policy.spillable},
                          {"durable", policy.durable}});
  } else {
    std::printf("%s: %llu bytes stored from %s%s%s\n", args[0].c_str(),
                static_cast<unsigned long long>(*bytes), args[1] == "-" ? "stdin" : args[1].c_str(),
                policy.spillable ? "" : " (never spilled)", policy.durable ? " (durable)" : "");
  }
  return 0;
}

int Evict(const Args& args) {
  const std::string tier_name = absl::GetFlag(FLAGS_tier);
  const std::optional<tierd::v1::Tier> tier = ParseTier(tier_name);
  if (!tier) return BadUsage("--tier must be gpu, host or all");
  absl::StatusOr<std::unique_ptr<tierd::Client>> client = Connect();
  if (!client.ok()) return Fail(client.status());
  absl::StatusOr<tierd::v1::EvictResponse> response = (*client)->Evict(args[0], *tier);
  if (!response.ok()) return Fail(response.status());
  if (absl::GetFlag(FLAGS_json)) {
    Json json{{"key", args[0]}, {"tier", tier_name.empty() ? "gpu" : tier_name}};
    json.update(tierd::ProtoToJson(*response));
    tierd::PrintJson(json);
  } else {
    std::printf("evicted %u, skipped %u (leased, pinned or busy)\n", response->evicted(),
                response->skipped());
  }
  return 0;
}

// A session of --client-group's (the main sockets' without), for the retained-set commands.
absl::StatusOr<std::unique_ptr<tierd::Session>> GroupSession() {
  absl::StatusOr<std::unique_ptr<tierd::Client>> client = Connect(absl::GetFlag(FLAGS_client_group));
  if (!client.ok()) return client.status();
  return (*client)->OpenSession();
}

int PrintRetainedSet(const tierd::v1::RetainedSet& set) {
  if (absl::GetFlag(FLAGS_json)) {
    tierd::PrintJson(tierd::ProtoToJson(set));
  } else {
    std::printf("%s\n", tierd::FormatRetainedSets({set}).c_str());
  }
  return 0;
}

int Retain(const Args& args) {
  absl::Duration ttl = absl::ZeroDuration();
  if (const std::string text = absl::GetFlag(FLAGS_ttl); !text.empty()) {
    if (!absl::ParseDuration(text, &ttl) || ttl <= absl::ZeroDuration()) {
      return BadUsage(absl::StrCat("--ttl=", text, " is not a positive duration such as 30m"));
    }
  }
  absl::StatusOr<std::unique_ptr<tierd::Session>> session = GroupSession();
  if (!session.ok()) return Fail(session.status());
  // Loading a large set takes as long as reading it: no deadline unless --timeout-ms is given.
  Watchdog watchdog(CommandTimeout(), "retain");
  absl::StatusOr<tierd::v1::RetainedSet> set = (*session)->Retain(args[0], ttl);
  if (!set.ok()) return Fail(set.status());
  return PrintRetainedSet(*set);
}

int Unretain(const Args& args) {
  absl::StatusOr<std::unique_ptr<tierd::Session>> session = GroupSession();
  if (!session.ok()) return Fail(session.status());
  if (absl::Status released = (*session)->Unretain(args[0]); !released.ok()) {
    return Fail(released);
  }
  if (absl::GetFlag(FLAGS_json)) {
    tierd::PrintJson(Json{{"target", args[0]}, {"released", true}});
  } else {
    std::printf("released %s\n", args[0].c_str());
  }
  return 0;
}

// sleep and wake: `call` on a session of --client-group's, the set it answers printed. A wake
// takes as long as loading the set: no deadline unless --timeout-ms is given.
int ChangeRetainedSet(const Args& args, const char* command,
                      absl::StatusOr<tierd::v1::RetainedSet> (tierd::Session::*call)(
                          const std::string&)) {
  absl::StatusOr<std::unique_ptr<tierd::Session>> session = GroupSession();
  if (!session.ok()) return Fail(session.status());
  Watchdog watchdog(CommandTimeout(), command);
  absl::StatusOr<tierd::v1::RetainedSet> set = ((**session).*call)(args[0]);
  if (!set.ok()) return Fail(set.status());
  return PrintRetainedSet(*set);
}

int Sleep(const Args& args) { return ChangeRetainedSet(args, "sleep", &tierd::Session::Sleep); }
int Wake(const Args& args) { return ChangeRetainedSet(args, "wake", &tierd::Session::Wake); }

int Retained(const Args&) {
  absl::StatusOr<std::unique_ptr<tierd::Session>> session = GroupSession();
  if (!session.ok()) return Fail(session.status());
  absl::StatusOr<tierd::v1::RetainedSets> sets = (*session)->ListRetained();
  if (!sets.ok()) return Fail(sets.status());
  if (absl::GetFlag(FLAGS_json)) {
    tierd::PrintJson(tierd::ProtoToJson(*sets));
  } else {
    std::printf("%s\n", tierd::FormatRetainedSets({sets->sets().begin(), sets->sets().end()},
                                                   sets->bytes(), sets->budget_bytes())
                             .c_str());
  }
  return 0;
}

constexpr size_t kAnyNumber = SIZE_MAX;

struct Command {
  absl::string_view name;
  size_t min_args;
  size_t max_args;
  // The per-command flags it takes, as the usage text spells them, separated by spaces.
  absl::string_view flags;
  int (*run)(const Args& args);
};

constexpr Command kCommands[] = {
    {"health", 0, 0, "", Health},
    {"load", 2, 2, "--group --verify", Load},
    {"ls", 0, 1, "", List},
    {"stats", 0, 0, "", Stats},
    {"prefetch", 1, kAnyNumber, "--shard", Prefetch},
    {"get", 1, 1, "-o --shard", Get},
    {"put", 2, 2, "--no-spill --durable", Put},
    {"evict", 1, 1, "--tier", Evict},
    {"retain", 1, 1, "--ttl --client-group", Retain},
    {"unretain", 1, 1, "--client-group", Unretain},
    {"sleep", 1, 1, "--client-group", Sleep},
    {"wake", 1, 1, "--client-group", Wake},
    {"retained", 0, 0, "--client-group", Retained},
};

// The per-command flags given on this command line that `command` does not take.
std::vector<std::string> MisplacedFlags(const Command& command) {
  const std::pair<absl::string_view, bool> given[] = {
      {"--group", !absl::GetFlag(FLAGS_group).empty()},
      {"--verify", absl::GetFlag(FLAGS_verify)},
      {"-o", !absl::GetFlag(FLAGS_output).empty()},
      {"--no-spill", absl::GetFlag(FLAGS_no_spill)},
      {"--durable", absl::GetFlag(FLAGS_durable)},
      {"--tier", !absl::GetFlag(FLAGS_tier).empty()},
      {"--shard", !absl::GetFlag(FLAGS_shard).empty()},
      {"--ttl", !absl::GetFlag(FLAGS_ttl).empty()},
      {"--client-group", !absl::GetFlag(FLAGS_client_group).empty()},
  };
  std::vector<std::string> misplaced;
  for (const auto& [flag, is_given] : given) {
    const std::vector<absl::string_view> taken = absl::StrSplit(command.flags, ' ');
    if (is_given && std::find(taken.begin(), taken.end(), flag) == taken.end()) {
      misplaced.emplace_back(flag);
    }
  }
  return misplaced;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsage);
  absl::StatusOr<std::vector<std::string>> parsed =
      tierd::ParseFlagsAndArguments(argc, argv, {__FILE__, {{"o", "output"}}});
  if (!parsed.ok()) return BadUsage(std::string(parsed.status().message()));
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--") break;
    timeout_given |= absl::StartsWith(arg, "--timeout-ms") || absl::StartsWith(arg, "--timeout_ms");
  }
  const std::vector<std::string>& positional = *parsed;
  if (const int timeout_ms = absl::GetFlag(FLAGS_timeout_ms); timeout_ms <= 0) {
    return BadUsage(absl::StrCat("--timeout-ms=", timeout_ms, " is not a positive number of ms"));
  }
  if (positional.size() < 2) return BadUsage("no command given");
  const std::string& name = positional[1];
  const Args args(positional.begin() + 2, positional.end());
  for (const Command& command : kCommands) {
    if (command.name != name) continue;
    if (args.size() < command.min_args || args.size() > command.max_args) {
      return BadUsage(absl::StrCat("wrong number of arguments for ", name));
    }
    if (std::vector<std::string> misplaced = MisplacedFlags(command); !misplaced.empty()) {
      return BadUsage(absl::StrCat(name, " does not take ", absl::StrJoin(misplaced, ", ")));
    }
    return command.run(args);
  }
  return BadUsage(absl::StrCat("unknown command: ", name));
}
