// node_bench's client processes: one per daemon, forked before the parent creates any gRPC channel
// or device (WorkerProcesses), each driving its daemon through its own client and session when the
// parent says so, so that all daemons load at the same moment. The parent sends one JSON request
// at a time and gets one JSON answer; every answer has "error" (empty when the request succeeded).
//
// Requests ("op"):
//   connect    {socket, model}: a client and session with that daemon, the model's objects listed.
//              Answer: device, transport, objects, bytes.
//   load       fetch every object (one prefetch of them all first), wait for the bytes, release.
//              With {shard: {dim, index, count}}, each object's tensor-parallel shard instead
//              (objects of one tensor). Answer: start_s, end_s (CLOCK_MONOTONIC, comparable
//              across processes), bytes.
//   evict_gpu  evict the model from the daemon's GPU tier, waiting for releases to drain.
//   map_reference {shm}: map the shared buffer `shm` (the parent's SharedMemory, the model's size),
//              register it with the session's device, and allocate a device buffer to copy into.
//   copy_reference  copy the model's bytes, object by object, from the shared buffer to the device
//              on one stream and wait. Answer: start_s, end_s, bytes.
//   disconnect drop the reference buffers, the session and the client.
#ifndef TIERD_BENCH_NODE_WORKER_H_
#define TIERD_BENCH_NODE_WORKER_H_

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "bench/worker_processes.h"

namespace tierd::bench {

// A worker's body (WorkerProcesses::Body): answers requests until the parent closes its pipe.
int RunNodeWorker(int index, WorkerChannel& channel);

// The parent's side of the client processes. Dies (Die) on a worker that fails a request, ends or
// does not answer within the timeout, naming the worker and the request.
class NodeClients {
 public:
  // Forks `count` workers. REQUIRES: nothing of gRPC or a device exists in this process yet.
  NodeClients(int count, absl::Duration timeout);
  ~NodeClients();
  NodeClients(const NodeClients&) = delete;
  NodeClients& operator=(const NodeClients&) = delete;

  int count() const { return processes_->count(); }

  // Sends `request` to each of `workers` (all as one burst: the start barrier) and returns their
  // answers in the same order.
  std::vector<nlohmann::json> Ask(const std::vector<int>& workers, const nlohmann::json& request);
  // Sends `requests[i]` to `workers[i]`, then collects the answers in the same order.
  std::vector<nlohmann::json> AskEach(const std::vector<int>& workers,
                                      const std::vector<nlohmann::json>& requests);

 private:
  std::unique_ptr<WorkerProcesses> processes_;
  absl::Duration timeout_;
};

// 0..count-1.
std::vector<int> FirstWorkers(int count);

}  // namespace tierd::bench

#endif  // TIERD_BENCH_NODE_WORKER_H_
