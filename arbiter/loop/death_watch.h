// Knowing who a tenant is and when it dies: pidfds (readable when the process exits, so
// the event loop learns of a SIGKILL within milliseconds) and the cgroup a pid lives in.
#pragma once

#include <sys/types.h>

#include <string>

#include "arbiter/loop/event_loop.h"

namespace quanta::arbiter {

// A pidfd for a live process; an empty UniqueFd when it no longer exists.
UniqueFd open_pidfd(pid_t pid);
// The process's cgroup path as common/cgroup.h picks it from /proc/<pid>/cgroup (the v2
// path, or on hybrid hosts whose containers have v1 cgroups only, the v1 one), or "" when
// it cannot be read. quanta-hook registers containers by the same rule.
std::string cgroup_of(pid_t pid);
// Sends `sig` through the pidfd (never to a pid that may have been reused). False when
// the process is gone.
bool signal_pidfd(int pidfd, int sig);

}  // namespace quanta::arbiter
