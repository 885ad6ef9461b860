// Pod bookkeeping, policy resolution and the state file's load and save.
#include "arbiter/state/pod_registry.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "common/clock.h"
#include "hosted/names.h"

namespace quanta::arbiter {

std::string Registration::pod_key() const {
  if (!pod_name.empty())
    return (pod_namespace.empty() ? "default" : pod_namespace) + "/" + pod_name;
  return "uid:" + pod_uid;
}

namespace {

uint64_t random_tag() {
  uint64_t tag = 0;
  while (tag == 0) {
    if (getrandom(&tag, sizeof(tag), 0) != static_cast<ssize_t>(sizeof(tag))) tag = 0;
  }
  return tag;
}

}  // namespace

PodRegistry::PodRegistry(const config::NodeConfig& config)
    : config_(config), now_(common::monotonic_ns) {}

bool PodRegistry::dead(const std::string& container_id, const Registration& r) const {
  auto record = records_.find(container_id);
  const uint64_t since = record == records_.end() ? 0 : record->second.since_ns;
  return now_() - since >= kRegistrationGraceNs && !cgroup_alive_(r.cgroup_path);
}

void PodRegistry::drop_registration(std::map<std::string, Registration>::iterator it,
                                    const char* why) {
  spdlog::warn("container {} of pod {} {}: its registration is dropped",
               hosted::printable(it->first), hosted::printable(it->second.pod_key()), why);
  erase_registration(it);
}

void PodRegistry::erase_registration(std::map<std::string, Registration>::iterator it) {
  records_.erase(it->first);
  auto pod = by_pod_.find(it->second.pod_key());
  if (pod != by_pod_.end() && pod->second.erase(it->first) != 0 && pod->second.empty())
    by_pod_.erase(pod);
  auto ns = per_namespace_.find(namespace_of(it->second.pod_key()));
  if (ns != per_namespace_.end() && --ns->second == 0) per_namespace_.erase(ns);
  registrations_.erase(it);
}

std::set<std::string> PodRegistry::reap_dead_registrations(size_t budget) {
  std::vector<std::string> gone;
  auto it = registrations_.lower_bound(reap_cursor_);
  const size_t looks = std::min(budget, registrations_.size());
  for (size_t looked = 0; looked < looks; ++looked, ++it) {
    if (it == registrations_.end()) it = registrations_.begin();
    if (dead(it->first, it->second)) gone.push_back(it->first);
  }
  reap_cursor_ = it == registrations_.end() ? std::string() : it->first;
  std::set<std::string> touched;
  for (const std::string& id : gone) {
    auto dropped = registrations_.find(id);
    touched.insert(dropped->second.pod_key());
    drop_registration(dropped, "ended without its poststop hook (its cgroup is gone)");
  }
  for (const std::string& key : touched) forget_overrides_if_unknown(key);
  return touched;
}

std::string PodRegistry::registration_bound_error(const Registration& r) {
  if (registrations_.count(r.container_id) != 0) return "";  // registered again: counted
  const std::string key = r.pod_key();
  const std::string ns = namespace_of(key);
  auto in_pod = [&] {
    auto pod = by_pod_.find(key);
    return pod == by_pod_.end() ? size_t{0} : pod->second.size();
  };
  auto in_namespace = [&] {
    auto n = per_namespace_.find(ns);
    return n == per_namespace_.end() ? size_t{0} : n->second;
  };
  auto in_node = [&] { return registrations_.size(); };
  struct Bound {
    std::function<size_t()> count;
    std::function<bool(const Registration&)> in_scope;
    size_t most;
    std::string what;
  };
  for (const Bound& b : {
           Bound{in_pod, [&](const Registration& o) { return o.pod_key() == key; },
                 kMaxRegistrationsPerPod, "pod " + key},
           Bound{in_namespace,
                 [&](const Registration& o) { return namespace_of(o.pod_key()) == ns; },
                 kMaxRegistrationsPerNamespace,
                 "namespace " + (ns.empty() ? std::string("(none)") : ns)},
           Bound{in_node, [](const Registration&) { return true; }, kMaxRegistrations,
                 "this node"}}) {
    if (b.count() < b.most) continue;
    // At the bound: the dead registrations in its way make room first.
    for (auto it = registrations_.begin(); it != registrations_.end();) {
      auto next = std::next(it);
      if (b.in_scope(it->second) && dead(it->first, it->second))
        drop_registration(it, "ended without its poststop hook (its cgroup is gone)");
      it = next;
    }
    if (b.count() >= b.most)
      return "container " + hosted::printable(r.container_id) + " of pod " + key +
             " is refused: " + b.what + " already has " + std::to_string(b.count()) +
             " registered containers, the most it may have (" + std::to_string(b.most) +
             "); a registration ends with its container";
  }
  return "";
}

std::string PodRegistry::register_container(const Registration& r) {
  std::string err;
  if (r.container_id.empty()) return "register needs a container_id";
  if (!(err = hosted::check_text(r.container_id, "container_id", 256)).empty()) return err;
  if (r.cgroup_path.empty() || r.cgroup_path[0] != '/') {
    return "register needs cgroup_path, the container's cgroup as /proc/<pid>/cgroup shows it "
           "(\"/kubepods/…\")";
  }
  if (!(err = hosted::check_text(r.cgroup_path, "cgroup_path", 4096)).empty()) return err;
  if (!(err = hosted::check_text(r.container_name, "container_name", 256)).empty()) return err;
  if (r.pod_name.empty() && r.pod_uid.empty())
    return "register needs pod_name (with pod_namespace) or pod_uid";
  if (!(err = hosted::check_pod_key(r.pod_key(), "pod key")).empty()) return err;
  for (const std::string& d : r.devices) {
    if (d.size() >= common::kUuidLen || (d.rfind("GPU-", 0) != 0 && d.rfind("MIG-", 0) != 0) ||
        !hosted::check_pod_key(d, "device").empty())
      return "container " + hosted::printable(r.container_id) + ": device \"" +
             hosted::printable(d) +
             "\" is not a GPU or MIG UUID (GPU-… or MIG-…, as NVML reports it)";
  }
  const std::string key = r.pod_key();
  // The pod's other containers (a copy: a dead one is dropped on the way).
  std::vector<std::string> same_pod;
  if (auto pod = by_pod_.find(key); pod != by_pod_.end())
    same_pod.assign(pod->second.begin(), pod->second.end());
  for (const std::string& id : same_pod) {
    auto it = registrations_.find(id);
    const Registration& o = it->second;
    if (id == r.container_id || o.pod_uid == r.pod_uid) continue;
    if (cgroup_alive_(o.cgroup_path))
      return "container " + hosted::printable(r.container_id) + " claims pod " + key +
             " with pod uid \"" + hosted::printable(r.pod_uid) +
             "\", but a live container registered pod " + key +
             " with another uid: a pod's name belongs to one live pod (a recreated pod registers "
             "once the old one's containers are gone)";
    spdlog::warn("pod {} is recreated with pod uid {}", key, hosted::printable(r.pod_uid));
    drop_registration(it, "left no poststop and its cgroup is gone");
  }
  // One pod, one policy: a runtime gives every container of a pod the pod's annotations,
  // so another set of values for a live pod is refused rather than merged or ranked.
  if (auto pod = by_pod_.find(key); pod != by_pod_.end()) {
    for (const std::string& id : pod->second) {
      const Registration& o = registrations_.at(id);
      if (id == r.container_id || o.policy == r.policy) continue;
      auto text = [](const std::map<std::string, std::string>& m) {
        std::string out;
        for (const auto& [k, v] : m)
          out += (out.empty() ? "" : ", ") + k + "=" + hosted::printable(v);
        return out.empty() ? std::string("no quanta.dev/* values") : out;
      };
      return "container " + hosted::printable(r.container_id) + " of pod " + key + " asks for " +
             text(r.policy) + ", but the pod's running containers registered " + text(o.policy) +
             ": the containers of one pod share one policy (change it for the whole pod with "
             "quantactl set)";
    }
  }
  if (!(err = registration_bound_error(r)).empty()) return err;
  common::Policy p = config_.defaults;
  for (const auto& [k, v] : r.policy) {
    err = config::apply_policy_value(&p, k, v);
    if (!err.empty()) return "container " + hosted::printable(r.container_id) + ": " + err;
  }
  // What the pod asked for against its namespace's bounds; the operator's own overrides
  // (`quantactl set`, below) are not bounded.
  const std::string ns = namespace_of(key);
  const bool own_table = config_.namespace_bounds.count(ns) != 0;
  // (quanta-hook names the container and pod before the line it shows.)
  err = config::bounds_error(config_.bounds_for(ns),
                             own_table ? "[namespace.\"" + ns + "\"]" : "[bounds]", p, r.policy);
  if (!err.empty()) return err;
  auto overridden = overrides_.find(r.pod_key());
  if (overridden != overrides_.end()) {
    for (const auto& [k, v] : overridden->second) config::apply_policy_value(&p, k, v);
  }
  err = config::policy_error(p);
  if (err.empty()) err = check_minimums(r.pod_key(), p, r.devices, overridden == overrides_.end());
  if (!err.empty())
    return "container " + hosted::printable(r.container_id) + " of pod " + r.pod_key() + ": " + err;
  if (auto again = registrations_.find(r.container_id); again != registrations_.end())
    erase_registration(again);
  registrations_[r.container_id] = r;
  records_[r.container_id] = Record{now_(), render_registration(r)};
  by_pod_[key].insert(r.container_id);
  ++per_namespace_[namespace_of(key)];
  return "";
}

namespace {

std::string share_text(uint64_t ppm) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", static_cast<double>(ppm) / common::kShareScale);
  return buf;
}

bool can_share(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  if (a.empty() || b.empty()) return true;  // one of them may use any GPU
  for (const std::string& x : a) {
    if (std::find(b.begin(), b.end(), x) != b.end()) return true;
  }
  return false;
}

}  // namespace

