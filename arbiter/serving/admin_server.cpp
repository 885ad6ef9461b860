// Admin socket I/O: accept (root only), read lines, queue responses, write when writable.
#include "arbiter/serving/admin_server.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "arbiter/loop/unix_socket.h"
#include "arbiter/serving/peer_identity.h"

#ifndef SO_PASSRIGHTS
#define SO_PASSRIGHTS 83
#endif

namespace quanta::arbiter {
namespace {

using nlohmann::json;

std::string error_line(const std::string& text) {
  return json{{"ok", false}, {"error", text}}.dump(-1, ' ', false, json::error_handler_t::replace) +
         "\n";
}

// The tenant socket's folder is mounted read-only into GPU containers (docs/containers.md)
// and may hold this socket too; a container's root is often uid 0 as well. So a caller
// must also see the filesystem the arbiter or the host's init sees: a process inside a
// container (pivoted into its image) does not. quanta-hook registers from the runtime's
// namespaces, before the container pivots, and passes. AT_STATX_DONT_SYNC: the root's
// cached inode is enough, so a FUSE root is never asked and the loop never waits on it.
bool outside_containers(pid_t pid) {
  if (pid <= 0) return false;
  const auto root_of = [](const std::string& path, struct statx* out) {
    return statx(AT_FDCWD, path.c_str(), AT_STATX_DONT_SYNC, STATX_INO, out) == 0;
  };
  struct statx caller {};
  if (!root_of("/proc/" + std::to_string(pid) + "/root", &caller)) return false;
  for (const char* root : {"/proc/self/root", "/proc/1/root"}) {
    struct statx s {};
    if (root_of(root, &s) && s.stx_dev_major == caller.stx_dev_major &&
        s.stx_dev_minor == caller.stx_dev_minor && s.stx_ino == caller.stx_ino)
      return true;
  }
  return false;
}

}  // namespace

AdminServer::AdminServer(EventLoop& loop, AdminApi& api, FdReaper& reaper, const std::string& path,
                         AdminLimits limits)
    : loop_(loop), api_(api), reaper_(reaper), path_(path), limits_(limits) {
  listener_ = open_listener();
  loop_.add(listener_.get(), [this](uint32_t) { on_accept(); });
}

UniqueFd AdminServer::open_listener() {
  UniqueFd listener = listen_unix(path_, SOCK_STREAM, 0600);
  bound_ = path_identity(path_);
  int off = 0;
  setsockopt(listener.get(), SOL_SOCKET, SO_PASSRIGHTS, &off, sizeof(off));
  return listener;
}

void AdminServer::keep_listening() {
  if (path_identity(path_) == bound_) return;
  try {
    UniqueFd fresh = open_listener();
    loop_.remove(listener_.get());
    listener_ = std::move(fresh);
    loop_.add(listener_.get(), [this](uint32_t) { on_accept(); });
    relisten_failed_ = false;
    spdlog::warn("the admin socket {} was removed or replaced: listening there again", path_);
  } catch (const std::exception& error) {
    if (!relisten_failed_) spdlog::warn("cannot listen on {} again: {}", path_, error.what());
    relisten_failed_ = true;
  }
}

AdminServer::~AdminServer() {
  for (auto& [fd, c] : clients_) {
    loop_.remove(fd);
    reaper_.close_later(c.sock.release());
  }
  clients_.clear();
  ::unlink(path_.c_str());
}

void AdminServer::on_accept() {
  for (;;) {
    int fd = accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    // The caller as a live process (a pidfd, as on the tenant socket), so the root checked
    // below is the caller's own and not that of a process that got its pid after it left.
    PeerIdentity peer;
    std::string why;
    std::string refusal;
    if (!identify_peer(fd, /*allow_peer_pidfd=*/true, &peer, &why)) {
      refusal = "the admin socket could not identify its caller: " + why;
    } else if (peer.uid != 0) {
      refusal = "the admin socket serves root only (caller uid " + std::to_string(peer.uid) + ")";
    } else if (!outside_containers(peer.pid) || !peer_alive(peer)) {
      refusal = "the admin socket serves processes outside containers only (caller pid " +
                std::to_string(peer.pid) + " has another root filesystem than the host's, or exited)";
    } else if (clients_.size() >= limits_.max_clients) {
      refusal = "too many admin clients (" + std::to_string(clients_.size()) + ")";
    }
    if (!refusal.empty()) {
      const std::string line = error_line(refusal);
      ssize_t n = send(fd, line.data(), line.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      (void)n;
      reaper_.close_later(fd);
      continue;
    }
    Client& c = clients_[fd];
    c.sock.reset(fd);
    loop_.add(fd, [this, fd](uint32_t events) { on_event(fd, events); });
  }
}

void AdminServer::on_event(int fd, uint32_t events) {
  auto it = clients_.find(fd);
  if (it == clients_.end()) return;
  Client& c = it->second;
  if (events & EPOLLOUT) {
    if (!flush(fd, c)) return;
  }
  if ((events & (EPOLLIN | EPOLLHUP | EPOLLERR)) && c.outbox.empty() && !c.close_after_flush) {
    char buf[4096];
    ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (n <= 0) return drop(fd);
    c.inbox.append(buf, static_cast<size_t>(n));
  }
  serve(fd, c);
}

void AdminServer::serve(int fd, Client& c) {
  size_t nl;
  while (c.outbox.empty() && !c.close_after_flush &&
         (nl = c.inbox.find('\n')) != std::string::npos) {
    const std::string line = c.inbox.substr(0, nl);
    c.inbox.erase(0, nl + 1);
    AdminRequest request;
    std::string err = parse_admin_request(line, &request);
    json response;
    if (!err.empty()) {
      response = json{{"ok", false}, {"error", err}};
    } else {
      response = api_.handle(request);
    }
    c.outbox = response.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
    c.sent = 0;
    if (!flush(fd, c)) return;
  }
  if (c.inbox.size() > limits_.max_request_bytes && c.inbox.find('\n') == std::string::npos) {
    c.inbox.clear();
    c.outbox += error_line("request longer than " +
                           std::to_string(limits_.max_request_bytes / 1024) + " KiB");
    c.close_after_flush = true;
    if (!flush(fd, c)) return;
  }
  watch(fd, c);
}

bool AdminServer::flush(int fd, Client& c) {
  while (c.sent < c.outbox.size()) {
    ssize_t n =
        send(fd, c.outbox.data() + c.sent, c.outbox.size() - c.sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      c.sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (c.outbox.size() - c.sent > limits_.max_pending_output) {
        spdlog::warn("dropping an admin client that does not read its responses");
        drop(fd);
        return false;
      }
      watch(fd, c);
      return true;
    }
    drop(fd);
    return false;
  }
  c.outbox.clear();
  c.sent = 0;
  if (c.close_after_flush) {
    drop(fd);
    return false;
  }
  watch(fd, c);
  return true;
}

void AdminServer::watch(int fd, const Client& c) {
  // Unanswered output first: no new request is read until the client took its answers.
  loop_.modify(fd, c.outbox.empty() ? EPOLLIN : EPOLLOUT);
}

void AdminServer::drop(int fd) {
  auto it = clients_.find(fd);
  if (it == clients_.end()) return;
  loop_.remove(fd);
  reaper_.close_later(it->second.sock.release());
  clients_.erase(it);
}

}  // namespace quanta::arbiter
