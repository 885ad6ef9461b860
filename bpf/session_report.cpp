// Text and JSON reports of a session: per GPU the handoff histogram and its parts, gate
// waits, drains, revoke-to-release, per pod the same figures and where its time went, per
// process the driver's launch-to-completion and sync waits, and the two instruments side
// by side.
#include "bpf/session_report.h"

#include <algorithm>
#include <cstdio>
#include <ostream>
#include <string>
#include <vector>

namespace quanta::bpf {
namespace {

using nlohmann::json;

std::string pct(double part, double whole) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%.0f%%", whole > 0 ? 100.0 * part / whole : 0.0);
  return buf;
}

std::string secs(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, s >= 10 ? "%.1fs" : "%.2fs", s);
  return buf;
}

std::string p50_p99(const Histogram& h) {
  if (h.empty()) return "-";
  return format_duration_ns(h.percentile_ns(0.5)) + " / " +
         format_duration_ns(h.percentile_ns(0.99));
}

// The pods active on one GPU, in a stable order.
std::vector<std::string> pods_on(const SessionView& view, const GpuModel& gpu) {
  std::set<std::string> pods;
  for (const auto& hold : gpu.holds) pods.insert(view.pod_of(hold.tgid));
  for (const auto& wait : gpu.waits) pods.insert(view.pod_of(wait.tgid));
  std::vector<std::string> out;
  for (const auto& pod : pods) {
    if (view.pod_filter.empty() || pod == view.pod_filter) out.push_back(pod);
  }
  return out;
}

std::function<bool(uint32_t)> in_pod(const SessionView& view, const std::string& pod) {
  return [&view, pod](uint32_t tgid) { return view.pod_of(tgid) == pod; };
}

std::function<bool(uint32_t)> selected(const SessionView& view) {
  return [&view](uint32_t tgid) { return view.pod_selected(tgid); };
}

json stats_json(const GpuStats& s) {
  json kinds = json::object();
  for (const auto& [kind, n] : s.by_kind) kinds[switch_kind_name(kind)] = n;
  return {{"switches", s.switches},
          {"switches_complete", s.complete},
          {"switches_with_wakeup", s.sched_seen},
          {"switch_kinds", kinds},
          {"handoff", s.handoff.to_json()},
          {"handoff_self_reported", s.handoff_own.to_json()},
          {"arbiter", s.arbiter.to_json()},
          {"arbiter_notice", s.notice.to_json()},
          {"arbiter_decide", s.decide.to_json()},
          {"wakeup", s.wakeup.to_json()},
          {"run_queue", s.run_queue.to_json()},
          {"gate_exit", s.gate_exit.to_json()},
          {"gate_wait", s.gate_wait.to_json()},
          {"drain", s.drain.to_json()},
          {"revoke_to_release", s.revoke_to_release.to_json()}};
}

// From the first grant or wait on the GPU to the end of its last hold: the part of the
// session the GPU was in use, which percentages of time are taken of.
std::pair<uint64_t, uint64_t> active_span(const SessionView& view, const GpuModel& gpu) {
  uint64_t from = view.model.end_ns, to = view.model.start_ns;
  for (const auto& hold : gpu.holds) {
    from = std::min(from, hold.grant_ns);
    to = std::max(to, hold.end_ns);
  }
  for (const auto& wait : gpu.waits) {
    from = std::min(from, wait.begin_ns);
    to = std::max(to, wait.end_ns);
  }
  from = std::max(from, view.model.start_ns);  // a wait in progress at the start began before
  to = std::min(to, view.model.end_ns);
  if (from >= to) return {view.model.start_ns, view.model.end_ns};
  return {from, to};
}

Agreement agreement_of(const SessionView& view) {
  return agreement(view.model, [&view](const GpuKey& key) { return view.gpu_selected(key); });
}

