// The endpoint's thread: one epoll set over the listening socket, its connections and a wake
// eventfd. Connections live in a fixed table allocated once; each holds its request head in
// a fixed buffer, so what a client sends never grows the arbiter. The only things shared with
// the event loop are one mutex-guarded snapshot pointer and two eventfds.
#include "arbiter/observing/metrics_server.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <spdlog/spdlog.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "arbiter/observing/metrics_text.h"
#include "common/clock.h"

namespace quanta::arbiter {

struct MetricsServer::Connection {
  enum class State { kFree, kReading, kWaitingSnapshot, kWriting };
  State state = State::kFree;
  UniqueFd fd;
  uint64_t accepted_ns = 0;
  uint64_t waiting_since_ns = 0;
  bool head_only = false;  // HEAD: the response without its body
  size_t head_len = 0;
  std::array<char, kMaxRequestBytes> head{};
  std::string out;
  size_t out_off = 0;
};

namespace {

constexpr uint64_t kListenTag = ~0ull;
constexpr uint64_t kWakeTag = ~0ull - 1;

std::pair<std::string, std::string> split_listen(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 >= listen.size())
    throw std::runtime_error("[metrics] listen = \"" + listen + "\": use HOST:PORT");
  std::string host = listen.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  const std::string port = listen.substr(colon + 1);
  for (char c : port)
    if (c < '0' || c > '9')
      throw std::runtime_error("[metrics] listen = \"" + listen + "\": the port is not a number");
  return {host, port};
}

void add_to(int epoll_fd, int fd, uint32_t events, uint64_t tag) {
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = tag;
  if (epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0) throw_errno("epoll_ctl for the metrics endpoint");
}

// The end of the request head ("\r\n\r\n", or "\n\n" from a lax client), or 0.
size_t head_end(const char* data, size_t len) {
  for (size_t i = 0; i + 1 < len; ++i) {
    if (data[i] != '\n') continue;
    if (data[i + 1] == '\n') return i + 2;
    if (i + 2 < len && data[i + 1] == '\r' && data[i + 2] == '\n') return i + 3;
  }
  return 0;
}

}  // namespace

