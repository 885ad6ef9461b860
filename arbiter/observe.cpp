// The arbiter's side of observation: starting the sampler and the endpoint, the tick that
// charges NVML busy time to pods and records history, snapshots of live state for
// /metrics and `quantactl top`, and `quantactl explain`'s look back at one pod.
#include <spdlog/spdlog.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "arbiter/arbiter.h"
#include "arbiter/death_watch.h"
#include "arbiter/figures.h"
#include "arbiter/observation.h"
#include "arbiter/wait_budget.h"
#include "common/clock.h"
#include "common/version.h"

namespace quanta::arbiter {
namespace {

using nlohmann::json;

double ratio_of(uint64_t part, uint64_t whole) {
  return whole == 0 ? 0.0
                    : std::clamp(static_cast<double>(part) / static_cast<double>(whole), 0.0, 1.0);
}

double seconds_of(uint64_t ns) {
  return static_cast<double>(ns) / 1e9;
}

bool active(TenantState s) {
  return s == TenantState::kWaiting || s == TenantState::kHolding || s == TenantState::kRevoking;
}

// b - a, for totals taken at two instants.
PodTotals difference(const PodTotals& b, const PodTotals& a) {
  PodTotals d;
  for (size_t k = 0; k < kPhaseCount; ++k)
    d.phase_ns[k] = b.phase_ns[k] - std::min(b.phase_ns[k], a.phase_ns[k]);
  d.held_ns = b.held_ns - std::min(b.held_ns, a.held_ns);
  d.busy_ns = b.busy_ns - std::min(b.busy_ns, a.busy_ns);
  // The span the driver's figures cover (they lag the hold timeline by up to a sample).
  d.busy_until_ns = b.busy_until_ns - std::min(b.busy_until_ns, a.busy_until_ns);
  d.grants = b.grants - std::min(b.grants, a.grants);
  d.revoke_timeouts = b.revoke_timeouts - std::min(b.revoke_timeouts, a.revoke_timeouts);
  for (const auto& [holder, ns] : b.waited_behind_ns) {
    auto it = a.waited_behind_ns.find(holder);
    const uint64_t before = it == a.waited_behind_ns.end() ? 0 : it->second;
    if (ns > before) d.waited_behind_ns[holder] = ns - before;
  }
  return d;
}

std::vector<std::pair<std::string, uint64_t>> behind_list(const GpuAccounting& acct,
                                                          const std::map<AccountId, uint64_t>& m) {
  std::vector<std::pair<std::string, uint64_t>> out;
  for (const auto& [holder, ns] : m) out.emplace_back(acct.key_of(holder), ns);
  std::sort(out.begin(), out.end(),
            [](const auto& a, const auto& b) { return a.second > b.second; });
  return out;
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

std::shared_ptr<const NodeFigures> Arbiter::take_figures(uint64_t now) {
  Observation& o = *observation_;
  auto f = std::make_shared<NodeFigures>();
  f->scope = config_.scope;
  f->hostname = o.hostname;
  f->version = common::release();
  f->generation = generation_;
  f->taken_ns = now;
  f->uptime_s = seconds_of(now - started_ns_);
  f->start_time_s = o.start_time_s;
  f->refusals = o.refusals;
  f->tenant_connections = static_cast<uint32_t>(tenants_ ? tenants_->connections() : 0);
  f->probes = config_.metrics.fit_probes;
  charge_nvml_busy();
  std::shared_ptr<const std::vector<GpuReading>> readings = nvml_->latest();
  const pid_t self = getpid();

  for (auto& gpu_ptr : gpus_) {
    Gpu& gpu = *gpu_ptr;
    GpuAccounting& acct = gpu.accounting;
    acct.advance(now);
    const GpuReading* reading =
        readings && gpu.index < readings->size() && (*readings)[gpu.index].ok
            ? &(*readings)[gpu.index]
            : nullptr;
    const uint64_t window = gpu.sched->options().stats_window_ns;
    GpuFigures g;
    g.index = gpu.index;
    g.uuid = gpu.uuid;
    g.parent = gpu.info.parent;
    if (gpu.index < nvml_->identities().size()) g.identity = nvml_->identities()[gpu.index];
    g.utilization_source = reading && reading->process_busy_supported ? "driver" : "holds";
    g.window_ns = window;

    // The scheduler's view of each tenant: targets, quanta and waits per pod.
    std::vector<BudgetTenant> tenants;
    std::map<std::string, double> targets;
    std::map<std::string, uint64_t> wait_p99;
    for (const TenantReport& r : gpu.sched->report(now)) {
      const Pod* pod = pods_.find(r.pod);
      if (pod == nullptr) continue;
      tenants.push_back({pod->key, pod->policy.weight, pod->policy.priority, r.quantum_ns,
                         active(r.state)});
      targets[pod->key] += r.target_share;
      wait_p99[pod->key] = std::max(wait_p99[pod->key], r.wait_p99_ns);
    }

    std::set<pid_t> managed;
    for (const auto& [slot, pid] : gpu.slot_pids) {
      managed.insert(pid);
      const Process& proc = processes_.at(pid);
      const Pod* pod = pods_.find(proc.pod_index);
      if (pod == nullptr) continue;
      ProcessFigures pf;
      pf.pid = pid;
      pf.slot = slot;
      pf.state = state_name(gpu.sched->state(slot));
      pf.memory_used = channel(proc, gpu.index).memory_used.load(std::memory_order_relaxed);
      auto cached = o.containers.find(pid);
      if (cached == o.containers.end()) {
        const Registration* reg = pods_.match_cgroup(cgroup_of(pid));
        cached = o.containers.emplace(pid, reg != nullptr ? reg->container_name : "").first;
      }
      pf.container = cached->second;
      if (reading != nullptr) {
        for (const NvmlProcess& np : reading->processes) {
          if (np.pid == pid) pf.nvml_memory = np.used_bytes;
        }
      }
      g.processes[pod->key].push_back(pf);
    }
    if (reading != nullptr) {
      for (const NvmlProcess& np : reading->processes) {
        if (managed.count(np.pid) != 0 || np.pid == self) continue;
        ++g.unmanaged_processes;
        g.unmanaged_memory += np.used_bytes;
      }
    }

    std::vector<PodLoad> loads;
    for (const auto& [id, acc] : acct.pods()) {
      PodFigures p;
      p.key = acc.key;
      std::tie(p.namespace_name, p.pod_name) = split_pod_key(acc.key);
      p.live = acc.tenants != 0;
      if (Pod* reg = pods_.find_key(acc.key)) {
        p.policy = reg->policy;
        p.min_share = reg->policy.min_share_ppm / static_cast<double>(common::kShareScale);
        p.memory_used = reg->region.memory_used(gpu.index).load(std::memory_order_relaxed);
        p.alloc_denied = reg->region.alloc_denied(gpu.index).load(std::memory_order_relaxed);
      }
      p.target_share = targets.count(acc.key) ? targets[acc.key] : 0;
      p.wait_p99_ns = wait_p99.count(acc.key) ? wait_p99[acc.key] : 0;
      p.totals = acc.totals;
      p.wait = acc.wait;
      p.drain = acc.drain;
      p.tenants_by_state = acc.tenants_by_state;
      p.waited_behind = behind_list(acct, acc.totals.waited_behind_ns);
      if (const PodSample* s = acct.sample_before(acc, now, window)) {
        const PodTotals d = difference(acc.totals, s->totals);
        p.window_ns = now > s->at_ns ? now - s->at_ns : 0;
        p.window_phase_ns = d.phase_ns;
        p.window_behind = behind_list(acct, d.waited_behind_ns);
        p.achieved_share = ratio_of(d.held_ns, p.window_ns);
        p.utilization = reading && reading->process_busy_supported
                            ? ratio_of(d.busy_ns, d.busy_until_ns)
                            : ratio_of(d.held_ns, p.window_ns);
        const uint64_t wanted = d.phase_ns[static_cast<size_t>(Phase::kRunning)] +
                                d.phase_ns[static_cast<size_t>(Phase::kDraining)] +
                                d.phase_ns[static_cast<size_t>(Phase::kWaiting)];
        if (p.live) {
          PodLoad load;
          load.weight = p.policy.weight;
          load.priority = p.policy.priority;
          load.min_share = p.min_share;
          load.max_share = p.policy.max_share_ppm / static_cast<double>(common::kShareScale);
          load.demand = ratio_of(wanted, p.window_ns);
          load.memory_cap = p.policy.memory_limit;
          load.memory_used = p.memory_used;
          loads.push_back(load);
        }
      }
      if (p.live && p.policy.priority != common::Priority::kBestEffort) {
        const SchedulerOptions& so = gpu.sched->options();
        const uint64_t budget =
            wait_budget_ns(tenants, p.key, p.policy.weight, p.policy.priority,
                           {so.quantum_ns, so.quantum_min_ns, so.quantum_slack_ppm});
        p.wait_budget_s = seconds_of(round_up_to_wait_bucket(budget));
      }
      if (p.live) {
        g.memory_used += p.memory_used;
        g.busy_ratio += p.utilization;
      }
      g.pods.push_back(std::move(p));
    }
    g.busy_ratio = std::min(g.busy_ratio, 1.0);
    const auto [held_at, held_then] = acct.held_before(now, window);
    g.held_ratio = ratio_of(acct.held_ns() - std::min(acct.held_ns(), held_then),
                            now > held_at ? now - held_at : 0);
    g.switches = acct.switches();
    g.draining = gpu.sched->drain_requested();
    g.handoff = acct.handoff();
    g.waiting = gpu.region->header.waiters.load(std::memory_order_relaxed);
    const uint32_t holder = gpu.region->header.holder.load(std::memory_order_relaxed);
    if (holder != common::kNoSlot && gpu.slot_pids.count(holder) != 0) {
      if (const Pod* pod = pods_.find(processes_.at(gpu.slot_pids.at(holder)).pod_index))
        g.holder = pod->key;
    }
    const uint32_t free_slots =
        common::kMaxSlotsPerGpu - static_cast<uint32_t>(gpu.slot_pids.size());
    g.capacity =
        gpu_capacity(loads, g.identity.memory_total, g.unmanaged_memory, free_slots, f->probes,
                     pods_.promised_minimum_ppm(gpu.uuid) / static_cast<double>(common::kShareScale));
    f->gpus.push_back(std::move(g));
  }
  f->node_fits = sum_node_fits(f->gpus, f->probes.size());
  return f;
}

json Arbiter::top_json() {
  const std::shared_ptr<const NodeFigures> f = take_figures(common::monotonic_ns());
  json gpus = json::array();
  for (const GpuFigures& g : f->gpus) {
    json pods = json::array();
    for (const PodFigures& p : g.pods) {
      if (!p.live) continue;
      json behind = json::array();
      for (const auto& [holder, ns] : p.window_behind) {
        behind.push_back({{"pod", holder}, {"seconds", seconds_of(ns)}});
      }
      json phases = json::object();
      for (size_t k = 0; k < kPhaseCount; ++k)
        phases[phase_name(static_cast<Phase>(k))] = ratio_of(p.window_phase_ns[k], p.window_ns);
      uint32_t tenants = 0;
      for (uint32_t n : p.tenants_by_state) tenants += n;
      pods.push_back(
          {{"pod", p.key},
           {"priority", common::priority_name(p.policy.priority)},
           {"weight", p.policy.weight},
           {"min_share", p.min_share},
           {"max_share", p.policy.max_share_ppm / static_cast<double>(common::kShareScale)},
           {"target_share", p.target_share},
           {"achieved_share", p.achieved_share},
           {"utilization", p.utilization},
           {"phases", phases},
           {"behind", behind},
           {"wait_p99_ms", static_cast<double>(p.wait_p99_ns) / 1e6},
           {"grants", p.totals.grants},
           {"revoke_timeouts", p.totals.revoke_timeouts},
           {"tenants", tenants},
           {"memory_used", p.memory_used},
           {"memory_limit", p.policy.memory_limit},
           {"alloc_denied", p.alloc_denied}});
    }
    json fits = json::array();
    for (size_t k = 0; k < f->probes.size() && k < g.capacity.fits.size(); ++k) {
      fits.push_back({{"share", f->probes[k].share_label},
                      {"memory", f->probes[k].memory_label},
                      {"pods", g.capacity.fits[k]}});
    }
    gpus.push_back({{"index", g.index},
                    {"uuid", g.uuid},
                    {"model", g.identity.model},
                    {"holder", g.holder},
                    {"waiting", g.waiting},
                    {"window_s", seconds_of(g.window_ns)},
                    {"held_ratio", g.held_ratio},
                    {"busy_ratio", g.busy_ratio},
                    {"utilization_source", g.utilization_source},
                    {"switches", g.switches},
                    {"memory_total", g.capacity.memory_total},
                    {"memory_used", g.memory_used},
                    {"memory_caps", g.capacity.memory_caps},
                    {"memory_unpromised", g.capacity.memory_unpromised},
                    {"new_pod_share", g.capacity.new_pod_share},
                    {"min_share_promised", g.capacity.promised_min_share},
                    {"fits", fits},
                    {"unmanaged_processes", g.unmanaged_processes},
                    {"pods", pods}});
  }
  json node_fits = json::array();
  for (size_t k = 0; k < f->probes.size(); ++k) {
    node_fits.push_back({{"share", f->probes[k].share_label},
                         {"memory", f->probes[k].memory_label},
                         {"pods", f->node_fits[k]}});
  }
  return json{{"ok", true},
              {"scope", f->scope},
              {"generation", f->generation},
              {"uptime_s", f->uptime_s},
              {"gpus", gpus},
              {"node_fits", node_fits}};
}

json Arbiter::explain_json(const AdminRequest& request) {
  const std::string& wanted = request.pod;
  const double span_s = request.seconds;  // 1-60, checked by parse_admin_request
  const uint64_t now = common::monotonic_ns();
  const uint64_t span = static_cast<uint64_t>(span_s * 1e9);

  // The pod, named as on every quantactl command.
  std::set<std::string> known;
  for (auto& gpu : gpus_) {
    for (const auto& [id, acc] : gpu->accounting.pods()) known.insert(acc.key);
  }
  std::string ambiguous;
  const std::string key = resolve_pod_name(known, wanted, &ambiguous);
  if (!ambiguous.empty()) return json{{"ok", false}, {"error", ambiguous}};
  if (key.empty()) {
    std::string list;
    for (const std::string& k : known) list += (list.empty() ? "" : ", ") + k;
    return json{{"ok", false},
                {"error", "no pod " + wanted + " on any GPU in the last 5 minutes; pods known: " +
                              (list.empty() ? std::string("none") : list)}};
  }

  json out_gpus = json::array();
  for (auto& gpu_ptr : gpus_) {
    Gpu& gpu = *gpu_ptr;
    GpuAccounting& acct = gpu.accounting;
    acct.advance(now);
    const PodAccount* acc = acct.pod(key);
    if (acc == nullptr) continue;
    const bool driver_busy = nvml_->latest() &&
                             gpu.index < nvml_->latest()->size() &&
                             (*nvml_->latest())[gpu.index].process_busy_supported;
    // A pod that left is told up to its departure, not through the silence after it.
    const uint64_t end = acc->tenants == 0 && acc->retired_ns != 0 ? acc->retired_ns : now;
    auto totals_at = [&](uint64_t back_ns) -> std::pair<uint64_t, PodTotals> {
      if (back_ns == 0) return {end, acc->totals};
      const PodSample* s = acct.sample_before(*acc, end, back_ns);
      return s ? std::make_pair(s->at_ns, s->totals) : std::make_pair(end, acc->totals);
    };
    auto [from_ns, from_totals] = totals_at(span);
    const PodTotals d = difference(acc->totals, from_totals);
    const uint64_t dt = end > from_ns ? end - from_ns : 0;
    double target_sum = 0;
    int target_n = 0;
    for (const PodSample& s : acc->history) {
      if (s.ticked && s.at_ns >= from_ns && s.at_ns <= end) {
        target_sum += s.target_share;
        ++target_n;
      }
    }
    json phases = json::object();
    for (size_t k = 0; k < kPhaseCount; ++k)
      phases[phase_name(static_cast<Phase>(k))] = seconds_of(d.phase_ns[k]);
    json behind = json::array();
    for (const auto& [holder, ns] : behind_list(acct, d.waited_behind_ns))
      behind.push_back({{"pod", holder}, {"seconds", seconds_of(ns)}});
    std::vector<uint64_t> waits;
    for (const WaitRecord& w : acc->waits) {
      if (w.end_ns + span >= end) waits.push_back(w.wait_ns);
    }
    std::sort(waits.begin(), waits.end());
    json wait_json{{"count", waits.size()}};
    if (!waits.empty()) {
      wait_json["p99_ms"] =
          static_cast<double>(waits[std::min(waits.size() - 1, (waits.size() * 99) / 100)]) / 1e6;
      wait_json["max_ms"] = static_cast<double>(waits.back()) / 1e6;
      wait_json["median_ms"] = static_cast<double>(waits[waits.size() / 2]) / 1e6;
    }
    // Ten-second slices, oldest first.
    json slices = json::array();
    const uint64_t step = 10'000'000'000;
    for (uint64_t back = (span + step - 1) / step * step; back >= step; back -= step) {
      auto [a_ns, a] = totals_at(back);
      auto [b_ns, b] = totals_at(back - step);
      if (b_ns <= a_ns) continue;
      const PodTotals s = difference(b, a);
      double t_sum = 0;
      int t_n = 0;
      for (const PodSample& h : acc->history) {
        if (h.ticked && h.at_ns > a_ns && h.at_ns <= b_ns) {
          t_sum += h.target_share;
          ++t_n;
        }
      }
      const auto top = behind_list(acct, s.waited_behind_ns);
      slices.push_back({{"from_s", -static_cast<double>(now - a_ns) / 1e9},
                        {"to_s", -static_cast<double>(now - b_ns) / 1e9},
                        {"share", ratio_of(s.held_ns, b_ns - a_ns)},
                        {"target", t_n ? t_sum / t_n : 0.0},
                        {"waiting_s", seconds_of(s.phase_ns[static_cast<size_t>(Phase::kWaiting)])},
                        {"behind", top.empty() ? json(nullptr) : json(top.front().first)}});
    }
    // The pods that shared the GPU with it during the span, over the same span.
    auto policy_of = [&](const std::string& k) -> std::optional<common::Policy> {
      if (const Pod* reg = pods_.find_key(k)) return reg->policy;
      auto it = observation_->last_policy.find(k);
      if (it != observation_->last_policy.end()) return it->second;
      return std::nullopt;
    };
    json neighbours = json::array();
    for (const auto& [id, other] : acct.pods()) {
      if (other.key == key || (other.tenants == 0 && other.retired_ns < from_ns)) continue;
      const PodSample* a = acct.sample_before(other, end, end - std::min(end, from_ns));
      const PodSample* b = end == now ? nullptr : acct.sample_before(other, end, 0);
      const PodTotals& b_totals = b != nullptr && other.tenants != 0 ? b->totals : other.totals;
      const PodTotals od = a ? difference(b_totals, a->totals) : PodTotals{};
      const auto policy = policy_of(other.key);
      neighbours.push_back(
          {{"pod", other.key},
           {"weight", policy ? policy->weight : 0},
           {"priority", policy ? common::priority_name(policy->priority) : "?"},
           {"target_share", other.target_share},
           {"achieved_share", ratio_of(od.held_ns, dt)}});
    }
    json g{{"index", gpu.index},
           {"uuid", gpu.uuid},
           {"span_s", seconds_of(dt)},
           {"live", acc->tenants != 0},
           {"target_share", target_n ? target_sum / target_n : 0.0},
           {"achieved_share", ratio_of(d.held_ns, dt)},
           {"utilization",
            driver_busy ? ratio_of(d.busy_ns, d.busy_until_ns) : ratio_of(d.held_ns, dt)},
           {"utilization_source", driver_busy ? "driver" : "holds"},
           {"phases", phases},
           {"behind", behind},
           {"waits", wait_json},
           {"grants", d.grants},
           {"revoke_timeouts", d.revoke_timeouts},
           {"slices", slices},
           {"neighbours", neighbours}};
    if (const auto policy = policy_of(key)) {
      g["weight"] = policy->weight;
      g["priority"] = common::priority_name(policy->priority);
      g["min_share"] = policy->min_share_ppm / static_cast<double>(common::kShareScale);
      g["max_share"] = policy->max_share_ppm / static_cast<double>(common::kShareScale);
      g["memory_limit"] = policy->memory_limit;
    }
    if (const Pod* reg = pods_.find_key(key)) {
      g["memory_used"] = reg->region.memory_used(gpu.index).load(std::memory_order_relaxed);
      g["alloc_denied"] = reg->region.alloc_denied(gpu.index).load(std::memory_order_relaxed);
    }
    out_gpus.push_back(g);
  }
  return json{{"ok", true}, {"pod", key}, {"seconds", span_s}, {"gpus", out_gpus}};
}

}  // namespace quanta::arbiter