void print_gpu(const SessionView& view, const GpuKey& key, std::ostream& out) {
  const GpuModel& gpu = view.model.gpus.at(key);
  const GpuView& info = view.gpus.at(key);
  const GpuStats all = gpu_stats(gpu, selected(view));
  out << "\n" << view.gpu_label(key) << ": " << all.switches << " switches";
  if (info.arbiter_switches && view.pod_filter.empty())
    out << " (the arbiter counted " << *info.arbiter_switches << ")";
  out << ", " << gpu.grants << " grants, " << gpu.revokes.size() << " revokes";
  if (gpu.pass_overs) out << ", " << gpu.pass_overs << " holders passed over";
  out << "\n";
  if (gpu.grants == 0 && all.gate_wait.empty()) {
    out << "  idle: no grant during the session\n";
    return;
  }
  if (all.switches == 0) {
    out << "  no switch between tenants seen\n";
  } else {
    all.handoff.print(out, "handoff latency (release, or grant, -> next tenant's first launch)");
    out << "  its parts, p50 / p99:\n";
    out << "    arbiter       (release -> grant)          " << p50_p99(all.arbiter) << "\n";
    if (!all.notice.empty()) {
      out << "      notice      (release -> applied)        " << p50_p99(all.notice) << "\n";
      out << "      decide      (applied -> grant)          " << p50_p99(all.decide) << "\n";
    }
    out << "    wake-up       (grant -> waiter runnable)  " << p50_p99(all.wakeup) << "\n";
    out << "    run queue     (runnable -> on a CPU)      " << p50_p99(all.run_queue) << "\n";
    out << "    gate exit     (on a CPU -> launch)        " << p50_p99(all.gate_exit) << "\n";
    std::string kinds;
    for (const auto& [kind, n] : all.by_kind)
      kinds += (kinds.empty() ? "" : ", ") + std::to_string(n) + " " + switch_kind_name(kind);
    if (!kinds.empty()) out << "  switches by kind: " << kinds << "\n";
  }
  all.gate_wait.print(out, "gate wait (a launch blocked until its grant)");
  if (!all.drain.empty())
    all.drain.print(out, "drain (revoke seen -> in-flight work done, released)");
  if (!all.revoke_to_release.empty()) all.revoke_to_release.print(out, "revoke -> release");

  const std::vector<std::string> pods = pods_on(view, gpu);
  if (pods.empty()) return;
  char line[256];
  std::snprintf(line, sizeof line, "\n  %-24s %8s %21s %21s %12s %12s\n", "POD", "SWITCHES",
                "HANDOFF p50 / p99", "GATE WAIT p50 / p99", "DRAIN p50", "REV->REL p50");
  out << line;
  for (const auto& pod : pods) {
    const GpuStats s = gpu_stats(gpu, in_pod(view, pod));
    auto p50 = [](const Histogram& h) {
      return h.empty() ? std::string("-") : format_duration_ns(h.percentile_ns(0.5));
    };
    std::snprintf(line, sizeof line, "  %-24s %8llu %21s %21s %12s %12s\n", pod.c_str(),
                  static_cast<unsigned long long>(s.switches), p50_p99(s.handoff).c_str(),
                  p50_p99(s.gate_wait).c_str(), p50(s.drain).c_str(),
                  p50(s.revoke_to_release).c_str());
    out << line;
  }
  if (!view.pod_filter.empty()) {
    const GpuStats s = gpu_stats(gpu, in_pod(view, view.pod_filter));
    s.handoff.print(out, "handoff latency into " + view.pod_filter);
    s.gate_wait.print(out, "gate wait of " + view.pod_filter);
  }

  const auto [from_ns, to_ns] = active_span(view, gpu);
  const double session_s = static_cast<double>(to_ns - from_ns) / 1e9;
  const auto times =
      attribute(gpu, from_ns, to_ns, [&view](uint32_t tgid) { return view.pod_of(tgid); });
  out << "\n  Contention attribution, " << view.gpu_label(key) << "\n  (percentages of the "
      << secs(session_s)
      << " it was in use; waited on = who held the GPU while the pod waited for it)\n";
  std::snprintf(line, sizeof line, "  %-24s %13s %13s %13s  %s\n", "POD", "HELD", "WAITING",
                "DRAINING", "WAITED ON");
  out << line;
  for (const auto& pod : pods) {
    auto it = times.find(pod);
    if (it == times.end()) continue;
    const PodTime& t = it->second;
    std::vector<std::pair<double, std::string>> on;
    for (const auto& [holder, s] : t.waited_on) on.emplace_back(s, holder);
    std::sort(on.rbegin(), on.rend());
    std::string who;
    // Its own hold overlapping its wait: the next launch blocked while it drained.
    for (const auto& [s, holder] : on)
      who += (who.empty() ? "" : ", ") + (holder == pod ? std::string("its own drain") : holder) +
             " " + secs(s);
    if (t.waited_unheld_s > 0.0005)
      who += (who.empty() ? "" : ", ") + std::string("switching ") + secs(t.waited_unheld_s);
    auto cell = [&](double s) { return secs(s) + " " + pct(s, session_s); };
    std::snprintf(line, sizeof line, "  %-24s %13s %13s %13s  ", pod.c_str(),
                  cell(t.held_s).c_str(), cell(t.waiting_s).c_str(), secs(t.draining_s).c_str());
    out << line << (who.empty() ? "-" : who) << "\n";
  }
}

