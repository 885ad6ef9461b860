// Peer identity by pidfd, with the start-time fallback for kernels before 6.5.
#include "arbiter/serving/peer_identity.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "arbiter/loop/death_watch.h"

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77
#endif

namespace quanta::arbiter {

pid_t pid_of_pidfd(int pidfd) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", pidfd);
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("Pid:", 0) == 0) {
      long pid = std::strtol(line.c_str() + 4, nullptr, 10);
      return static_cast<pid_t>(pid);
    }
  }
  return 0;
}

uint64_t process_start_time(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  std::getline(in, text);
  // The command name may hold spaces and parentheses: fields start after the last ')'.
  const auto paren = text.rfind(')');
  if (paren == std::string::npos) return 0;
  std::istringstream fields(text.substr(paren + 1));
  std::string field;
  // After ')' come field 3 (state) onwards; start time is field 22.
  for (int i = 3; i <= 22; ++i) {
    if (!(fields >> field)) return 0;
  }
  return std::strtoull(field.c_str(), nullptr, 10);
}

namespace {

// Why a peer could not be held: gone, or (with `error` EMFILE or ENFILE, from the pidfd or
// the /proc read that failed) the arbiter's own descriptor limit, which an operator must be
// told as such rather than as a caller that went away.
std::string not_held(const std::string& whom, int error) {
  if (error == EMFILE || error == ENFILE)
    return "cannot hold " + whom + " by a pidfd: " + std::strerror(error) +
           " (the arbiter is out of file descriptors; raise its RLIMIT_NOFILE or see what holds them)";
  if (error == 0 || error == ESRCH || error == ENOENT) return whom + " has exited";
  return "cannot hold " + whom + " by a pidfd: " + std::strerror(error);
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
