// pidfd_open through syscall(2) (glibc 2.36 wraps it, Debian 12's does, older ones don't)
// and reading /proc/<pid>/cgroup (the choice of line is common/cgroup.h's).
#include "arbiter/loop/death_watch.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "common/cgroup.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_send_signal
#define SYS_pidfd_send_signal 424
#endif

namespace quanta::arbiter {

UniqueFd open_pidfd(pid_t pid) {
  if (pid <= 0) return UniqueFd();
  return UniqueFd(static_cast<int>(syscall(SYS_pidfd_open, pid, 0)));
}

std::string cgroup_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/cgroup");
  std::stringstream text;
  text << in.rdbuf();
  return std::string(common::container_cgroup_path(text.str()));
}

bool signal_pidfd(int pidfd, int sig) {
  return syscall(SYS_pidfd_send_signal, pidfd, sig, nullptr, 0) == 0;
}

}  // namespace quanta::arbiter