void print_processes(const SessionView& view, std::ostream& out) {
  std::vector<const ProcessView*> shown;
  for (const auto& [pid, p] : view.processes) {
    if (view.process_selected(p) && (p.launches || p.syncs)) shown.push_back(&p);
  }
  if (shown.empty()) return;
  out << "\nDriver calls (uprobes on libcuda.so.1; shim no = native time slicing, yes = under "
         "Quanta)\n";
  char line[320];
  std::snprintf(line, sizeof line, "  %-8s %-24s %-4s %-14s %9s %8s %21s %21s\n", "PID", "POD",
                "SHIM", "GPU", "LAUNCHES", "SYNCS", "LAUNCH->DONE p50/p99", "SYNC WAIT p50 / p99");
  out << line;
  for (const ProcessView* p : shown) {
    std::string gpu = p->gpus.empty() ? "?" : *p->gpus.begin();
    if (gpu.size() > 14) gpu = gpu.substr(0, 13) + "~";
    std::snprintf(line, sizeof line, "  %-8u %-24s %-4s %-14s %9llu %8llu %21s %21s\n", p->pid,
                  p->pod.c_str(), p->managed ? "yes" : "no", gpu.c_str(),
                  static_cast<unsigned long long>(p->launches),
                  static_cast<unsigned long long>(p->syncs),
                  p50_p99(p->launch_to_completion).c_str(), p50_p99(p->sync_wait).c_str());
    out << line;
  }
  if (shown.size() <= 6) {
    for (const ProcessView* p : shown) {
      if (p->launch_to_completion.empty()) continue;
      out << "\n";
      p->launch_to_completion.print(out, "launch to completion, pid " + std::to_string(p->pid) +
                                             " (" + p->pod +
                                             (p->managed ? ", with the shim" : ", native") + ")");
    }
  }
}

}  // namespace

void print_report(const SessionView& view, std::ostream& out) {
  out << "quanta-trace session: " << secs(view.duration_s) << ", scheduler tracepoints "
      << view.tracepoints << "\n";
  for (const auto& a : view.arbiters) {
    out << "  arbiter pid " << a.pid << (a.scope.empty() ? "" : ", scope " + a.scope)
        << (a.admin_socket.empty() ? "" : ", admin socket " + a.admin_socket)
        << (a.status_error.empty() ? "" : " (" + a.status_error + ")") << "\n";
  }
  for (const auto& f : view.files) {
    if (f.kind == "arbiter") continue;
    out << "  " << (f.kind == "shim" ? "libquanta.so " : "libcuda      ") << f.path << " ("
        << f.pids.size() << " process" << (f.pids.size() == 1 ? "" : "es") << ")\n";
  }
  int ok = 0, failed = 0;
  for (const auto& a : view.attached) (a.error.empty() ? ok : failed) += 1;
  out << "  " << ok << " probes attached"
      << (failed ? ", " + std::to_string(failed) + " not" : std::string()) << "; " << view.events
      << " events, " << view.events_lost << " lost\n";

  for (const GpuKey& key : view.reported_gpus()) print_gpu(view, key, out);
  print_processes(view, out);

  const Agreement a = agreement_of(view);
  if (a.switches) {
    char line[256];
    std::snprintf(line, sizeof line,
                  "\nTwo instruments, same %llu switches: handoff p50 %s by the kernel's clock at "
                  "each probe, %s by "
                  "the shim's and arbiter's own clocks (%.1f%% apart)\n",
                  static_cast<unsigned long long>(a.switches),
                  format_duration_ns(a.ebpf_p50_ns).c_str(),
                  format_duration_ns(a.own_p50_ns).c_str(), 100 * a.difference);
    out << line;
  }
  if (!view.perfetto_file.empty())
    out << "Perfetto trace: " << view.perfetto_file << " (open it at https://ui.perfetto.dev)\n";
  if (!view.svg_file.empty()) out << "SVG timeline: " << view.svg_file << "\n";
  for (const auto& note : view.notes) out << "note: " << note << "\n";
}

