// Peer identity by pidfd, with the start-time fallback for kernels before 6.5.
#include "arbiter/serving/peer_identity.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <string>

#include "arbiter/loop/death_watch.h"
#include "hosted/errno_text.h"

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77
#endif

namespace quanta::arbiter {

namespace {

// A small /proc file read whole by open(2) and read(2): empty when it cannot be opened, with
// errno left as the open failed (EMFILE when the arbiter is out of descriptors) for the
// caller to name.
std::string read_proc_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  std::string text;
  char buf[1024];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n > 0) {
      text.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    break;
  }
  const int error = errno;
  ::close(fd);
  errno = error;
  return text;
}

}  // namespace

pid_t pid_of_pidfd(int pidfd) {
  const std::string text = read_proc_file("/proc/self/fdinfo/" + std::to_string(pidfd));
  for (size_t at = 0; at < text.size();) {
    const size_t end = std::min(text.find('\n', at), text.size());
    if (text.compare(at, 4, "Pid:") == 0)
      return static_cast<pid_t>(std::strtol(text.c_str() + at + 4, nullptr, 10));
    at = end + 1;
  }
  return 0;
}

uint64_t process_start_time(pid_t pid) {
  const std::string text = read_proc_file("/proc/" + std::to_string(pid) + "/stat");
  // The command name may hold spaces and parentheses: fields start after the last ')'.
  const auto paren = text.rfind(')');
  if (paren == std::string::npos) return 0;
  // After ')' come field 3 (state) onwards; start time is field 22.
  size_t at = paren + 1;
  for (int field = 3;; ++field) {
    at = text.find_first_not_of(' ', at);
    if (at == std::string::npos) return 0;
    if (field == 22) return std::strtoull(text.c_str() + at, nullptr, 10);
    at = text.find(' ', at);
    if (at == std::string::npos) return 0;
  }
}

namespace {

// Why a peer could not be held: gone, or (with `error` EMFILE or ENFILE, from the pidfd or
// the /proc read that failed) the arbiter's own descriptor limit, which an operator must be
// told as such rather than as a caller that went away.
std::string not_held(const std::string& whom, int error) {
  if (error == EMFILE || error == ENFILE)
    return "cannot hold " + whom + " by a pidfd: " + hosted::errno_text(error) +
           " (the arbiter is out of file descriptors; raise its RLIMIT_NOFILE or see what holds them)";
  if (error == 0 || error == ESRCH || error == ENOENT) return whom + " has exited";
  return "cannot hold " + whom + " by a pidfd: " + hosted::errno_text(error);
}

}  // namespace

bool identify_peer(int socket_fd, bool allow_peer_pidfd, PeerIdentity* out, std::string* why) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(socket_fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || cred.pid <= 0) {
    *why = "the peer's credentials are unavailable";
    return false;
  }
  out->uid = cred.uid;
  if (allow_peer_pidfd) {
    int pidfd = -1;
    len = sizeof(pidfd);
    errno = 0;
    if (getsockopt(socket_fd, SOL_SOCKET, SO_PEERPIDFD, &pidfd, &len) == 0 && pidfd >= 0) {
      out->method = IdentityMethod::kPeerPidfd;
      out->pidfd.reset(pidfd);
      fcntl(pidfd, F_SETFD, FD_CLOEXEC);
      if (!peer_alive(*out)) {
        *why = "the process that connected has exited";
        return false;
      }
      errno = 0;
      out->pid = pid_of_pidfd(pidfd);  // reads /proc/self/fdinfo: needs a descriptor too
      if (out->pid <= 0) {
        *why = not_held("the process that connected", errno);
        return false;
      }
      return true;
    }
    if (errno != ENOPROTOOPT && errno != EINVAL) {
      *why = not_held("the process that connected", errno);
      return false;
    }
  }
  out->method = IdentityMethod::kStartTime;
  out->pid = cred.pid;
  const std::string whom = "pid " + std::to_string(cred.pid);
  errno = 0;
  out->start_time = process_start_time(cred.pid);
  if (out->start_time == 0) {
    *why = not_held(whom, errno);
    return false;
  }
  out->pidfd = open_pidfd(cred.pid);
  if (!out->pidfd) {
    *why = not_held(whom, errno);
    return false;
  }
  errno = 0;
  if (!peer_alive(*out)) {
    *why = not_held(whom, errno);
    return false;
  }
  return true;
}

bool peer_alive(const PeerIdentity& peer) {
  if (!peer.pidfd) return false;
  // A pidfd becomes readable when its process exits (zombies included).
  pollfd p{peer.pidfd.get(), POLLIN, 0};
  if (poll(&p, 1, 0) != 0) return false;
  if (peer.method == IdentityMethod::kStartTime) {
    // The pidfd was opened by number: it is this process only if the start time still is.
    return process_start_time(peer.pid) == peer.start_time;
  }
  return true;
}

}  // namespace quanta::arbiter
