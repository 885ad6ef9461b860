// Nice values are per thread on Linux: setpriority(PRIO_PROCESS, 0) changes the calling
// thread, and a thread starts with its creator's value.
#include "arbiter/loop/cpu_priority.h"

#include <sys/resource.h>

#include <cerrno>
#include <cstring>

namespace quanta::arbiter {

std::string set_nice(int nice) {
  if (setpriority(PRIO_PROCESS, 0, nice) == 0) return "";
  const int error = errno;
  std::string why = "cannot set the arbiter's nice value to " + std::to_string(nice) + ": " + std::strerror(error);
  if (error == EACCES || error == EPERM) why += " (a value below the current one needs CAP_SYS_NICE)";
  return why;
}

int current_nice() {
  errno = 0;
  return getpriority(PRIO_PROCESS, 0);
}

}  // namespace quanta::arbiter
