// Pods and where their policy comes from: containers registered by quanta-hook (matched by
// cgroup path), the config's [pod."NAME"] tables and defaults, and live `quantactl set`
// overrides. Registrations and overrides are kept in state_dir across restarts. Each pod
// known to have processes owns a pod region.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "arbiter/config.h"
#include "arbiter/regions.h"
#include "common/policy.h"

namespace quanta::arbiter {

struct Registration {
  std::string container_id;
  std::string pod_uid;
  std::string pod_name;
  std::string pod_namespace;
  std::string container_name;
  std::string cgroup_path;
  // The GPUs the runtime gave the container, as UUIDs ("GPU-…"/"MIG-…"); its processes may
  // attach to these only. Empty: the registration did not say (see the admin protocol).
  std::vector<std::string> devices;
  std::map<std::string, std::string> policy;  // annotation values as text ("weight" → "4")

  // "namespace/name", or "uid:<uid>" when the pod has no name.
  std::string pod_key() const;
};

struct Pod {
  uint32_t index = 0;
  std::string key;
  common::Policy policy;
  PodRegionMap region;
  uint32_t processes = 0;  // admitted processes using this pod region
  bool truncated_reported = false;
};

class PodRegistry {
 public:
  explicit PodRegistry(const NodeConfig& config);

  // Registrations. register_container validates the policy; returns "" or an error line.
  std::string register_container(const Registration& r);
  bool unregister_container(const std::string& container_id);
  // The registration whose cgroup is this one or one of its ancestors.
  const Registration* match_cgroup(const std::string& cgroup) const;
  const std::map<std::string, Registration>& registrations() const { return registrations_; }

  // Live overrides (`quantactl set`); validated; returns "" or an error line.
  std::string set_override(const std::string& pod_key,
                           const std::map<std::string, std::string>& values);

  // The policy a pod has now: registration or config table, then overrides.
  common::Policy resolve_policy(const std::string& pod_key) const;

  // Pods with regions.
  Pod& get_or_create(const std::string& key);
  // Re-opens a region left by a previous arbiter; throws RegionError on a mismatch.
  Pod& adopt(uint32_t index);
  Pod* find(uint32_t index);
  Pod* find_key(const std::string& key);
  // Unlinks and forgets a pod that has no processes left.
  void release_if_unused(uint32_t index);
  std::map<uint32_t, Pod>& pods() { return pods_; }

  void load_state();
  void save_state() const;

 private:
  std::string state_file() const;

  const NodeConfig& config_;
  std::map<std::string, Registration> registrations_;
  std::map<std::string, std::map<std::string, std::string>> overrides_;
  std::map<uint32_t, Pod> pods_;
  std::map<uint32_t, std::string> recorded_keys_;  // pod index → key, from the state file
};

}  // namespace quanta::arbiter