std::string PodRegistry::check_minimums(const std::string& pod_key, const common::Policy& policy,
                                        const std::vector<std::string>& devices, bool bounded) const {
  if (policy.min_share_ppm == 0) return "";
  // Every other pod that could run on a GPU this one may use, with its devices (the union
  // of its containers' lists; a pod with no list, or none registered, may use any GPU).
  std::map<std::string, std::vector<std::string>> others;
  std::map<std::string, bool> anywhere;
  for (const auto& [id, r] : registrations_) {
    if (r.pod_key() == pod_key) continue;
    // A container that ended without its poststop promises nothing (the probe costs a
    // stat, so only for the few pods that hold a minimum).
    if (resolve_policy(r.pod_key()).min_share_ppm != 0 && dead(id, r)) continue;
    auto& list = others[r.pod_key()];
    if (r.devices.empty()) anywhere[r.pod_key()] = true;
    list.insert(list.end(), r.devices.begin(), r.devices.end());
  }
  for (const auto& [index, pod] : pods_) {
    if (pod.key != pod_key && !others.count(pod.key)) {
      others[pod.key];
      anywhere[pod.key] = true;
    }
  }
  // The refusal says what was refused and the room left, never which pods hold the rest:
  // it lands in the refused pod's own events.
  const std::string ns = namespace_of(pod_key);
  const uint32_t ns_cap = config_.bounds_for(ns).namespace_min_share_ppm;
  uint64_t promised = 0, promised_in_ns = 0;
  for (auto& [key, list] : others) {
    if (anywhere[key]) list.clear();
    const uint32_t min = resolve_policy(key).min_share_ppm;
    if (min == 0 || !can_share(list, devices)) continue;
    promised += min;
    if (namespace_of(key) == ns) promised_in_ns += min;
  }
  if (promised + policy.min_share_ppm > common::kShareScale)
    return "min-share " + share_text(policy.min_share_ppm) +
           " is refused: pods that can share a GPU with it are already promised " +
           share_text(promised) + " of it, so at most " +
           share_text(common::kShareScale - std::min<uint64_t>(promised, common::kShareScale)) +
           " is left (the minimums on a GPU add up to at most 1)";
  if (bounded && promised_in_ns + policy.min_share_ppm > ns_cap)
    return "min-share " + share_text(policy.min_share_ppm) + " is refused: pods of namespace " +
           (ns.empty() ? std::string("(none)") : ns) + " that can share a GPU with it are already promised " +
           share_text(promised_in_ns) + ", and the node allows a namespace " + share_text(ns_cap) +
           " of a GPU (namespace_min_share), so at most " +
           share_text(ns_cap - std::min<uint64_t>(promised_in_ns, ns_cap)) + " is left";
  return "";
}

