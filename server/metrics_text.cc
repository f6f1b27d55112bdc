#include "server/metrics_text.h"

#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"

namespace tierd {
namespace {

// Escapes a label value: backslash, double quote and newline.
std::string LabelValue(absl::string_view value) {
  return absl::StrReplaceAll(value, {{"\\", "\\\\"}, {"\"", "\\\""}, {"\n", "\\n"}});
}

class Writer {
 public:
  // Starts metric `name` of `type` ("gauge" or "counter").
  Writer& Metric(absl::string_view name, absl::string_view type, absl::string_view help) {
    name_ = std::string(name);
    absl::StrAppend(&out_, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
    return *this;
  }
  // A sample of the current metric, with `labels` already formatted (`tier="gpu"`) or empty.
  template <typename Number>
  Writer& Sample(Number value, absl::string_view labels = "") {
    absl::StrAppend(&out_, name_, labels.empty() ? "" : "{", labels, labels.empty() ? "" : "}", " ",
                    value, "\n");
    return *this;
  }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
  std::string name_;
};

std::string Label(absl::string_view name, absl::string_view value) {
  return absl::StrCat(name, "=\"", LabelValue(value), "\"");
}

// "NOT_FOUND" for absl::StatusCode::kNotFound: the names gRPC and docs/CLIENTS.md use.
std::string CodeName(int code) {
  std::string name = absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
  absl::AsciiStrToUpper(&name);
  return absl::StrReplaceAll(name, {{" ", "_"}});
}

// "12.000345" for 12000345: exact, whatever the count.
std::string MicrosAsSeconds(uint64_t micros) {
  return absl::StrFormat("%d.%06d", micros / 1000000, micros % 1000000);
}

const v1::FigureOptions& FigureOf(const google::protobuf::FieldDescriptor& field) {
  return field.options().GetExtension(v1::figure);
}

void StartMetric(const v1::FigureOptions& figure, Writer& out) {
  out.Metric(figure.metric(), figure.kind() == v1::FigureOptions::COUNTER ? "counter" : "gauge",
             figure.help());
}

// Every figure of Stats that declares a metric (proto/tierd/v1/tierd.proto), in the order of the
// fields; the figures of each TierStats field a sample labelled with its tier.
void RenderFigures(const v1::Stats& stats, Writer& out) {
  using google::protobuf::Descriptor;
  using google::protobuf::FieldDescriptor;
  const Descriptor& descriptor = *v1::Stats::descriptor();
  const google::protobuf::Reflection& reflection = *stats.GetReflection();
  std::vector<std::pair<std::string, const v1::TierStats*>> tiers;
  for (int i = 0; i < descriptor.field_count(); ++i) {
    const FieldDescriptor& field = *descriptor.field(i);
    if (field.message_type() == v1::TierStats::descriptor() && !FigureOf(field).tier().empty()) {
      tiers.emplace_back(FigureOf(field).tier(),
                         static_cast<const v1::TierStats*>(&reflection.GetMessage(stats, &field)));
    }
  }
  const Descriptor& tier_descriptor = *v1::TierStats::descriptor();
  for (int i = 0; i < tier_descriptor.field_count(); ++i) {
    const FieldDescriptor& field = *tier_descriptor.field(i);
    if (FigureOf(field).metric().empty()) continue;
    StartMetric(FigureOf(field), out);
    for (const auto& [tier, values] : tiers) {
      out.Sample(values->GetReflection()->GetUInt64(*values, &field), Label("tier", tier));
    }
  }
  for (int i = 0; i < descriptor.field_count(); ++i) {
    const FieldDescriptor& field = *descriptor.field(i);
    if (field.cpp_type() != FieldDescriptor::CPPTYPE_UINT64 || FigureOf(field).metric().empty()) {
      continue;
    }
    StartMetric(FigureOf(field), out);
    const uint64_t value = reflection.GetUInt64(stats, &field);
    if (FigureOf(field).unit() == v1::FigureOptions::MICROSECONDS) {
      out.Sample(MicrosAsSeconds(value));
    } else {
      out.Sample(value);
    }
  }
}

}  // namespace

std::string RenderPrometheusText(const MetricsSnapshot& snapshot) {
  const v1::Stats& stats = snapshot.stats;
  Writer out;
  out.Metric("tierd_serving", "gauge",
             "1 when the health service says SERVING: the device answers and the daemon is not "
             "starting or stopping")
      .Sample(snapshot.serving ? 1 : 0);
  out.Metric("tierd_device_info", "gauge", "The device this daemon serves, as a label")
      .Sample(1, Label("device", stats.device()));
  out.Metric("tierd_build_info", "gauge", "The daemon's version, as a label")
      .Sample(1, Label("version", stats.version()));

  RenderFigures(stats, out);

  const StageCounts bytes = StageBytes(stats);
  out.Metric("tierd_stage_bytes_total", "counter", "Bytes moved by each stage");
  for (int i = 0; i < kStageCount; ++i) {
    out.Sample(bytes[i], Label("stage", StageName(static_cast<Stage>(i))));
  }
  out.Metric("tierd_stage_throughput_bytes_per_second", "gauge",
             "Bytes per second moved by each stage over the last 10 seconds");
  for (int i = 0; i < kStageCount; ++i) {
    out.Sample(snapshot.stage_rates[i], Label("stage", StageName(static_cast<Stage>(i))));
  }

  out.Metric("tierd_requests_total", "counter",
             "Requests answered (session requests and unary calls), by status code");
  for (int code = 0; code < ResponseCounters::kCodes; ++code) {
    out.Sample(snapshot.responses[code], Label("code", CodeName(code)));
  }
  return out.Take();
}

}  // namespace tierd
