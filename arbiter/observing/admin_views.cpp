// `quantactl status` from the node's status as gathered, `top` from the figures, `explain`
// from the view's accounting history.
#include "arbiter/observing/admin_views.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "common/version.h"

namespace quanta::arbiter {
namespace {

using nlohmann::json;

constexpr uint64_t kSliceNs = 10'000'000'000;  // explain's slices

json fits_json(const std::vector<config::FitProbe>& probes, const std::vector<uint32_t>& fits) {
  json out = json::array();
  for (size_t k = 0; k < probes.size() && k < fits.size(); ++k) {
    out.push_back(
        {{"share", probes[k].share_label}, {"memory", probes[k].memory_label}, {"pods", fits[k]}});
  }
  return out;
}

json behind_json(const std::vector<std::pair<std::string, uint64_t>>& behind) {
  json out = json::array();
  for (const auto& [holder, ns] : behind)
    out.push_back({{"pod", holder}, {"seconds", seconds_of(ns)}});
  return out;
}

json top_pod(const PodFigures& p) {
  json phases = json::object();
  for (size_t k = 0; k < kPhaseCount; ++k)
    phases[phase_name(static_cast<Phase>(k))] = ratio_of(p.window_phase_ns[k], p.window_ns);
  uint32_t tenants = 0;
  for (uint32_t n : p.tenants_by_state) tenants += n;
  return {{"pod", p.key},
          {"priority", common::priority_name(p.policy.priority)},
          {"weight", p.policy.weight},
          {"min_share", p.min_share},
          {"max_share", p.policy.max_share_ppm / static_cast<double>(common::kShareScale)},
          {"target_share", p.target_share},
          {"achieved_share", p.achieved_share},
          {"utilization", p.utilization},
          {"phases", phases},
          {"behind", behind_json(p.window_behind)},
          {"wait_p99_ms", static_cast<double>(p.wait_p99_ns) / 1e6},
          {"grants", p.totals.grants},
          {"revoke_timeouts", p.totals.revoke_timeouts},
          {"tenants", tenants},
          {"memory_used", p.memory_used},
          {"memory_limit", p.policy.memory_limit},
          {"alloc_denied", p.alloc_denied}};
}

json top_gpu(const GpuFigures& g, const std::vector<config::FitProbe>& probes) {
  json pods = json::array();
  for (const PodFigures& p : g.pods) {
    if (p.live) pods.push_back(top_pod(p));
  }
  return {{"index", g.index},
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
          {"fits", fits_json(probes, g.capacity.fits)},
          {"unmanaged_processes", g.unmanaged_processes},
          {"pods", pods}};
}

// One pod's account on one GPU, told from `end` (now, or its departure) back.
class PodStory {
 public:
  PodStory(const GpuAccounting& acct, const PodAccount& acc, uint64_t now)
      : acct_(acct),
        acc_(acc),
        end_(acc.tenants == 0 && acc.retired_ns != 0 ? acc.retired_ns : now) {}

  uint64_t end() const { return end_; }

  // The pod's totals `back_ns` before the end (the oldest it has when it is younger), and
  // when they were taken.
  std::pair<uint64_t, PodTotals> totals_at(uint64_t back_ns) const {
    if (back_ns == 0) return {end_, acc_.totals};
    const PodSample* s = acct_.sample_before(acc_, end_, back_ns);
    return s ? std::make_pair(s->at_ns, s->totals) : std::make_pair(end_, acc_.totals);
  }

  // The mean of the target shares its ticks recorded in (from_ns, to_ns], 0 when none;
  // `from_inclusive` takes a tick at from_ns too.
  double mean_target(uint64_t from_ns, uint64_t to_ns, bool from_inclusive) const {
    double sum = 0;
    int n = 0;
    for (const PodSample& s : acc_.history) {
      const bool after = from_inclusive ? s.at_ns >= from_ns : s.at_ns > from_ns;
      if (s.ticked && after && s.at_ns <= to_ns) {
        sum += s.target_share;
        ++n;
      }
    }
    return n ? sum / n : 0.0;
  }