uint64_t PodRegistry::promised_minimum_ppm(const std::string& uuid) const {
  std::map<std::string, bool> here;  // pod key -> may use `uuid`
  for (const auto& [id, r] : registrations_) {
    if (resolve_policy(r.pod_key()).min_share_ppm == 0 || dead(id, r)) continue;
    bool& may = here[r.pod_key()];
    may = may || can_share(r.devices, {uuid});
  }
  for (const auto& [index, pod] : pods_) here.emplace(pod.key, true);
  uint64_t promised = 0;
  for (const auto& [key, may] : here) {
    if (may) promised += resolve_policy(key).min_share_ppm;
  }
  return promised;
}

std::string namespace_of(const std::string& pod_key) {
  if (pod_key.rfind("uid:", 0) == 0) return "";
  const size_t slash = pod_key.find('/');
  return slash == std::string::npos ? "" : pod_key.substr(0, slash);
}

bool cgroup_exists(const std::string& path) {
  namespace fs = std::filesystem;
  if (path.empty() || path[0] != '/' || (path + "/").find("/../") != std::string::npos ||
      (path + "/").find("/./") != std::string::npos)
    return true;  // not a path this check can judge
  const size_t second = path.find('/', 1);
  const std::string top = path.substr(0, second);
  std::error_code ec;
  bool visible = false;
  for (const char* root : {"/sys/fs/cgroup", "/sys/fs/cgroup/memory"}) {
    if (top.size() > 1 && fs::is_directory(root + top, ec)) visible = true;
    if (fs::is_directory(root + path, ec)) return true;
  }
  return !visible;
}

