// Knowing who a tenant is and when it dies: pidfds (readable when the process exits, so
// the event loop learns of a SIGKILL within milliseconds) and the cgroup a pid lives in.
#pragma once

#include <sys/types.h>

#include <string>

#include "arbiter/event_loop.h"

namespace quanta::arbiter {

// A pidfd for a live process; an empty UniqueFd when it no longer exists.
UniqueFd open_pidfd(pid_t pid);
// The process's cgroup path (the cgroup v2 "0::" line, else the first v1 hierarchy's),
// or "" when it cannot be read.
std::string cgroup_of(pid_t pid);
// Whether the process maps the shared-memory object /dev/shm/<name> (name without the
// leading '/'), deleted or not. A tenant always maps its pod region; the check tells a
// genuine process table entry from one another process wrote there.
bool maps_shm(pid_t pid, const std::string& name);

}  // namespace quanta::arbiter
