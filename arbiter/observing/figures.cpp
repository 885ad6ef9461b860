// The node's figures from a view of it (node_view.h): per GPU its processes, the pods its
// accounting tells of with their shares, waits and promises, and what more the GPU could
// take; then the node's fits. Pure: what the view says at its instant, nothing else.
#include "arbiter/observing/figures.h"

#include <algorithm>
#include <set>

#include "arbiter/observing/wait_budget.h"

namespace quanta::arbiter {
namespace {

// What the scheduler says of the GPU's pods now: target shares summed over each pod's
// tenants, and the largest p99 wait among them.
struct ScheduledPods {
  std::vector<BudgetTenant> tenants;
  std::map<std::string, double> targets;
  std::map<std::string, uint64_t> wait_p99;
};

ScheduledPods scheduled_pods(const GpuView& gpu) {
  ScheduledPods s;
  for (const ShareView& share : gpu.shares) {
    const std::string& key = share.tenant.pod;
    s.tenants.push_back(share.tenant);
    s.targets[key] += share.target_share;
    s.wait_p99[key] = std::max(s.wait_p99[key], share.wait_p99_ns);
  }
  return s;
}

// The GPU's processes by pod, and what NVML lists on it that is no tenant of it (the
// arbiter itself aside).
void add_processes(const GpuView& gpu, const GpuReading* reading, pid_t self, GpuFigures& g) {
  std::set<pid_t> managed;
  for (const TenantView& t : gpu.tenants) {
    managed.insert(t.pid);
    if (t.pod.empty()) continue;
    ProcessFigures pf;
    pf.pid = t.pid;
    pf.slot = t.slot;
    pf.state = state_name(t.state);
    pf.memory_used = t.memory_used;
    pf.container = t.container;
    if (reading != nullptr) {
      for (const NvmlProcess& np : reading->processes) {
        if (np.pid == t.pid) pf.nvml_memory = np.used_bytes;
      }
    }
    g.processes[t.pod].push_back(pf);
  }
  if (reading == nullptr) return;
  for (const NvmlProcess& np : reading->processes) {
    if (managed.count(np.pid) != 0 || np.pid == self) continue;
    ++g.unmanaged_processes;
    g.unmanaged_memory += np.used_bytes;
  }
}

// The share a live pod wanted over the window and what it holds: one load for capacity.
PodLoad load_of(const PodFigures& p, const PodTotals& window) {
  const uint64_t wanted = window.phase_ns[static_cast<size_t>(Phase::kRunning)] +
                          window.phase_ns[static_cast<size_t>(Phase::kDraining)] +
                          window.phase_ns[static_cast<size_t>(Phase::kWaiting)];
  PodLoad load;
  load.weight = p.policy.weight;
  load.priority = p.policy.priority;
  load.min_share = p.min_share;
  load.max_share = p.policy.max_share_ppm / static_cast<double>(common::kShareScale);
  load.demand = ratio_of(wanted, p.window_ns);
  load.memory_cap = p.policy.memory_limit;
  load.memory_used = p.memory_used;
  return load;
}

// One pod the GPU's accounting tells of; its load joins `loads` when it is live and has a
// window to measure.
PodFigures pod_figures(const GpuView& gpu, const PodAccount& acc, const ScheduledPods& scheduled,
                       bool driver_busy, uint64_t now, std::vector<PodLoad>& loads) {
  const GpuAccounting& acct = *gpu.accounting;
  PodFigures p;
  p.key = acc.key;
  std::tie(p.namespace_name, p.pod_name) = split_pod_key(acc.key);
  p.live = acc.tenants != 0;
  if (auto reg = gpu.registered.find(acc.key); reg != gpu.registered.end()) {
    p.policy = reg->second.policy;
    p.min_share = reg->second.policy.min_share_ppm / static_cast<double>(common::kShareScale);
    p.memory_used = reg->second.memory_used;
    p.alloc_denied = reg->second.alloc_denied;
  }
  if (auto t = scheduled.targets.find(acc.key); t != scheduled.targets.end())
    p.target_share = t->second;
  if (auto w = scheduled.wait_p99.find(acc.key); w != scheduled.wait_p99.end())
    p.wait_p99_ns = w->second;
  p.totals = acc.totals;
  p.wait = acc.wait;
  p.drain = acc.drain;
  p.tenants_by_state = acc.tenants_by_state;
  p.waited_behind = acct.by_holder(acc.totals.waited_behind_ns);
  if (const PodSample* s = acct.sample_before(acc, now, gpu.window_ns)) {
    const PodTotals d = totals_between(acc.totals, s->totals);
    p.window_ns = now > s->at_ns ? now - s->at_ns : 0;
    p.window_phase_ns = d.phase_ns;
    p.window_behind = acct.by_holder(d.waited_behind_ns);
    p.achieved_share = ratio_of(d.held_ns, p.window_ns);
    p.utilization =
        driver_busy ? ratio_of(d.busy_ns, d.busy_until_ns) : ratio_of(d.held_ns, p.window_ns);
    if (p.live) loads.push_back(load_of(p, d));
  }
  if (p.live && p.policy.priority != common::Priority::kBestEffort) {
    const uint64_t budget =
        wait_budget_ns(scheduled.tenants, p.key, p.policy.weight, p.policy.priority, gpu.timings);
    p.wait_budget_s = seconds_of(round_up_to_wait_bucket(budget));
  }
  return p;
}

GpuFigures gpu_figures(const NodeView& node, const GpuView& gpu) {
  const uint64_t now = node.taken_ns;
  const GpuAccounting& acct = *gpu.accounting;
  const GpuReading* reading = gpu.reading != nullptr && gpu.reading->ok ? gpu.reading : nullptr;
  const bool driver_busy = reading != nullptr && reading->process_busy_supported;
  GpuFigures g;
  g.index = gpu.index;
  g.uuid = gpu.uuid;
  g.parent = gpu.parent;
  g.identity = gpu.identity;
  g.utilization_source = driver_busy ? "driver" : "holds";
  g.window_ns = gpu.window_ns;
  add_processes(gpu, reading, node.self, g);

  const ScheduledPods scheduled = scheduled_pods(gpu);
  std::vector<PodLoad> loads;
  for (const auto& [id, acc] : acct.pods()) {
    PodFigures p = pod_figures(gpu, acc, scheduled, driver_busy, now, loads);
    if (p.live) {
      g.memory_used += p.memory_used;
      g.busy_ratio += p.utilization;
    }
    g.pods.push_back(std::move(p));
  }
  g.busy_ratio = std::min(g.busy_ratio, 1.0);
  const auto [held_at, held_then] = acct.held_before(now, gpu.window_ns);
  g.held_ratio = ratio_of(acct.held_ns() - std::min(acct.held_ns(), held_then),
                          now > held_at ? now - held_at : 0);
  g.switches = acct.switches();
  g.draining = gpu.draining;
  g.handoff = acct.handoff();
  g.waiting = gpu.waiting;
  g.holder = gpu.holder;
  g.capacity = gpu_capacity(loads, g.identity.memory_total, g.unmanaged_memory, gpu.free_slots,
                            node.probes, gpu.promised_min_share);
  return g;
}

}  // namespace

NodeFigures figures_of(const NodeView& node) {
  NodeFigures f;
  f.scope = node.scope;
  f.hostname = node.hostname;
  f.version = node.version;
  f.generation = node.generation;
  f.taken_ns = node.taken_ns;
  f.uptime_s = seconds_of(node.taken_ns - std::min(node.taken_ns, node.started_ns));
  f.start_time_s = node.start_time_s;
  f.refusals = node.refusals;
  f.tenant_connections = node.tenant_connections;
  f.probes = node.probes;
  for (const GpuView& gpu : node.gpus) f.gpus.push_back(gpu_figures(node, gpu));
  f.node_fits = sum_node_fits(f.gpus, f.probes.size());
  return f;
}

std::vector<uint32_t> sum_node_fits(std::vector<GpuFigures>& gpus, size_t probes) {
  std::set<std::string> parents;
  for (const GpuFigures& g : gpus) {
    if (!g.parent.empty()) parents.insert(g.parent);
  }
  std::vector<uint32_t> fits(probes, 0);
  for (GpuFigures& g : gpus) {
    g.mig_parent = parents.count(g.uuid) != 0;
    if (g.mig_parent) continue;
    for (size_t k = 0; k < probes && k < g.capacity.fits.size(); ++k) fits[k] += g.capacity.fits[k];
  }
  return fits;
}

const char* refusal_reason(const std::string& text) {
  if (text.find("not in a registered container and this node does not admit") != std::string::npos)
    return "unregistered";
  if (text.find("names no pod") != std::string::npos) return "no-pod";
  if (text.find("could not be watched") != std::string::npos) return "pidfd";
  if (text.find("no region for pod") != std::string::npos) return "region";
  if (text.find("processes on the GPUs, the most") != std::string::npos) return "pod-full";
  if (text.find("speaks tenant protocol") != std::string::npos ||
      text.find("must load one release's libquanta.so") != std::string::npos ||
      text.find("only such pods are served in that layout") != std::string::npos)
    return "version";
  return "other";
}

}  // namespace quanta::arbiter