namespace {

// One pod on one GPU: its stats, its processes, and where its time went.
json pod_json(const SessionView& view, const GpuModel& gpu, const std::string& pod,
              const std::map<std::string, PodTime>& times) {
  json p = stats_json(gpu_stats(gpu, in_pod(view, pod)));
  p["pod"] = pod;
  std::set<uint32_t> pids;
  for (const auto& hold : gpu.holds) {
    if (view.pod_of(hold.tgid) == pod && hold.tgid) pids.insert(hold.tgid);
  }
  for (const auto& wait : gpu.waits) {
    if (view.pod_of(wait.tgid) == pod) pids.insert(wait.tgid);
  }
  p["pids"] = pids;
  if (auto t = times.find(pod); t != times.end()) {
    json on = json::object();
    for (const auto& [holder, s] : t->second.waited_on) on[holder] = s;
    p["time"] = {{"held_s", t->second.held_s},
                 {"waiting_s", t->second.waiting_s},
                 {"draining_s", t->second.draining_s},
                 {"waited_on_s", on},
                 {"waited_while_switching_s", t->second.waited_unheld_s}};
  }
  return p;
}

// One GPU: its handoff stats, its counts, what its arbiter counted, and its pods.
json gpu_json(const SessionView& view, const GpuKey& key) {
  const GpuModel& gpu = view.model.gpus.at(key);
  const GpuView& info = view.gpus.at(key);
  json entry = stats_json(gpu_stats(gpu, selected(view)));
  entry["arbiter_pid"] = key.arbiter;
  entry["scope"] = info.scope;
  entry["index"] = key.index;
  entry["uuid"] = info.uuid;
  entry["grants"] = gpu.grants;
  entry["revokes"] = gpu.revokes.size();
  entry["pass_overs"] = gpu.pass_overs;
  entry["holds"] = gpu.holds.size();
  if (info.arbiter_switches) {
    entry["arbiter_counted"] = {{"grants", *info.arbiter_grants},
                                {"switches", *info.arbiter_switches}};
  }
  const auto [from_ns, to_ns] = active_span(view, gpu);
  entry["in_use_s"] = static_cast<double>(to_ns - from_ns) / 1e9;
  const auto times =
      attribute(gpu, from_ns, to_ns, [&view](uint32_t tgid) { return view.pod_of(tgid); });
  json pods = json::array();
  for (const auto& pod : pods_on(view, gpu)) pods.push_back(pod_json(view, gpu, pod, times));
  entry["pods"] = std::move(pods);
  return entry;
}

}  // namespace

json report_json(const SessionView& view) {
  json arbiters = json::array();
  for (const auto& a : view.arbiters) {
    arbiters.push_back({{"pid", a.pid},
                        {"scope", a.scope},
                        {"binary", a.binary},
                        {"admin_socket", a.admin_socket},
                        {"status_error", a.status_error}});
  }
  json files = json::array();
  for (const auto& f : view.files) {
    files.push_back(
        {{"kind", f.kind}, {"path", f.path}, {"opened_as", f.open_path}, {"pids", f.pids}});
  }
  json attached = json::array();
  for (const auto& a : view.attached) {
    json entry = {{"probe", a.probe}, {"file", a.file}, {"attached", a.error.empty()}};
    if (!a.error.empty()) entry["error"] = a.error;
    attached.push_back(entry);
  }

  json gpus = json::array();
  for (const GpuKey& key : view.reported_gpus()) gpus.push_back(gpu_json(view, key));

  json processes = json::array();
  for (const auto& [pid, p] : view.processes) {
    if (!view.process_selected(p)) continue;
    processes.push_back({{"pid", p.pid},
                         {"comm", p.comm},
                         {"pod", p.pod},
                         {"pod_source", p.pod_source},
                         {"managed", p.managed},
                         {"gpus", p.gpus},
                         {"launches", p.launches},
                         {"syncs", p.syncs},
                         {"launch_to_completion", p.launch_to_completion.to_json()},
                         {"sync_wait", p.sync_wait.to_json()}});
  }
  const Agreement a = agreement_of(view);
  json report = {{"tool", "session"},
                 {"duration_s", view.duration_s},
                 {"tracepoints", view.tracepoints},
                 {"filters", {{"gpu", view.gpu_filter}, {"pod", view.pod_filter}}},
                 {"arbiters", arbiters},
                 {"found", files},
                 {"attached", attached},
                 {"probes_fired", view.probes_fired},
                 {"events", {{"received", view.events}, {"lost", view.events_lost}}},
                 {"gpus", gpus},
                 {"processes", processes},
                 {"agreement",
                  {{"switches", a.switches},
                   {"ebpf_p50_ns", a.ebpf_p50_ns},
                   {"self_reported_p50_ns", a.own_p50_ns},
                   {"difference", a.difference}}},
                 {"notes", view.notes}};
  if (!view.perfetto_file.empty()) report["perfetto"] = view.perfetto_file;
  if (!view.svg_file.empty()) report["svg"] = view.svg_file;
  return report;
}

}  // namespace quanta::bpf