bool PodRegistry::unregister_container(const std::string& container_id) {
  auto it = registrations_.find(container_id);
  if (it == registrations_.end()) return false;
  const std::string key = it->second.pod_key();
  erase_registration(it);
  forget_overrides_if_unknown(key);
  return true;
}

bool PodRegistry::known(const std::string& pod_key) const {
  if (by_pod_.count(pod_key) != 0 || config_.pods.count(pod_key) != 0) return true;
  for (const auto& [index, pod] : pods_) {
    if (pod.key == pod_key) return true;
  }
  return false;
}

std::set<std::string> PodRegistry::known_keys() const {
  std::set<std::string> keys;
  for (const auto& [key, ids] : by_pod_) keys.insert(key);
  for (const auto& [key, policy] : config_.pods) keys.insert(key);
  for (const auto& [index, pod] : pods_) keys.insert(pod.key);
  return keys;
}

void PodRegistry::forget_overrides_if_unknown(const std::string& pod_key) {
  auto it = overrides_.find(pod_key);
  if (it == overrides_.end() || known(pod_key)) return;
  spdlog::info("pod {} is gone: its live policy override is forgotten", hosted::printable(pod_key));
  overrides_.erase(it);
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
  if (pod_key.empty()) return "set needs a pod name";
  std::string err = hosted::check_pod_key(pod_key, "pod");
  if (!err.empty()) return err;
  if (!known(pod_key))
    return "pod " + hosted::printable(pod_key) +
           " is not known to this arbiter (no registered container, no process and no "
           "[pod.\"" +
           hosted::printable(pod_key) + "\"] table): check its name with `quantactl status`";
  return apply_override(pod_key, values);
}

std::string PodRegistry::apply_override(const std::string& pod_key,
                                        const std::map<std::string, std::string>& values) {
  std::string err;
  if (values.empty())
    return "set needs at least one key=value (weight, priority, max-share, min-share, "
           "memory-limit, quantum)";
  common::Policy probe = resolve_policy(pod_key);
  for (const auto& [k, v] : values) {
    err = config::apply_policy_value(&probe, k, v);
    if (!err.empty()) return err;
  }
  err = config::policy_error(probe);
  if (err.empty()) {
    std::vector<std::string> devices;
    bool registered = false;
    bool any_gpu = false;
    for (const auto& [id, r] : registrations_) {
      if (r.pod_key() != pod_key) continue;
      registered = true;
      any_gpu = any_gpu || r.devices.empty();
      devices.insert(devices.end(), r.devices.begin(), r.devices.end());
    }
    if (!registered || any_gpu) devices.clear();
    err = check_minimums(pod_key, probe, devices, /*bounded=*/false);
  }
  if (!err.empty()) return "pod " + pod_key + ": " + err;
  for (const auto& [k, v] : values) {
    std::string key = k;
    for (char& c : key) c = c == '_' ? '-' : c;
    overrides_[pod_key][key] = v;
  }
  return "";
}

