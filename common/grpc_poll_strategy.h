// The gRPC poll strategy of tierd's processes (daemon and clients).
//
// gRPC's default on Linux (epoll1) has one thread poll for the whole process and wake the thread a
// message is for; "poll" lets each waiting thread poll its own descriptors, which saves a thread
// wake-up per message. On the GPU machine (a virtual machine, where a wake-up is costly) that took
// a session round trip from 99 to 69 µs at p50, and the p99 of a fetch from 1.6 to 0.5 ms
// (bench/results/README.md). A daemon serves a few tens of sessions, so polling each descriptor
// set costs nothing measurable.
#ifndef TIERD_COMMON_GRPC_POLL_STRATEGY_H_
#define TIERD_COMMON_GRPC_POLL_STRATEGY_H_

namespace tierd {

// Sets GRPC_POLL_STRATEGY=poll unless the environment already names a strategy. Effective only
// before the process's first gRPC call; harmless after it.
void PreferLowLatencyPolling();

}  // namespace tierd

#endif  // TIERD_COMMON_GRPC_POLL_STRATEGY_H_
