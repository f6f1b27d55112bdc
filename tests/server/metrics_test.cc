// The pieces behind the metrics endpoint and the pressure log, on made-up counters.
#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/metrics_text.h"
#include "server/pressure_reporter.h"
#include "server/throughput_meter.h"

namespace tierd {
namespace {

using ::testing::HasSubstr;

const absl::Time kStart = absl::FromUnixSeconds(1'000'000);

TEST(ThroughputMeterTest, RatesAreOverTheWindow) {
  ThroughputMeter meter(absl::Seconds(10));
  EXPECT_EQ(meter.Rates()[0], 0);  // nothing to compare yet
  meter.Sample(kStart, {0, 0, 0, 0});
  meter.Sample(kStart + absl::Seconds(1), {1000, 0, 0, 0});
  EXPECT_DOUBLE_EQ(meter.Rates()[static_cast<int>(Stage::kDiskToHost)], 1000);
  for (int s = 2; s <= 20; ++s) meter.Sample(kStart + absl::Seconds(s), {1000, 0, 500ull * s, 0});
  // Only the last ten seconds count: the early disk burst has left the window.
  const StageRates rates = meter.Rates();
  EXPECT_DOUBLE_EQ(rates[static_cast<int>(Stage::kDiskToHost)], 0);
  EXPECT_DOUBLE_EQ(rates[static_cast<int>(Stage::kGpuToHost)], 500);
  EXPECT_STREQ(StageName(Stage::kHostToGpu), "host_to_gpu");
}

TEST(PressureReporterTest, OneLinePerPeriodOnlyUnderPressure) {
  PressureReporter reporter(absl::Seconds(30));
  v1::Stats stats;
  stats.mutable_gpu()->set_budget_bytes(100);
  stats.mutable_gpu()->set_used_bytes(97);
  stats.mutable_host()->set_budget_bytes(200);
  stats.mutable_host()->set_used_bytes(50);
  EXPECT_FALSE(reporter.Observe(kStart, stats, 0).has_value());
  // Quiet: nothing evicted or refused.
  EXPECT_FALSE(reporter.Observe(kStart + absl::Seconds(31), stats, 0).has_value());
  stats.mutable_gpu()->set_evictions(12);
  EXPECT_FALSE(reporter.Observe(kStart + absl::Seconds(40), stats, 2).has_value());  // not yet
  std::optional<std::string> line = reporter.Observe(kStart + absl::Seconds(62), stats, 3);
  ASSERT_TRUE(line.has_value());
  EXPECT_THAT(*line,
              HasSubstr("over the last 31s: 12 GPU and 0 host eviction(s), 3 request(s) "
                        "refused RESOURCE_EXHAUSTED; GPU pool 97% used, host cache 25% used"));
  EXPECT_FALSE(reporter.Observe(kStart + absl::Seconds(93), stats, 3).has_value());
  // Running short of interprocess events is pressure too.
  stats.set_event_shortfalls(4);
  stats.set_events_in_use(64);
  stats.set_events_max(64);
  line = reporter.Observe(kStart + absl::Seconds(124), stats, 3);
  ASSERT_TRUE(line.has_value());
  EXPECT_THAT(*line, HasSubstr("; 4 request(s) found no interprocess event free (64 of "
                               "--max-events=64 in use"));
}

TEST(MetricsTextTest, EveryMetricHasHelpAndTypeAndCodesAreNamed) {
  MetricsSnapshot snapshot;
  snapshot.serving = true;
  snapshot.stats.set_device("cuda:0 (\"quoted\" \\ name)");
  snapshot.stats.set_bytes_host_to_gpu(123456789012ull);
  snapshot.stage_rates[static_cast<int>(Stage::kHostToGpu)] = 5.5e10;
  snapshot.responses[static_cast<int>(absl::StatusCode::kResourceExhausted)] = 7;
  snapshot.stats.set_peer_fetches(5);
  snapshot.stats.set_peer_fetches_through_host(2);
  snapshot.stats.set_bytes_peer_to_gpu(4096);
  const std::string text = RenderPrometheusText(snapshot);
  EXPECT_THAT(text, HasSubstr("tierd_serving 1\n"));
  // Label values are escaped.
  EXPECT_THAT(text,
              HasSubstr("tierd_device_info{device=\"cuda:0 (\\\"quoted\\\" \\\\ name)\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("tierd_stage_bytes_total{stage=\"host_to_gpu\"} 123456789012\n"));
  EXPECT_THAT(
      text, HasSubstr("tierd_stage_throughput_bytes_per_second{stage=\"host_to_gpu\"} 5.5e+10\n"));
  EXPECT_THAT(text, HasSubstr("tierd_requests_total{code=\"RESOURCE_EXHAUSTED\"} 7\n"));
  EXPECT_THAT(text, HasSubstr("tierd_requests_total{code=\"DEADLINE_EXCEEDED\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("tierd_peer_fetches_total 5\n"));
  EXPECT_THAT(text, HasSubstr("tierd_peer_fetches_through_host_total 2\n"));
  EXPECT_THAT(text, HasSubstr("tierd_peer_bytes_total 4096\n"));
  // Each metric name announced once, with HELP then TYPE.
  int help = 0;
  int type = 0;
  for (size_t at = 0; (at = text.find("# HELP ", at)) != std::string::npos; ++at) ++help;
  for (size_t at = 0; (at = text.find("# TYPE ", at)) != std::string::npos; ++at) ++type;
  EXPECT_EQ(help, type);
  EXPECT_GE(help, 25);
}

}  // namespace
}  // namespace tierd