  // Its waits for a grant that ended within the span: count, median, p99 and max.
  json waits(uint64_t span) const {
    std::vector<uint64_t> waits;
    for (const WaitRecord& w : acc_.waits) {
      if (w.end_ns + span >= end_) waits.push_back(w.wait_ns);
    }
    std::sort(waits.begin(), waits.end());
    json out{{"count", waits.size()}};
    if (!waits.empty()) {
      out["p99_ms"] =
          static_cast<double>(waits[std::min(waits.size() - 1, (waits.size() * 99) / 100)]) / 1e6;
      out["max_ms"] = static_cast<double>(waits.back()) / 1e6;
      out["median_ms"] = static_cast<double>(waits[waits.size() / 2]) / 1e6;
    }
    return out;
  }

  // Ten-second slices of the span, oldest first: share, target, waiting and whom it waited
  // behind most. Times are seconds before `now`.
  json slices(uint64_t span, uint64_t now) const {
    json out = json::array();
    for (uint64_t back = (span + kSliceNs - 1) / kSliceNs * kSliceNs; back >= kSliceNs;
         back -= kSliceNs) {
      auto [a_ns, a] = totals_at(back);
      auto [b_ns, b] = totals_at(back - kSliceNs);
      if (b_ns <= a_ns) continue;
      const PodTotals s = totals_between(b, a);
      const auto top = acct_.by_holder(s.waited_behind_ns);
      out.push_back({{"from_s", -static_cast<double>(now - a_ns) / 1e9},
                     {"to_s", -static_cast<double>(now - b_ns) / 1e9},
                     {"share", ratio_of(s.held_ns, b_ns - a_ns)},
                     {"target", mean_target(a_ns, b_ns, false)},
                     {"waiting_s", seconds_of(s.phase_ns[static_cast<size_t>(Phase::kWaiting)])},
                     {"behind", top.empty() ? json(nullptr) : json(top.front().first)}});
    }
    return out;
  }

