// Pods and where their policy comes from: containers registered by quanta-hook (matched by
// cgroup path), the config's [pod."NAME"] tables and defaults, and live `quantactl set`
// overrides. Each pod with processes owns a pod region; which of its process entries are
// in use is counted here, never read from the tenant-writable region. Registrations,
// overrides and what a restart needs to re-adopt the regions are kept in the state file
// (state_file.h).
#pragma once

#include <bitset>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "arbiter/state/regions.h"
#include "arbiter/state/registration.h"
#include "arbiter/state/state_file.h"
#include "common/policy.h"
#include "config/node_config.h"

namespace quanta::arbiter {

struct Pod {
  uint32_t index = 0;
  std::string key;
  common::Policy policy;
  PodRegionMap region;
  uint64_t recovery_tag = 0;
  bool registered = false;   // created for a registered container (not a claimed name)
  std::string claimed_from;  // the cgroup of the process that claimed it (unregistered pods)
  std::bitset<common::kMaxProcsPerPod> entries;  // process entries in use
  std::set<pid_t> pids;                          // admitted processes
  // GPUs where NVML showed the pod above its cap and over_cap = deny: the cap its slots
  // carry there instead of the policy's (one byte: nothing more is allocated there).
  std::map<uint32_t, uint64_t> denied_caps;
  uint32_t processes() const { return static_cast<uint32_t>(entries.count()); }
};

// Whether the container cgroup `path` (as /proc/<pid>/cgroup names it) exists on this host:
// false only when its hierarchy is visible here (the path's first folder exists under
// /sys/fs/cgroup, unified or memory) and the cgroup is not in it; a hierarchy this process
// cannot see counts as alive, so nothing is dropped on a guess.
bool cgroup_exists(const std::string& path);

// The namespace of a pod key ("ns/name"); "" for pods outside Kubernetes ("uid:…", names
// without a namespace).
std::string namespace_of(const std::string& pod_key);

class PodRegistry {
 public:
  // Bounds on pods (each costs a region of sizeof(common::PodRegion) bytes).
  static constexpr size_t kMaxPods = 1024;
  static constexpr size_t kMaxClaimedPods = 64;          // unregistered pods in all
  static constexpr size_t kMaxClaimedPodsPerCgroup = 8;  // ... claimed from one cgroup
  // Bounds on registrations (a node runs a few hundred containers at most; a creation that
  // fails half way leaves its registration until the reaper finds its cgroup gone).
  static constexpr size_t kMaxRegistrations = 4096;
  static constexpr size_t kMaxRegistrationsPerNamespace = 1024;
  static constexpr size_t kMaxRegistrationsPerPod = 64;
  // How long a registration counts as alive whatever its cgroup says: a runtime may still
  // be creating it.
  static constexpr uint64_t kRegistrationGraceNs = 10ull * 1000 * 1000 * 1000;

  explicit PodRegistry(const config::NodeConfig& config);

  // Registrations. register_container validates names and the policy; "" or an error line.
  // A pod key (namespace/name) belongs to one pod uid while a container of that pod lives:
  // another uid claiming it is refused, and a registration of the old uid whose cgroup is
  // gone is dropped instead (the pod ended without its poststop hook).
  // Registrations beyond kMaxRegistrations*, after the dead ones in the way are dropped,
  // are refused.
  std::string register_container(const Registration& r);
  bool unregister_container(const std::string& container_id);
  // Registrations whose container ended without a poststop hook (a creation that failed
  // after createRuntime, a runtime that died): those older than kRegistrationGraceNs whose
  // cgroup is gone are dropped, each with a warning. Looks at up to `budget` registrations,
  // going on where the last call stopped, so a full registry costs the loop a little at a
  // time. Returns the keys of the pods that lost a registration.
  std::set<std::string> reap_dead_registrations(size_t budget);
  // The registration whose cgroup is this one or one of its ancestors.
  const Registration* match_cgroup(const std::string& cgroup) const;
  const std::map<std::string, Registration>& registrations() const { return registrations_; }

  // Live overrides (`quantactl set`, `unset`); validated; return "" or an error line. Only
  // a pod the arbiter knows (known()) takes one, and it lasts as long as the pod is known:
  // it goes with the pod's last registration, or with the last process of a pod no
  // registration names and no [pod] table lists.
  std::string set_override(const std::string& pod_key,
                           const std::map<std::string, std::string>& values);
  // Removes the named keys of the pod's override ("weight", "min-share"…; all when empty).
  std::string unset_override(const std::string& pod_key, const std::vector<std::string>& keys);
  const std::map<std::string, std::map<std::string, std::string>>& overrides() const {
    return overrides_;
  }
  // Registered, with processes now (a region), or named by a [pod."…"] table.
  bool known(const std::string& pod_key) const;
  // Every pod known(): registered, with processes now, or in a [pod] table.
  std::set<std::string> known_keys() const;

  // Each value of a pod's policy now and where it came from: "default" (the node's
  // [defaults]), "node table" ([pod."…"]), "annotation" (its registration) or "override"
  // (`quantactl set`). In the order weight, priority, min-share, max-share, memory-limit,
  // quantum.
  struct PolicyValue {
    std::string key;
    std::string value;
    std::string source;
  };
  std::vector<PolicyValue> explain_policy(const std::string& pod_key) const;

  // The policy a pod has now: registration or config table, then overrides.
  common::Policy resolve_policy(const std::string& pod_key) const;

