// A snapshot of what the arbiter knows, worked out on the event loop from a view of its live
// state (node_view.h, figures.cpp) and handed whole to the readers that must never touch
// live state: the /metrics renderer (another thread) and the admin views (`quantactl top`).
// Plain values only.
#pragma once

#include <sys/types.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "arbiter/observing/capacity.h"
#include "arbiter/observing/node_view.h"
#include "arbiter/observing/nvml_sampler.h"
#include "arbiter/scheduling/accounting.h"
#include "common/pod_key.h"
#include "common/policy.h"

namespace quanta::arbiter {

struct ProcessFigures {
  pid_t pid = 0;
  std::string container;  // from its registration, "" when it names none
  uint32_t slot = 0;
  std::string state;  // the scheduler's tenant state
  uint64_t memory_used = 0;
  std::optional<uint64_t> nvml_memory;  // NVML's figure for the same pid, where it lists it
};

struct PodFigures {
  std::string key;
  std::string namespace_name;  // label values: "ns/name" splits at the first '/'
  std::string pod_name;
  common::Policy policy;
  double min_share = 0;
  double target_share = 0;              // the scheduler's, now
  double achieved_share = 0;            // held over the window
  double utilization = 0;               // busy with its work over the window
  std::optional<double> wait_budget_s;  // none for best-effort (no promise)
  uint64_t wait_p99_ns = 0;             // the scheduler's, the largest of its processes
  PodTotals totals;                     // up to the snapshot
  LatencyHistogram wait;
  LatencyHistogram drain;
  std::array<uint32_t, 5> tenants_by_state{};
  std::vector<std::pair<std::string, uint64_t>> waited_behind;  // holder key ("" = nobody)
  // Over the window, for the views: time per phase and the largest holder it waited for.
  std::array<uint64_t, kPhaseCount> window_phase_ns{};
  std::vector<std::pair<std::string, uint64_t>> window_behind;  // largest first
  uint64_t window_ns = 0;
  uint64_t memory_used = 0;
  uint64_t alloc_denied = 0;
  bool live = true;  // has processes on the GPU (a departed pod is kept a while)
};

struct GpuFigures {
  uint32_t index = 0;
  std::string uuid;
  GpuIdentity identity;
  std::string parent;       // a MIG instance's GPU UUID; "" for a whole GPU
  bool mig_parent = false;  // a GPU whose MIG instances are managed: counted through them
  std::string holder;       // pod key holding the grant now, "" when none
  uint32_t waiting = 0;
  double held_ratio = 0;                     // some tenant held the grant, over the window
  double busy_ratio = 0;                     // the GPU ran managed work, over the window
  const char* utilization_source = "holds";  // "driver" (NVML per process) or "holds"
  uint64_t switches = 0;
  LatencyHistogram handoff;
  uint64_t memory_used = 0;
  GpuCapacity capacity;
  bool draining = false;
  uint32_t unmanaged_processes = 0;
  uint64_t unmanaged_memory = 0;
  uint64_t window_ns = 0;
  std::vector<PodFigures> pods;
  // Per pod key, its processes on this GPU.
  std::map<std::string, std::vector<ProcessFigures>> processes;
};

struct NodeFigures {
  std::string scope;
  std::string hostname;
  std::string version;
  uint64_t generation = 0;
  double start_time_s = 0;  // Unix time
  double uptime_s = 0;
  uint64_t taken_ns = 0;                     // CLOCK_MONOTONIC
  std::map<std::string, uint64_t> refusals;  // reason -> count
  uint32_t tenant_connections = 0;
  std::vector<config::FitProbe> probes;
  std::vector<uint32_t> node_fits;  // per probe, summed over the GPUs
  std::vector<GpuFigures> gpus;
};

// The node's figures at the view's instant.
NodeFigures figures_of(const NodeView& node);

// `part` over `whole`, within [0, 1] (0 for an empty whole).
inline double ratio_of(uint64_t part, uint64_t whole) {
  return whole == 0 ? 0.0
                    : std::clamp(static_cast<double>(part) / static_cast<double>(whole), 0.0, 1.0);
}

inline double seconds_of(uint64_t ns) {
  return static_cast<double>(ns) / 1e9;
}

// The node's fits per probe (NodeFigures::node_fits): the sum of its GPUs', a GPU whose MIG
// instances are managed too counted through them only (its capacity is theirs), which marks
// it mig_parent.
std::vector<uint32_t> sum_node_fits(std::vector<GpuFigures>& gpus, size_t probes);

// Refusal reasons at the tenant socket (the `reason` label), and the one a refusal's text
// belongs to.
inline constexpr const char* kRefusalReasons[] = {"unregistered", "no-pod",  "pidfd", "region",
                                                  "pod-full",     "version", "other"};
const char* refusal_reason(const std::string& text);

// Pod keys as operators name them (common/pod_key.h).
using common::resolve_pod_name;
using common::split_pod_key;

}  // namespace quanta::arbiter
