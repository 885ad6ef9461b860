// The arbiter's side of observation: starting the sampler and the endpoint, the tick that
// charges NVML busy time to pods and records history, and the view of live state
// (node_view.h) that the figures (figures.cpp) and the top and explain answers
// (admin_views.cpp) are worked out from.
#include <spdlog/spdlog.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>

#include "arbiter/arbiter.h"
#include "arbiter/loop/death_watch.h"
#include "arbiter/observing/figures.h"
#include "arbiter/observing/observation.h"
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

std::string Arbiter::metrics_address() const {
  return observation_ && observation_->server ? observation_->server->address() : "";
}

void Arbiter::note_refusal(const std::string& reason) {
  if (observation_) ++observation_->refusals[refusal_reason(reason)];
}

void Arbiter::start_observation() {
  observation_ = std::make_unique<Observation>();
  Observation& o = *observation_;
  o.hostname = node_name();
  o.start_time_s = unix_now_s() - seconds_of(common::monotonic_ns() - started_ns_);
  o.reading_at_ns.assign(gpus_.size(), 0);
  o.busy_charged.resize(gpus_.size());
  loop_.add(o.tick.fd(), [this](uint32_t) {
    observation_->tick.acknowledge();
    observation_tick();
  });
  if (!config_.metrics.listen.empty()) {
    o.server = std::make_unique<MetricsServer>(config_.metrics.listen);
    loop_.add(o.server->refresh_fd(), [this](uint32_t) {
      observation_->server->acknowledge_refresh();
      observation_->server->publish(take_figures(common::monotonic_ns()));
    });
    spdlog::info("serving metrics on http://{}/metrics", o.server->address());
  }
  observation_tick();
}

// Device time NVML saw each managed pid run since the last reading, charged to its pod.
void Arbiter::charge_nvml_busy() {
  Observation& o = *observation_;
  std::shared_ptr<const std::vector<GpuReading>> readings = nvml_->latest();
  if (!readings) return;
  for (auto& gpu_ptr : gpus_) {
    Gpu& gpu = *gpu_ptr;
    if (gpu.index >= readings->size()) continue;
    const GpuReading& r = (*readings)[gpu.index];
    if (!r.ok || !r.process_busy_supported || r.at_ns == o.reading_at_ns[gpu.index]) continue;
    o.reading_at_ns[gpu.index] = r.at_ns;
    std::map<pid_t, uint64_t>& charged = o.busy_charged[gpu.index];
    std::map<pid_t, uint64_t> next;
    for (const auto& [pid, busy] : r.busy_ns) {
      auto seen = charged.find(pid);
      const uint64_t before = seen == charged.end() ? 0 : seen->second;
      const uint64_t delta = busy >= before ? busy - before : busy;
      next[pid] = busy;
      auto proc = processes_.find(pid);
      if (delta == 0 || proc == processes_.end() || proc->second.slots.count(gpu.index) == 0)
        continue;
      if (const Pod* pod = pods_.find(proc->second.pod_index))
        gpu.accounting.add_busy(pod->key, delta);
    }
    charged = std::move(next);
    gpu.accounting.busy_reported(r.at_ns);
  }
}

void Arbiter::observation_tick() {
  Observation& o = *observation_;
  const uint64_t now = common::monotonic_ns();
  charge_nvml_busy();
  for (auto& gpu_ptr : gpus_) {
    Gpu& gpu = *gpu_ptr;
    std::map<std::string, double> targets;
    for (const TenantReport& r : gpu.sched->report(now)) {
      if (const Pod* pod = pods_.find(r.pod)) {
        targets[pod->key] += r.target_share;
        o.last_policy[pod->key] = pod->policy;  // explain tells a departed pod's policy too
      }
    }
    gpu.accounting.tick(targets, now);
  }
  for (auto it = o.containers.begin(); it != o.containers.end();) {
    it = processes_.count(it->first) != 0 ? std::next(it) : o.containers.erase(it);
  }
  for (auto it = o.last_policy.begin(); it != o.last_policy.end();) {
    bool kept = false;
    for (const auto& g : gpus_) kept = kept || g->accounting.pod(it->first) != nullptr;
    it = kept ? std::next(it) : o.last_policy.erase(it);
  }
  if (o.server) o.server->publish(take_figures(now));
  o.tick.arm_at(now + kObservationTickNs);
}

