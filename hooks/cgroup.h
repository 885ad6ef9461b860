// The cgroup a container's processes live in, as the arbiter will see it when they connect:
// /proc/<pid>/cgroup of the container's init read from the runtime's namespaces, through the
// rule common/cgroup.h shares with the arbiter (cgroup v2, v1 and hybrid hosts).
#pragma once

#include <sys/types.h>

#include <string>

namespace quanta::hooks {

// The container's cgroup path. Throws HookError when it cannot be read, or when it does
// not tell the container apart: the root, or the very cgroup the hook (the runtime) runs
// in, which would place every process of the runtime into this pod.
std::string container_cgroup(pid_t container_pid);

// The same check on given texts (tests, fuzzing): `container` and `runtime` are
// /proc/<pid>/cgroup contents.
std::string container_cgroup_from(const std::string& container, const std::string& runtime,
                                   pid_t container_pid);

}  // namespace quanta::hooks
