// The Prometheus endpoint: one thread of its own serving /metrics and /healthz over HTTP/1.1
// from the latest snapshot the event loop published. The loop never waits for it: a scrape
// asks for a fresh snapshot through an eventfd the loop watches, and the connection waits
// (briefly, parked, never blocking the thread) for it.
//
// Anyone who can reach the port is a client, so every resource a client can make it hold is
// bounded: a request head of at most kMaxRequestBytes and kMaxHeaderLines, received within
// kHeadDeadlineNs, a whole exchange within kConnectionDeadlineNs, at most kMaxConnections
// open (a new one evicts the connection that has waited longest for its head: a real
// client sends its head at once, so probes and scrapes get in during a slowloris flood),
// no keep-alive, no request body. /healthz is answered from the published snapshot at once,
// so nothing on the scrape path can starve it.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "arbiter/loop/event_loop.h"
#include "arbiter/observing/figures.h"

namespace quanta::arbiter {

class MetricsServer {
 public:
  // A snapshot younger than this is served as it is; an older one is refreshed first.
  static constexpr uint64_t kFreshNs = 100'000'000;
  // How long a scrape waits for the loop's fresh snapshot before serving the last one.
  static constexpr uint64_t kRefreshWaitNs = 250'000'000;
  // /healthz fails when the loop has published nothing for this long (it is stuck).
  static constexpr uint64_t kStaleNs = 10'000'000'000;
  // What one client can hold.
  static constexpr size_t kMaxConnections = 64;
  static constexpr size_t kMaxRequestBytes = 8192;  // request line and headers
  static constexpr size_t kMaxHeaderLines = 64;
  static constexpr uint64_t kHeadDeadlineNs = 3'000'000'000;
  static constexpr uint64_t kConnectionDeadlineNs = 10'000'000'000;

  // Binds `listen` ("HOST:PORT", port 0 = any) now; throws std::runtime_error with one line
  // when it cannot. Serving starts at once.
  explicit MetricsServer(const std::string& listen);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // "HOST:PORT" actually bound (the port filled in when 0 was asked).
  const std::string& address() const { return address_; }
  // Readable when a scrape wants a fresh snapshot; the loop then calls publish().
  int refresh_fd() const { return refresh_fd_.get(); }
  void acknowledge_refresh();
  void publish(std::shared_ptr<const NodeFigures> figures);

 private:
  struct Connection;

  void serve();
  void accept_all(uint64_t now);
  void on_readable(Connection& c, uint64_t now);
  void on_request(Connection& c, uint64_t now);
  void answer_metrics(Connection& c, bool waited_out = false);
  void respond(Connection& c, int status, const char* reason, const char* content_type,
               const std::string& body);
  void flush(Connection& c);
  void close_connection(Connection& c);
  void expire(uint64_t now);
  std::shared_ptr<const NodeFigures> latest();

  std::string address_;
  UniqueFd listen_fd_;
  UniqueFd epoll_fd_;
  UniqueFd wake_fd_;     // publish() and the destructor wake the thread
  UniqueFd refresh_fd_;  // the thread asks the loop for a snapshot
  std::unique_ptr<Connection[]> connections_;
  std::atomic<bool> stopping_{false};
  std::mutex mu_;
  std::shared_ptr<const NodeFigures> latest_;
  std::thread thread_;
};

}  // namespace quanta::arbiter
