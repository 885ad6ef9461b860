// The Observer (observer.h): starting the tick and the endpoint, charging NVML's busy time to
// pods, recording history, and the view of live state (node_view.h) that the figures
// (figures.cpp) and the top and explain answers (admin_views.cpp) are worked out from.
#include "arbiter/observing/observer.h"

#include <spdlog/spdlog.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>

#include "arbiter/loop/death_watch.h"
#include "arbiter/observing/figures.h"
#include "common/clock.h"
#include "common/version.h"

namespace quanta::arbiter {
namespace {

bool active(TenantState s) {
  return s == TenantState::kWaiting || s == TenantState::kHolding || s == TenantState::kRevoking;
}

double unix_now_s() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

std::string node_name() {
  if (const char* n = std::getenv("NODE_NAME"); n != nullptr && *n != '\0') return n;
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) return "";
  return host;
}

}  // namespace

Observer::Observer(EventLoop& loop, ObservedNode node) : loop_(loop), node_(std::move(node)) {
  hostname_ = node_name();
  start_time_s_ = unix_now_s() - seconds_of(common::monotonic_ns() - node_.started_ns);
  reading_at_ns_.assign(node_.gpus.size(), 0);
  busy_charged_.resize(node_.gpus.size());
  loop_.add(tick_timer_.fd(), [this](uint32_t) {
    tick_timer_.acknowledge();
    tick();
  });
  if (!node_.config.metrics.listen.empty()) {
    server_ = std::make_unique<MetricsServer>(node_.config.metrics.listen);
    loop_.add(server_->refresh_fd(), [this](uint32_t) {
      server_->acknowledge_refresh();
      server_->publish(figures(common::monotonic_ns()));
    });
    spdlog::info("serving metrics on http://{}/metrics", server_->address());
  }
  tick();
}

Observer::~Observer() {
  loop_.remove(tick_timer_.fd());
  if (server_) loop_.remove(server_->refresh_fd());
}

std::string Observer::metrics_address() const { return server_ ? server_->address() : ""; }

void Observer::refused(const std::string& reason) { ++refusals_[refusal_reason(reason)]; }

void Observer::charge_nvml_busy() {
  std::shared_ptr<const std::vector<GpuReading>> readings = node_.nvml.latest();
  if (!readings) return;
  for (const auto& gpu_ptr : node_.gpus) {
    Gpu& gpu = *gpu_ptr;
    if (gpu.index >= readings->size()) continue;
    const GpuReading& r = (*readings)[gpu.index];
    if (!r.ok || !r.process_busy_supported || r.at_ns == reading_at_ns_[gpu.index]) continue;
    reading_at_ns_[gpu.index] = r.at_ns;
    std::map<pid_t, uint64_t>& charged = busy_charged_[gpu.index];
    std::map<pid_t, uint64_t> next;
    for (const auto& [pid, busy] : r.busy_ns) {
      auto seen = charged.find(pid);
      const uint64_t before = seen == charged.end() ? 0 : seen->second;
      const uint64_t delta = busy >= before ? busy - before : busy;
      next[pid] = busy;
      auto proc = node_.processes.find(pid);
      if (delta == 0 || proc == node_.processes.end() || proc->second.slots.count(gpu.index) == 0)
        continue;
      if (const Pod* pod = node_.pods.find(proc->second.pod_index))
        gpu.accounting.add_busy(pod->key, delta);
    }
    charged = std::move(next);
    gpu.accounting.busy_reported(r.at_ns);
  }
}