NodeView Arbiter::view_node(uint64_t now) {
  Observation& o = *observation_;
  charge_nvml_busy();
  NodeView v;
  v.taken_ns = now;
  v.scope = config_.scope;
  v.hostname = o.hostname;
  v.version = common::release();
  v.generation = generation_;
  v.started_ns = started_ns_;
  v.start_time_s = o.start_time_s;
  v.refusals = o.refusals;
  v.tenant_connections = static_cast<uint32_t>(tenants_ ? tenants_->connections() : 0);
  v.probes = config_.metrics.fit_probes;
  v.self = getpid();
  v.last_policy = o.last_policy;
  v.readings = nvml_->latest();
  for (auto& gpu : gpus_) v.gpus.push_back(view_gpu(*gpu, v.readings.get(), now));
  return v;
}

GpuView Arbiter::view_gpu(Gpu& gpu, const std::vector<GpuReading>* readings, uint64_t now) {
  gpu.accounting.advance(now);
  GpuView v;
  v.index = gpu.index;
  v.uuid = gpu.uuid;
  v.parent = gpu.info.parent;
  if (gpu.index < nvml_->identities().size()) v.identity = nvml_->identities()[gpu.index];
  if (readings != nullptr && gpu.index < readings->size()) v.reading = &(*readings)[gpu.index];
  v.accounting = &gpu.accounting;
  const SchedulerOptions& so = gpu.sched->options();
  v.timings = {so.quantum_ns, so.quantum_min_ns, so.quantum_slack_ppm};
  v.window_ns = so.stats_window_ns;
  for (const TenantReport& r : gpu.sched->report(now)) {
    if (const Pod* pod = pods_.find(r.pod)) {
      v.shares.push_back(
          {{pod->key, pod->policy.weight, pod->policy.priority, r.quantum_ns, active(r.state)},
           r.target_share,
           r.wait_p99_ns});
    }
  }
  for (const auto& [slot, pid] : gpu.slot_pids) {
    const Process& proc = processes_.at(pid);
    TenantView t;
    t.slot = slot;
    t.pid = pid;
    t.state = gpu.sched->state(slot);
    if (const Pod* pod = pods_.find(proc.pod_index)) {
      t.pod = pod->key;
      t.memory_used = channel(proc, gpu.index).memory_used.load(std::memory_order_relaxed);
      auto cached = observation_->containers.find(pid);
      if (cached == observation_->containers.end()) {
        const Registration* reg = pods_.match_cgroup(cgroup_of(pid));
        cached =
            observation_->containers.emplace(pid, reg != nullptr ? reg->container_name : "").first;
      }
      t.container = cached->second;
    }
    v.tenants.push_back(std::move(t));
  }
  for (const auto& [id, acc] : gpu.accounting.pods()) {
    if (const Pod* reg = pods_.find_key(acc.key)) {
      v.registered[acc.key] = {reg->policy,
                               reg->region.memory_used(gpu.index).load(std::memory_order_relaxed),
                               reg->region.alloc_denied(gpu.index).load(std::memory_order_relaxed)};
    }
  }
  const uint32_t holder = gpu.region->header.holder.load(std::memory_order_relaxed);
  if (holder != common::kNoSlot && gpu.slot_pids.count(holder) != 0) {
    if (const Pod* pod = pods_.find(processes_.at(gpu.slot_pids.at(holder)).pod_index))
      v.holder = pod->key;
  }
  v.waiting = gpu.region->header.waiters.load(std::memory_order_relaxed);
  v.draining = gpu.sched->drain_requested();
  v.free_slots = common::kMaxSlotsPerGpu - static_cast<uint32_t>(gpu.slot_pids.size());
  v.promised_min_share =
      pods_.promised_minimum_ppm(gpu.uuid) / static_cast<double>(common::kShareScale);
  return v;
}

std::shared_ptr<const NodeFigures> Arbiter::take_figures(uint64_t now) {
  return std::make_shared<const NodeFigures>(figures_of(view_node(now)));
}

}  // namespace quanta::arbiter
