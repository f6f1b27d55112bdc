// The metrics endpoint: an HTTP server (cpp-httplib) answering GET /metrics with the Prometheus
// text that `render` produces, on its own two threads. Anything else is 404.
#ifndef TIERD_SERVER_METRICS_SERVER_H_
#define TIERD_SERVER_METRICS_SERVER_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace httplib {
class Server;
}

namespace tierd {

class MetricsServer {
 public:
  // Listens on `address`:`port` (port 0: one the kernel picks; port() says which). `render` is
  // called on a server thread for each scrape and must be thread-safe.
  // Errors: INVALID_ARGUMENT for a port outside 0..65535; UNAVAILABLE when the address cannot be
  // bound (in use, not an address of this machine).
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& address, int port,
                                                              std::function<std::string()> render);
  // Stops listening and waits for scrapes in progress.
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  int port() const { return port_; }

 private:
  MetricsServer(std::unique_ptr<httplib::Server> server, int port);

  std::unique_ptr<httplib::Server> server_;
  const int port_;
  std::thread thread_;
};

}  // namespace tierd

#endif  // TIERD_SERVER_METRICS_SERVER_H_
