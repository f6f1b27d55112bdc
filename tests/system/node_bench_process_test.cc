// node_bench as a program on the host backend: two daemons it starts itself, a model of a few MiB
// it writes, and every phase in its JSON with figures that add up (each client fetched the whole
// model, the node read each object at least once, the warm phase read nothing from disk). The
// node tier's goals are not checked here.
#include <sys/stat.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

using ::testing::HasSubstr;
using ::tierd::testing::IsOk;

constexpr absl::Duration kTimeout = absl::Seconds(300);
constexpr int kDaemons = 2;
constexpr int kRepeat = 2;
constexpr uint64_t kModelBytes = 4 << 20;  // 1MiBx4

class NodeBenchProcessTest : public ::testing::Test {
 protected:
  std::string model_dir() const { return dir_.path() + "/model"; }
  std::string json() const { return dir_.path() + "/node.json"; }

  absl::StatusOr<testing::RunResult> NodeBench(const std::string& phases = "") const {
    std::vector<std::string> argv = {testing::SiblingBinary("node_bench"),
                                     absl::StrCat("--tierd=", testing::SiblingBinary("tierd")),
                                     "--backend=host",
                                     absl::StrCat("--daemons=", kDaemons),
                                     absl::StrCat("--model-dir=", model_dir()),
                                     "--tensors=1MiBx4",
                                     "--files=2",
                                     absl::StrCat("--work-dir=", dir_.path(), "/work"),
                                     absl::StrCat("--repeat=", kRepeat),
                                     "--host-cache-bytes=8MiB",
                                     "--gpu-pool-bytes=8MiB",
                                     "--timeout=120",
                                     "--drop-caches=false",
                                     absl::StrCat("--json=", json())};
    if (!phases.empty()) argv.push_back("--phases=" + phases);
    return testing::RunProgramWithStderr(argv, kTimeout);
  }

  nlohmann::json Result() const {
    std::ifstream in(json());
    return nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  }

  testing::TempDir dir_;
};

TEST_F(NodeBenchProcessTest, ReportsEveryPhaseWithFiguresThatAddUp) {
  auto run = NodeBench();
  ASSERT_THAT(run, IsOk());
  ASSERT_EQ(run->exit_code, 0) << run->output;
  EXPECT_THAT(run->output, HasSubstr("warm (all daemons at once"));
  const nlohmann::json result = Result();
  ASSERT_FALSE(result.is_discarded()) << run->output;
  EXPECT_EQ(result["benchmark"], "node");
  EXPECT_THAT(result["command"].get<std::string>(), HasSubstr("--daemons=2"));
  EXPECT_FALSE(result["date"].get<std::string>().empty());
  EXPECT_GT(result["machine"]["nproc"].get<int>(), 0);
  EXPECT_EQ(result["machine"]["devices"], nlohmann::json::array({"host"}));
  EXPECT_EQ(result["model"]["bytes"], kModelBytes);
  EXPECT_EQ(result["model"]["objects"], 4);
  EXPECT_EQ(result["daemons"]["count"], kDaemons);

  const nlohmann::json& alone = result["phases"]["alone"];
  EXPECT_EQ(alone["bytes_fetched"], kModelBytes);
  EXPECT_GT(alone["gb_per_s"].get<double>(), 0);
  EXPECT_EQ(alone["stats"]["bytes_disk_to_host"], kModelBytes);
  EXPECT_EQ(alone["stats"]["node_host_fetches"], 0) << "alone, daemon 0 has no peers";
  EXPECT_FALSE(alone["page_cache_dropped"].get<bool>());

  const nlohmann::json& together = result["phases"]["together"];
  ASSERT_EQ(together["daemons"].size(), static_cast<size_t>(kDaemons));
  uint64_t disk_bytes = 0;
  for (const nlohmann::json& daemon : together["daemons"]) {
    EXPECT_EQ(daemon["bytes_fetched"], kModelBytes) << daemon.dump();
    EXPECT_GT(daemon["gb_per_s"].get<double>(), 0);
    EXPECT_EQ(daemon["on"], "host");
    disk_bytes += daemon["bytes_disk_to_host"].get<uint64_t>();
  }
  EXPECT_EQ(together["disk_bytes"], disk_bytes);
  EXPECT_GE(disk_bytes, kModelBytes) << "the node read every object at least once";
  EXPECT_LE(disk_bytes, kDaemons * kModelBytes);
  EXPECT_GE(together["host_bytes_over_model"].get<double>(), 1.0);
  EXPECT_LT(together["host_bytes_over_model"].get<double>(), kDaemons + 0.1);
  ASSERT_EQ(together["devices"].size(), 1u);
  EXPECT_EQ(together["devices"][0]["daemons"], nlohmann::json::array({0, 1}));
  EXPECT_GT(together["devices"][0]["ratio_to_alone"].get<double>(), 0);
  EXPECT_GT(together["aggregate_gb_per_s"].get<double>(), 0);

  const nlohmann::json& warm = result["phases"]["warm"];
  EXPECT_EQ(warm["bytes_per_run"], kDaemons * kModelBytes);
  ASSERT_EQ(warm["tierd_gb_per_s"].size(), static_cast<size_t>(kRepeat));
  ASSERT_EQ(warm["reference_gb_per_s"].size(), static_cast<size_t>(kRepeat));
  for (int run = 0; run < kRepeat; ++run) {
    EXPECT_GT(warm["tierd_gb_per_s"][run].get<double>(), 0);
    EXPECT_GT(warm["reference_gb_per_s"][run].get<double>(), 0);
  }
  EXPECT_GT(warm["ratio"].get<double>(), 0);
  EXPECT_THAT(warm["reference"].get<std::string>(), HasSubstr("memcpy"));
  EXPECT_EQ(warm["disk_bytes_during_warm"], 0) << "the model was in host memory";
}

