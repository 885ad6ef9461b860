// Everything a finished `quanta-trace session` reports from: the switch model, who each
// process is, what was found and attached, and the driver statistics per process. The
// outputs (terminal, JSON, Perfetto, SVG) read it; none of them touch BPF or /proc.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "bpf/histogram.h"
#include "bpf/switch_model.h"

namespace quanta::bpf {

// One synchronize (or completing query) call a process made on libcuda.so.1.
struct SyncSpan {
  uint32_t tid = 0;
  uint64_t entry_ns = 0;
  uint64_t return_ns = 0;
  uint64_t oldest_launch_ns = 0;  // the oldest submission it completed; 0: none
  uint64_t completed = 0;         // submissions it completed
  bool query = false;             // cuEventQuery/cuStreamQuery that found the work done
};

struct ProcessView {
  uint32_t pid = 0;
  std::string comm;
  std::string pod;
  std::string pod_source;      // arbiter | kubernetes | cgroup | environment | process
  bool managed = false;        // runs with libquanta.so
  std::set<std::string> gpus;  // UUIDs: the arbiter's for managed processes, NVML's otherwise
  uint64_t launches = 0;
  uint64_t syncs = 0;
  Histogram launch_to_completion;
  Histogram sync_wait;
  std::vector<SyncSpan> spans;
};

struct GpuView {
  GpuKey key;
  std::string uuid;   // empty when no arbiter status named it
  std::string scope;  // the arbiter's scope
  // The arbiter's own counters over the session (status at the start and at the end).
  std::optional<uint64_t> arbiter_grants;
  std::optional<uint64_t> arbiter_switches;
};

struct FoundFile {
  std::string kind;  // arbiter | shim | driver
  std::string path;  // as the processes see it
  std::string open_path;
  std::set<uint32_t> pids;
};

struct AttachRecord {
  std::string probe;  // "usdt quanta:grant", "uprobe cuLaunchKernel", "tracepoint sched_switch"
  std::string file;   // empty for tracepoints
  int links = 0;
  std::string error;  // empty when attached
};

struct ArbiterView {
  uint32_t pid = 0;
  std::string scope;
  std::string binary;
  std::string admin_socket;
  std::string status_error;  // why status could not be read; empty when it was
};

struct SessionView {
  double duration_s = 0;
  std::string tracepoints;  // tp_btf | raw_tp
  Model model;
  std::map<GpuKey, GpuView> gpus;
  std::map<uint32_t, ProcessView> processes;
  std::vector<ArbiterView> arbiters;
  std::vector<FoundFile> files;
  std::vector<AttachRecord> attached;
  std::vector<std::string> notes;
  std::map<std::string, uint64_t> probes_fired;
  uint64_t events = 0;
  uint64_t events_lost = 0;
  uint64_t procs_dropped = 0;
  std::string gpu_filter;  // UUID; empty: all
  std::string pod_filter;  // pod key; empty: all
  std::string perfetto_file;
  std::string svg_file;

  std::string pod_of(uint32_t tgid) const;
  bool pod_selected(uint32_t tgid) const;
  bool gpu_selected(const GpuKey& key) const;
  bool process_selected(const ProcessView& process) const;
  // "GPU 0 GPU-5175…" (with the arbiter's pid when several arbiters were traced).
  std::string gpu_label(const GpuKey& key) const;
  // GPUs to report, in order: selected and with anything traced on them.
  std::vector<GpuKey> reported_gpus() const;
};

}  // namespace quanta::bpf
