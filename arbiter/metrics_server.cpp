// The endpoint's threads: httplib's listener and worker pool. Each request renders the
// snapshot it was handed; the only thing shared with the loop is one mutex-guarded pointer
// and an eventfd, so nothing here can make the loop wait.
#include "arbiter/metrics_server.h"

#include <httplib.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <stdexcept>

#include "arbiter/metrics_text.h"
#include "common/clock.h"

namespace quanta::arbiter {
namespace {

// Workers for concurrent scrapes: Prometheus, a probe and a person with curl, with room
// for a few clients that stall until their timeout.
constexpr size_t kWorkers = 4;
constexpr time_t kIoTimeoutS = 5;

std::pair<std::string, int> split_listen(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 >= listen.size())
    throw std::runtime_error("[metrics] listen = \"" + listen + "\": use HOST:PORT");
  std::string host = listen.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  return {host, std::stoi(listen.substr(colon + 1))};
}

}  // namespace

MetricsServer::MetricsServer(const std::string& listen)
    : server_(std::make_unique<httplib::Server>()) {
  refresh_fd_.reset(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!refresh_fd_) throw_errno("eventfd for the metrics endpoint");
  auto [host, port] = split_listen(listen);
  server_->new_task_queue = [] { return new httplib::ThreadPool(kWorkers); };
  server_->set_read_timeout(kIoTimeoutS, 0);
  server_->set_write_timeout(kIoTimeoutS, 0);
  server_->set_keep_alive_timeout(kIoTimeoutS);
  server_->set_keep_alive_max_count(100);
  server_->set_payload_max_length(64 * 1024);

  server_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    std::shared_ptr<const NodeFigures> figures = fresh_snapshot();
    if (!figures) {
      res.status = 503;
      res.set_content("quanta-arbiter: no snapshot yet\n", "text/plain");
      return;
    }
    res.set_content(render_prometheus(*figures), "text/plain; version=0.0.4; charset=utf-8");
  });
  server_->Get("/healthz", [this](const httplib::Request&, httplib::Response& res) {
    std::shared_ptr<const NodeFigures> figures;
    {
      std::lock_guard lock(mu_);
      figures = latest_;
    }
    const uint64_t now = common::monotonic_ns();
    if (figures && now - figures->taken_ns < kStaleNs) {
      res.set_content("ok\n", "text/plain");
    } else {
      res.status = 503;
      res.set_content(figures ? "quanta-arbiter: its event loop published nothing for 10 s\n"
                              : "quanta-arbiter: starting\n",
                      "text/plain");
    }
  });

  int bound = port;
  if (port == 0) {
    bound = server_->bind_to_any_port(host);
    if (bound < 0)
      throw std::runtime_error("[metrics] listen = \"" + listen + "\": cannot bind " + host);
  } else if (!server_->bind_to_port(host, port)) {
    throw std::runtime_error("[metrics] listen = \"" + listen +
                             "\": cannot bind (in use, or not an address of this host)");
  }
  address_ =
      (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(bound);
  thread_ = std::thread([this] { server_->listen_after_bind(); });
}

MetricsServer::~MetricsServer() {
  server_->stop();
  if (thread_.joinable()) thread_.join();
}

void MetricsServer::acknowledge_refresh() {
  uint64_t n = 0;
  [[maybe_unused]] ssize_t r = ::read(refresh_fd_.get(), &n, sizeof n);
}

void MetricsServer::publish(std::shared_ptr<const NodeFigures> figures) {
  {
    std::lock_guard lock(mu_);
    latest_ = std::move(figures);
  }
  published_.notify_all();
}

std::shared_ptr<const NodeFigures> MetricsServer::fresh_snapshot() {
  std::unique_lock lock(mu_);
  const uint64_t now = common::monotonic_ns();
  if (latest_ && now - latest_->taken_ns < kFreshNs) return latest_;
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t w = ::write(refresh_fd_.get(), &one, sizeof one);
  published_.wait_for(lock, std::chrono::nanoseconds(kRefreshWaitNs),
                      [&] { return latest_ && latest_->taken_ns >= now; });
  return latest_;
}

}  // namespace quanta::arbiter