// One rank per daemon, each cold-loading its shards along dimension 0, then 1, then again warm:
// the ranks' shards add up to the model, read once for the node.
TEST_F(NodeBenchProcessTest, TensorParallelPhasesSplitTheModelAndReadItOnce) {
  auto run = NodeBench("alone,tp");
  ASSERT_THAT(run, IsOk());
  ASSERT_EQ(run->exit_code, 0) << run->output;
  EXPECT_THAT(run->output, HasSubstr("dim 1 / dim 0 node throughput"));
  const nlohmann::json result = Result();
  ASSERT_FALSE(result.is_discarded()) << run->output;
  EXPECT_FALSE(result["phases"].contains("together"));
  EXPECT_FALSE(result["phases"].contains("warm"));
  for (const char* name : {"tp_dim0", "tp_dim1"}) {
    SCOPED_TRACE(name);
    const nlohmann::json& tp = result["phases"][name];
    ASSERT_EQ(tp["ranks"].size(), static_cast<size_t>(kDaemons));
    for (const nlohmann::json& rank : tp["ranks"]) {
      EXPECT_EQ(rank["bytes_fetched"], kModelBytes / kDaemons) << rank.dump();
      EXPECT_GT(rank["seconds"].get<double>(), 0);
    }
    EXPECT_EQ(tp["shard_bytes"], kModelBytes);
    EXPECT_EQ(tp["disk_bytes"], kModelBytes);
    EXPECT_GE(tp["disk_bytes_read"].get<uint64_t>(), kModelBytes);
    // Raw reads too: each tensor once, its blocks rounded out (dim 1's slices are cut from it).
    EXPECT_LE(tp["disk_bytes_read"].get<uint64_t>(),
              kModelBytes + result["model"]["objects"].get<uint64_t>() * 2 * 4096);
    EXPECT_GT(tp["alone_seconds"].get<double>(), 0);
    // Warm: from the node's host tier, nothing read again.
    const nlohmann::json& warm = tp["warm"];
    EXPECT_EQ(warm["tierd_gb_per_s"].size(), warm["repeat"].get<size_t>());
    EXPECT_GT(warm["ratio_to_gpus_times_single"].get<double>(), 0);
    EXPECT_EQ(warm["disk_bytes_read_during_warm"], 0) << "the checkpoint was in host memory";
  }
  EXPECT_GT(result["phases"]["tp_dim1"]["throughput_over_dim0"].get<double>(), 0);
}

TEST_F(NodeBenchProcessTest, NeverOverwritesADirectoryItDidNotWrite) {
  ASSERT_EQ(::mkdir(model_dir().c_str(), 0755), 0);
  const std::string foreign = model_dir() + "/notes.txt";
  std::ofstream(foreign) << "not a model\n";
  auto run = NodeBench();
  ASSERT_THAT(run, IsOk());
  EXPECT_NE(run->exit_code, 0);
  EXPECT_THAT(run->output, HasSubstr("holds no model this benchmark wrote"));
  std::ifstream in(foreign);
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "not a model");
}

}  // namespace
}  // namespace tierd
