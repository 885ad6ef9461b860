// Which managed GPUs a process may attach to: those its container was given. The
// registration's `devices` (what the runtime injected, sent by quanta-hook) decide; a
// registration that names none falls back to the container's device cgroup (cgroup v1
// devices.list) or, on cgroup v2, the NVIDIA device nodes the runtime put in its /dev.
// Unregistered development processes (allow_unregistered) keep every managed GPU.
#pragma once

#include <sys/types.h>

#include <set>
#include <string>
#include <vector>

#include "arbiter/observing/gpu_inventory.h"
#include "arbiter/state/registration.h"

namespace quanta::arbiter {

struct DeviceGrant {
  bool all = false;
  std::set<std::string> uuids;  // when !all
  std::string source;           // where the answer came from, for messages
};

// `gpus`: the managed devices. Reads /proc/<pid>/cgroup, the devices cgroup and
// /proc/<pid>/root/dev as needed (none of these wait on the process).
DeviceGrant devices_granted(const Registration* reg, pid_t pid, const std::vector<GpuInfo>& gpus);

// The managed devices a registration's list allows: a listed GPU brings its MIG
// instances, a listed MIG instance only itself. Pure.
DeviceGrant devices_listed(const std::vector<std::string>& listed,
                           const std::vector<GpuInfo>& gpus);

// The managed devices whose /dev/nvidia<minor> a cgroup v1 devices.list allows. Pure.
DeviceGrant devices_in_cgroup_list(const std::string& devices_list,
                                   const std::vector<GpuInfo>& gpus);

}  // namespace quanta::arbiter
