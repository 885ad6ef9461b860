// Names a process by the pod it runs in when the arbiter does not know it (an unmanaged
// process, or one that left before the arbiter was asked): Kubernetes' own files in the
// container, the pod UID in its cgroup, QUANTA_POD in its environment, else its pid.
#pragma once

#include <sys/types.h>

#include <string>

namespace quanta::bpf {

struct PodName {
  std::string pod;     // "namespace/name", "uid:<pod uid>", or "pid <n> (<comm>)"
  std::string source;  // arbiter | kubernetes | cgroup | environment | process
};

PodName pod_of_process(pid_t pid);

// The pod UID in a /proc/<pid>/cgroup text ("kubepods...pod<uid>..."), empty when none.
std::string pod_uid_from_cgroup(const std::string& cgroup_text);

}  // namespace quanta::bpf