namespace {

constexpr const char* kPolicyKeys[] = {"weight",    "priority",     "min-share",
                                       "max-share", "memory-limit", "quantum"};

// "quanta.dev/min_share" -> "min-share": the one spelling overrides and sources use.
std::string policy_key(const std::string& key) {
  constexpr std::string_view kAnnotationPrefix = "quanta.dev/";
  std::string k = key.rfind(kAnnotationPrefix, 0) == 0 ? key.substr(kAnnotationPrefix.size()) : key;
  for (char& c : k) c = c == '_' ? '-' : c;
  return k;
}

std::string policy_value_text(const common::Policy& p, const std::string& key) {
  if (key == "weight") return std::to_string(p.weight);
  if (key == "priority") return common::priority_name(p.priority);
  if (key == "min-share") return p.min_share_ppm == 0 ? "none" : share_text(p.min_share_ppm);
  if (key == "max-share") return share_text(p.max_share_ppm);
  if (key == "memory-limit") return p.memory_limit == 0 ? "none" : std::to_string(p.memory_limit);
  if (key == "quantum") {
    if (p.quantum_ns == 0) return "node default";
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%gms", static_cast<double>(p.quantum_ns) / 1e6);
    return buf;
  }
  return "";
}

}  // namespace

std::string PodRegistry::unset_override(const std::string& pod_key,
                                        const std::vector<std::string>& keys) {
  auto it = overrides_.find(pod_key);
  if (it == overrides_.end())
    return "pod " + hosted::printable(pod_key) +
           " has no live override (`quantactl policy` lists them)";
  for (const std::string& key : keys) {
    if (it->second.count(policy_key(key)) == 0)
      return "pod " + hosted::printable(pod_key) + " has no live " + hosted::printable(key) +
             " override; it has: " + [&] {
               std::string have;
               for (const auto& [k, v] : it->second) have += (have.empty() ? "" : ", ") + k;
               return have;
             }();
  }
  if (keys.empty()) {
    overrides_.erase(it);
  } else {
    for (const std::string& key : keys) it->second.erase(policy_key(key));
    if (it->second.empty()) overrides_.erase(it);
  }
  return "";
}

std::vector<PodRegistry::PolicyValue> PodRegistry::explain_policy(
    const std::string& pod_key) const {
  const common::Policy now = resolve_policy(pod_key);
  std::set<std::string> annotated;
  auto pod = by_pod_.find(pod_key);
  if (pod != by_pod_.end()) {
    for (const auto& [k, v] : registrations_.at(*pod->second.begin()).policy)
      annotated.insert(policy_key(k));
  }
  const bool tabled = pod == by_pod_.end() && config_.pods.count(pod_key) != 0;
  const common::Policy base = tabled ? config_.pods.at(pod_key) : config_.defaults;
  auto overridden = overrides_.find(pod_key);
  std::vector<PolicyValue> out;
  for (const char* key : kPolicyKeys) {
    std::string source = "default";
    if (overridden != overrides_.end() && overridden->second.count(key) != 0) {
      source = "override";
    } else if (annotated.count(key) != 0) {
      source = "annotation";
    } else if (tabled && policy_value_text(base, key) != policy_value_text(config_.defaults, key)) {
      source = "node table";
    }
    out.push_back(PolicyValue{key, policy_value_text(now, key), source});
  }
  return out;
}

common::Policy PodRegistry::resolve_policy(const std::string& pod_key) const {
  common::Policy p = config_.policy_for(pod_key);
  auto pod = by_pod_.find(pod_key);
  if (pod != by_pod_.end()) {
    // One pod, one policy: every registration of the pod carries the same values.
    p = config_.defaults;
    for (const auto& [k, v] : registrations_.at(*pod->second.begin()).policy)
      config::apply_policy_value(&p, k, v);
  }
  auto it = overrides_.find(pod_key);
  if (it != overrides_.end()) {
    for (const auto& [k, v] : it->second) config::apply_policy_value(&p, k, v);
  }
  return p;
}

