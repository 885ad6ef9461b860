// The tenant socket. Every connection is bound at accept to the process that connected; a
// Hello is acted on only while that process lives and only when it sent the Hello itself
// (SCM_CREDENTIALS). Descriptors are refused by the kernel where it can (SO_PASSRIGHTS);
// elsewhere any that arrive, and every connection's final close, go to the FdReaper so no
// packet can make the loop wait. Any malformed packet drops only its connection.
#include "arbiter/serving/tenant_server.h"

#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "arbiter/loop/death_watch.h"
#include "arbiter/loop/unix_socket.h"
#include "arbiter/serving/tenant_protocol.h"
#include "common/clock.h"
#include "common/version.h"
#include "hosted/names.h"

#ifndef SO_PASSRIGHTS
#define SO_PASSRIGHTS 83
#endif

namespace quanta::arbiter {
namespace {

using common::MessageType;

// A reply in the tenant protocol `protocol` (0: before a Hello said one, this arbiter's own).
// The messages the arbiter sends are the same in every protocol it accepts.
template <typename T>
T make_message(MessageType type, uint32_t protocol) {
  T m{};
  m.header = common::make_header<T>(type);
  if (protocol != 0) m.header.version = protocol;
  return m;
}

void copy_text(char* dst, size_t cap, const std::string& text) {
  std::strncpy(dst, text.c_str(), cap - 1);
  dst[cap - 1] = '\0';
}

// Whether the other end of a connection is closed: a process that connects and closes
// again (a probe, a retry) leaves an accepted connection the loop has not read the close of
// yet, and it must not count against that process's bound on connections without a Hello.
// POLLHUP only: a peer that shut down just its writing side may still wait for a reply.
bool hung_up(int fd) {
  pollfd p{fd, 0, 0};
  return ::poll(&p, 1, 0) == 1 && (p.revents & POLLHUP) != 0;
}

// Room for the sender's credentials and, on kernels that cannot refuse them, every
// descriptor one message may carry (SCM_MAX_FD), so none is left for the kernel to close
// on this thread.
constexpr size_t kMaxFdsPerMessage = 253;
constexpr size_t kControlBytes =
    CMSG_SPACE(sizeof(ucred)) + CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage);

}  // namespace

TenantServer::TenantServer(EventLoop& loop, TenantApi& api, FdReaper& reaper, LogLimiter& log,
                           const std::string& path, TenantLimits limits, bool allow_peer_pidfd)
    : loop_(loop),
      api_(api),
      reaper_(reaper),
      log_(log),
      path_(path),
      limits_(limits),
      allow_peer_pidfd_(allow_peer_pidfd) {
  listener_ = open_listener();
  if (!rights_refused_) {
    spdlog::info(
        "this kernel cannot refuse descriptors on the tenant socket (SO_PASSRIGHTS needs Linux "
        "6.16): any a tenant sends are closed off the event loop");
  }
  loop_.add(listener_.get(), [this](uint32_t) { on_accept(); });
  loop_.add(deadline_timer_.fd(), [this](uint32_t) {
    deadline_timer_.acknowledge();
    on_deadline();
  });
}

UniqueFd TenantServer::open_listener() {
  UniqueFd listener = listen_unix(path_, SOCK_SEQPACKET, 0666);
  bound_ = path_identity(path_);
  // Accepted connections inherit both: no descriptors may be sent to the arbiter (the
  // sender gets EPERM), and every message carries its sender's pid.
  int off = 0;
  rights_refused_ = !limits_.accept_rights &&
                    setsockopt(listener.get(), SOL_SOCKET, SO_PASSRIGHTS, &off, sizeof(off)) == 0;
  int on = 1;
  setsockopt(listener.get(), SOL_SOCKET, SO_PASSCRED, &on, sizeof(on));
  return listener;
}

void TenantServer::keep_listening() {
  if (path_identity(path_) == bound_) return;
  const uint64_t now = common::monotonic_ns();
  try {
    UniqueFd fresh = open_listener();
    loop_.remove(listener_.get());
    listener_ = std::move(fresh);  // connections still in the old backlog are refused
    loop_.add(listener_.get(), [this](uint32_t) { on_accept(); });
    spdlog::warn("the tenant socket {} was removed or replaced: listening there again", path_);
  } catch (const std::exception& error) {
    log_.log(spdlog::level::warn, "relisten", now, "cannot listen on {} again: {}", path_,
             error.what());
  }
}

