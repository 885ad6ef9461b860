// The answers of `quantactl status`, `top` and `explain`, worked out from what the arbiter
// gathered of its live state (the node's status below, its figures, its view: node_view.h).
// Pure: admin_handlers.cpp gathers and sends; unit tests build any node by hand.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "arbiter/observing/figures.h"
#include "arbiter/observing/node_view.h"
#include "arbiter/scheduling/scheduler.h"
#include "common/policy.h"
#include "config/node_config.h"

namespace quanta::arbiter {

// One admitted process on a GPU as `status` tells it (docs/quantactl-status.md).
struct TenantStatus {
  TenantReport report;  // the scheduler's, now
  pid_t pid = 0;
  std::string pod;
  common::Policy policy;  // its pod's, in force
  // Its gate channel's counters, written by its shim.
  uint64_t gate_waits = 0;
  uint64_t gate_wait_ns = 0;
  uint64_t gate_wait_max_ns = 0;
  uint64_t launches = 0;
  uint64_t memory_used = 0;
  uint64_t pod_memory_used = 0;              // its pod region's count for this GPU
  uint32_t layout = 0;                       // the shared-memory layout its pod maps
  uint64_t memory_cap = 0;                   // the cap its slot carries now
  std::optional<uint64_t> nvml_memory_used;  // NVML's count for its pid, when NVML lists it
  bool connected = false;                    // said Hello to this arbiter
};

// A pod NVML shows above its cap on a GPU.
struct OverCapStatus {
  std::string pod;
  uint64_t nvml_memory_used = 0;
  uint64_t memory_cap = 0;
};

// The process holding a GPU's grant.
struct HolderStatus {
  uint32_t slot = 0;
  pid_t pid = 0;
  std::string pod;
};

struct GpuStatus {
  uint32_t index = 0;
  std::string uuid;
  std::optional<HolderStatus> holder;
  uint32_t waiting = 0;
  bool draining = false;
  bool idle = false;
  // Since this arbiter started (the Gpu's counters of the same names).
  uint64_t grants = 0;
  uint64_t switches = 0;
  std::optional<uint32_t> last_granted;
  uint64_t doorbells = 0;
  uint64_t passes = 0;
  uint64_t holder_looks = 0;
  uint64_t ended_by_holder = 0;
  std::vector<TenantStatus> tenants;  // in the scheduler's report order
  std::vector<UnmanagedProcess> unmanaged;
  std::vector<OverCapStatus> over_cap;
  std::string nvml_error;  // "" when NVML's last reading was good
};

struct NodeStatus {
  std::string scope;
  uint64_t generation = 0;
  uint64_t taken_ns = 0;    // CLOCK_MONOTONIC
  uint64_t started_ns = 0;  // CLOCK_MONOTONIC, when this arbiter started
  config::EnforceConfig enforce;
  nlohmann::json context_overhead;  // what the shims charge per context, and its source
  size_t tenant_connections = 0;
  std::string metrics_listen;  // "HOST:PORT" served, "" when not
  std::vector<GpuStatus> gpus;
};

// `status`: the node, each GPU and each admitted process on it, as gathered.
nlohmann::json status_answer(const NodeStatus& node);

// `top`: every GPU with its live pods' shares, phases, waits and memory over the window, and
// what more the GPU and the node could take.
nlohmann::json top_answer(const NodeFigures& figures);

// `explain`: one pod, named as on every quantactl command (`wanted`), over the last `span_s`
// seconds (1-60, checked by the admin protocol) of each GPU it used: its share against its
// target, where its time went, whom it waited behind, its waits, ten-second slices and the
// pods beside it. A pod that left is told up to its departure. An unknown or ambiguous name
// is an {"ok": false, "error": ...} answer naming the pods known.
nlohmann::json explain_answer(const NodeView& node, const std::string& wanted, double span_s);

}  // namespace quanta::arbiter
