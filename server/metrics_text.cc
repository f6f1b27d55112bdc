#include "server/metrics_text.h"

#include <initializer_list>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
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

  const std::pair<const char*, const v1::TierStats*> tiers[] = {{"gpu", &stats.gpu()},
                                                                {"host", &stats.host()}};
  out.Metric("tierd_tier_budget_bytes", "gauge",
             "Budget of each tier: --gpu-pool-bytes, --host-cache-bytes");
  for (const auto& [tier, t] : tiers) out.Sample(t->budget_bytes(), Label("tier", tier));
  out.Metric("tierd_tier_used_bytes", "gauge", "Bytes of each tier's budget in use");
  for (const auto& [tier, t] : tiers) out.Sample(t->used_bytes(), Label("tier", tier));
  out.Metric("tierd_tier_objects", "gauge", "Objects resident in each tier");
  for (const auto& [tier, t] : tiers) out.Sample(t->objects(), Label("tier", tier));
  out.Metric("tierd_tier_hits_total", "counter",
             "Requests for an object already resident in the tier");
  for (const auto& [tier, t] : tiers) out.Sample(t->hits(), Label("tier", tier));
  out.Metric("tierd_tier_misses_total", "counter",
             "Requests for an object that had to be brought into the tier");
  for (const auto& [tier, t] : tiers) out.Sample(t->misses(), Label("tier", tier));
  out.Metric("tierd_tier_evictions_total", "counter", "Objects evicted from the tier for room");
  for (const auto& [tier, t] : tiers) out.Sample(t->evictions(), Label("tier", tier));
  out.Metric("tierd_host_pinned_bytes", "gauge",
             "Bytes of the host cache pinned so far (the rest pins in the background)")
      .Sample(stats.host_pinned_bytes());
  out.Metric("tierd_stored_objects", "gauge", "Stored objects, in memory or spilled")
      .Sample(stats.stored_objects());
  out.Metric("tierd_spilled_objects", "gauge", "Stored objects only on disk (--spill-dir)")
      .Sample(stats.spilled_objects());
  out.Metric("tierd_spills_total", "counter", "Stored objects written to --spill-dir")
      .Sample(stats.spills());
  out.Metric("tierd_spill_failures_total", "counter", "Spills that failed")
      .Sample(stats.spill_failures());
  out.Metric("tierd_durable_objects", "gauge", "Durable stored objects on disk")
      .Sample(stats.durable_objects());
  out.Metric("tierd_durable_bytes", "gauge", "Bytes of the durable stored objects on disk")
      .Sample(stats.durable_bytes());
  out.Metric("tierd_durable_write_failures_total", "counter",
             "Durable writes that failed (their commits were refused)")
      .Sample(stats.durable_write_failures());

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

  out.Metric("tierd_peer_fetches_total", "counter",
             "Fetches answered with a copy of a peer daemon's object (--peers)")
      .Sample(stats.peer_fetches());
  out.Metric("tierd_peer_fetches_through_host_total", "counter",
             "Peer fetches copied through pinned host memory (the GPUs cannot reach each other)")
      .Sample(stats.peer_fetches_through_host());
  out.Metric("tierd_peer_bytes_total", "counter", "Bytes copied from peer daemons into staging")
      .Sample(stats.bytes_peer_to_gpu());

  out.Metric("tierd_disk_reads_in_flight", "gauge", "Objects being read from disk")
      .Sample(stats.disk_reads_in_flight());
  out.Metric("tierd_copies_in_flight", "gauge", "Copies between host and GPU in flight")
      .Sample(stats.copies_in_flight());
  out.Metric("tierd_gpu_allocation_waiters", "gauge",
             "Requests waiting for GPU staging room that copies or releases in flight will free")
      .Sample(stats.gpu_allocation_waiters());
  out.Metric("tierd_sessions", "gauge", "Open sessions").Sample(stats.sessions());
  out.Metric("tierd_leases", "gauge", "Leases held or draining").Sample(stats.leases());
  out.Metric("tierd_reservations", "gauge", "Store reservations not yet committed")
      .Sample(stats.reservations());
  out.Metric("tierd_pins", "gauge", "Pins held").Sample(stats.pins());
  out.Metric("tierd_models", "gauge", "Registered models").Sample(stats.models());
  out.Metric("tierd_gpu_slabs", "gauge", "Slabs of the GPU staging pool").Sample(stats.slabs());
  out.Metric("tierd_events", "gauge", "Interprocess events in the pool").Sample(stats.events());
  out.Metric("tierd_checksum_failures_total", "counter",
             "Reads whose checksum did not match (answered DATA_LOSS, bytes never handed out)")
      .Sample(stats.checksum_failures());

  out.Metric("tierd_requests_total", "counter",
             "Requests answered (session requests and unary calls), by status code");
  for (int code = 0; code < ResponseCounters::kCodes; ++code) {
    out.Sample(snapshot.responses[code], Label("code", CodeName(code)));
  }
  return out.Take();
}

}  // namespace tierd