TenantServer::~TenantServer() {
  for (auto& [fd, conn] : connections_) {
    loop_.remove(fd);
    if (conn.doorbell) loop_.remove(conn.doorbell.get());
    reaper_.close_later(conn.sock.release());
  }
  connections_.clear();
  ::unlink(path_.c_str());
}

void TenantServer::on_accept() {
  const uint64_t now = common::monotonic_ns();
  for (;;) {
    int fd = accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        log_.log(spdlog::level::warn, "accept", now, "tenant socket accept failed: {}",
                 std::strerror(errno));
      }
      return;
    }
    int on = 1;
    setsockopt(fd, SOL_SOCKET, SO_PASSCRED, &on, sizeof(on));
    if (connections_.size() >= limits_.max_connections) prune_gone_pending();
    if (connections_.size() >= limits_.max_connections) {
      log_.log(spdlog::level::warn, "accept-limit", now,
               "refusing a tenant connection: {} are open, the most allowed", connections_.size());
      reaper_.close_later(fd);
      continue;
    }
    PeerIdentity peer;
    std::string why;
    if (!identify_peer(fd, allow_peer_pidfd_, &peer, &why)) {
      log_.log(spdlog::level::info, "drop", now, "dropping a tenant connection: {}", why);
      reaper_.close_later(fd);
      continue;
    }
    std::string cgroup = cgroup_of(peer.pid);
    if (!peer_alive(peer)) {
      reaper_.close_later(fd);
      continue;
    }
    auto over = [&] {
      return pending_.size() >= limits_.max_pending ||
             pending_by_cgroup_[cgroup] >= limits_.max_pending_per_cgroup ||
             pending_by_pid_[peer.pid] >= limits_.max_pending_per_pid;
    };
    if (over()) prune_gone_pending();
    if (over()) {
      log_.log(spdlog::level::warn, "accept-limit", now,
               "refusing a tenant connection of pid {} (cgroup {}): {} from it, {} from its cgroup "
               "and {} in all have not said Hello yet",
               peer.pid, hosted::printable(cgroup), pending_by_pid_[peer.pid],
               pending_by_cgroup_[cgroup], pending_.size());
      reaper_.close_later(fd);
      continue;
    }
    Connection& conn = connections_[fd];
    conn.sock.reset(fd);
    conn.peer = std::move(peer);
    conn.cgroup = cgroup;
    conn.accepted_ns = now;
    pending_.insert(fd);
    ++pending_by_cgroup_[cgroup];
    ++pending_by_pid_[conn.peer.pid];
    pending_order_.emplace_back(now, fd);
    loop_.add(fd, [this, fd](uint32_t) { on_readable(fd); });
    arm_deadline();
  }
}

void TenantServer::arm_deadline() {
  while (!pending_order_.empty()) {
    auto [at, fd] = pending_order_.front();
    auto it = connections_.find(fd);
    if (pending_.count(fd) != 0 && it != connections_.end() && it->second.accepted_ns == at) {
      deadline_timer_.arm_at(at + limits_.hello_deadline_ns);
      return;
    }
    pending_order_.pop_front();  // welcomed or closed since
  }
  deadline_timer_.arm_at(0);
}

void TenantServer::on_deadline() {
  const uint64_t now = common::monotonic_ns();
  while (!pending_order_.empty()) {
    auto [at, fd] = pending_order_.front();
    if (at + limits_.hello_deadline_ns > now) break;
    pending_order_.pop_front();
    auto it = connections_.find(fd);
    if (pending_.count(fd) != 0 && it != connections_.end() && it->second.accepted_ns == at)
      close_connection(fd, "no Hello within the deadline");
  }
  arm_deadline();
}

void TenantServer::prune_gone_pending() {
  std::vector<int> dead;
  for (int fd : pending_) {
    auto it = connections_.find(fd);
    if (it != connections_.end() && (hung_up(fd) || !peer_alive(it->second.peer)))
      dead.push_back(fd);
  }
  for (int fd : dead) close_connection(fd, "");
}