void Observer::tick() {
  const uint64_t now = common::monotonic_ns();
  charge_nvml_busy();
  for (const auto& gpu_ptr : node_.gpus) {
    Gpu& gpu = *gpu_ptr;
    std::map<std::string, double> targets;
    for (const TenantReport& r : gpu.sched->report(now)) {
      if (const Pod* pod = node_.pods.find(r.pod)) {
        targets[pod->key] += r.target_share;
        last_policy_[pod->key] = pod->policy;  // explain tells a departed pod's policy too
      }
    }
    gpu.accounting.tick(targets, now);
  }
  for (auto it = containers_.begin(); it != containers_.end();) {
    it = node_.processes.count(it->first) != 0 ? std::next(it) : containers_.erase(it);
  }
  for (auto it = last_policy_.begin(); it != last_policy_.end();) {
    bool kept = false;
    for (const auto& g : node_.gpus) kept = kept || g->accounting.pod(it->first) != nullptr;
    it = kept ? std::next(it) : last_policy_.erase(it);
  }
  if (server_) server_->publish(figures(now));
  tick_timer_.arm_at(now + kObservationTickNs);
}

NodeView Observer::view(uint64_t now) {
  charge_nvml_busy();
  NodeView v;
  v.taken_ns = now;
  v.scope = node_.config.scope;
  v.hostname = hostname_;
  v.version = common::release();
  v.generation = node_.generation;
  v.started_ns = node_.started_ns;
  v.start_time_s = start_time_s_;
  v.refusals = refusals_;
  v.tenant_connections =
      static_cast<uint32_t>(node_.tenant_connections ? node_.tenant_connections() : 0);
  v.probes = node_.config.metrics.fit_probes;
  v.self = getpid();
  v.last_policy = last_policy_;
  v.readings = node_.nvml.latest();
  for (const auto& gpu : node_.gpus) v.gpus.push_back(view_gpu(*gpu, v.readings.get(), now));
  return v;
}

GpuView Observer::view_gpu(Gpu& gpu, const std::vector<GpuReading>* readings, uint64_t now) {
  gpu.accounting.advance(now);
  GpuView v;
  v.index = gpu.index;
  v.uuid = gpu.uuid;
  v.parent = gpu.info.parent;
  if (gpu.index < node_.nvml.identities().size()) v.identity = node_.nvml.identities()[gpu.index];
  if (readings != nullptr && gpu.index < readings->size()) v.reading = &(*readings)[gpu.index];
  v.accounting = &gpu.accounting;
  const SchedulerOptions& so = gpu.sched->options();
  v.timings = {so.quantum_ns, so.quantum_min_ns, so.quantum_slack_ppm};
  v.window_ns = so.stats_window_ns;
  for (const TenantReport& r : gpu.sched->report(now)) {
    if (const Pod* pod = node_.pods.find(r.pod)) {
      v.shares.push_back(
          {{pod->key, pod->policy.weight, pod->policy.priority, r.quantum_ns, active(r.state)},
           r.target_share,
           r.wait_p99_ns});
    }
  }
  for (const auto& [slot, pid] : gpu.slot_pids) {
    const Process& proc = node_.processes.at(pid);
    TenantView t;
    t.slot = slot;
    t.pid = pid;
    t.state = gpu.sched->state(slot);
    if (const Pod* pod = node_.pods.find(proc.pod_index)) {
      t.pod = pod->key;
      t.memory_used = pod->region.channel(proc.proc_index, gpu.index)
                          .memory_used.load(std::memory_order_relaxed);
      auto cached = containers_.find(pid);
      if (cached == containers_.end()) {
        const Registration* reg = node_.pods.match_cgroup(cgroup_of(pid));
        cached = containers_.emplace(pid, reg != nullptr ? reg->container_name : "").first;
      }
      t.container = cached->second;
    }
    v.tenants.push_back(std::move(t));
  }
  for (const auto& [id, acc] : gpu.accounting.pods()) {
    if (const Pod* reg = node_.pods.find_key(acc.key)) {
      v.registered[acc.key] = {reg->policy,
                               reg->region.memory_used(gpu.index).load(std::memory_order_relaxed),
                               reg->region.alloc_denied(gpu.index).load(std::memory_order_relaxed)};
    }
  }
  const uint32_t holder = gpu.region->header.holder.load(std::memory_order_relaxed);
  if (holder != common::kNoSlot && gpu.slot_pids.count(holder) != 0) {
    if (const Pod* pod = node_.pods.find(node_.processes.at(gpu.slot_pids.at(holder)).pod_index))
      v.holder = pod->key;
  }
  v.waiting = gpu.region->header.waiters.load(std::memory_order_relaxed);
  v.draining = gpu.sched->drain_requested();
  v.free_slots = common::kMaxSlotsPerGpu - static_cast<uint32_t>(gpu.slot_pids.size());
  v.promised_min_share =
      node_.pods.promised_minimum_ppm(gpu.uuid) / static_cast<double>(common::kShareScale);
  return v;
}

