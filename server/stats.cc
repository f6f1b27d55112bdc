#include "server/stats.h"

#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "common/figures.h"
#include "common/version.h"

namespace tierd {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;

// Sets every figure of `stats` that `out` has a field for (a client group has no byte counts).
template <typename Stats, size_t N>
void Report(const Figure<Stats> (&figures)[N], const Stats& stats, Message& out) {
  for (const Figure<Stats>& figure : figures) {
    SetFigure(out, figure.reported_as, stats.*figure.value);
  }
}

template <typename Stats, size_t N>
void AppendPaths(const Figure<Stats> (&figures)[N], std::vector<std::string>& paths) {
  for (const Figure<Stats>& figure : figures) paths.emplace_back(figure.reported_as);
}

}  // namespace

bool SetFigure(Message& message, absl::string_view path, uint64_t value) {
  Message* at = &message;
  const std::vector<absl::string_view> names = absl::StrSplit(path, '.');
  for (size_t i = 0; i < names.size(); ++i) {
    const FieldDescriptor* field = at->GetDescriptor()->FindFieldByName(std::string(names[i]));
    if (field == nullptr || field->is_repeated()) return false;
    if (i + 1 == names.size()) {
      if (field->cpp_type() != FieldDescriptor::CPPTYPE_UINT64) return false;
      at->GetReflection()->SetUInt64(at, field, value);
      return true;
    }
    if (field->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE) return false;
    at = at->GetReflection()->MutableMessage(at, field);
  }
  return false;
}

std::vector<std::string> ReportedFigures() {
  std::vector<std::string> paths = {"models"};
  AppendPaths(kGpuTierFigures, paths);
  AppendPaths(kEventPoolFigures, paths);
  AppendPaths(kRetainedSetsFigures, paths);
  AppendPaths(kHostCacheFigures, paths);
  AppendPaths(kDurableStoreFigures, paths);
  AppendPaths(kNodeHostFigures, paths);
  return paths;
}

v1::Stats CollectStats(Catalog& catalog, HostCache& host_cache, GpuTier& gpu_tier,
                       const std::vector<NamedGpuTier>& client_groups, const std::string& device,
                       const NodeParts& node) {
  v1::Stats stats;
  stats.set_device(device);
  stats.set_version(std::string(Version()));
  GpuTierStats gpu = gpu_tier.stats();
  EventPoolStats events = gpu_tier.event_stats();
  RetainedSetsStats retained = gpu_tier.retained().stats();
  if (!client_groups.empty()) {
    v1::ClientGroupStats* group = stats.add_client_groups();
    group->set_name("default");
    Report(kGpuTierFigures, gpu, *group);
    Report(kEventPoolFigures, events, *group);
    Report(kRetainedSetsFigures, retained, *group);
    for (const NamedGpuTier& named : client_groups) {
      const GpuTierStats own = named.tier->stats();
      const EventPoolStats own_events = named.tier->event_stats();
      group = stats.add_client_groups();
      group->set_name(named.name);
      Report(kGpuTierFigures, own, *group);
      Report(kEventPoolFigures, own_events, *group);
      const RetainedSetsStats own_retained = named.tier->retained().stats();
      Report(kRetainedSetsFigures, own_retained, *group);
      AddFigures(kGpuTierFigures, own, gpu);
      AddFigures(kEventPoolFigures, own_events, events);
      AddFigures(kRetainedSetsFigures, own_retained, retained);
    }
  }
  Report(kGpuTierFigures, gpu, stats);
  // Each tier has events of its own: the daemon's figures are their sums.
  Report(kEventPoolFigures, events, stats);
  Report(kRetainedSetsFigures, retained, stats);
  Report(kHostCacheFigures, host_cache.stats(), stats);
  if (const DurableStore* durable = gpu_tier.durable_store(); durable != nullptr) {
    Report(kDurableStoreFigures, durable->stats(), stats);
  }
  if (node.tier != nullptr) Report(kNodeHostFigures, node.tier->stats(node.lender), stats);
  stats.set_models(catalog.model_count());
  return stats;
}

}  // namespace tierd
