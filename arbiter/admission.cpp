// Admission and attach rules: which pod a process joins, which entry and slot it gets, and
// the line each refusal sends.
#include "arbiter/admission.h"

#include "hosted/names.h"

namespace quanta::arbiter {

common::RefusedAction unplaced_action(config::UnplacedAction rule, bool registered,
                                      const common::Policy* policy) {
  switch (rule) {
    case config::UnplacedAction::kOpen:
      return common::RefusedAction::kRunOpen;
    case config::UnplacedAction::kClosed:
      return common::RefusedAction::kDeny;
    case config::UnplacedAction::kClosedIfCapped:
      return registered && policy != nullptr && policy->memory_limit != 0
                 ? common::RefusedAction::kDeny
                 : common::RefusedAction::kRunOpen;
  }
  return common::RefusedAction::kRunOpen;
}

namespace {

// The pod an unregistered newcomer names, or why it names none it may join.
std::optional<std::string> claim_refusal(const Newcomer& newcomer, const PodRegistry& pods,
                                         const config::NodeConfig& config) {
  const std::string pid = std::to_string(newcomer.pid);
  if (!config.allow_unregistered) {
    return "pid " + pid + " (cgroup " +
           (newcomer.cgroup.empty() ? std::string("unknown") : hosted::printable(newcomer.cgroup)) +
           ") is not in a registered container and this node does not admit unregistered "
           "processes (allow_unregistered = false)";
  }
  if (newcomer.claimed_pod.empty()) {
    return "pid " + pid +
           " is not in a registered container and names no pod: set QUANTA_POD=<name>";
  }
  std::string err = hosted::check_pod_key(newcomer.claimed_pod, "QUANTA_POD");
  if (!err.empty()) return err;
  for (const auto& [id, r] : pods.registrations()) {
    if (r.pod_key() == newcomer.claimed_pod) {
      return "QUANTA_POD " + newcomer.claimed_pod +
             " names a registered pod; only its own containers join it";
    }
  }
  return std::nullopt;
}

}  // namespace

PodChoice choose_pod(const Newcomer& newcomer, const PodRegistry& pods,
                     const config::NodeConfig& config,
                     const std::set<std::string>& previous_release_pods) {
  PodChoice out;
  out.registration = pods.match_cgroup(newcomer.cgroup);
  if (out.registration != nullptr) {
    out.key = out.registration->pod_key();
  } else if (auto refused = claim_refusal(newcomer, pods, config)) {
    out.action = unplaced_action(config.enforce.unplaced, false, nullptr);
    out.refusal = Refusal{std::move(*refused), out.action};
    return out;
  } else {
    out.key = newcomer.claimed_pod;
  }
  const common::Policy policy = pods.resolve_policy(out.key);
  out.action = unplaced_action(config.enforce.unplaced, out.registration != nullptr, &policy);
  // Layout 2 shows each slot's pid, pod and cap to the other layout-2 processes of a GPU: only
  // pods the previous release placed get it, never one a process chooses it for.
  if (newcomer.layout == common::layout2::kVersion && pods.find_key(out.key) == nullptr &&
      previous_release_pods.count(out.key) == 0) {
    out.refusal =
        Refusal{"pod " + out.key + " was not placed by the previous release, and this process's " +
                    "libquanta.so maps shared-memory layout 2: only such pods are served in that " +
                    "layout; restart the pod so that it loads the libquanta.so installed now",
                out.action};
  }
  return out;
}

uint32_t free_entry(const std::bitset<common::kMaxProcsPerPod>& entries) {
  for (uint32_t i = 0; i < common::kMaxProcsPerPod; ++i) {
    if (!entries.test(i)) return i;
  }
  return common::kMaxProcsPerPod;
}

std::optional<std::string> join_refusal(const std::string& key, uint32_t pod_layout,
                                        const std::bitset<common::kMaxProcsPerPod>& entries,
                                        uint32_t layout) {
  if (pod_layout != layout) {
    // One pod region, one layout: a pod whose containers load libquanta.so of two releases (a
    // container added to a running pod after an upgrade) keeps the first one's.
    return "pod " + key + "'s other processes map shared-memory layout " +
           std::to_string(pod_layout) + ", this process's libquanta.so " + std::to_string(layout) +
           ": one pod's containers must load one release's libquanta.so; restart the pod so "
           "that all of them load the one installed now";
  }
  if (free_entry(entries) == common::kMaxProcsPerPod) {
    return "pod " + key + " already has " + std::to_string(common::kMaxProcsPerPod) +
           " processes on the GPUs, the most one pod may have";
  }
  return std::nullopt;
}

std::optional<std::string> hello_refusal(pid_t pid, uint32_t admitted_layout, uint32_t layout) {
  if (admitted_layout == layout) return std::nullopt;
  return "pid " + std::to_string(pid) + " was admitted with shared-memory layout " +
         std::to_string(admitted_layout) + " and now says Hello with " + std::to_string(layout) +
         ": one pod's containers must load one release's libquanta.so";
}

std::optional<std::string> device_refusal(const DeviceGrant& devices, const std::string& uuid) {
  if (devices.all || devices.uuids.count(uuid) != 0) return std::nullopt;
  std::string given;
  for (const std::string& u : devices.uuids) given += (given.empty() ? "" : ", ") + u;
  return "GPU " + uuid + " was not given to this container (" + devices.source + " gives " +
         (given.empty() ? std::string("none") : given) + ")";
}

SlotId first_free_slot(const std::map<SlotId, pid_t>& slot_pids) {
  SlotId expected = 0;
  for (const auto& [slot, pid] : slot_pids) {  // in slot order: the first gap is the answer
    if (slot != expected) break;
    ++expected;
  }
  return expected < common::kMaxSlotsPerGpu ? expected : common::kNoSlot;
}

}  // namespace quanta::arbiter
