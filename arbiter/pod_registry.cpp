// Pod bookkeeping and policy resolution, plus the small JSON state file that keeps
// registrations and live overrides across arbiter restarts.
#include "arbiter/pod_registry.h"

#include <spdlog/spdlog.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

namespace quanta::arbiter {

std::string Registration::pod_key() const {
  if (!pod_name.empty())
    return (pod_namespace.empty() ? "default" : pod_namespace) + "/" + pod_name;
  return "uid:" + pod_uid;
}

PodRegistry::PodRegistry(const NodeConfig& config) : config_(config) {}

std::string PodRegistry::register_container(const Registration& r) {
  if (r.container_id.empty()) return "register needs a container_id";
  if (r.cgroup_path.empty() || r.cgroup_path[0] != '/') {
    return "register needs cgroup_path, the container's cgroup as /proc/<pid>/cgroup shows it "
           "(\"/kubepods/…\")";
  }
  if (r.pod_name.empty() && r.pod_uid.empty())
    return "register needs pod_name (with pod_namespace) or pod_uid";
  if (r.pod_key().size() >= common::kPodKeyLen) return "pod key " + r.pod_key() + " is too long";
  for (const std::string& d : r.devices) {
    if (d.size() >= common::kUuidLen || (d.rfind("GPU-", 0) != 0 && d.rfind("MIG-", 0) != 0))
      return "container " + r.container_id + ": device \"" + d +
             "\" is not a GPU or MIG UUID (GPU-… or MIG-…, as NVML reports it)";
  }
  common::Policy p = config_.defaults;
  for (const auto& [k, v] : r.policy) {
    std::string err = apply_policy_value(&p, k, v);
    if (!err.empty()) return "container " + r.container_id + ": " + err;
  }
  registrations_[r.container_id] = r;
  return "";
}

bool PodRegistry::unregister_container(const std::string& container_id) {
  return registrations_.erase(container_id) != 0;
}

const Registration* PodRegistry::match_cgroup(const std::string& cgroup) const {
  const Registration* best = nullptr;
  for (const auto& [id, r] : registrations_) {
    const std::string& c = r.cgroup_path;
    bool inside = cgroup == c || (cgroup.size() > c.size() && cgroup.compare(0, c.size(), c) == 0 &&
                                  (c.back() == '/' || cgroup[c.size()] == '/'));
    if (inside && (best == nullptr || c.size() > best->cgroup_path.size())) best = &r;
  }
  return best;
}

std::string PodRegistry::set_override(const std::string& pod_key,
                                      const std::map<std::string, std::string>& values) {
  if (pod_key.empty() || pod_key.size() >= common::kPodKeyLen) return "set needs a pod name";
  if (values.empty())
    return "set needs at least one key=value (weight, priority, max-share, memory-limit, quantum)";
  common::Policy probe = resolve_policy(pod_key);
  for (const auto& [k, v] : values) {
    std::string err = apply_policy_value(&probe, k, v);
    if (!err.empty()) return err;
  }
  for (const auto& [k, v] : values) {
    std::string key = k;
    for (char& c : key) c = c == '_' ? '-' : c;
    overrides_[pod_key][key] = v;
  }
  return "";
}

common::Policy PodRegistry::resolve_policy(const std::string& pod_key) const {
  common::Policy p = config_.policy_for(pod_key);
  for (const auto& [id, r] : registrations_) {
    if (r.pod_key() != pod_key) continue;
    p = config_.defaults;
    for (const auto& [k, v] : r.policy) apply_policy_value(&p, k, v);
    break;
  }
  auto it = overrides_.find(pod_key);
  if (it != overrides_.end()) {
    for (const auto& [k, v] : it->second) apply_policy_value(&p, k, v);
  }
  return p;
}

Pod& PodRegistry::get_or_create(const std::string& key) {
  if (Pod* p = find_key(key)) return *p;
  uint32_t index = 0;
  while (pods_.count(index) != 0) ++index;
  std::string name = pod_region_name(config_.scope, index);
  // Every region a previous arbiter left was adopted at start, so one under a free index
  // belongs to nobody alive: start it afresh.
  boost::interprocess::shared_memory_object::remove(name.c_str());
  Pod pod;
  pod.index = index;
  pod.key = key;
  pod.policy = resolve_policy(key);
  pod.region = PodRegionMap(name, common::kPodMagic);
  std::strncpy(pod.region->header.pod_key, key.c_str(), common::kPodKeyLen - 1);
  Pod& out = pods_[index] = std::move(pod);
  save_state();
  return out;
}

Pod& PodRegistry::adopt(uint32_t index) {
  Pod pod;
  pod.index = index;
  pod.region = PodRegionMap(pod_region_name(config_.scope, index), common::kPodMagic);
  if (!pod.region.reopened())
    throw RegionError("pod region " + std::to_string(index) + " vanished");
  // The header's key is tenant-writable: trust the key this arbiter recorded, so a pod
  // cannot rename its region into another pod's after a restart.
  std::string claimed(pod.region->header.pod_key,
                      strnlen(pod.region->header.pod_key, common::kPodKeyLen));
  auto recorded = recorded_keys_.find(index);
  if (recorded != recorded_keys_.end()) {
    pod.key = recorded->second;
    if (claimed != pod.key) {
      spdlog::warn(
          "pod region {} says it belongs to \"{}\" but was created for \"{}\": keeping the latter",
          index, claimed, pod.key);
      std::strncpy(pod.region->header.pod_key, pod.key.c_str(), common::kPodKeyLen - 1);
    }
  } else {
    pod.key = claimed;
    spdlog::warn("pod region {} is not in {}; taking its own word that it belongs to \"{}\"", index,
                 state_file(), pod.key);
  }
  for (const auto& [i, p] : pods_) {
    if (p.key == pod.key)
      throw RegionError("pod regions " + std::to_string(i) + " and " + std::to_string(index) +
                        " both claim pod " + pod.key);
  }
  pod.policy = resolve_policy(pod.key);
  return pods_[index] = std::move(pod);
}

Pod* PodRegistry::find(uint32_t index) {
  auto it = pods_.find(index);
  return it == pods_.end() ? nullptr : &it->second;
}

Pod* PodRegistry::find_key(const std::string& key) {
  for (auto& [i, p] : pods_) {
    if (p.key == key) return &p;
  }
  return nullptr;
}

void PodRegistry::release_if_unused(uint32_t index) {
  auto it = pods_.find(index);
  if (it == pods_.end() || it->second.processes != 0) return;
  it->second.region.unlink();
  pods_.erase(it);
  save_state();
}

std::string PodRegistry::state_file() const {
  return config_.state_dir + "/" + config_.scope + ".state.json";
}

void PodRegistry::load_state() {
  std::ifstream in(state_file());
  if (!in) return;
  try {
    nlohmann::json j = nlohmann::json::parse(in);
    const nlohmann::json empty_list = nlohmann::json::array();
    const nlohmann::json empty_object = nlohmann::json::object();
    const nlohmann::json& saved = j.contains("registrations") ? j["registrations"] : empty_list;
    for (const auto& r : saved) {
      Registration reg;
      reg.container_id = r.value("container_id", "");
      reg.pod_uid = r.value("pod_uid", "");
      reg.pod_name = r.value("pod_name", "");
      reg.pod_namespace = r.value("pod_namespace", "");
      reg.container_name = r.value("container_name", "");
      reg.cgroup_path = r.value("cgroup_path", "");
      reg.devices = r.value("devices", std::vector<std::string>{});
      reg.policy = r.value("policy", std::map<std::string, std::string>{});
      std::string err = register_container(reg);
      if (!err.empty()) spdlog::warn("{}: dropping a saved registration: {}", state_file(), err);
    }
    const nlohmann::json& pods = j.contains("pods") ? j["pods"] : empty_object;
    for (const auto& [index, key] : pods.items()) {
      if (key.is_string())
        recorded_keys_[static_cast<uint32_t>(std::stoul(index))] = key.get<std::string>();
    }
    const nlohmann::json& overrides = j.contains("overrides") ? j["overrides"] : empty_object;
    for (const auto& [pod, values] : overrides.items()) {
      std::string err = set_override(pod, values.get<std::map<std::string, std::string>>());
      if (!err.empty())
        spdlog::warn("{}: dropping saved settings of pod {}: {}", state_file(), pod, err);
    }
  } catch (const std::exception& e) {
    spdlog::warn("{}: ignoring unreadable state ({})", state_file(), e.what());
  }
}

void PodRegistry::save_state() const {
  nlohmann::json j;
  j["registrations"] = nlohmann::json::array();
  for (const auto& [id, r] : registrations_) {
    j["registrations"].push_back({{"container_id", r.container_id},
                                  {"pod_uid", r.pod_uid},
                                  {"pod_name", r.pod_name},
                                  {"pod_namespace", r.pod_namespace},
                                  {"container_name", r.container_name},
                                  {"cgroup_path", r.cgroup_path},
                                  {"devices", r.devices},
                                  {"policy", r.policy}});
  }
  j["overrides"] = overrides_;
  j["pods"] = nlohmann::json::object();
  for (const auto& [index, pod] : pods_) j["pods"][std::to_string(index)] = pod.key;
  std::error_code ec;
  std::filesystem::create_directories(config_.state_dir, ec);
  std::string tmp = state_file() + ".tmp";
  {
    std::ofstream out(tmp);
    out << j.dump(2) << "\n";
    if (!out) {
      spdlog::warn("cannot write {}: registrations will not survive a restart", tmp);
      return;
    }
  }
  std::filesystem::rename(tmp, state_file(), ec);
  if (ec) spdlog::warn("cannot replace {}: {}", state_file(), ec.message());
}

}  // namespace quanta::arbiter
