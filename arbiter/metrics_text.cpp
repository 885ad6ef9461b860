// Rendering: one family at a time (Prometheus wants a family's series together), over every
// GPU, pod and process of the snapshot. Labels are built once per GPU and per pod.
#include "arbiter/metrics_text.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

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

std::string render_prometheus(const NodeFigures& f) {
  Exposition x;
  std::vector<std::string> gl;
  for (const GpuFigures& g : f.gpus) gl.push_back(gpu_labels(g));
  auto per_gpu = [&](const char* name, const char* type, const char* help, auto value) {
    x.family(name, type, help);
    for (size_t i = 0; i < f.gpus.size(); ++i) x.sample(name, gl[i], value(f.gpus[i]));
  };
  // Per pod: `emit(exposition, labels, pod)` writes that pod's series.
  auto per_pod = [&](const char* name, const char* type, const char* help, auto emit) {
    x.family(name, type, help);
    for (size_t i = 0; i < f.gpus.size(); ++i) {
      for (const PodFigures& p : f.gpus[i].pods) {
        if (p.live) emit(pod_labels(gl[i], p), p);
      }
    }
  };
  auto ratio = [](double v) { return number(std::clamp(v, 0.0, 1.0)); };

  // --- per GPU ---
  x.family("quanta_gpu_info", "gauge", "1 per managed GPU or MIG instance; carries Hostname");
  for (size_t i = 0; i < f.gpus.size(); ++i) {
    x.sample("quanta_gpu_info", join({gl[i], label("Hostname", f.hostname)}), "1");
  }
  per_gpu("quanta_gpu_busy_ratio", "gauge",
          "Fraction of the stats window the GPU ran managed tenants' work",
          [&](const GpuFigures& g) { return ratio(g.busy_ratio); });
  per_gpu("quanta_gpu_held_ratio", "gauge",
          "Fraction of the stats window some tenant held the grant (busy or not)",
          [&](const GpuFigures& g) { return ratio(g.held_ratio); });
  x.family("quanta_gpu_utilization_source_info", "gauge",
           "1; source says where per-pod utilisation comes from: driver (NVML per process) or "
           "holds (the hold timeline)");
  for (size_t i = 0; i < f.gpus.size(); ++i) {
    x.sample("quanta_gpu_utilization_source_info",
             join({gl[i], label("source", f.gpus[i].utilization_source)}), "1");
  }
  per_gpu("quanta_gpu_switches_total", "counter",
          "Grants that moved the GPU from one tenant to another",
          [&](const GpuFigures& g) { return count(g.switches); });
  x.family("quanta_gpu_handoff_seconds", "histogram",
           "From the arbiter seeing one tenant's release to its grant to the next waiting tenant");
  for (size_t i = 0; i < f.gpus.size(); ++i) {
    x.histogram("quanta_gpu_handoff_seconds", gl[i], f.gpus[i].handoff);
  }
  per_gpu("quanta_gpu_waiting_tenants", "gauge", "Tenants that want the GPU and do not hold it",
          [&](const GpuFigures& g) { return count(g.waiting); });
  per_gpu("quanta_gpu_memory_total_bytes", "gauge", "Device memory of the GPU or MIG instance",
          [&](const GpuFigures& g) { return count(g.capacity.memory_total); });
  per_gpu("quanta_gpu_memory_used_bytes", "gauge", "Sum of the pods' ledgers on this GPU",
          [&](const GpuFigures& g) { return count(g.memory_used); });
  per_gpu("quanta_gpu_memory_caps_bytes", "gauge",
          "Sum of the memory caps of the pods attached to this GPU",
          [&](const GpuFigures& g) { return count(g.capacity.memory_caps); });
  per_gpu("quanta_gpu_memory_unpromised_bytes", "gauge",
          "Memory not promised: total minus caps, uncapped pods' use and unmanaged processes' use",
          [&](const GpuFigures& g) { return count(g.capacity.memory_unpromised); });
  per_gpu("quanta_gpu_min_share_promised_ratio", "gauge",
          "Sum of the guaranteed minimum shares promised to pods that may use this GPU",
          [&](const GpuFigures& g) { return ratio(g.capacity.promised_min_share); });
  per_gpu("quanta_gpu_new_pod_share_ratio", "gauge",
          "Share of GPU time a new weight-1 batch pod would receive now",
          [&](const GpuFigures& g) { return ratio(g.capacity.new_pod_share); });
  x.family("quanta_gpu_pods_fit", "gauge",
           "Pods of the probe size (share, memory) that still fit on this GPU");
  for (size_t i = 0; i < f.gpus.size(); ++i) {
    for (size_t k = 0; k < f.probes.size() && k < f.gpus[i].capacity.fits.size(); ++k) {
      x.sample("quanta_gpu_pods_fit", join({gl[i], probe_labels(f.probes[k])}),
               count(f.gpus[i].capacity.fits[k]));
    }
  }
  per_gpu("quanta_gpu_draining", "gauge", "1 while quantactl drain holds new grants back",
          [&](const GpuFigures& g) { return count(g.draining ? 1 : 0); });
  per_gpu("quanta_gpu_unmanaged_processes", "gauge",
          "Processes NVML lists on the GPU that Quanta does not manage",
          [&](const GpuFigures& g) { return count(g.unmanaged_processes); });

  // --- per pod ---
  per_pod("quanta_pod_info", "gauge", "1 per pod on a GPU; carries priority",
          [&](const std::string& l, const PodFigures& p) {
            x.sample("quanta_pod_info",
                     join({l, label("priority", common::priority_name(p.policy.priority))}), "1");
          });
  per_pod("quanta_pod_weight", "gauge", "The pod's weight",
          [&](const std::string& l, const PodFigures& p) {
            x.sample("quanta_pod_weight", l, count(p.policy.weight));
          });
  per_pod("quanta_pod_min_share_ratio", "gauge", "Guaranteed minimum share (0 = none)",
          [&](const std::string& l, const PodFigures& p) {
            x.sample("quanta_pod_min_share_ratio", l, ratio(p.min_share));
          });
  per_pod("quanta_pod_max_share_ratio", "gauge", "Share ceiling (1 = none)",
          [&](const std::string& l, const PodFigures& p) {
            x.sample("quanta_pod_max_share_ratio", l,
                     ratio(p.policy.max_share_ppm / static_cast<double>(common::kShareScale)));
          });
  per_pod("quanta_pod_target_share_ratio", "gauge",
          "Share the policy gives it among the tenants active now",
          [&](const std::string& l, const PodFigures& p) {
            x.sample("quanta_pod_target_share_ratio", l, ratio(p.target_share));
          });
  per_pod("quanta_pod_achieved_share_ratio", "gauge",
          "Share of GPU time it held over the stats window",
          [&](const std::string& l, const PodFigures& p) {
            x.sample("quanta_pod_achieved_share_ratio", l, ratio(p.achieved_share));
          });
  per_pod("quanta_pod_utilization_ratio", "gauge",
          "Fraction of the stats window the GPU was busy with this pod's work",
          [&](const std::string& l, const PodFigures& p) {
            x.sample("quanta_pod_utilization_ratio", l, ratio(p.utilization));
          });
  per_pod("quanta_pod_gpu_seconds_total", "counter",
          "GPU time granted to it (grant to release, overrun included)",
          [&](const std::string& l, const PodFigures& p) {
            x.sample("quanta_pod_gpu_seconds_total", l, seconds(p.totals.held_ns));
          });
  per_pod("quanta_pod_busy_seconds_total", "counter",
          "Device time its work ran, as the driver reports it per process (see "
          "quanta_gpu_utilization_source_info)",
          [&](const std::string& l, const PodFigures& p) {
            x.sample("quanta_pod_busy_seconds_total", l, seconds(p.totals.busy_ns));
          });
  per_pod("quanta_pod_time_seconds_total", "counter",
          "Its time on the GPU by state: running, waiting, draining, idle",
          [&](const std::string& l, const PodFigures& p) {
            for (size_t k = 0; k < kPhaseCount; ++k) {
              x.sample("quanta_pod_time_seconds_total",
                       join({l, label("state", phase_name(static_cast<Phase>(k)))}),
                       seconds(p.totals.phase_ns[k]));
            }
          });
  per_pod("quanta_pod_waited_behind_seconds_total", "counter",
          "Time it waited while holder_namespace/holder_pod held the GPU (holder_pod=\"(none)\": "
          "nobody held it)",
          [&](const std::string& l, const PodFigures& p) {
            for (const auto& [holder, ns] : p.waited_behind) {
              std::pair<std::string, std::string> h{"", "(none)"};
              if (!holder.empty()) h = split_pod_key(holder);
              x.sample("quanta_pod_waited_behind_seconds_total",
                       join({l, label("holder_namespace", h.first), label("holder_pod", h.second)}),
                       seconds(ns));
            }
          });
  per_pod("quanta_pod_wait_seconds", "histogram", "From wanting the GPU to its grant",
          [&](const std::string& l, const PodFigures& p) {
            x.histogram("quanta_pod_wait_seconds", l, p.wait);
          });
  per_pod("quanta_pod_wait_budget_seconds", "gauge",
          "The longest wait its priority class is promised on this GPU now (none for best-effort)",
          [&](const std::string& l, const PodFigures& p) {
            if (p.wait_budget_s)
              x.sample("quanta_pod_wait_budget_seconds", l, number(*p.wait_budget_s));
          });
  per_pod("quanta_pod_drain_seconds", "histogram",
          "From a revoke, or the end of a quantum its holder ends itself, to its release",
          [&](const std::string& l, const PodFigures& p) {
            x.histogram("quanta_pod_drain_seconds", l, p.drain);
          });
  per_pod("quanta_pod_grants_total", "counter", "Quanta granted",
          [&](const std::string& l, const PodFigures& p) {
            x.sample("quanta_pod_grants_total", l, count(p.totals.grants));
          });
  per_pod("quanta_pod_revoke_timeouts_total", "counter",
          "Times it was passed over for not releasing within revoke_timeout",
          [&](const std::string& l, const PodFigures& p) {
            x.sample("quanta_pod_revoke_timeouts_total", l, count(p.totals.revoke_timeouts));
          });
  per_pod("quanta_pod_tenants", "gauge", "Its processes on this GPU by tenant state",
          [&](const std::string& l, const PodFigures& p) {
            for (size_t k = 0; k < p.tenants_by_state.size(); ++k) {
              x.sample("quanta_pod_tenants", join({l, label("state", kTenantStates[k])}),
                       count(p.tenants_by_state[k]));
            }
          });
  per_pod("quanta_pod_memory_used_bytes", "gauge",
          "Its ledger: bytes its processes hold on this GPU",
          [&](const std::string& l, const PodFigures& p) {
            x.sample("quanta_pod_memory_used_bytes", l, count(p.memory_used));
          });
  per_pod("quanta_pod_memory_limit_bytes", "gauge", "Its memory cap on this GPU (absent: none)",
          [&](const std::string& l, const PodFigures& p) {
            if (p.policy.memory_limit != 0)
              x.sample("quanta_pod_memory_limit_bytes", l, count(p.policy.memory_limit));
          });
  per_pod("quanta_pod_alloc_denied_total", "counter", "Allocations refused at its cap",
          [&](const std::string& l, const PodFigures& p) {
            x.sample("quanta_pod_alloc_denied_total", l, count(p.alloc_denied));
          });

  // --- per process ---
  auto per_process = [&](const char* name, const char* help, auto value) {
    x.family(name, "gauge", help);
    for (size_t i = 0; i < f.gpus.size(); ++i) {
      for (const PodFigures& p : f.gpus[i].pods) {
        auto procs = f.gpus[i].processes.find(p.key);
        if (!p.live || procs == f.gpus[i].processes.end()) continue;
        const std::string pl = pod_labels(gl[i], p);
        for (const ProcessFigures& proc : procs->second) {
          const auto v = value(proc);
          if (!v) continue;
          x.sample(name,
                   join({pl, label("container", proc.container),
                         label("pid", std::to_string(proc.pid))}),
                   count(*v));
        }
      }
    }
  };
  per_process("quanta_process_memory_used_bytes",
              "Bytes the process holds on the GPU (Quanta's ledger)",
              [](const ProcessFigures& p) { return std::optional<uint64_t>(p.memory_used); });
  per_process("quanta_process_nvml_memory_used_bytes",
              "What NVML reports the process holding on the GPU, where NVML lists it",
              [](const ProcessFigures& p) { return p.nvml_memory; });

  // --- per node ---
  x.family("quanta_node_pods_fit", "gauge",
           "Pods of the probe size (share, memory) that fit on the node's GPUs together");
  for (size_t k = 0; k < f.probes.size() && k < f.node_fits.size(); ++k) {
    x.sample("quanta_node_pods_fit", probe_labels(f.probes[k]), count(f.node_fits[k]));
  }
  x.family("quanta_arbiter_info", "gauge", "1; carries version and scope");
  x.sample("quanta_arbiter_info", join({label("version", f.version), label("scope", f.scope)}),
           "1");
  x.family("quanta_arbiter_generation", "gauge", "Bumped at every arbiter start");
  x.sample("quanta_arbiter_generation", "", count(f.generation));
  x.family("quanta_arbiter_start_time_seconds", "gauge", "Unix time the arbiter started");
  char start[32];
  std::snprintf(start, sizeof start, "%.3f", f.start_time_s);
  x.sample("quanta_arbiter_start_time_seconds", "", start);
  x.family("quanta_arbiter_admissions_refused_total", "counter",
           "Processes refused at the tenant socket, by reason");
  // Every reason from the start (at 0), so rate() works before the first refusal.
  for (const char* reason : kRefusalReasons) {
    auto it = f.refusals.find(reason);
    x.sample("quanta_arbiter_admissions_refused_total", label("reason", reason),
             count(it == f.refusals.end() ? 0 : it->second));
  }
  x.family("quanta_arbiter_tenant_connections", "gauge", "Open tenant connections");
  x.sample("quanta_arbiter_tenant_connections", "", count(f.tenant_connections));
  return x.take();
}

}  // namespace quanta::arbiter
