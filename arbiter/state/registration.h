// A container quanta-hook registered: which pod it belongs to, the cgroup its processes
// live in, the GPUs the runtime gave it and the policy its annotations ask for.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace quanta::arbiter {

struct Registration {
  std::string container_id;
  std::string pod_uid;
  std::string pod_name;
  std::string pod_namespace;
  std::string container_name;
  std::string cgroup_path;
  // The GPUs the runtime gave the container, as UUIDs ("GPU-…"/"MIG-…"); its processes may
  // attach to these only. Empty: the registration did not say (see docs/quantactl-status.md).
  std::vector<std::string> devices;
  std::map<std::string, std::string> policy;  // annotation values as text ("weight" → "4")

  // "namespace/name", or "uid:<uid>" when the pod has no name.
  std::string pod_key() const;
  bool operator==(const Registration&) const = default;
};

}  // namespace quanta::arbiter
