// The admin socket's transport (root only): newline-delimited JSON in, one response line
// out per request, every socket non-blocking with bounded buffers. A client that stops
// reading only stops being served (its requests wait until it reads) and is dropped when
// its unread responses pass the bound; it never makes the event loop wait. What a request
// does is decided behind AdminApi.
#pragma once

#include <map>
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "arbiter/loop/event_loop.h"
#include "arbiter/loop/fd_reaper.h"
#include "arbiter/loop/unix_socket.h"
#include "arbiter/serving/admin_protocol.h"

namespace quanta::arbiter {

class AdminApi {
 public:
  virtual ~AdminApi() = default;
  // One parsed request; the response object ("ok", and "error" when false).
  virtual nlohmann::json handle(const AdminRequest& request) = 0;
};

struct AdminLimits {
  size_t max_request_bytes = 64 * 1024;          // one line
  size_t max_pending_output = 16 * 1024 * 1024;  // unread responses of one client
  size_t max_clients = 64;
};

class AdminServer {
 public:
  // Listens on `path` (mode 0600). Throws std::runtime_error on failure.
  AdminServer(EventLoop& loop, AdminApi& api, FdReaper& reaper, const std::string& path,
              AdminLimits limits = {});
  ~AdminServer();
  AdminServer(const AdminServer&) = delete;
  AdminServer& operator=(const AdminServer&) = delete;
  // Listens on the path again when its socket file was removed or replaced (called from
  // the heartbeat), so quantactl keeps working after a cleanup removed the file.
  void keep_listening();

 private:
  struct Client {
    UniqueFd sock;
    std::string inbox;
    std::string outbox;
    size_t sent = 0;  // bytes of outbox already written
    bool close_after_flush = false;
  };

  UniqueFd open_listener();  // bound to path_; records bound_
  void on_accept();
  void on_event(int fd, uint32_t events);
  // Answers complete lines while nothing is waiting to be written.
  void serve(int fd, Client& c);
  // Writes what it can; false when the client was dropped.
  bool flush(int fd, Client& c);
  void watch(int fd, const Client& c);
  void drop(int fd);

  EventLoop& loop_;
  AdminApi& api_;
  FdReaper& reaper_;
  std::string path_;
  AdminLimits limits_;
  UniqueFd listener_;
  PathIdentity bound_;  // what path_ led to when listener_ was bound
  bool relisten_failed_ = false;
  std::map<int, Client> clients_;
};

}  // namespace quanta::arbiter
