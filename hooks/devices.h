// The GPUs a container was really given, as UUIDs for its registration (the arbiter lets
// its processes attach to these only). Derived from what the runtime wrote into config.json,
// documented in docs/containers.md ("Which GPUs a container registers"):
//   claims: CDI device names in cdi.k8s.io/* annotations, NVIDIA_VISIBLE_DEVICES, and the
//           QUANTA_DEVICE_* variables Quanta's CDI devices set;
//   nodes:  /dev/nvidia<N> device nodes and device cgroup rules granting read/write on them.
// With nodes, the claims are kept only for GPUs whose node the container has (no claim:
// every such GPU); without nodes, the claims stand alone.
#pragma once

#include <functional>
#include <set>
#include <string>
#include <vector>

#include "hooks/bundle.h"
#include "hooks/device_table.h"

namespace quanta::hooks {

// Environment variable a Quanta CDI device sets for the GPU it stands for ("QUANTA_DEVICE_"
// and the UUID in capitals with '-' as '_', or QUANTA_DEVICE_ALL), value the UUID or "all".
std::string device_marker_name(const std::string& uuid_or_all);

struct DeviceEvidence {
  std::vector<std::string> claims;  // device names: indexes, "N:M", UUIDs or "all"
  std::vector<std::string> claim_sources;  // where each claim came from, for messages
  bool has_nodes = false;       // the container has NVIDIA GPU device nodes or rules
  bool all_minors = false;      // a rule grants every NVIDIA GPU node
  std::set<int> minors;         // /dev/nvidia<N> it may open
};

DeviceEvidence gather_device_evidence(const BundleConfig& config);

// The UUIDs, in NVML order, deduplicated. `table` is called at most once and only when a
// name needs NVML (full UUID claims without nodes do not). Throws HookError for a claim no
// device answers to. `notes` receives one line per claim dropped for want of its node.
std::vector<std::string> resolve_devices(const DeviceEvidence& evidence,
                                         const std::function<DeviceTable()>& table,
                                         std::vector<std::string>* notes);

}  // namespace quanta::hooks
