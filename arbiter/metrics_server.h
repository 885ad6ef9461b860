// The Prometheus endpoint: cpp-httplib on threads of its own serving /metrics and /healthz
// from the latest snapshot the event loop published. The loop never waits for it: a scrape
// asks for a fresh snapshot through an eventfd the loop watches and waits (briefly) on its
// own thread for it; a slow or hostile client only ever holds up its own connection.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "arbiter/event_loop.h"
#include "arbiter/figures.h"

namespace httplib {
class Server;
}

namespace quanta::arbiter {

class MetricsServer {
 public:
  // A snapshot younger than this is served as it is; an older one is refreshed first.
  static constexpr uint64_t kFreshNs = 100'000'000;
  // How long a scrape waits for the loop's fresh snapshot before serving the last one.
  static constexpr uint64_t kRefreshWaitNs = 250'000'000;
  // /healthz fails when the loop has published nothing for this long (it is stuck).
  static constexpr uint64_t kStaleNs = 10'000'000'000;

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
  std::shared_ptr<const NodeFigures> fresh_snapshot();

  std::unique_ptr<httplib::Server> server_;
  std::string address_;
  UniqueFd refresh_fd_;
  std::mutex mu_;
  std::condition_variable published_;
  std::shared_ptr<const NodeFigures> latest_;
  std::thread thread_;
};

}  // namespace quanta::arbiter