 private:
  const GpuAccounting& acct_;
  const PodAccount& acc_;
  uint64_t end_;
};

// A pod's policy: the one in force when it is registered, else the one it last had.
std::optional<common::Policy> policy_of(const NodeView& node, const GpuView& gpu,
                                        const std::string& key) {
  if (auto reg = gpu.registered.find(key); reg != gpu.registered.end()) return reg->second.policy;
  if (auto last = node.last_policy.find(key); last != node.last_policy.end()) return last->second;
  return std::nullopt;
}

// The pods that shared the GPU with `key` during [from_ns, end], over the same span.
json neighbours(const NodeView& node, const GpuView& gpu, const std::string& key, uint64_t from_ns,
                uint64_t end) {
  const GpuAccounting& acct = *gpu.accounting;
  const uint64_t now = node.taken_ns;
  const uint64_t dt = end > from_ns ? end - from_ns : 0;
  json out = json::array();
  for (const auto& [id, other] : acct.pods()) {
    if (other.key == key || (other.tenants == 0 && other.retired_ns < from_ns)) continue;
    const PodSample* a = acct.sample_before(other, end, end - std::min(end, from_ns));
    const PodSample* b = end == now ? nullptr : acct.sample_before(other, end, 0);
    const PodTotals& b_totals = b != nullptr && other.tenants != 0 ? b->totals : other.totals;
    const PodTotals od = a ? totals_between(b_totals, a->totals) : PodTotals{};
    const auto policy = policy_of(node, gpu, other.key);
    out.push_back({{"pod", other.key},
                   {"weight", policy ? policy->weight : 0},
                   {"priority", policy ? common::priority_name(policy->priority) : "?"},
                   {"target_share", other.target_share},
                   {"achieved_share", ratio_of(od.held_ns, dt)}});
  }
  return out;
}

json explain_gpu(const NodeView& node, const GpuView& gpu, const PodAccount& acc, uint64_t span) {
  const GpuAccounting& acct = *gpu.accounting;
  const bool driver_busy = gpu.reading != nullptr && gpu.reading->process_busy_supported;
  const PodStory story(acct, acc, node.taken_ns);
  const uint64_t end = story.end();
  const auto [from_ns, from_totals] = story.totals_at(span);
  const PodTotals d = totals_between(acc.totals, from_totals);
  const uint64_t dt = end > from_ns ? end - from_ns : 0;
  json phases = json::object();
  for (size_t k = 0; k < kPhaseCount; ++k)
    phases[phase_name(static_cast<Phase>(k))] = seconds_of(d.phase_ns[k]);
  json g{
      {"index", gpu.index},
      {"uuid", gpu.uuid},
      {"span_s", seconds_of(dt)},
      {"live", acc.tenants != 0},
      {"target_share", story.mean_target(from_ns, end, true)},
      {"achieved_share", ratio_of(d.held_ns, dt)},
      {"utilization", driver_busy ? ratio_of(d.busy_ns, d.busy_until_ns) : ratio_of(d.held_ns, dt)},
      {"utilization_source", driver_busy ? "driver" : "holds"},
      {"phases", phases},
      {"behind", behind_json(acct.by_holder(d.waited_behind_ns))},
      {"waits", story.waits(span)},
      {"grants", d.grants},
      {"revoke_timeouts", d.revoke_timeouts},
      {"slices", story.slices(span, node.taken_ns)},
      {"neighbours", neighbours(node, gpu, acc.key, from_ns, end)}};
  if (const auto policy = policy_of(node, gpu, acc.key)) {
    g["weight"] = policy->weight;
    g["priority"] = common::priority_name(policy->priority);
    g["min_share"] = policy->min_share_ppm / static_cast<double>(common::kShareScale);
    g["max_share"] = policy->max_share_ppm / static_cast<double>(common::kShareScale);
    g["memory_limit"] = policy->memory_limit;
  }
  if (auto reg = gpu.registered.find(acc.key); reg != gpu.registered.end()) {
    g["memory_used"] = reg->second.memory_used;
    g["alloc_denied"] = reg->second.alloc_denied;
  }
  return g;
}

}  // namespace

json top_answer(const NodeFigures& f) {
  json gpus = json::array();
  for (const GpuFigures& g : f.gpus) gpus.push_back(top_gpu(g, f.probes));
  return json{{"ok", true},
              {"scope", f.scope},
              {"generation", f.generation},
              {"uptime_s", f.uptime_s},
              {"gpus", gpus},
              {"node_fits", fits_json(f.probes, f.node_fits)}};
}

json explain_answer(const NodeView& node, const std::string& wanted, double span_s) {
  const uint64_t span = static_cast<uint64_t>(span_s * 1e9);
  std::set<std::string> known;
  for (const GpuView& gpu : node.gpus) {
    for (const auto& [id, acc] : gpu.accounting->pods()) known.insert(acc.key);
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
  json gpus = json::array();
  for (const GpuView& gpu : node.gpus) {
    if (const PodAccount* acc = gpu.accounting->pod(key))
      gpus.push_back(explain_gpu(node, gpu, *acc, span));
  }
  return json{{"ok", true}, {"pod", key}, {"seconds", span_s}, {"gpus", gpus}};
}

namespace {

double ms(uint64_t ns) {
  return static_cast<double>(ns) / 1e6;
}

double share(uint64_t ppm) {
  return static_cast<double>(ppm) / static_cast<double>(common::kShareScale);
}

json tenant_status(const TenantStatus& t) {
  const TenantReport& r = t.report;
  return {
      {"pid", t.pid},
      {"pod", t.pod},
      {"slot", r.slot},
      {"weight", t.policy.weight},
      {"priority", common::priority_name(t.policy.priority)},
      {"min_share", share(t.policy.min_share_ppm)},
      {"max_share", share(t.policy.max_share_ppm)},
      {"quantum_ms", ms(r.quantum_ns)},
      {"target_share", r.target_share},
      {"achieved_share", r.achieved_share},
      {"wait_p99_ms", ms(r.wait_p99_ns)},
      {"gate_waits", t.gate_waits},
      {"gate_wait_avg_ms",
       t.gate_waits == 0 ? 0.0 : ms(t.gate_wait_ns) / static_cast<double>(t.gate_waits)},
      {"gate_wait_max_ms", ms(t.gate_wait_max_ns)},
      {"launches", t.launches},
      {"memory_used", t.memory_used},
      {"pod_memory_used", t.pod_memory_used},
      {"shared_memory_layout", t.layout},
      {"memory_cap", t.memory_cap},
      {"nvml_memory_used", t.nvml_memory_used ? json(*t.nvml_memory_used) : json(nullptr)},
      {"state", state_name(r.state)},
      {"grants", r.grants},
      {"revoke_timeouts", r.pass_overs},
      {"connected", t.connected},
  };
}

json gpu_status(const GpuStatus& gpu, config::OverCapAction over_cap) {
  json tenants = json::array();
  for (const TenantStatus& t : gpu.tenants) tenants.push_back(tenant_status(t));
  json unmanaged = json::array();
  for (const UnmanagedProcess& u : gpu.unmanaged) {
    unmanaged.push_back({{"pid", u.pid},
                         {"memory_used", u.used_bytes},
                         {"pod", u.pod.empty() ? json(nullptr) : json(u.pod)},
                         {"command", u.command}});
  }
  json over = json::array();
  for (const OverCapStatus& o : gpu.over_cap) {
    over.push_back({{"pod", o.pod},
                    {"nvml_memory_used", o.nvml_memory_used},
                    {"memory_cap", o.memory_cap},
                    {"action", config::over_cap_name(over_cap)}});
  }
  json holder = nullptr;
  if (gpu.holder)
    holder = {{"slot", gpu.holder->slot}, {"pid", gpu.holder->pid}, {"pod", gpu.holder->pod}};
  json out{{"index", gpu.index},
           {"uuid", gpu.uuid},
           {"holder", holder},
           {"waiting", gpu.waiting},
           {"draining", gpu.draining},
           {"idle", gpu.idle},
           {"grants", gpu.grants},
           {"switches", gpu.switches},
           {"last_granted", gpu.last_granted ? json(*gpu.last_granted) : json(nullptr)},
           {"doorbells", gpu.doorbells},
           {"passes", gpu.passes},
           {"holder_looks", gpu.holder_looks},
           {"ended_by_holder", gpu.ended_by_holder},
           {"tenants", tenants},
           {"unmanaged", unmanaged},
           {"over_cap", over}};
  if (!gpu.nvml_error.empty()) out["nvml_error"] = gpu.nvml_error;
  return out;
}

json interface_versions(const common::InterfaceVersions& v) {
  return json{{"speaks", v.speaks}, {"accepts", json::array({v.oldest, v.newest})}};
}

}  // namespace

json status_answer(const NodeStatus& node) {
  json gpus = json::array();
  for (const GpuStatus& gpu : node.gpus) gpus.push_back(gpu_status(gpu, node.enforce.over_cap));
  return json{{"ok", true},
              {"scope", node.scope},
              {"versions",
               {{"release", common::release()},
                {"tenant_protocol", interface_versions(common::kTenantProtocol)},
                {"shared_memory_layout", interface_versions(common::kSharedMemoryLayout)}}},
              {"generation", node.generation},
              {"taken_ns", node.taken_ns},
              {"uptime_s", static_cast<double>(node.taken_ns - node.started_ns) / 1e9},
              {"enforce",
               {{"enforce", node.enforce.enforce},
                {"unplaced", config::unplaced_name(node.enforce.unplaced)},
                {"over_cap", config::over_cap_name(node.enforce.over_cap)}}},
              {"context_overhead", node.context_overhead},
              {"tenant_connections", node.tenant_connections},
              {"metrics_listen", node.metrics_listen},
              {"gpus", gpus}};
}

}  // namespace quanta::arbiter
