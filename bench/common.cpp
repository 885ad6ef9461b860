// Helpers every scenario uses: targets, notes, measurement windows, shares of GPU time.
#include "bench/scenarios.h"
#include "bench/stats.h"

#include <algorithm>
#include <cmath>
#include <map>

namespace quanta::bench {

const std::vector<ScenarioEntry>& scenarios() {
  static const std::vector<ScenarioEntry> entries = {
      {"fairness", "3 batch tenants with weights 1:2:4: share error against the weighted target", run_fairness},
      {"interactive", "an interactive tenant's request latency among 4 batch tenants with 20 ms kernels", run_interactive},
      {"interactive-8", "the same among 8 batch tenants", run_interactive8},
      {"overhead", "useful throughput of 3 equal batch tenants, Quanta against native time slicing", run_overhead},
      {"handoff", "release-to-next-launch latency against the one-hop futex floor", run_handoff},
      {"launch-cost", "ns added per cuLaunchKernel and per cuMemAlloc+cuMemFree on the fast path", run_launch_cost},
      {"memcap", "8 processes of one pod racing allocations at a memory cap", run_memcap},
      {"scale", "64 tenants on one GPU, and 8 GPUs with 8 tenants each", run_scale},
      {"churn", "pods arriving, sleeping, waking and leaving beside best-effort and capped pods: longest wait, share error per window", run_churn},
      {"soak", "64 tenants for --minutes with random kills, arbiter restarts, policy changes and allocation churn", run_soak},
  };
  return entries;
}

Json target(const std::string& description, std::optional<double> value, double limit, bool at_most, int digits) {
  Json out = {{"description", description}, {"limit", limit}, {"comparison", at_most ? "<=" : ">="}};
  out["value"] = figure(value, digits);
  if (!value || !std::isfinite(*value)) {
    out["met"] = nullptr;
    out["margin"] = nullptr;
  } else {
    out["met"] = at_most ? *value <= limit : *value >= limit;
    out["margin"] = figure(*value - limit, digits);
  }
  return out;
}

void add_note(Json& obj, const std::string& note) {
  if (note.empty()) return;
  if (obj.contains("note") && obj["note"].is_string() && !obj["note"].get<std::string>().empty()) {
    obj["note"] = obj["note"].get<std::string>() + "; " + note;
  } else {
    obj["note"] = note;
  }
}

Window steady_window(uint64_t start_ns, double seconds) {
  double head = std::min(0.5, 0.1 * seconds);
  double tail = 0.05 * seconds;
  return Window{start_ns + static_cast<uint64_t>(head * 1e9), start_ns + static_cast<uint64_t>((seconds - tail) * 1e9)};
}

Shares measure_shares(const std::vector<ShareTenant>& tenants, const SimLog* log, const Window& window,
                      int device_count) {
  Shares out;
  std::map<int, double> weight_sum;
  for (const auto& tenant : tenants) weight_sum[tenant.device] += tenant.weight;

  std::map<pid_t, uint64_t> busy;
  bool from_log = log != nullptr && !log->slices.empty();
  if (from_log) busy = busy_ns_by_pid(*log, window);
  std::map<int, double> used_sum;
  std::vector<std::optional<double>> used(tenants.size());
  for (size_t i = 0; i < tenants.size(); ++i) {
    if (from_log) {
      auto it = busy.find(tenants[i].pid);
      used[i] = it == busy.end() ? 0.0 : static_cast<double>(it->second) / 1e9;
    } else {
      used[i] = tenants[i].kernel_seconds;
    }
    if (used[i]) used_sum[tenants[i].device] += *used[i];
  }
  out.source = from_log ? "simgpu execution log" : "tenant reports";

  double worst = 0;
  bool any = false;
  for (size_t i = 0; i < tenants.size(); ++i) {
    double target_share = tenants[i].weight / weight_sum[tenants[i].device];
    Json row = {{"weight", tenants[i].weight}, {"target_share", figure(target_share, 4)}};
    if (device_count > 1) row["device"] = tenants[i].device;
    std::optional<double> achieved;
    if (used[i] && used_sum[tenants[i].device] > 0) achieved = *used[i] / used_sum[tenants[i].device];
    row["achieved_share"] = figure(achieved, 4);
    if (achieved) {
      worst = std::max(worst, std::fabs(*achieved - target_share) * 100.0);
      any = true;
    }
    out.tenants.push_back(row);
  }
  if (any) out.max_share_error_pp = worst;

  if (from_log) {
    out.utilization = utilization(*log, window, -1, device_count);
    if (window.seconds() > 0) {
      out.switches_per_s = static_cast<double>(switches(*log, window).size()) / window.seconds();
    }
  }
  return out;
}

std::optional<double> sum_useful_per_s(const std::vector<TenantResult>& results, size_t first, size_t last) {
  std::optional<double> sum;
  for (size_t i = first; i < results.size() && i < last; ++i) {
    if (!results[i].report) continue;
    auto value = number_field(*results[i].report, {"useful_per_s"});
    if (value) sum = sum.value_or(0.0) + *value;
  }
  return sum;
}

Json guarded(const std::string& what, const std::function<Json()>& configure) {
  try {
    return configure();
  } catch (const std::exception& error) {
    return Json{{"note", what + " failed: " + error.what()}};
  }
}

}  // namespace quanta::bench