void TenantServer::close_connection(int fd, const std::string& why) {
  auto it = connections_.find(fd);
  if (it == connections_.end()) return;
  Connection& conn = it->second;
  if (!why.empty()) {
    log_.log(spdlog::level::warn, "drop", common::monotonic_ns(),
             "dropping tenant connection of pid {}: {}", conn.peer.pid, why);
  }
  loop_.remove(fd);
  if (conn.doorbell) loop_.remove(conn.doorbell.get());
  if (pending_.erase(fd) != 0) {
    if (--pending_by_cgroup_[conn.cgroup] == 0) pending_by_cgroup_.erase(conn.cgroup);
    if (--pending_by_pid_[conn.peer.pid] == 0) pending_by_pid_.erase(conn.peer.pid);
  }
  auto w = welcomed_by_pid_.find(conn.peer.pid);
  if (w != welcomed_by_pid_.end() && w->second == fd) welcomed_by_pid_.erase(w);
  reaper_.close_later(conn.sock.release());
  connections_.erase(it);
}

void TenantServer::drop_process(pid_t pid) {
  auto w = welcomed_by_pid_.find(pid);
  if (w != welcomed_by_pid_.end()) close_connection(w->second, "");
}

void TenantServer::on_readable(int fd) {
  alignas(8) unsigned char buf[1024];
  alignas(cmsghdr) unsigned char control[kControlBytes];
  iovec iov{buf, sizeof(buf)};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
  pid_t sender = 0;
  bool had_fds = false;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET) continue;
    if (c->cmsg_type == SCM_CREDENTIALS && c->cmsg_len >= CMSG_LEN(sizeof(ucred))) {
      ucred cred;
      std::memcpy(&cred, CMSG_DATA(c), sizeof(cred));
      sender = cred.pid;
    } else if (c->cmsg_type == SCM_RIGHTS) {
      // Only on kernels without SO_PASSRIGHTS. Tenants never send descriptors.
      size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int stray;
        std::memcpy(&stray, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        reaper_.close_later(stray);
      }
      had_fds = had_fds || count != 0;
    }
  }
  if (n <= 0) return close_connection(fd, "");
  auto it = connections_.find(fd);
  if (it == connections_.end()) return;
  Connection& conn = it->second;
  if (had_fds) return close_connection(fd, "it sent file descriptors");
  TenantMessage m;
  std::string err = parse_tenant_message(buf, static_cast<size_t>(n),
                                         (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0, &m);
  if (!peer_alive(conn.peer)) return close_connection(fd, "the process that connected has exited");
  if (sender != conn.peer.pid) {
    return close_connection(fd, "message sent by pid " + std::to_string(sender) +
                                    ", not by the process that connected");
  }
  // A shim of another release's protocol is told why in a Refused of this one (its header
  // says our version, so a newer shim can name both), counted and logged; it then runs as
  // one the arbiter cannot place, by its node's [enforce] unplaced rule.
  if (m.other_version != 0 && !conn.welcomed) return refuse(conn, err, common::RefusedAction::kRunOpen);
  if (!err.empty()) return close_connection(fd, err);
  if (conn.protocol != 0 && m.version != conn.protocol) {
    return close_connection(fd, "a message of tenant protocol " + std::to_string(m.version) +
                                    " on a connection that said Hello in " +
                                    std::to_string(conn.protocol));
  }
  switch (m.kind) {
    case TenantMessage::Kind::kHello:
      if (conn.welcomed) return close_connection(fd, "second Hello on one connection");
      return handle_hello(conn, m);
    case TenantMessage::Kind::kAttach:
      if (!conn.welcomed) return close_connection(fd, "Attach before a Welcome");
      return handle_attach(conn, m);
  }
}

void TenantServer::refuse(Connection& conn, const std::string& reason,
                          common::RefusedAction action) {
  api_.refused(reason);
  log_.log(spdlog::level::info, "refuse", common::monotonic_ns(), "refusing pid {}: {}{}",
           conn.peer.pid, hosted::printable(reason),
           action == common::RefusedAction::kDeny ? " (denied CUDA)" : "");
  auto m = make_message<common::RefusedMessage>(MessageType::kRefused, conn.protocol);
  m.action = action;
  copy_text(m.reason, sizeof(m.reason), reason);
  send_with_fds(conn.sock.get(), &m, sizeof(m), {});
  close_connection(conn.sock.get(), "");  // the tenant needs nothing more from us
}

