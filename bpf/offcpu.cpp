// quanta-trace offcpu: run-queue latency and off-CPU time of the given processes, from
// offcpu.bpf.c, printed as histograms per process (text, JSON or Prometheus).
#include "bpf/offcpu.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "bpf/histogram.h"
#include "bpf/libbpf_handles.h"
#include "bpf/tools.h"
#include "bpf/trace_run.h"
#include "offcpu.skel.h"

namespace quanta::bpf {
namespace {

struct SkeletonDeleter {
  void operator()(offcpu_bpf* skel) const { offcpu_bpf__destroy(skel); }
};

struct ProcessHists {
  Histogram runq;
  Histogram off;
};

std::string process_name(pid_t pid) {
  std::ifstream comm("/proc/" + std::to_string(pid) + "/comm");
  std::string name;
  std::getline(comm, name);
  return name;
}

std::map<uint32_t, ProcessHists> read_hists(offcpu_bpf* skel) {
  std::map<uint32_t, ProcessHists> result;
  for_each_entry<quanta_offcpu_key, quanta_hist>(
      bpf_map__fd(skel->maps.hists), [&result](const quanta_offcpu_key& key, const quanta_hist& raw) {
        auto& entry = result[key.tgid];
        (key.kind == QUANTA_OFFCPU_RUNQ ? entry.runq : entry.off).add(raw);
      });
  return result;
}

}  // namespace

int run_offcpu(const OffcpuOptions& options) {
  if (options.pids.empty()) throw TraceError("offcpu needs at least one --pid");
  if (options.pids.size() > QUANTA_OFFCPU_MAX_TGIDS) {
    throw TraceError("offcpu traces at most " + std::to_string(QUANTA_OFFCPU_MAX_TGIDS) +
                     " processes; got " + std::to_string(options.pids.size()));
  }
  require_processes(options.pids);

  std::unique_ptr<offcpu_bpf, SkeletonDeleter> skel(offcpu_bpf__open());
  if (!skel) throw TraceError("cannot open the offcpu BPF object: " + errno_text(errno));
  skel->rodata->targ_filter = true;
  // One set of scheduler programs is loaded: BTF tracepoints, or raw ones without them.
  const bool btf = !options.raw_tracepoints && btf_tracepoint_usable("sched_switch");
  bpf_program__set_autoload(skel->progs.handle_wakeup, btf);
  bpf_program__set_autoload(skel->progs.handle_wakeup_new, btf);
  bpf_program__set_autoload(skel->progs.handle_switch, btf);
  bpf_program__set_autoload(skel->progs.handle_wakeup_raw, !btf);
  bpf_program__set_autoload(skel->progs.handle_wakeup_new_raw, !btf);
  bpf_program__set_autoload(skel->progs.handle_switch_raw, !btf);
  if (int err = offcpu_bpf__load(skel.get()); err != 0) {
    throw TraceError("cannot load the offcpu BPF programs (root and a BTF kernel >= 5.5 needed): " +
                     errno_text(err));
  }
  const int tgids_fd = bpf_map__fd(skel->maps.tgids);
  for (pid_t pid : options.pids) {
    const uint32_t tgid = static_cast<uint32_t>(pid);
    const uint8_t yes = 1;
    if (bpf_map_update_elem(tgids_fd, &tgid, &yes, BPF_ANY) != 0) {
      throw TraceError("cannot add pid " + std::to_string(pid) +
                       " to the filter: " + errno_text(errno));
    }
  }
  struct {
    bpf_program* prog;
    bpf_link** link;
    const char* what;
  } attachments[] = {
      {skel->progs.handle_wakeup, &skel->links.handle_wakeup, "tp_btf/sched_wakeup"},
      {skel->progs.handle_wakeup_new, &skel->links.handle_wakeup_new, "tp_btf/sched_wakeup_new"},
      {skel->progs.handle_switch, &skel->links.handle_switch, "tp_btf/sched_switch"},
      {skel->progs.handle_wakeup_raw, &skel->links.handle_wakeup_raw, "raw_tp/sched_wakeup"},
      {skel->progs.handle_wakeup_new_raw, &skel->links.handle_wakeup_new_raw,
       "raw_tp/sched_wakeup_new"},
      {skel->progs.handle_switch_raw, &skel->links.handle_switch_raw, "raw_tp/sched_switch"},
  };
  for (auto& a : attachments) {
    if (!bpf_program__autoload(a.prog)) continue;
    *a.link = bpf_program__attach(a.prog);
    if (!*a.link)
      throw TraceError(std::string("cannot attach ") + a.what + ": " + errno_text(errno));
  }

  std::string pid_list;
  for (pid_t pid : options.pids) pid_list += (pid_list.empty() ? "" : ",") + std::to_string(pid);
  spdlog::info("Tracing run-queue latency and off-CPU time of pid {} for {} s (Ctrl-C to end)",
               pid_list, options.duration_s);
  const double elapsed = run_bounded(
      std::chrono::duration<double>(options.duration_s), options.pids,
      [](int timeout_ms) { std::this_thread::sleep_for(std::chrono::milliseconds(timeout_ms)); });
  offcpu_bpf__detach(skel.get());
  const auto hists = read_hists(skel.get());

  if (options.json) {
    nlohmann::json processes = nlohmann::json::array();
    for (const auto& [tgid, h] : hists) {
      processes.push_back({{"tgid", tgid},
                           {"comm", process_name(static_cast<pid_t>(tgid))},
                           {"runq_latency", h.runq.to_json()},
                           {"off_cpu", h.off.to_json()}});
    }
    nlohmann::json report = {{"tool", "offcpu"},
                             {"duration_s", elapsed},
                             {"tracepoints", btf ? "tp_btf" : "raw_tp"},
                             {"pids", options.pids},
                             {"processes", std::move(processes)}};
    std::cout << report.dump(2) << std::endl;
  } else {
    if (hists.empty()) std::cout << "no scheduler events for the traced processes\n";
    for (const auto& [tgid, h] : hists) {
      std::cout << "\npid " << tgid << " (" << process_name(static_cast<pid_t>(tgid)) << ")\n";
      h.runq.print(std::cout, "run-queue latency (wakeup -> on CPU)");
      h.off.print(std::cout, "off-CPU time (switched out -> switched in)");
    }
  }

  if (!options.prometheus_file.empty()) {
    std::ofstream out(options.prometheus_file);
    if (!out) throw TraceError("cannot write " + options.prometheus_file);
    const char* runq = "quanta_offcpu_runqueue_latency_seconds";
    const char* off = "quanta_offcpu_off_cpu_seconds";
    write_prometheus_header(out, runq, "Time from wakeup (or preemption) to running on a CPU.");
    for (const auto& [tgid, h] : hists) {
      h.runq.write_prometheus(out, runq, "pid=\"" + std::to_string(tgid) + "\"");
    }
    write_prometheus_header(out, off, "Time from leaving a CPU to running on one again.");
    for (const auto& [tgid, h] : hists) {
      h.off.write_prometheus(out, off, "pid=\"" + std::to_string(tgid) + "\"");
    }
    if (!out.flush()) throw TraceError("cannot write " + options.prometheus_file);
  }
  return 0;
}

}  // namespace quanta::bpf