  // Whether `pod_key` may have `policy` on `devices` (empty: any GPU) beside the pods
  // already known (registered, or with processes now): "" or why not. Minimum shares are
  // promises: those of pods that can use the same GPU must add up to at most the GPU, and
  // when `bounded` (a pod's own annotations, not `quantactl set`) those of one namespace to
  // at most its namespace_min_share.
  std::string check_minimums(const std::string& pod_key, const common::Policy& policy,
                             const std::vector<std::string>& devices, bool bounded = true) const;
  // The minimum shares promised on the GPU `uuid`: those of every pod that may use it
  // (registered for it or for any GPU, or with a region and no registration), whether or
  // not its processes run there now. The sum the rule above keeps within the GPU.
  uint64_t promised_minimum_ppm(const std::string& uuid) const;

  // Pods with regions.
  // The pod named `key`, its region created in shared-memory `layout` if it has none (one it
  // has keeps its own layout: the caller compares). `claimed_from` is the claimer's cgroup
  // for a pod no registration names ("" for registered pods). Throws RegionError, or
  // std::runtime_error when a bound is reached.
  Pod& get_or_create(const std::string& key, bool registered, const std::string& claimed_from,
                     uint32_t layout = common::kLayoutVersion);
  // Takes a region a previous arbiter left, found through a tenant's mapping; throws
  // RegionError when it is not the one recorded (seals, size, header, tag). Never refused
  // by the bounds (its processes run on), but it counts against them, its claimer's too.
  Pod& adopt(uint32_t index, UniqueFd fd, const SavedPod& saved);
  Pod* find(uint32_t index);
  const Pod* find(uint32_t index) const;
  Pod* find_key(const std::string& key);
  const Pod* find_key(const std::string& key) const;
  // Forgets a pod that has no processes left (tenants keep their mappings).
  void release_if_unused(uint32_t index);
  std::map<uint32_t, Pod>& pods() { return pods_; }
  const std::map<uint32_t, Pod>& pods() const { return pods_; }

  // The state file. load_state returns what the last arbiter recorded about regions (the
  // registry keeps registrations and overrides itself); it never throws.
  SavedState load_state();
  // Never throws: a failure is logged and the previous file stays.
  void save_state() const;
  // Whether the state file is no longer the one the last save wrote (removed with its
  // folder, truncated, edited, replaced): a restart would then lose the pods' regions, so
  // the heartbeat writes it again at once.
  bool state_file_changed() const;
  // What the arbiter adds to every save: its generation, its control regions and the key
  // of their owner words (slot_owner.h).
  void set_node_record(uint64_t generation, std::map<uint32_t, SavedGpu> gpus,
                       std::string slot_key);
  // Where a save sends a descriptor of the file it replaced, the last reference to it.
  // Freeing a file's blocks can wait for the disk (on a filesystem mounted with discard the
  // kernel trims them before the unlink returns), so the arbiter closes it on another
  // thread instead of on its event loop. Unset: closed during the save.
  void close_replaced_with(std::function<void(int)> close_later);
  // Whether a registration's cgroup still exists (default: cgroup_exists); tests substitute.
  void probe_cgroups_with(std::function<bool(const std::string&)> alive) { cgroup_alive_ = std::move(alive); }
  // The clock registrations are aged by (default: common::monotonic_ns); tests substitute.
  void use_clock(std::function<uint64_t()> now) { now_ = std::move(now); }

 private:
  std::string state_file() const;
  // Whether a registration ended without its poststop: past its grace, cgroup gone.
  bool dead(const std::string& container_id, const Registration& r) const;
  void drop_registration(std::map<std::string, Registration>::iterator it, const char* why);
  void erase_registration(std::map<std::string, Registration>::iterator it);
  // "" or why `r` (a new container) would pass a bound on registrations, after dropping
  // the dead registrations that count against that bound.
  std::string registration_bound_error(const Registration& r);

  const config::NodeConfig& config_;
  std::map<std::string, Registration> registrations_;
  // Per registration: when it was made (this arbiter's clock; a restart starts the grace
  // again) and its text in the state file.
  struct Record {
    uint64_t since_ns = 0;
    std::string text;
  };
  std::map<std::string, Record> records_;
  std::map<std::string, std::set<std::string>> by_pod_;  // pod key → its container ids
  std::map<std::string, size_t> per_namespace_;          // namespace → its registrations
  std::string reap_cursor_;  // the container id the reaper looks at next
  std::function<bool(const std::string&)> cgroup_alive_ = cgroup_exists;
  std::function<uint64_t()> now_;
  std::map<std::string, std::map<std::string, std::string>> overrides_;
  // set_override without the check that the pod is known (a restart's saved overrides).
  std::string apply_override(const std::string& pod_key,
                             const std::map<std::string, std::string>& values);
  void forget_overrides_if_unknown(const std::string& pod_key);
  std::map<uint32_t, Pod> pods_;
  uint64_t generation_ = 0;
  std::map<uint32_t, SavedGpu> gpus_;
  std::string slot_key_;
  // The state file as the last save left it (all zeros: absent).
  struct FileStamp {
    uint64_t dev = 0, ino = 0, size = 0, mtime_ns = 0;
    bool operator==(const FileStamp&) const = default;
  };
  FileStamp stamp_of_state_file() const;
  mutable FileStamp saved_stamp_;
  std::function<void(int)> close_replaced_;
};

}  // namespace quanta::arbiter
