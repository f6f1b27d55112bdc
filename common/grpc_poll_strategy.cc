#include "common/grpc_poll_strategy.h"

#include <cstdlib>

namespace tierd {

void PreferLowLatencyPolling() { ::setenv("GRPC_POLL_STRATEGY", "poll", /*overwrite=*/0); }

}  // namespace tierd
