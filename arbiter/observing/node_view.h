// What the observing side reads of the arbiter's live state, gathered on the event loop at one
// instant (Observer::view, observer.cpp) and read by pure functions: the figures behind
// /metrics and `quantactl top` (figures.cpp) and `quantactl explain` (admin_views.cpp). Tests
// build a view of any node they like, with accounting they drive, and check the figures
// without a daemon, a socket or a region. Nothing here writes back to the arbiter.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "arbiter/observing/nvml_sampler.h"
#include "arbiter/observing/wait_budget.h"
#include "arbiter/scheduling/accounting.h"
#include "common/policy.h"
#include "config/fit_probe.h"

namespace quanta::arbiter {

// A process NVML lists on a GPU that is not an admitted tenant of it.
struct UnmanagedProcess {
  pid_t pid = 0;
  uint64_t used_bytes = 0;
  std::string pod;      // the pod its cgroup belongs to, "" when none
  std::string command;  // /proc/<pid>/comm
};

// One admitted process's slot on the GPU.
struct TenantView {
  SlotId slot = 0;
  pid_t pid = 0;
  std::string pod;  // its pod's key
  TenantState state = TenantState::kIdle;
  uint64_t memory_used = 0;  // what its shim counts, from its gate channel
  std::string container;     // its registration's container name, "" when none
};

// A scheduler tenant as the scheduler reports it now, with its pod's weight and class.
struct ShareView {
  BudgetTenant tenant;
  double target_share = 0;
  uint64_t wait_p99_ns = 0;
};

// A pod the node has registered (its policy is in force), as it stands on one GPU.
struct RegisteredPodView {
  common::Policy policy;
  uint64_t memory_used = 0;   // its region's count for this GPU
  uint64_t alloc_denied = 0;  // allocations its cap refused on this GPU
};

struct GpuView {
  uint32_t index = 0;
  std::string uuid;
  std::string parent;  // a MIG instance's GPU UUID; "" for a whole GPU
  GpuIdentity identity;
  // NVML's latest reading of the GPU (ok or not), nullptr before the first.
  const GpuReading* reading = nullptr;
  // The GPU's hold timeline, brought up to the view's instant.
  const GpuAccounting* accounting = nullptr;
  BudgetTimings timings;   // the scheduler's quantum bounds
  uint64_t window_ns = 0;  // the scheduler's statistics window
  std::vector<ShareView> shares;
  std::vector<TenantView> tenants;  // in slot order
  // Every pod the accounting knows that is registered now, by key.
  std::map<std::string, RegisteredPodView> registered;
  std::string holder;  // the pod holding the grant now, "" when none
  uint32_t waiting = 0;
  bool draining = false;
  uint32_t free_slots = 0;
  double promised_min_share = 0;  // the minimum shares registered pods hold on it, summed
};

struct NodeView {
  uint64_t taken_ns = 0;  // CLOCK_MONOTONIC
  std::string scope;
  std::string hostname;
  std::string version;
  uint64_t generation = 0;
  uint64_t started_ns = 0;  // CLOCK_MONOTONIC, when this arbiter started
  double start_time_s = 0;  // the same instant in Unix time
  std::map<std::string, uint64_t> refusals;
  uint32_t tenant_connections = 0;
  std::vector<config::FitProbe> probes;
  pid_t self = 0;  // the arbiter's own pid (NVML lists it; it is nobody's tenant)
  // Pods the accounting still tells of, with the policy they last had on the node.
  std::map<std::string, common::Policy> last_policy;
  std::shared_ptr<const std::vector<GpuReading>> readings;  // what GpuView::reading points in
  std::vector<GpuView> gpus;
};

}  // namespace quanta::arbiter
