// pidfd_open through syscall(2) (glibc 2.36 wraps it, Debian 12's does, older ones don't)
// and /proc/<pid>/cgroup parsing.
#include "arbiter/death_watch.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <fstream>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

namespace quanta::arbiter {

UniqueFd open_pidfd(pid_t pid) {
  if (pid <= 0) return UniqueFd();
  return UniqueFd(static_cast<int>(syscall(SYS_pidfd_open, pid, 0)));
}

std::string cgroup_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/cgroup");
  std::string line;
  std::string first_v1;
  while (std::getline(in, line)) {
    if (line.rfind("0::", 0) == 0) return line.substr(3);
    auto colon = line.find(':', line.find(':') + 1);
    if (first_v1.empty() && colon != std::string::npos) first_v1 = line.substr(colon + 1);
  }
  return first_v1;
}

bool maps_shm(pid_t pid, const std::string& name) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/maps");
  const std::string path = "/dev/shm/" + name;
  std::string line;
  while (std::getline(in, line)) {
    auto at = line.find(path);
    if (at == std::string::npos) continue;
    size_t end = at + path.size();
    if (end == line.size() || line[end] == ' ')
      return true;  // not a longer name ("pod.1" vs "pod.10")
  }
  return false;
}

}  // namespace quanta::arbiter