std::shared_ptr<const NodeFigures> Observer::figures(uint64_t now) {
  return std::make_shared<const NodeFigures>(figures_of(view(now)));
}

NodeStatus Observer::status(uint64_t now) const {
  NodeStatus node;
  node.scope = node_.config.scope;
  node.generation = node_.generation;
  node.taken_ns = now;
  node.started_ns = node_.started_ns;
  node.enforce = node_.config.enforce;
  node.context_overhead = node_.context_overhead;
  node.tenant_connections = node_.tenant_connections ? node_.tenant_connections() : 0;
  node.metrics_listen = metrics_address();
  for (const auto& gpu : node_.gpus) node.gpus.push_back(status_of_gpu(*gpu, now));
  return node;
}

GpuStatus Observer::status_of_gpu(const Gpu& gpu, uint64_t now) const {
  const common::ControlHeader& header = gpu.region->header;
  GpuStatus out;
  out.index = gpu.index;
  out.uuid = gpu.uuid;
  for (const TenantReport& r : gpu.sched->report(now)) {
    const pid_t pid = gpu.slot_pids.at(r.slot);
    const Process& proc = node_.processes.at(pid);
    const Pod& pod = node_.pods.pods().at(proc.pod_index);
    const common::GateChannel& ch = pod.region.channel(proc.proc_index, gpu.index);
    TenantStatus t;
    t.report = r;
    t.pid = pid;
    t.pod = pod.key;
    t.policy = pod.policy;
    t.gate_waits = ch.gate_waits.load();
    t.gate_wait_ns = ch.gate_wait_ns.load();
    t.gate_wait_max_ns = ch.gate_wait_max_ns.load();
    t.launches = ch.launches.load();
    t.memory_used = ch.memory_used.load();
    t.pod_memory_used = pod.region.memory_used(gpu.index).load();
    t.layout = pod.region.layout();
    auto denied = pod.denied_caps.find(gpu.index);
    t.memory_cap = denied != pod.denied_caps.end() ? denied->second : pod.policy.memory_limit;
    if (auto nvml = gpu.nvml_bytes.find(pid); nvml != gpu.nvml_bytes.end())
      t.nvml_memory_used = nvml->second;
    t.connected = proc.connected;
    out.tenants.push_back(std::move(t));
  }
  out.unmanaged = gpu.unmanaged;
  for (const std::string& key : gpu.over_cap) {
    auto bytes = gpu.pod_nvml_bytes.find(key);
    out.over_cap.push_back({key, bytes != gpu.pod_nvml_bytes.end() ? bytes->second : 0,
                            node_.pods.resolve_policy(key).memory_limit});
  }
  const uint32_t holder = header.holder.load();
  if (holder != common::kNoSlot && gpu.slot_pids.count(holder) != 0) {
    const pid_t pid = gpu.slot_pids.at(holder);
    const std::string& pod = node_.pods.pods().at(node_.processes.at(pid).pod_index).key;
    out.holder = HolderStatus{holder, pid, pod};
  }
  out.waiting = header.waiters.load();
  out.draining = gpu.sched->drain_requested();
  out.idle = gpu.sched->idle();
  out.grants = gpu.grants;
  out.switches = gpu.switches;
  if (gpu.last_granted != common::kNoSlot) out.last_granted = gpu.last_granted;
  out.doorbells = gpu.doorbells;
  out.passes = gpu.passes;
  out.holder_looks = gpu.holder_looks;
  out.ended_by_holder = gpu.ended_by_holder;
  out.nvml_error = gpu.nvml_error;
  return out;
}

}  // namespace quanta::arbiter