void TenantServer::handle_hello(Connection& conn, const TenantMessage& hello) {
  const int fd = conn.sock.get();
  conn.protocol = hello.version;
  // The cgroup now, and the process still alive after reading it: then the pid was its own.
  std::string cgroup = cgroup_of(conn.peer.pid);
  if (!peer_alive(conn.peer)) return close_connection(fd, "the process that connected has exited");
  Admission a =
      api_.admit(conn.peer, cgroup, hello.claimed_pod, common::layout_of_protocol(hello.version));
  if (!a.admitted) return refuse(conn, a.reason, a.action);
  // One connection per process: a new Hello (a reconnect) replaces the old one.
  auto w = welcomed_by_pid_.find(conn.peer.pid);
  if (w != welcomed_by_pid_.end() && w->second != fd) close_connection(w->second, "");
  int doorbell = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (doorbell < 0) {
    return refuse(conn, std::string("eventfd failed: ") + std::strerror(errno),
                  common::RefusedAction::kRunOpen);
  }
  conn.doorbell.reset(doorbell);
  // Edge-triggered: every ring (an eventfd write) is an event of its own, so the count is
  // never read back, a system call saved per ring. Only the tenant itself could fill it
  // (2^64 - 2 rings), and then only its own rings would stop reaching the arbiter, which
  // still reads its wants at every pass and heartbeat.
  loop_.add(doorbell, [this, fd](uint32_t) { on_doorbell(fd); }, EPOLLIN | EPOLLET);
  conn.welcomed = true;
  if (pending_.erase(fd) != 0) {
    if (--pending_by_cgroup_[conn.cgroup] == 0) pending_by_cgroup_.erase(conn.cgroup);
    if (--pending_by_pid_[conn.peer.pid] == 0) pending_by_pid_.erase(conn.peer.pid);
  }
  welcomed_by_pid_[conn.peer.pid] = fd;

  auto m = make_message<common::WelcomeMessage>(MessageType::kWelcome, conn.protocol);
  m.pod_index = a.pod_index;
  m.proc_index = a.proc_index;
  m.arbiter_generation = a.generation;
  copy_text(m.pod_key, sizeof(m.pod_key), a.pod_key);
  m.flags = a.flags;
  m.count_managed = a.count_managed;
  m.context_overhead = a.context_overhead;
  if (!send_with_fds(fd, &m, sizeof(m), {a.pod_fd, doorbell})) close_connection(fd, "");
}

void TenantServer::handle_attach(Connection& conn, const TenantMessage& request) {
  const int fd = conn.sock.get();
  Attachment a = api_.attach(conn.peer.pid, request);
  if (!a.attached) {
    auto m = make_message<common::AttachFailedMessage>(MessageType::kAttachFailed, conn.protocol);
    copy_text(m.reason, sizeof(m.reason), a.reason);
    m.action = a.action;
    if (!send_with_fds(fd, &m, sizeof(m), {})) close_connection(fd, "");
    return;
  }
  auto m = make_message<common::AttachedMessage>(MessageType::kAttached, conn.protocol);
  m.gpu_index = a.gpu_index;
  m.slot = a.slot;
  m.owner = a.owner;
  m.memory_cap = a.memory_cap;
  const bool send_fd = a.control_fd >= 0 && conn.control_sent.count(a.gpu_index) == 0;
  m.fd_attached = send_fd ? 1 : 0;
  std::vector<int> fds;
  if (send_fd) fds.push_back(a.control_fd);
  if (!send_with_fds(fd, &m, sizeof(m), fds)) return close_connection(fd, "");
  if (send_fd) conn.control_sent.insert(a.gpu_index);
}

void TenantServer::on_doorbell(int fd) {
  auto it = connections_.find(fd);
  if (it == connections_.end()) return;
  api_.rang(it->second.peer.pid);
}

}  // namespace quanta::arbiter
