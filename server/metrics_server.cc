#include "server/metrics_server.h"

#include <httplib.h>

#include <atomic>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace tierd {

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& address, int port, std::function<std::string()> render) {
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--metrics-port ", port, " is not a port"));
  }
  auto server = std::make_unique<httplib::Server>();
  // Scrapes are rare and cheap: two threads, not one per core.
  server->new_task_queue = [] { return new httplib::ThreadPool(2); };
  server->set_read_timeout(5, 0);
  server->set_write_timeout(5, 0);
  server->Get("/metrics",
              [render = std::move(render)](const httplib::Request&, httplib::Response& response) {
                response.set_content(render(), "text/plain; version=0.0.4; charset=utf-8");
              });
  const int bound = port == 0 ? server->bind_to_any_port(address)
                              : (server->bind_to_port(address, port) ? port : -1);
  if (bound < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen for metrics on ", address, ":", port,
                     " (in use, or not an address of this machine: see --metrics-address)"));
  }
  std::unique_ptr<MetricsServer> metrics(new MetricsServer(std::move(server), bound));
  httplib::Server* raw = metrics->server_.get();
  auto returned = std::make_shared<std::atomic<bool>>(false);
  metrics->thread_ = std::thread([raw, returned] {
    raw->listen_after_bind();
    *returned = true;
  });
  // stop() only reaches a server whose loop runs: wait for it, so the destructor cannot miss it.
  while (!raw->is_running() && !*returned) absl::SleepFor(absl::Milliseconds(1));
  if (*returned) return absl::UnavailableError("the metrics server stopped at once");
  return metrics;
}

MetricsServer::MetricsServer(std::unique_ptr<httplib::Server> server, int port)
    : server_(std::move(server)), port_(port) {}

MetricsServer::~MetricsServer() {
  server_->stop();
  thread_.join();
}

}  // namespace tierd