MetricsServer::MetricsServer(const std::string& listen)
    : connections_(std::make_unique<Connection[]>(kMaxConnections)) {
  auto [host, port] = split_listen(listen);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &found); rc != 0)
    throw std::runtime_error("[metrics] listen = \"" + listen + "\": cannot resolve " + host + ": " +
                             gai_strerror(rc));
  int bind_errno = 0;
  for (addrinfo* a = found; a != nullptr && !listen_fd_; a = a->ai_next) {
    UniqueFd fd(socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol));
    if (!fd) continue;
    const int one = 1;
    setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd.get(), a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd.get(), 64) != 0) {
      bind_errno = errno;
      continue;
    }
    listen_fd_ = std::move(fd);
  }
  freeaddrinfo(found);
  if (!listen_fd_)
    throw std::runtime_error("[metrics] listen = \"" + listen + "\": cannot bind (" +
                             std::strerror(bind_errno) +
                             "; in use, or not an address of this host)");
  sockaddr_storage bound{};
  socklen_t bound_len = sizeof bound;
  getsockname(listen_fd_.get(), reinterpret_cast<sockaddr*>(&bound), &bound_len);
  const int bound_port = bound.ss_family == AF_INET6
                             ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                             : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  address_ = (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" +
             std::to_string(bound_port);

  refresh_fd_.reset(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  wake_fd_.reset(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  epoll_fd_.reset(epoll_create1(EPOLL_CLOEXEC));
  if (!refresh_fd_ || !wake_fd_ || !epoll_fd_) throw_errno("eventfd or epoll for the metrics endpoint");
  add_to(epoll_fd_.get(), listen_fd_.get(), EPOLLIN, kListenTag);
  add_to(epoll_fd_.get(), wake_fd_.get(), EPOLLIN, kWakeTag);
  thread_ = std::thread([this] { serve(); });
}

MetricsServer::~MetricsServer() {
  stopping_ = true;
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t w = ::write(wake_fd_.get(), &one, sizeof one);
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
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t w = ::write(wake_fd_.get(), &one, sizeof one);
}

std::shared_ptr<const NodeFigures> MetricsServer::latest() {
  std::lock_guard lock(mu_);
  return latest_;
}

void MetricsServer::serve() {
  std::array<epoll_event, 32> events;
  while (!stopping_) {
    const int n = epoll_wait(epoll_fd_.get(), events.data(), static_cast<int>(events.size()), 100);
    if (n < 0 && errno != EINTR) {
      spdlog::error("metrics endpoint: epoll_wait failed: {}; it stops serving", std::strerror(errno));
      return;
    }
    const uint64_t now = common::monotonic_ns();
    for (int i = 0; i < n; ++i) {
      const uint64_t tag = events[i].data.u64;
      if (tag == kListenTag) {
        accept_all(now);
      } else if (tag == kWakeTag) {
        uint64_t count = 0;
        [[maybe_unused]] ssize_t r = ::read(wake_fd_.get(), &count, sizeof count);
        for (size_t k = 0; k < kMaxConnections; ++k) {
          Connection& c = connections_[k];
          if (c.state == Connection::State::kWaitingSnapshot) answer_metrics(c);
        }
      } else if (tag < kMaxConnections) {
        Connection& c = connections_[tag];
        if (events[i].events & (EPOLLERR | EPOLLHUP)) {
          close_connection(c);
        } else if (c.state == Connection::State::kReading && (events[i].events & EPOLLIN)) {
          on_readable(c, now);
        } else if (c.state == Connection::State::kWriting && (events[i].events & EPOLLOUT)) {
          flush(c);
        }
      }
    }
    expire(now);
  }
}

void MetricsServer::accept_all(uint64_t now) {
  for (;;) {
    UniqueFd fd(accept4(listen_fd_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!fd) return;  // EAGAIN, or a connection that died before it was taken
    Connection* slot = nullptr;
    Connection* oldest_reading = nullptr;
    for (size_t k = 0; k < kMaxConnections && slot == nullptr; ++k) {
      Connection& c = connections_[k];
      if (c.state == Connection::State::kFree) slot = &c;
      if (c.state == Connection::State::kReading &&
          (oldest_reading == nullptr || c.accepted_ns < oldest_reading->accepted_ns))
        oldest_reading = &c;
    }
    if (slot == nullptr && oldest_reading != nullptr) {
      close_connection(*oldest_reading);
      slot = oldest_reading;
    }
    if (slot == nullptr) continue;  // every slot is being answered: this one is dropped
    const uint64_t tag = static_cast<uint64_t>(slot - connections_.get());
    slot->fd = std::move(fd);
    slot->state = Connection::State::kReading;
    slot->accepted_ns = now;
    slot->head_len = 0;
    slot->head_only = false;
    slot->out.clear();
    slot->out_off = 0;
    add_to(epoll_fd_.get(), slot->fd.get(), EPOLLIN | EPOLLRDHUP, tag);
  }
}

void MetricsServer::on_readable(Connection& c, uint64_t now) {
  for (;;) {
    if (c.head_len == c.head.size()) {
      respond(c, 431, "Request Header Fields Too Large", "text/plain",
              "quanta-arbiter: a request head is at most " + std::to_string(kMaxRequestBytes) +
                  " bytes\n");
      return;
    }
    const ssize_t n = ::recv(c.fd.get(), c.head.data() + c.head_len, c.head.size() - c.head_len, 0);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
      close_connection(c);
      return;
    }
    if (n < 0) return;
    const size_t before = c.head_len;
    c.head_len += static_cast<size_t>(n);
    // Only the new bytes (and the three before them) can complete the head.
    const size_t from = before > 3 ? before - 3 : 0;
    if (const size_t end = head_end(c.head.data() + from, c.head_len - from); end != 0) {
      c.head_len = from + end;
      on_request(c, now);
      return;
    }
  }
}

void MetricsServer::on_request(Connection& c, uint64_t now) {
  const std::string_view head(c.head.data(), c.head_len);
  size_t lines = 0;
  for (char ch : head) lines += ch == '\n';
  if (lines > kMaxHeaderLines + 2) {
    respond(c, 431, "Request Header Fields Too Large", "text/plain",
            "quanta-arbiter: a request has at most " + std::to_string(kMaxHeaderLines) +
                " header lines\n");
    return;
  }
  const size_t first_sp = head.find(' ');
  const size_t second_sp = first_sp == std::string_view::npos ? first_sp : head.find(' ', first_sp + 1);
  const size_t eol = head.find('\n');
  if (first_sp == std::string_view::npos || second_sp == std::string_view::npos || second_sp > eol ||
      head.substr(second_sp + 1, 5) != "HTTP/") {
    respond(c, 400, "Bad Request", "text/plain", "quanta-arbiter: not an HTTP/1.x request\n");
    return;
  }
  const std::string_view method = head.substr(0, first_sp);
  std::string_view target = head.substr(first_sp + 1, second_sp - first_sp - 1);
  target = target.substr(0, target.find('?'));
  if (method != "GET" && method != "HEAD") {
    respond(c, 405, "Method Not Allowed", "text/plain", "quanta-arbiter: only GET and HEAD\n");
    return;
  }
  c.head_only = method == "HEAD";
  if (target == "/healthz") {
    const std::shared_ptr<const NodeFigures> figures = latest();
    if (figures && now - figures->taken_ns < kStaleNs) {
      respond(c, 200, "OK", "text/plain", "ok\n");
    } else {
      respond(c, 503, "Service Unavailable", "text/plain",
              figures ? "quanta-arbiter: its event loop published nothing for 10 s\n"
                      : "quanta-arbiter: starting\n");
    }
    return;
  }
  if (target != "/metrics") {
    respond(c, 404, "Not Found", "text/plain", "quanta-arbiter: serves /metrics and /healthz\n");
    return;
  }
  const std::shared_ptr<const NodeFigures> figures = latest();
  if (figures && now - figures->taken_ns < kFreshNs) {
    answer_metrics(c);
    return;
  }
  c.state = Connection::State::kWaitingSnapshot;
  c.waiting_since_ns = now;
  // Parked: nothing it sends is read now (a hang-up is still reported and closes it).
  epoll_event ev{};
  ev.data.u64 = static_cast<uint64_t>(&c - connections_.get());
  epoll_ctl(epoll_fd_.get(), EPOLL_CTL_MOD, c.fd.get(), &ev);
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t w = ::write(refresh_fd_.get(), &one, sizeof one);
}

// A parked scrape is answered once a snapshot taken after it asked arrives, or with the last
// one when kRefreshWaitNs has passed (`waited_out`, from expire()).
void MetricsServer::answer_metrics(Connection& c, bool waited_out) {
  const std::shared_ptr<const NodeFigures> figures = latest();
  if (c.state == Connection::State::kWaitingSnapshot && !waited_out &&
      (!figures || figures->taken_ns < c.waiting_since_ns))
    return;
  if (!figures) {
    respond(c, 503, "Service Unavailable", "text/plain", "quanta-arbiter: no snapshot yet\n");
    return;
  }
  respond(c, 200, "OK", "text/plain; version=0.0.4; charset=utf-8", render_prometheus(*figures));
}

void MetricsServer::respond(Connection& c, int status, const char* reason, const char* content_type,
                            const std::string& body) {
  c.out = "HTTP/1.1 " + std::to_string(status) + " " + reason + "\r\nContent-Type: " + content_type +
          "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n";
  if (!c.head_only) c.out += body;
  c.out_off = 0;
  c.state = Connection::State::kWriting;
  epoll_event ev{};
  ev.events = EPOLLOUT;
  ev.data.u64 = static_cast<uint64_t>(&c - connections_.get());
  epoll_ctl(epoll_fd_.get(), EPOLL_CTL_MOD, c.fd.get(), &ev);
  flush(c);
}

void MetricsServer::flush(Connection& c) {
  while (c.out_off < c.out.size()) {
    const ssize_t n = ::send(c.fd.get(), c.out.data() + c.out_off, c.out.size() - c.out_off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;  // EPOLLOUT brings us back
    if (n <= 0) break;
    c.out_off += static_cast<size_t>(n);
  }
  // Done (or the client went away): no keep-alive, the connection ends here.
  shutdown(c.fd.get(), SHUT_WR);
  close_connection(c);
}

void MetricsServer::close_connection(Connection& c) {
  if (c.fd) epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, c.fd.get(), nullptr);
  c.fd.reset();
  c.state = Connection::State::kFree;
  c.head_len = 0;
  std::string().swap(c.out);  // a large response's buffer is not kept by an idle slot
  c.out_off = 0;
}

void MetricsServer::expire(uint64_t now) {
  for (size_t k = 0; k < kMaxConnections; ++k) {
    Connection& c = connections_[k];
    if (c.state == Connection::State::kFree) continue;
    if (c.state == Connection::State::kWaitingSnapshot && now - c.waiting_since_ns >= kRefreshWaitNs) {
      answer_metrics(c, /*waited_out=*/true);
      continue;
    }
    if ((c.state == Connection::State::kReading && now - c.accepted_ns >= kHeadDeadlineNs) ||
        now - c.accepted_ns >= kConnectionDeadlineNs)
      close_connection(c);
  }
}

}  // namespace quanta::arbiter
