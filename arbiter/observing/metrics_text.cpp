// Rendering: one family at a time (Prometheus wants a family's series together), over every
// GPU, pod and process of the snapshot. Labels are built once per GPU and per pod.
#include "arbiter/observing/metrics_text.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>

#include "hosted/names.h"

namespace quanta::arbiter {
namespace {

std::string number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  if (v == std::floor(v) && std::fabs(v) < 1e15) {
    std::snprintf(buf, sizeof buf, "%.0f", v);
  } else {
    std::snprintf(buf, sizeof buf, "%.9g", v);
  }
  return buf;
}

std::string count(uint64_t v) {
  return std::to_string(v);
}

// Exact seconds from nanoseconds: "12.000345", no float rounding on long-running counters.
std::string seconds(uint64_t ns) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%llu.%09llu", static_cast<unsigned long long>(ns / 1'000'000'000),
                static_cast<unsigned long long>(ns % 1'000'000'000));
  std::string s = buf;
  while (s.back() == '0') s.pop_back();
  if (s.back() == '.') s.pop_back();
  return s;
}

class Exposition {
 public:
  void family(const char* name, const char* type, const char* help) {
    out_ += "# HELP ";
    out_ += name;
    out_ += ' ';
    out_ += help;
    out_ += "\n# TYPE ";
    out_ += name;
    out_ += ' ';
    out_ += type;
    out_ += '\n';
  }
  void sample(std::string_view name, const std::string& labels, const std::string& value) {
    out_ += name;
    if (!labels.empty()) {
      out_ += '{';
      out_ += labels;
      out_ += '}';
    }
    out_ += ' ';
    out_ += value;
    out_ += '\n';
  }
  void histogram(const std::string& name, const std::string& labels, const LatencyHistogram& h) {
    const std::string sep = labels.empty() ? "" : ",";
    for (size_t i = 0; i < LatencyHistogram::kBoundsNs.size(); ++i) {
      sample(name + "_bucket",
             labels + sep + "le=\"" + seconds(LatencyHistogram::kBoundsNs[i]) + "\"",
             count(h.at_or_below(i)));
    }
    sample(name + "_bucket", labels + sep + "le=\"+Inf\"", count(h.count()));
    sample(name + "_sum", labels, seconds(h.sum_ns()));
    sample(name + "_count", labels, count(h.count()));
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

std::string label(const char* name, std::string_view value) {
  return std::string(name) + "=\"" + escape_label_value(value) + "\"";
}

std::string join(std::initializer_list<std::string> parts) {
  std::string out;
  for (const std::string& p : parts) {
    if (p.empty()) continue;
    if (!out.empty()) out += ',';
    out += p;
  }
  return out;
}

std::string gpu_labels(const GpuFigures& g) {
  return join({label("gpu", std::to_string(g.index)), label("UUID", g.uuid),
               label("model_name", g.identity.model),
               label("GPU_I_PROFILE", g.identity.mig_profile),
               label("GPU_I_ID", g.identity.mig_instance)});
}

std::string pod_labels(const std::string& gpu, const PodFigures& p) {
  return join({gpu, label("namespace", p.namespace_name), label("pod", p.pod_name)});
}

std::string probe_labels(const config::FitProbe& probe) {
  return join({label("share", probe.share_label), label("memory", probe.memory_label)});
}

// The tenant states quanta_pod_tenants counts, in TenantState order.
constexpr const char* kTenantStates[] = {"idle", "waiting", "holding", "revoking", "passed-over"};


// --- the catalogue: one row per metric family, in the order they are rendered ----------
// A row is the family's name, type and help, and what writes its series for one GPU, pod,
// process or the node. docs/metrics.md describes the same families (Docs tests hold it).

std::string ratio(double v) { return number(std::clamp(v, 0.0, 1.0)); }

struct GpuFamily {
  const char* name;
  const char* type;
  const char* help;
  // Writes the GPU's series; `labels` are the GPU's own.
  void (*emit)(Exposition& x, const char* name, const std::string& labels, const GpuFigures& g,
               const NodeFigures& f);
};

// A family with one value per GPU.
#define QUANTA_GPU_VALUE(expr)                                                         \
  [](Exposition& x, const char* name, const std::string& labels, const GpuFigures& g, \
     const NodeFigures&) { x.sample(name, labels, expr); }

const GpuFamily kGpuFamilies[] = {
    {"quanta_gpu_info", "gauge", "1 per managed GPU or MIG instance; carries Hostname",
     [](Exposition& x, const char* name, const std::string& labels, const GpuFigures&,
        const NodeFigures& f) { x.sample(name, join({labels, label("Hostname", f.hostname)}), "1"); }},
    {"quanta_gpu_busy_ratio", "gauge",
     "Fraction of the stats window the GPU ran managed tenants' work",
     QUANTA_GPU_VALUE(ratio(g.busy_ratio))},
    {"quanta_gpu_held_ratio", "gauge",
     "Fraction of the stats window some tenant held the grant (busy or not)",
     QUANTA_GPU_VALUE(ratio(g.held_ratio))},
    {"quanta_gpu_utilization_source_info", "gauge",
     "1; source says where per-pod utilisation comes from: driver (NVML per process) or "
     "holds (the hold timeline)",
     [](Exposition& x, const char* name, const std::string& labels, const GpuFigures& g,
        const NodeFigures&) {
       x.sample(name, join({labels, label("source", g.utilization_source)}), "1");
     }},
    {"quanta_gpu_switches_total", "counter",
     "Grants that moved the GPU from one tenant to another", QUANTA_GPU_VALUE(count(g.switches))},
    {"quanta_gpu_handoff_seconds", "histogram",
     "From the arbiter seeing one tenant's release to its grant to the next waiting tenant",
     [](Exposition& x, const char* name, const std::string& labels, const GpuFigures& g,
        const NodeFigures&) { x.histogram(name, labels, g.handoff); }},
    {"quanta_gpu_waiting_tenants", "gauge", "Tenants that want the GPU and do not hold it",
     QUANTA_GPU_VALUE(count(g.waiting))},
    {"quanta_gpu_memory_total_bytes", "gauge", "Device memory of the GPU or MIG instance",
     QUANTA_GPU_VALUE(count(g.capacity.memory_total))},
    {"quanta_gpu_memory_used_bytes", "gauge", "Sum of the pods' ledgers on this GPU",
     QUANTA_GPU_VALUE(count(g.memory_used))},
    {"quanta_gpu_memory_caps_bytes", "gauge",
     "Sum of the memory caps of the pods attached to this GPU",
     QUANTA_GPU_VALUE(count(g.capacity.memory_caps))},
    {"quanta_gpu_memory_unpromised_bytes", "gauge",
     "Memory not promised: total minus caps, uncapped pods' use and unmanaged processes' use",
     QUANTA_GPU_VALUE(count(g.capacity.memory_unpromised))},
    {"quanta_gpu_min_share_promised_ratio", "gauge",
     "Sum of the guaranteed minimum shares promised to pods that may use this GPU",
     QUANTA_GPU_VALUE(ratio(g.capacity.promised_min_share))},
    {"quanta_gpu_new_pod_share_ratio", "gauge",
     "Share of GPU time a new weight-1 batch pod would receive now",
     QUANTA_GPU_VALUE(ratio(g.capacity.new_pod_share))},
    {"quanta_gpu_pods_fit", "gauge",
     "Pods of the probe size (share, memory) that still fit on this GPU",
     [](Exposition& x, const char* name, const std::string& labels, const GpuFigures& g,
        const NodeFigures& f) {
       for (size_t k = 0; k < f.probes.size() && k < g.capacity.fits.size(); ++k)
         x.sample(name, join({labels, probe_labels(f.probes[k])}), count(g.capacity.fits[k]));
     }},
    {"quanta_gpu_draining", "gauge", "1 while quantactl drain holds new grants back",
     QUANTA_GPU_VALUE(count(g.draining ? 1 : 0))},
    {"quanta_gpu_unmanaged_processes", "gauge",
     "Processes NVML lists on the GPU that Quanta does not manage",
     QUANTA_GPU_VALUE(count(g.unmanaged_processes))},
};
#undef QUANTA_GPU_VALUE

struct PodFamily {
  const char* name;
  const char* type;
  const char* help;
  // Writes a live pod's series on one GPU; `labels` are the GPU's and the pod's.
  void (*emit)(Exposition& x, const char* name, const std::string& labels, const PodFigures& p);
};

// A family with one value per pod and GPU.
#define QUANTA_POD_VALUE(expr) \
  [](Exposition& x, const char* name, const std::string& labels, const PodFigures& p) { \
    x.sample(name, labels, expr);                                                       \
  }

const PodFamily kPodFamilies[] = {
    {"quanta_pod_info", "gauge", "1 per pod on a GPU; carries priority",
     [](Exposition& x, const char* name, const std::string& labels, const PodFigures& p) {
       x.sample(name, join({labels, label("priority", common::priority_name(p.policy.priority))}),
                "1");
     }},
    {"quanta_pod_weight", "gauge", "The pod's weight", QUANTA_POD_VALUE(count(p.policy.weight))},
    {"quanta_pod_min_share_ratio", "gauge", "Guaranteed minimum share (0 = none)",
     QUANTA_POD_VALUE(ratio(p.min_share))},
    {"quanta_pod_max_share_ratio", "gauge", "Share ceiling (1 = none)",
     QUANTA_POD_VALUE(ratio(p.policy.max_share_ppm / static_cast<double>(common::kShareScale)))},
    {"quanta_pod_target_share_ratio", "gauge",
     "Share the policy gives it among the tenants active now", QUANTA_POD_VALUE(ratio(p.target_share))},
    {"quanta_pod_achieved_share_ratio", "gauge", "Share of GPU time it held over the stats window",
     QUANTA_POD_VALUE(ratio(p.achieved_share))},
    {"quanta_pod_utilization_ratio", "gauge",
     "Fraction of the stats window the GPU was busy with this pod's work",
     QUANTA_POD_VALUE(ratio(p.utilization))},
    {"quanta_pod_gpu_seconds_total", "counter",
     "GPU time granted to it (grant to release, overrun included)",
     QUANTA_POD_VALUE(seconds(p.totals.held_ns))},
    {"quanta_pod_busy_seconds_total", "counter",
     "Device time its work ran, as the driver reports it per process (see "
     "quanta_gpu_utilization_source_info)",
     QUANTA_POD_VALUE(seconds(p.totals.busy_ns))},
    {"quanta_pod_time_seconds_total", "counter",
     "Its time on the GPU by state: running, waiting, draining, idle",
     [](Exposition& x, const char* name, const std::string& labels, const PodFigures& p) {
       for (size_t k = 0; k < kPhaseCount; ++k) {
         x.sample(name, join({labels, label("state", phase_name(static_cast<Phase>(k)))}),
                  seconds(p.totals.phase_ns[k]));
       }
     }},
    {"quanta_pod_waited_behind_seconds_total", "counter",
     "Time it waited while holder_namespace/holder_pod held the GPU (holder_pod=\"(none)\": "
     "nobody held it)",
     [](Exposition& x, const char* name, const std::string& labels, const PodFigures& p) {
       for (const auto& [holder, ns] : p.waited_behind) {
         std::pair<std::string, std::string> h{"", "(none)"};
         if (!holder.empty()) h = split_pod_key(holder);
         x.sample(name,
                  join({labels, label("holder_namespace", h.first), label("holder_pod", h.second)}),
                  seconds(ns));
       }
     }},
    {"quanta_pod_wait_seconds", "histogram", "From wanting the GPU to its grant",
     [](Exposition& x, const char* name, const std::string& labels, const PodFigures& p) {
       x.histogram(name, labels, p.wait);
     }},
    {"quanta_pod_wait_budget_seconds", "gauge",
     "The longest wait its priority class is promised on this GPU now (none for best-effort)",
     [](Exposition& x, const char* name, const std::string& labels, const PodFigures& p) {
       if (p.wait_budget_s) x.sample(name, labels, number(*p.wait_budget_s));
     }},
    {"quanta_pod_drain_seconds", "histogram",
     "From a revoke, or the end of a quantum its holder ends itself, to its release",
     [](Exposition& x, const char* name, const std::string& labels, const PodFigures& p) {
       x.histogram(name, labels, p.drain);
     }},
    {"quanta_pod_grants_total", "counter", "Quanta granted", QUANTA_POD_VALUE(count(p.totals.grants))},
    {"quanta_pod_revoke_timeouts_total", "counter",
     "Times it was passed over for not releasing within revoke_timeout",
     QUANTA_POD_VALUE(count(p.totals.revoke_timeouts))},
    {"quanta_pod_tenants", "gauge", "Its processes on this GPU by tenant state",
     [](Exposition& x, const char* name, const std::string& labels, const PodFigures& p) {
       for (size_t k = 0; k < p.tenants_by_state.size(); ++k) {
         x.sample(name, join({labels, label("state", kTenantStates[k])}),
                  count(p.tenants_by_state[k]));
       }
     }},
    {"quanta_pod_memory_used_bytes", "gauge", "Its ledger: bytes its processes hold on this GPU",
     QUANTA_POD_VALUE(count(p.memory_used))},
    {"quanta_pod_memory_limit_bytes", "gauge", "Its memory cap on this GPU (absent: none)",
     [](Exposition& x, const char* name, const std::string& labels, const PodFigures& p) {
       if (p.policy.memory_limit != 0) x.sample(name, labels, count(p.policy.memory_limit));
     }},
    {"quanta_pod_alloc_denied_total", "counter", "Allocations refused at its cap",
     QUANTA_POD_VALUE(count(p.alloc_denied))},
};
#undef QUANTA_POD_VALUE

struct ProcessFamily {
  const char* name;
  const char* help;  // every process family is a gauge of bytes
  std::optional<uint64_t> (*value)(const ProcessFigures& p);  // nullopt: no series
};

const ProcessFamily kProcessFamilies[] = {
    {"quanta_process_memory_used_bytes", "Bytes the process holds on the GPU (Quanta's ledger)",
     [](const ProcessFigures& p) { return std::optional<uint64_t>(p.memory_used); }},
    {"quanta_process_nvml_memory_used_bytes",
     "What NVML reports the process holding on the GPU, where NVML lists it",
     [](const ProcessFigures& p) { return p.nvml_memory; }},
};

struct NodeFamily {
  const char* name;
  const char* type;
  const char* help;
  void (*emit)(Exposition& x, const char* name, const NodeFigures& f);
};

const NodeFamily kNodeFamilies[] = {
    {"quanta_node_pods_fit", "gauge",
     "Pods of the probe size (share, memory) that fit on the node's GPUs together",
     [](Exposition& x, const char* name, const NodeFigures& f) {
       for (size_t k = 0; k < f.probes.size() && k < f.node_fits.size(); ++k)
         x.sample(name, probe_labels(f.probes[k]), count(f.node_fits[k]));
     }},
    {"quanta_arbiter_info", "gauge", "1; carries version and scope",
     [](Exposition& x, const char* name, const NodeFigures& f) {
       x.sample(name, join({label("version", f.version), label("scope", f.scope)}), "1");
     }},
    {"quanta_arbiter_generation", "gauge", "Bumped at every arbiter start",
     [](Exposition& x, const char* name, const NodeFigures& f) {
       x.sample(name, "", count(f.generation));
     }},
    {"quanta_arbiter_start_time_seconds", "gauge", "Unix time the arbiter started",
     [](Exposition& x, const char* name, const NodeFigures& f) {
       char start[32];
       std::snprintf(start, sizeof start, "%.3f", f.start_time_s);
       x.sample(name, "", start);
     }},
    {"quanta_arbiter_admissions_refused_total", "counter",
     "Processes refused at the tenant socket, by reason",
     [](Exposition& x, const char* name, const NodeFigures& f) {
       // Every reason from the start (at 0), so rate() works before the first refusal.
       for (const char* reason : kRefusalReasons) {
         auto it = f.refusals.find(reason);
         x.sample(name, label("reason", reason), count(it == f.refusals.end() ? 0 : it->second));
       }
     }},
    {"quanta_arbiter_tenant_connections", "gauge", "Open tenant connections",
     [](Exposition& x, const char* name, const NodeFigures& f) {
       x.sample(name, "", count(f.tenant_connections));
     }},
};

}  // namespace

std::string escape_label_value(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (size_t i = 0; i < value.size();) {
    const char c = value[i];
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      out += "\xef\xbf\xbd";
    } else {
      const size_t n = hosted::utf8_length(value, i);
      if (n == 0) {
        out += "\xef\xbf\xbd";
        ++i;
        continue;
      }
      out.append(value.substr(i, n));
      i += n;
      continue;
    }
    ++i;
  }
  return out;
}

std::vector<std::string> metric_families() {
  std::vector<std::string> names;
  for (const GpuFamily& m : kGpuFamilies) names.push_back(m.name);
  for (const PodFamily& m : kPodFamilies) names.push_back(m.name);
  for (const ProcessFamily& m : kProcessFamilies) names.push_back(m.name);
  for (const NodeFamily& m : kNodeFamilies) names.push_back(m.name);
  return names;
}

std::string render_prometheus(const NodeFigures& f) {
  Exposition x;
  std::vector<std::string> gpu_label_sets;
  for (const GpuFigures& g : f.gpus) gpu_label_sets.push_back(gpu_labels(g));
  for (const GpuFamily& m : kGpuFamilies) {
    x.family(m.name, m.type, m.help);
    for (size_t i = 0; i < f.gpus.size(); ++i) m.emit(x, m.name, gpu_label_sets[i], f.gpus[i], f);
  }
  for (const PodFamily& m : kPodFamilies) {
    x.family(m.name, m.type, m.help);
    for (size_t i = 0; i < f.gpus.size(); ++i) {
      for (const PodFigures& p : f.gpus[i].pods) {
        if (p.live) m.emit(x, m.name, pod_labels(gpu_label_sets[i], p), p);
      }
    }
  }
  for (const ProcessFamily& m : kProcessFamilies) {
    x.family(m.name, "gauge", m.help);
    for (size_t i = 0; i < f.gpus.size(); ++i) {
      for (const PodFigures& p : f.gpus[i].pods) {
        auto procs = f.gpus[i].processes.find(p.key);
        if (!p.live || procs == f.gpus[i].processes.end()) continue;
        const std::string pod = pod_labels(gpu_label_sets[i], p);
        for (const ProcessFigures& proc : procs->second) {
          const std::optional<uint64_t> v = m.value(proc);
          if (!v) continue;
          x.sample(m.name,
                   join({pod, label("container", proc.container),
                         label("pid", std::to_string(proc.pid))}),
                   count(*v));
        }
      }
    }
  }
  for (const NodeFamily& m : kNodeFamilies) {
    x.family(m.name, m.type, m.help);
    m.emit(x, m.name, f);
  }
  return x.take();
}

}  // namespace quanta::arbiter
