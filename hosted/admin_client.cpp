// A non-blocking unix-socket exchange with poll(2) against one deadline.
#include "hosted/admin_client.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string_view>

#include "hosted/errno_text.h"
#include "hosted/unique_fd.h"

namespace quanta::hosted {
namespace {

uint64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(ts.tv_nsec);
}

using Fd = UniqueFd;

// Waits for `events` until the deadline; false on timeout or error.
bool wait_for(int fd, short events, uint64_t deadline_ns) {
  for (;;) {
    const uint64_t now = now_ns();
    if (now >= deadline_ns) return false;
    pollfd p{fd, events, 0};
    const int ms = static_cast<int>((deadline_ns - now + 999'999) / 1'000'000);
    const int rc = poll(&p, 1, ms);
    if (rc > 0) return true;
    if (rc == 0) continue;  // the loop re-checks the deadline
    if (errno != EINTR) return false;
  }
}

std::string seconds(uint64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3gs", static_cast<double>(ns) / 1e9);
  return buf;
}

}  // namespace

AdminReply admin_request(const std::string& socket_path, const nlohmann::json& request,
                         uint64_t timeout_ns, size_t max_answer_bytes) {
  AdminReply reply;
  const uint64_t deadline = now_ns() + timeout_ns;
  const std::string where = "the arbiter's admin socket " + socket_path;

  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (socket_path.empty() || socket_path.size() >= sizeof(address.sun_path)) {
    reply.reason = where + " is not a usable socket path";
    return reply;
  }
  std::memcpy(address.sun_path, socket_path.c_str(), socket_path.size() + 1);
  Fd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) {
    reply.reason = std::string("socket() failed: ") + errno_text(errno);
    return reply;
  }
  for (;;) {
    if (connect(fd.get(), reinterpret_cast<const sockaddr*>(&address), sizeof(address)) == 0) break;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EINPROGRESS) {
      // A full backlog: the arbiter is alive but behind; wait for it within the deadline.
      if (!wait_for(fd.get(), POLLOUT, deadline)) {
        reply.reason = where + " did not accept the connection within " + seconds(timeout_ns);
        reply.timed_out = true;
        return reply;
      }
      int err = 0;
      socklen_t len = sizeof(err);
      getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      if (err == 0) break;
      errno = err;
    }
    reply.connect_error = errno;
    reply.reason = "cannot connect to " + where + ": " + errno_text(errno);
    return reply;
  }

  const std::string line = request.dump() + "\n";
  size_t sent = 0;
  while (sent < line.size()) {
    ssize_t n = send(fd.get(), line.data() + sent, line.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN && wait_for(fd.get(), POLLOUT, deadline)) continue;
    // An arbiter that refuses a caller (not root, too many clients) writes its reason and
    // closes without reading the request: that reason is already queued here, so it is
    // read below rather than lost to a broken pipe.
    if (n < 0 && (errno == EPIPE || errno == ECONNRESET)) break;
    reply.reason = "cannot send to " + where + (n < 0 ? std::string(": ") + errno_text(errno)
                                                      : std::string(" within the deadline"));
    return reply;
  }

  std::string in;
  size_t line_end = std::string::npos;
  while (line_end == std::string::npos) {
    if (!wait_for(fd.get(), POLLIN, deadline)) {
      reply.reason = where + " did not answer within " + seconds(timeout_ns);
      reply.timed_out = true;
      return reply;
    }
    char buf[65536];
    ssize_t n = ::read(fd.get(), buf, sizeof(buf));
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) {
      reply.reason = where + " closed the connection without answering";
      return reply;
    }
    const size_t searched = in.size();  // only the new bytes can hold the line's end
    in.append(buf, static_cast<size_t>(n));
    line_end = in.find('\n', searched);
    if ((line_end == std::string::npos ? in.size() : line_end) > max_answer_bytes) {
      reply.reason = where + " answered with more than " + std::to_string(max_answer_bytes) +
                     " bytes, the most this caller reads";
      return reply;
    }
  }
  reply.response = nlohmann::json::parse(std::string_view(in).substr(0, line_end), nullptr, false);
  if (!reply.response.is_object() || !reply.response.contains("ok") ||
      !reply.response["ok"].is_boolean()) {
    reply.reason = where + " answered with something that is not an admin response";
    return reply;
  }
  if (reply.response["ok"].get<bool>()) {
    reply.outcome = AdminOutcome::kAnswered;
  } else {
    reply.outcome = AdminOutcome::kRefused;
    const nlohmann::json& error = reply.response["error"];
    reply.reason = error.is_string() ? error.get<std::string>() : "(no error given)";
  }
  return reply;
}

}  // namespace quanta::hosted
