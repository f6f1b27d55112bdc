// disk_read_bench --mode=host-load as a program, on the host backend with a small model: both sides
// report a throughput, every object is checked against the files, the model it writes is one tierd
// registers as the layout it reports, and it refuses what it must before writing anything.
#include <sys/stat.h>

#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/model/catalog.h"
#include "tests/storage_test_support.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::tierd::testing::IsOk;

constexpr absl::Duration kTimeout = absl::Seconds(300);
constexpr int kObjects = 16;  // 64 MiB in objects of 4 MiB
constexpr uint64_t kObjectBytes = 4 << 20;

class DiskReadBenchHostLoadTest : public ::testing::Test {
 protected:
  std::string model_dir() const { return dir_.path() + "/model"; }
  std::string json() const { return dir_.path() + "/host-load.json"; }

  absl::StatusOr<testing::RunResult> HostLoad(const std::vector<std::string>& flags = {},
                                              const std::string& model_bytes = "64MiB") const {
    std::vector<std::string> argv = {testing::SiblingBinary("disk_read_bench"),
                                     "--mode=host-load",
                                     "--device=host",
                                     absl::StrCat("--model-dir=", model_dir()),
                                     absl::StrCat("--model-bytes=", model_bytes),
                                     "--object-bytes=4MiB",
                                     "--shard-bytes=24MiB",
                                     "--repeat=1",
                                     "--reference-threads=2",
                                     absl::StrCat("--json=", json())};
    argv.insert(argv.end(), flags.begin(), flags.end());
    return testing::RunProgramWithStderr(argv, kTimeout);
  }

  nlohmann::json Result() const {
    std::ifstream in(json());
    return nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  }

  testing::TempDir dir_;
};

TEST_F(DiskReadBenchHostLoadTest, ReportsBothSidesAndChecksEveryObject) {
  auto run = HostLoad();
  ASSERT_THAT(run, IsOk());
  ASSERT_EQ(run->exit_code, 0) << run->output;
  EXPECT_THAT(run->output, HasSubstr("every object's bytes checked against the files"));
  const nlohmann::json result = Result();
  ASSERT_FALSE(result.is_discarded()) << run->output;
  EXPECT_EQ(result["mode"], "host-load");
  ASSERT_EQ(result["tierd"]["gb_per_s"].size(), 1u);
  EXPECT_GT(result["tierd"]["gb_per_s"][0].get<double>(), 0);
  EXPECT_GT(result["tierd"]["median_gb_per_s"].get<double>(), 0);
  EXPECT_EQ(result["tierd"]["checksums"], nlohmann::json::array({"recorded"}));
  ASSERT_EQ(result["reference"]["runs"].size(), 1u);
  const nlohmann::json& reference = result["reference"]["runs"][0];
  EXPECT_EQ(reference["threads"], 2);
  EXPECT_GT(reference["gb_per_s"][0].get<double>(), 0);
  EXPECT_GT(reference["ratio"].get<double>(), 0);
  EXPECT_EQ(result["verified_objects_per_run"], kObjects);
  EXPECT_TRUE(result["reader"]["defaults"].get<bool>());
  EXPECT_GT(result["reader"]["threads"].get<int>(), 0);
  EXPECT_EQ(result["model"]["objects"], kObjects);
  EXPECT_EQ(result["model"]["object_bytes_total"], kObjects * kObjectBytes);
  EXPECT_EQ(result["model"]["files"].size(), 3u);  // 6 objects of 4 MiB fit in 24 MiB

  // The files it wrote are a model tierd registers as the layout the record gives.
  auto catalog = Catalog::Open(dir_.path() + "/state");
  ASSERT_THAT(catalog, IsOk());
  auto summary = (*catalog)->RegisterModel("m", model_dir(), Grouping::kBlock,
                                           GroupingRules::Defaults(), nullptr, /*verify=*/true);
  ASSERT_THAT(summary, IsOk());
  EXPECT_EQ(summary->files, 3u);
  EXPECT_EQ(summary->objects, static_cast<size_t>(kObjects));
  EXPECT_EQ(summary->total_bytes, kObjects * kObjectBytes);
  auto model = (*catalog)->GetModel("m");
  ASSERT_THAT(model, IsOk());
  for (const ObjectInfo& object : (*model)->objects) {
    EXPECT_THAT(object.name, ::testing::StartsWith("model.layers."));
    EXPECT_EQ(object.size, kObjectBytes) << object.name;
  }
}

TEST_F(DiskReadBenchHostLoadTest, ReusesTheModelItWrote) {
  auto first = HostLoad();
  ASSERT_THAT(first, IsOk());
  ASSERT_EQ(first->exit_code, 0) << first->output;
  EXPECT_THAT(first->output, HasSubstr("writing "));
  auto again = HostLoad({"--load=prefetch"});
  ASSERT_THAT(again, IsOk());
  ASSERT_EQ(again->exit_code, 0) << again->output;
  EXPECT_THAT(again->output, Not(HasSubstr("writing ")));
  EXPECT_EQ(Result()["load"], "prefetch");
}

TEST_F(DiskReadBenchHostLoadTest, NeverOverwritesAModelItDidNotWrite) {
  ASSERT_EQ(::mkdir(model_dir().c_str(), 0755), 0);
  const std::string foreign = model_dir() + "/model.safetensors";
  ASSERT_THAT(testing::WriteSafetensors(foreign, {testing::RandomTensor("w", "U8", {4096}, 1)}),
              IsOk());
  std::ifstream original(foreign, std::ios::binary);
  const std::string before((std::istreambuf_iterator<char>(original)),
                           std::istreambuf_iterator<char>());
  auto run = HostLoad();
  ASSERT_THAT(run, IsOk());
  EXPECT_NE(run->exit_code, 0);
  EXPECT_THAT(run->output, HasSubstr("no model this benchmark wrote"));
  std::ifstream in(foreign, std::ios::binary);
  const std::string after((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(after, before);
}

TEST_F(DiskReadBenchHostLoadTest, RefusesAModelOverHalfTheAvailableMemory) {
  auto run = HostLoad({}, "1024TiB");
  ASSERT_THAT(run, IsOk());
  EXPECT_NE(run->exit_code, 0);
  EXPECT_THAT(run->output, HasSubstr("more than half of the memory available"));
  struct stat st;
  EXPECT_NE(::stat(model_dir().c_str(), &st), 0) << "nothing is written before the check";
}

}  // namespace
}  // namespace tierd