Pod& PodRegistry::get_or_create(const std::string& key, bool registered,
                                const std::string& claimed_from, uint32_t layout) {
  if (Pod* p = find_key(key)) return *p;
  if (pods_.size() >= kMaxPods) {
    throw std::runtime_error("this node already has " + std::to_string(kMaxPods) +
                             " pods with processes, the most it keeps");
  }
  if (!registered) {
    size_t claimed = 0;
    size_t same_cgroup = 0;
    for (const auto& [i, p] : pods_) {
      if (p.registered) continue;
      ++claimed;
      same_cgroup += p.claimed_from == claimed_from ? 1 : 0;
    }
    if (claimed >= kMaxClaimedPods || same_cgroup >= kMaxClaimedPodsPerCgroup) {
      throw std::runtime_error("too many unregistered pods (" + std::to_string(claimed) +
                               " in all, " + std::to_string(same_cgroup) + " claimed from cgroup " +
                               hosted::printable(claimed_from) + "; at most " +
                               std::to_string(kMaxClaimedPods) + " and " +
                               std::to_string(kMaxClaimedPodsPerCgroup) + ")");
    }
  }
  uint32_t index = 0;
  while (pods_.count(index) != 0) ++index;
  Pod pod;
  pod.index = index;
  pod.key = key;
  pod.registered = registered;
  pod.claimed_from = registered ? "" : claimed_from;
  pod.policy = resolve_policy(key);
  pod.region = PodRegionMap::create(pod_region_name(config_.scope, index), layout);
  pod.recovery_tag = random_tag();
  std::strncpy(pod.region.header().pod_key, key.c_str(), common::kPodKeyLen - 1);
  pod.region.header().recovery_tag = pod.recovery_tag;
  Pod& out = pods_[index] = std::move(pod);
  save_state();
  return out;
}

Pod& PodRegistry::adopt(uint32_t index, UniqueFd fd, const SavedPod& saved) {
  Pod pod;
  pod.index = index;
  pod.key = saved.key;
  pod.recovery_tag = saved.recovery_tag;
  pod.region =
      PodRegionMap::adopt(std::move(fd), pod_region_name(config_.scope, index), saved.recovery_tag);
  if (pod.region.inode() != saved.inode)
    throw RegionError("pod region " + std::to_string(index) + " is not the file recorded for it");
  // The header's key is tenant-writable: the state file's record is the truth.
  std::strncpy(pod.region.header().pod_key, pod.key.c_str(), common::kPodKeyLen - 1);
  pod.region.header().pod_key[common::kPodKeyLen - 1] = '\0';
  for (const auto& [id, r] : registrations_)
    pod.registered = pod.registered || r.pod_key() == pod.key;
  // A re-adopted claimed pod still counts against its claimer's bound, so a restart never
  // lets one cgroup claim more pods than it could before.
  pod.claimed_from = pod.registered ? "" : saved.claimed_from;
  for (const auto& [i, p] : pods_) {
    if (p.key == pod.key)
      throw RegionError("pod regions " + std::to_string(i) + " and " + std::to_string(index) +
                        " are both recorded for pod " + hosted::printable(pod.key));
  }
  pod.policy = resolve_policy(pod.key);
  return pods_[index] = std::move(pod);
}

Pod* PodRegistry::find(uint32_t index) {
  return const_cast<Pod*>(std::as_const(*this).find(index));
}

const Pod* PodRegistry::find(uint32_t index) const {
  auto it = pods_.find(index);
  return it == pods_.end() ? nullptr : &it->second;
}

Pod* PodRegistry::find_key(const std::string& key) {
  return const_cast<Pod*>(std::as_const(*this).find_key(key));
}

const Pod* PodRegistry::find_key(const std::string& key) const {
  for (const auto& [i, p] : pods_) {
    if (p.key == key) return &p;
  }
  return nullptr;
}

void PodRegistry::release_if_unused(uint32_t index) {
  auto it = pods_.find(index);
  if (it == pods_.end() || it->second.processes() != 0) return;
  const std::string key = it->second.key;
  pods_.erase(it);
  forget_overrides_if_unknown(key);
  save_state();
}

void PodRegistry::close_replaced_with(std::function<void(int)> close_later) {
  close_replaced_ = std::move(close_later);
}

