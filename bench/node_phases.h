// node_bench's three phases, each returning its figures as JSON (docs/BENCHMARKS.md, "The node: N
// daemons, one model"):
//   alone     daemon 0 by itself (no --peers), fresh: one client cold-loads the model to its GPU.
//   together  all daemons fresh, each other's --peers; every client cold-loads the whole model at
//             the same moment; per daemon its throughput and its stats after, and the node's
//             totals.
//   warm      the same daemons, the model in host memory and evicted from the GPUs: every client
//             fetches the whole model at once, --repeat times, alternating with plain copies of
//             the same bytes from one shared pinned buffer by the same processes.
#ifndef TIERD_BENCH_NODE_PHASES_H_
#define TIERD_BENCH_NODE_PHASES_H_

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/node_daemons.h"
#include "bench/node_worker.h"

namespace tierd::bench {

struct NodePlan {
  NodeDaemonOptions daemons;  // devices: one entry per daemon
  std::string model;
  std::string model_dir;
  bool drop_caches = true;
  bool model_on_tmpfs = false;
  bool cuda = true;  // the daemons run on GPUs (else on the host backend)
  int repeat = 3;
  int cold_repeat = 1;  // runs of each cold phase, fresh daemons each time

  int daemon_count() const { return static_cast<int>(daemons.devices.size()); }
};

nlohmann::json RunAlonePhase(const NodePlan& plan, NodeClients& clients);

// Stops the daemons in `daemons` first, and leaves its own running there, for the warm phase.
// `alone_gb_per_s`: the alone phase's throughput, which each GPU's is compared with.
nlohmann::json RunTogetherPhase(const NodePlan& plan, NodeClients& clients, double alone_gb_per_s,
                                std::unique_ptr<NodeDaemons>& daemons);

// REQUIRES: `daemons` hold the model in host memory and `clients` are connected to them.
nlohmann::json RunWarmPhase(const NodePlan& plan, NodeClients& clients, NodeDaemons& daemons);

// Tensor parallelism over the node's daemons, one rank each: all fresh, each other's --peers, and
// every client cold-loads its rank's shard (along `dim`) of every tensor at the same moment. Per
// rank its seconds against `alone_seconds` / ranks (goal: within 10%), and the node's bytes read
// from disk against the model (goal: 1.0). Then warm ("warm" in the result): the checkpoint in
// the node's host tier, evicted from the GPUs, every rank loading its shards at once, against
// the GPUs times one GPU's copy rate measured in the same run (goal: 0.9).
nlohmann::json RunTensorParallelPhase(const NodePlan& plan, NodeClients& clients, uint32_t dim,
                                      double alone_seconds);

// Of several runs of a phase, the one whose `figure` is the median (nearest rank), with
// "runs_FIGURE" listing every run's figure. REQUIRES: `runs` is not empty.
nlohmann::json MedianRun(const std::vector<nlohmann::json>& runs, const std::string& figure);

}  // namespace tierd::bench

#endif  // TIERD_BENCH_NODE_PHASES_H_
