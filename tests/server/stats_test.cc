// The figure tables that fill GetStats, checked against the Stats message: every figure a tier
// counts reaches a field, every field is filled, and the metrics endpoint and `tierctl stats` show
// every figure the proto declares for them.
#include "server/stats.h"

#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "client/tierctl_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/metrics_text.h"

namespace tierd {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using ::testing::HasSubstr;

// The dot-separated paths of Stats' uint64 fields, descending into its singular messages.
void Uint64Paths(const Descriptor& descriptor, const std::string& prefix,
                 std::vector<std::string>& paths) {
  for (int i = 0; i < descriptor.field_count(); ++i) {
    const FieldDescriptor& field = *descriptor.field(i);
    if (field.is_repeated()) continue;
    if (field.cpp_type() == FieldDescriptor::CPPTYPE_UINT64) {
      paths.push_back(prefix + field.name());
    } else if (field.cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      Uint64Paths(*field.message_type(), prefix + field.name() + ".", paths);
    }
  }
}

// Stats with every figure set to a value of its own: 1000 + its place among the paths.
v1::Stats DistinctFigures() {
  v1::Stats stats;
  std::vector<std::string> paths;
  Uint64Paths(*v1::Stats::descriptor(), "", paths);
  for (size_t i = 0; i < paths.size(); ++i) SetFigure(stats, paths[i], 1000 + i);
  return stats;
}

TEST(StatsFiguresTest, EveryFigureOfATierIsReportedInAFieldOfItsOwn) {
  std::set<std::string> seen;
  for (const std::string& path : ReportedFigures()) {
    v1::Stats stats;
    EXPECT_TRUE(SetFigure(stats, path, 1)) << path << " is no uint64 field of tierd.v1.Stats";
    EXPECT_TRUE(seen.insert(path).second) << path << " is reported twice";
  }
}

TEST(StatsFiguresTest, EveryFieldOfStatsIsFilled) {
  const std::vector<std::string> reported = ReportedFigures();
  const std::set<std::string> filled(reported.begin(), reported.end());
  std::vector<std::string> paths;
  Uint64Paths(*v1::Stats::descriptor(), "", paths);
  ASSERT_GT(paths.size(), 30u);
  for (const std::string& path : paths) {
    EXPECT_EQ(filled.count(path), 1u) << "no tier reports tierd.v1.Stats." << path;
  }
}

TEST(StatsFiguresTest, SetFigureRefusesWhatTheMessageDoesNotHave) {
  v1::ClientGroupStats group;
  EXPECT_TRUE(SetFigure(group, "sessions", 3));
  EXPECT_TRUE(SetFigure(group, "gpu.hits", 4));
  EXPECT_EQ(group.sessions(), 3u);
  EXPECT_EQ(group.gpu().hits(), 4u);
  EXPECT_FALSE(SetFigure(group, "bytes_host_to_gpu", 5));  // only the daemon's total has it
  EXPECT_FALSE(SetFigure(group, "name", 5));               // not a number
  EXPECT_FALSE(SetFigure(group, "gpu", 5));                // a message
  EXPECT_FALSE(SetFigure(group, "gpu.hits.more", 5));
  EXPECT_FALSE(SetFigure(group, "", 5));
}

TEST(StatsFiguresTest, TheMetricsEndpointExportsEveryFigureThatDeclaresAMetric) {
  MetricsSnapshot snapshot;
  snapshot.stats = DistinctFigures();
  const std::string text = RenderPrometheusText(snapshot);
  std::set<std::string> metrics;
  auto expect_exported = [&](const FieldDescriptor& field, const std::string& sample) {
    const v1::FigureOptions& figure = field.options().GetExtension(v1::figure);
    if (figure.metric().empty()) return;
    EXPECT_FALSE(figure.help().empty()) << figure.metric();
    EXPECT_EQ(figure.kind() == v1::FigureOptions::COUNTER,
              absl::EndsWith(figure.metric(), "_total"))
        << figure.metric() << ": counters, and only counters, end in _total";
    EXPECT_THAT(text, HasSubstr(absl::StrCat("# HELP ", figure.metric(), " ", figure.help())));
    EXPECT_THAT(text, HasSubstr(absl::StrCat(figure.metric(), sample, "\n")));
    metrics.insert(figure.metric());
  };
  const Descriptor& stats = *v1::Stats::descriptor();
  for (int i = 0; i < stats.field_count(); ++i) {
    const FieldDescriptor& field = *stats.field(i);
    if (field.cpp_type() != FieldDescriptor::CPPTYPE_UINT64) continue;
    const uint64_t value = snapshot.stats.GetReflection()->GetUInt64(snapshot.stats, &field);
    if (field.options().GetExtension(v1::figure).unit() == v1::FigureOptions::MICROSECONDS) {
      // In seconds, every microsecond kept.
      expect_exported(field, absl::StrFormat(" %d.%06d", value / 1000000, value % 1000000));
    } else {
      expect_exported(field, absl::StrCat(" ", value));
    }
  }
  for (const auto& [tier, values] :
       {std::pair{"gpu", &snapshot.stats.gpu()}, std::pair{"host", &snapshot.stats.host()}}) {
    const Descriptor& tier_stats = *v1::TierStats::descriptor();
    for (int i = 0; i < tier_stats.field_count(); ++i) {
      const FieldDescriptor& field = *tier_stats.field(i);
      expect_exported(field, absl::StrCat("{tier=\"", tier, "\"} ",
                                          values->GetReflection()->GetUInt64(*values, &field)));
    }
  }
  EXPECT_GE(metrics.size(), 27u);
}

TEST(StatsFiguresTest, TierctlShowsEveryFigureThatDeclaresALine) {
  const v1::Stats stats = DistinctFigures();
  const std::string text = FormatStats(stats);
  const Descriptor& descriptor = *v1::Stats::descriptor();
  for (int i = 0; i < descriptor.field_count(); ++i) {
    const FieldDescriptor& field = *descriptor.field(i);
    const v1::FigureOptions& figure = field.options().GetExtension(v1::figure);
    if (field.cpp_type() != FieldDescriptor::CPPTYPE_UINT64 || figure.label().empty()) continue;
    EXPECT_THAT(text, HasSubstr(figure.section() + "\n")) << field.name();
    EXPECT_THAT(text, HasSubstr("  " + figure.label() + " ")) << field.name();
    const uint64_t value = stats.GetReflection()->GetUInt64(stats, &field);
    if (figure.unit() == v1::FigureOptions::COUNT) {
      EXPECT_THAT(text, HasSubstr(absl::StrCat(value))) << field.name();
    } else if (figure.unit() == v1::FigureOptions::MICROSECONDS) {
      EXPECT_THAT(text, HasSubstr(absl::FormatDuration(absl::Microseconds(value)))) << field.name();
    }
  }
  EXPECT_THAT(text, HasSubstr("GPU tier\n"));
  EXPECT_THAT(text, HasSubstr("host tier\n"));
  EXPECT_THAT(text, HasSubstr(absl::StrCat(stats.gpu().hits(), " (")));  // share of lookups
}

}  // namespace
}  // namespace tierd