std::string PodRegistry::state_file() const {
  return config_.state_dir + "/" + config_.scope + ".state.json";
}

void PodRegistry::set_node_record(uint64_t generation, std::map<uint32_t, SavedGpu> gpus,
                                  std::string slot_key) {
  generation_ = generation;
  gpus_ = std::move(gpus);
  slot_key_ = std::move(slot_key);
}

SavedState PodRegistry::load_state() {
  std::ifstream in(state_file());
  if (!in) return SavedState();
  std::stringstream text;
  text << in.rdbuf();
  std::vector<std::string> warnings;
  SavedState saved = parse_state(text.str(), &warnings);
  for (const std::string& w : warnings) spdlog::warn("{}: {}", state_file(), hosted::printable(w));
  for (const Registration& reg : saved.registrations) {
    std::string err = register_container(reg);
    if (!err.empty()) spdlog::warn("{}: dropping a saved registration: {}", state_file(), err);
  }
  for (const auto& [pod, values] : saved.overrides) {
    bool had_region = false;
    for (const auto& [index, p] : saved.pods) had_region = had_region || p.key == pod;
    if (!had_region && !known(pod)) {
      spdlog::info("{}: pod {} is gone: its live policy override is forgotten", state_file(),
                   hosted::printable(pod));
      continue;
    }
    std::string err = apply_override(pod, values);
    if (!err.empty()) {
      spdlog::warn("{}: dropping saved settings of pod {}: {}", state_file(),
                   hosted::printable(pod), err);
    }
  }
  return saved;
}

void PodRegistry::save_state() const {
  SavedState s;
  s.generation = generation_;
  std::vector<std::string_view> registration_texts;
  registration_texts.reserve(records_.size());
  for (const auto& [id, record] : records_) registration_texts.push_back(record.text);
  s.overrides = overrides_;
  for (const auto& [index, pod] : pods_) {
    SavedPod& p = s.pods[index];
    p.key = pod.key;
    p.inode = pod.region.inode();
    p.recovery_tag = pod.recovery_tag;
    p.pids.assign(pod.pids.begin(), pod.pids.end());
    p.claimed_from = pod.claimed_from;
  }
  s.gpus = gpus_;
  s.slot_key = slot_key_;
  std::error_code ec;
  std::filesystem::create_directories(config_.state_dir, ec);
  const std::string tmp = state_file() + ".tmp";
  {
    // Root's alone (0600): it names every pod, its cgroup and its policy.
    const std::string text = render_state(s, registration_texts);
    UniqueFd out(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600));
    bool ok = out && fchmod(out.get(), 0600) == 0;
    for (size_t off = 0; ok && off < text.size();) {
      const ssize_t n = ::write(out.get(), text.data() + off, text.size() - off);
      if (n < 0 && errno == EINTR) continue;
      ok = n > 0;
      if (ok) off += static_cast<size_t>(n);
    }
    if (!ok) {
      spdlog::warn("cannot write {}: {}; registrations and pod regions will not survive a restart",
                   tmp, std::strerror(errno));
      saved_stamp_ = stamp_of_state_file();
      return;
    }
  }
  // Held across the rename, so the replaced file's blocks are freed where its last
  // descriptor is closed (close_replaced_with), not inside the rename.
  UniqueFd replaced(close_replaced_ ? ::open(state_file().c_str(), O_RDONLY | O_CLOEXEC) : -1);
  std::filesystem::rename(tmp, state_file(), ec);
  if (ec) spdlog::warn("cannot replace {}: {}", state_file(), ec.message());
  if (replaced) close_replaced_(replaced.release());
  saved_stamp_ = stamp_of_state_file();
}

PodRegistry::FileStamp PodRegistry::stamp_of_state_file() const {
  struct stat st {};
  if (::stat(state_file().c_str(), &st) != 0) return {};
  return FileStamp{static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino),
                   static_cast<uint64_t>(st.st_size),
                   static_cast<uint64_t>(st.st_mtim.tv_sec) * 1000000000ull +
                       static_cast<uint64_t>(st.st_mtim.tv_nsec)};
}

bool PodRegistry::state_file_changed() const {
  return stamp_of_state_file() != saved_stamp_;
}

}  // namespace quanta::arbiter
