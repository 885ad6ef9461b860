// The rules that admit a process into a pod and attach it to a GPU, as functions of what the
// arbiter knows when it asks (its registrations and pods, the node's settings, the GPU's
// slots); the Arbiter applies their answers to the regions and the scheduler. A refusal is
// a value: its line names what was wrong and what is allowed, and the action the refused
// process takes. Unit tests state every rule here without a daemon (admission_test.cpp).
#pragma once

#include <sys/types.h>

#include <bitset>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "arbiter/scheduling/scheduler.h"
#include "arbiter/state/device_access.h"
#include "arbiter/state/pod_registry.h"
#include "common/policy.h"
#include "common/shm_layout.h"
#include "common/wire.h"
#include "config/node_config.h"

namespace quanta::arbiter {

struct Refusal {
  std::string reason;  // for the tenant and the log
  common::RefusedAction action = common::RefusedAction::kRunOpen;
};

// What a refused process does under the node's [enforce] unplaced rule: `registered` and
// `policy` (nullptr when no pod was found) are the refused process's.
common::RefusedAction unplaced_action(config::UnplacedAction rule, bool registered,
                                      const common::Policy* policy);

// A process that says Hello for the first time (or again, after its previous pid died).
struct Newcomer {
  pid_t pid = 0;
  std::string cgroup;       // /proc/<pid>/cgroup's path, "" when unknown
  std::string claimed_pod;  // QUANTA_POD, "" when unset
  uint32_t layout = 0;      // the shared-memory layout its libquanta.so maps
};

// The pod a newcomer joins, or why it joins none.
struct PodChoice {
  std::string key;
  const Registration* registration = nullptr;  // the container it runs in; nullptr: none
  // What the process does if it is refused after this (on its pod's policy).
  common::RefusedAction action = common::RefusedAction::kRunOpen;
  std::optional<Refusal> refusal;
};

// A process in a registered container joins that container's pod, whatever it claims; any
// other joins the pod it names in QUANTA_POD, when the node admits unregistered processes and
// the name is valid and no registered pod's. A process of shared-memory layout 2 joins only
// a pod that has a region now or that the previous release placed
// (`previous_release_pods`).
PodChoice choose_pod(const Newcomer& newcomer, const PodRegistry& pods,
                     const config::NodeConfig& config,
                     const std::set<std::string>& previous_release_pods);

// The first free process entry of a pod (common::kMaxProcsPerPod when none is).
uint32_t free_entry(const std::bitset<common::kMaxProcsPerPod>& entries);

// Why pod `key`, whose region maps `pod_layout` and has `entries` in use, takes no process of
// `layout`; nullopt when it takes it.
std::optional<std::string> join_refusal(const std::string& key, uint32_t pod_layout,
                                        const std::bitset<common::kMaxProcsPerPod>& entries,
                                        uint32_t layout);

// Why an admitted process that says Hello again with `layout` is refused (nullopt: it is
// not): a process keeps the layout it was admitted with.
std::optional<std::string> hello_refusal(pid_t pid, uint32_t admitted_layout, uint32_t layout);

// Why a process given `devices` may not attach to the GPU `uuid` (nullopt: it may).
std::optional<std::string> device_refusal(const DeviceGrant& devices, const std::string& uuid);

// The lowest slot of a GPU that no admitted process holds (common::kNoSlot when all are).
SlotId first_free_slot(const std::map<SlotId, pid_t>& slot_pids);

}  // namespace quanta::arbiter
