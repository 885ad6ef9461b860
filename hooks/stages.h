// The three OCI hook stages quanta-hook runs as, each given the OCI state and the node
// config:
//   create-runtime   (createRuntime: runtime namespaces, the state's pid is the host pid)
//                    validates the pod's annotations, finds the container's cgroup and GPUs,
//                    registers it with the arbiter (or applies [enforce] unplaced when the
//                    arbiter is unreachable) and writes its container.conf into the bundle;
//   create-container (createContainer: the container's mount namespace, before pivot_root)
//                    mounts container.conf read-only at /etc/quanta/container.conf, and any
//                    of Quanta's files the runtime did not mount (the hooks.d form);
//   poststop         unregisters the container.
// Sandbox (pause) containers are left alone. Failures throw HookError: the runtime then
// refuses the container and shows the line.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "config/node_config.h"
#include "hooks/cgroup.h"
#include "hooks/device_table.h"
#include "hooks/layout.h"
#include "hooks/oci_state.h"

namespace quanta::hooks {

struct StageContext {
  config::NodeConfig config;
  Layout layout;
  OciState state;
  // The node's GPU table; unset means the arbiter's (arbiter_device_table).
  std::function<DeviceTable()> devices;
  std::function<std::string(pid_t)> cgroup = container_cgroup;  // tests substitute both
  // Lines for the runtime's log that do not fail the stage (written to stderr by main).
  std::vector<std::string> notes;
};

void create_runtime(StageContext& ctx);
void create_container(StageContext& ctx);
void poststop(StageContext& ctx);

}  // namespace quanta::hooks
