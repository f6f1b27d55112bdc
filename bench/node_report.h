// node_bench's table: the figures of a finished run (node_bench's JSON) as text for stdout.
#ifndef TIERD_BENCH_NODE_REPORT_H_
#define TIERD_BENCH_NODE_REPORT_H_

#include <nlohmann/json.hpp>
#include <string>

namespace tierd::bench {

// One line per daemon and phase, then the node's totals against their goals. `result` is what
// node_bench writes to --json; phases it lacks are left out.
std::string FormatNodeReport(const nlohmann::json& result);

// A ratio as "1.000", or "unknown" for null (a figure the machine could not give).
std::string FormatRatio(const nlohmann::json& ratio);

}  // namespace tierd::bench

#endif  // TIERD_BENCH_NODE_REPORT_H_
