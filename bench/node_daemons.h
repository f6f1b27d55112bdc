// The daemons of one node as node_bench runs them: tierd processes it starts itself, one per
// index, each with its own socket, state directory and log under a work directory, and a client
// of each for the unary calls (register, stats). Daemon i keeps the same socket across starts, so
// every --peers list names the same paths.
//
// Not thread-safe: one thread starts, asks and stops them.
#ifndef TIERD_BENCH_NODE_DAEMONS_H_
#define TIERD_BENCH_NODE_DAEMONS_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/tierd_client.h"

namespace tierd::bench {

struct NodeDaemonOptions {
  std::string tierd;                 // the tierd binary
  std::string work_dir;              // daemon-I/{tierd.sock,state,PHASE.log} go under it
  std::vector<std::string> devices;  // per daemon index: "cuda:K" or "host"
  // --model-roots of every daemon: the model's directory, as a deployment confines models. The
  // daemons then size their disk readers to the storage the model is on, not their state's.
  std::string model_root;
  uint64_t host_cache_bytes = 0;
  uint64_t gpu_pool_bytes = 0;
  std::vector<std::string> extra_flags;  // given to every daemon, after the bench's own
  absl::Duration start_timeout = absl::Minutes(5);
};

// The socket daemon `index` serves on.
std::string NodeDaemonSocket(const NodeDaemonOptions& options, int index);

class NodeDaemons {
 public:
  // Starts daemons 0..count-1 fresh (state directories emptied), logging to daemon-I/LABEL.log,
  // with --peers naming all `count` sockets when `with_peers`, and waits until each serves and
  // has pinned its host cache (or stopped pinning). Errors: a daemon that exits or does not serve
  // within options.start_timeout (all are stopped); REQUIRES: count <= options.devices.size().
  static absl::StatusOr<std::unique_ptr<NodeDaemons>> Start(const NodeDaemonOptions& options,
                                                            int count, bool with_peers,
                                                            const std::string& label);
  // Stops the daemons still running.
  ~NodeDaemons();
  NodeDaemons(const NodeDaemons&) = delete;
  NodeDaemons& operator=(const NodeDaemons&) = delete;

  int count() const { return static_cast<int>(daemons_.size()); }
  const std::string& socket(int index) const { return daemons_[index].socket; }
  tierd::Client& client(int index) { return *daemons_[index].client; }

  // SIGTERM to every daemon, SIGKILL to those still running after `grace`; reaps them all.
  // Returns how each ended ("exited 0", "killed by signal 9"), in index order.
  std::vector<std::string> Stop(absl::Duration grace = absl::Seconds(30));

 private:
  struct Daemon {
    pid_t pid = -1;
    std::string socket;
    std::unique_ptr<tierd::Client> client;
  };
  NodeDaemons() = default;
  absl::Status WaitUntilServing(int index, absl::Time deadline);
  absl::Status WaitUntilPinned(int index, absl::Time deadline);

  std::vector<Daemon> daemons_;
};

}  // namespace tierd::bench

#endif  // TIERD_BENCH_NODE_DAEMONS_H_
