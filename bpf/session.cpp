// quanta-trace session: finds what to trace on the node by itself (node_scan.h), loads
// session.bpf.c (open -> read-only config -> load -> attach), attaches the scheduler
// tracepoints, Quanta's USDT probes in every arbiter and libquanta.so, and uprobes in
// every libcuda.so.1, keeps looking for new ones while it runs, then hands a SessionView
// to the outputs (session_report.h, perfetto.h, svg_timeline.h).
#include "bpf/session.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <ctime>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "bpf/arbiter_client.h"
#include "bpf/elf_symbols.h"
#include "bpf/libbpf_handles.h"
#include "bpf/node_scan.h"
#include "bpf/nvml_processes.h"
#include "bpf/perfetto.h"
#include "bpf/pod_names.h"
#include "bpf/session_report.h"
#include "bpf/session_view.h"
#include "bpf/svg_timeline.h"
#include "bpf/tools.h"
#include "bpf/trace_run.h"
#include "common/pod_key.h"
#include "session.skel.h"

namespace quanta::bpf {
namespace {

struct SkeletonDeleter {
  void operator()(session_bpf* skel) const { session_bpf__destroy(skel); }
};

uint64_t monotonic_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

const char* const kShimProbes[] = {"gate_wait_begin", "gate_wait_end", "drain_begin", "release"};
const char* const kArbiterProbes[] = {"grant", "revoke", "released", "pass_over", "slot_freed"};

const char* const kCounterNames[QUANTA_CNT_COUNT] = {
    "gate_wait_begin", "gate_wait_end", "drain_begin",  "release",      "grant",
    "revoke",          "released",      "pass_over",    "slot_freed",   "launch",
    "event_record",    "sync",          "sync_return",  "query_return", "sched_wakeup",
    "sched_switch",    "events_lost",   "procs_dropped"};

// What each libcuda.so.1 entry point means to the session. Submissions are the calls the
// shim gates (kernels, graphs, memsets, device-to-device copies), so launch-to-completion
// compares like for like with and without the shim.
enum class DriverRole { kLaunch, kRecord, kSyncAll, kSyncEvent, kQueryAll, kQueryEvent };
struct DriverEntry {
  const char* symbol;
  DriverRole role;
};
const DriverEntry kDriverEntries[] = {
    {"cuLaunchKernel", DriverRole::kLaunch},
    {"cuLaunchKernel_ptsz", DriverRole::kLaunch},
    {"cuLaunchKernelEx", DriverRole::kLaunch},
    {"cuLaunchKernelEx_ptsz", DriverRole::kLaunch},
    {"cuLaunchCooperativeKernel", DriverRole::kLaunch},
    {"cuLaunchCooperativeKernel_ptsz", DriverRole::kLaunch},
    {"cuLaunchCooperativeKernelMultiDevice", DriverRole::kLaunch},
    {"cuGraphLaunch", DriverRole::kLaunch},
    {"cuGraphLaunch_ptsz", DriverRole::kLaunch},
    {"cuMemsetD8_v2", DriverRole::kLaunch},
    {"cuMemsetD16_v2", DriverRole::kLaunch},
    {"cuMemsetD32_v2", DriverRole::kLaunch},
    {"cuMemsetD8Async", DriverRole::kLaunch},
    {"cuMemsetD16Async", DriverRole::kLaunch},
    {"cuMemsetD32Async", DriverRole::kLaunch},
    {"cuMemsetD2D8_v2", DriverRole::kLaunch},
    {"cuMemsetD2D16_v2", DriverRole::kLaunch},
    {"cuMemsetD2D32_v2", DriverRole::kLaunch},
    {"cuMemcpyDtoD_v2", DriverRole::kLaunch},
    {"cuMemcpyDtoDAsync_v2", DriverRole::kLaunch},
    {"cuEventRecord", DriverRole::kRecord},
    {"cuEventRecord_ptsz", DriverRole::kRecord},
    {"cuEventRecordWithFlags", DriverRole::kRecord},
    {"cuEventRecordWithFlags_ptsz", DriverRole::kRecord},
    {"cuCtxSynchronize", DriverRole::kSyncAll},
    {"cuStreamSynchronize", DriverRole::kSyncAll},
    {"cuStreamSynchronize_ptsz", DriverRole::kSyncAll},
    {"cuEventSynchronize", DriverRole::kSyncEvent},
    {"cuStreamQuery", DriverRole::kQueryAll},
    {"cuStreamQuery_ptsz", DriverRole::kQueryAll},
    {"cuEventQuery", DriverRole::kQueryEvent},
};

class Tracer {
 public:
  explicit Tracer(const SessionOptions& options) : options_(options) {}

  void start();
  void run();
  SessionView finish();

 private:
  struct Arbiter {
    ArbiterView view;
    std::set<FileId> shm;
    std::optional<nlohmann::json> first_status;
    std::optional<nlohmann::json> last_status;
  };

  static int on_event(void* ctx, void* data, size_t size);
  void scan_new_processes();
  void consider(const ProcessScan& scan);
  FoundFile& found(const std::string& kind, const MappedFile& file, bool* is_new);
  void attach_usdt(const MappedFile& file, const char* const* probes, size_t count,
                   bpf_program* const* programs);
  void adopt(const std::string& kind, const MappedFile& file, uint32_t pid);
  void attach_driver(const MappedFile& file);
  void refresh_arbiter(Arbiter& arbiter);
  void resolve(uint32_t tgid);
  void link_tenants();
  std::vector<uint64_t> read_counters() const;
  // finish()'s steps, in order.
  uint64_t stop_probes();
  void count_probes();
  void build_session_model(uint64_t end_ns);
  void view_gpus();
  ProcessView& process_view(uint32_t tgid);
  void view_processes();
  void read_driver_maps();
  void note_what_is_missing();

  const SessionOptions& options_;
  std::unique_ptr<session_bpf, SkeletonDeleter> skel_;
  UniqueRingBuffer ring_;
  std::vector<UniqueLink> links_;
  std::map<FileId, size_t> files_;  // index in view_.files
  std::set<pid_t> scanned_;
  std::map<pid_t, Arbiter> arbiters_;
  std::map<pid_t, std::set<FileId>> tenant_shm_;
  std::map<uint32_t, uint32_t> arbiter_of_;
  std::set<uint32_t> managed_;
  std::map<uint32_t, PodName> names_;
  std::map<uint32_t, std::string> comms_;
  std::vector<quanta_session_event> events_;
  std::set<uint32_t> unresolved_;
  NvmlProcesses nvml_;
  SessionView view_;
  uint64_t start_ns_ = 0;                    // every probe attached: the session begins
  std::vector<uint64_t> counters_at_start_;  // the programs' counters then
  uint64_t last_scan_ns_ = 0;
  bool btf_ = true;
  const uint32_t self_ = static_cast<uint32_t>(::getpid());
};

int Tracer::on_event(void* ctx, void* data, size_t size) {
  auto* self = static_cast<Tracer*>(ctx);
  if (size < sizeof(quanta_session_event)) return 0;
  const auto& e = *static_cast<const quanta_session_event*>(data);
  if (e.tgid == self->self_ || e.ts_ns < self->start_ns_) return 0;
  self->events_.push_back(e);
  if (!self->names_.count(e.tgid)) self->unresolved_.insert(e.tgid);
  if (e.kind == QUANTA_EV_GATE_WAIT_BEGIN || e.kind == QUANTA_EV_GATE_WAIT_END ||
      e.kind == QUANTA_EV_DRAIN_BEGIN || e.kind == QUANTA_EV_RELEASE)
    self->managed_.insert(e.tgid);
  return 0;
}

FoundFile& Tracer::found(const std::string& kind, const MappedFile& file, bool* is_new) {
  auto it = files_.find(file.id);
  *is_new = it == files_.end();
  if (*is_new) {
    view_.files.push_back(FoundFile{kind, file.path, file.open_path, {}});
    it = files_.emplace(file.id, view_.files.size() - 1).first;
  }
  return view_.files[it->second];
}

void Tracer::attach_usdt(const MappedFile& file, const char* const* probes, size_t count,
                         bpf_program* const* programs) {
  std::string absent;
  for (size_t i = 0; i < count; ++i) {
    AttachRecord record{std::string("usdt quanta:") + probes[i], file.path, 0, {}};
    bpf_link* link = bpf_program__attach_usdt(programs[i], -1, file.open_path.c_str(), "quanta",
                                              probes[i], nullptr);
    if (link) {
      links_.emplace_back(link);
      record.links = 1;
    } else {
      const int err = errno;
      record.error = err == ENOENT ? "not in this build" : errno_text(err);
      if (err == ENOENT) {
        absent += (absent.empty() ? "quanta:" : ", quanta:") + std::string(probes[i]);
      } else {
        spdlog::warn("cannot attach USDT probe quanta:{} in {} (opened as {}): {}", probes[i],
                     file.path, file.open_path, record.error);
      }
    }
    view_.attached.push_back(record);
  }
  if (!absent.empty()) {
    view_.notes.push_back(file.path + " is an older build without " + absent +
                          ": what those measure is missing for its processes");
  }
}

void Tracer::attach_driver(const MappedFile& file) {
  std::map<std::string, uint64_t> offsets;
  try {
    offsets = elf_function_offsets(file.open_path);
  } catch (const TraceError& e) {
    spdlog::warn("cannot read the symbols of {}: {}", file.path, e.what());
    view_.attached.push_back(AttachRecord{"uprobe libcuda entry points", file.path, 0, e.what()});
    return;
  }
  std::set<uint64_t> taken;  // aliases share an address: one probe per address
  for (const DriverEntry& entry : kDriverEntries) {
    auto at = offsets.find(entry.symbol);
    if (at == offsets.end() || !taken.insert(at->second).second) continue;
    bpf_program* entry_prog = nullptr;
    bool returns = false;
    switch (entry.role) {
      case DriverRole::kLaunch:
        entry_prog = skel_->progs.driver_launch;
        break;
      case DriverRole::kRecord:
        entry_prog = skel_->progs.driver_event_record;
        break;
      case DriverRole::kSyncAll:
        entry_prog = skel_->progs.driver_sync_all;
        returns = true;
        break;
      case DriverRole::kSyncEvent:
        entry_prog = skel_->progs.driver_sync_event;
        returns = true;
        break;
      case DriverRole::kQueryAll:
        entry_prog = skel_->progs.driver_query_all;
        returns = true;
        break;
      case DriverRole::kQueryEvent:
        entry_prog = skel_->progs.driver_query_event;
        returns = true;
        break;
    }
    for (int ret = 0; ret <= (returns ? 1 : 0); ++ret) {
      bpf_program* prog = ret ? skel_->progs.driver_sync_return : entry_prog;
      AttachRecord record{
          std::string(ret ? "uretprobe " : "uprobe ") + entry.symbol, file.path, 0, {}};
      bpf_link* link = bpf_program__attach_uprobe(prog, ret != 0, -1, file.open_path.c_str(),
                                                  static_cast<size_t>(at->second));
      if (link) {
        links_.emplace_back(link);
        record.links = 1;
      } else {
        record.error = errno_text(errno);
        spdlog::warn("cannot attach {} {} in {}: {}", ret ? "uretprobe" : "uprobe", entry.symbol,
                     file.path, record.error);
      }
      view_.attached.push_back(record);
    }
  }
}

void Tracer::consider(const ProcessScan& scan) {
  const uint32_t pid = static_cast<uint32_t>(scan.pid);
  if (pid == self_) return;
  bool is_new = false;
  if (scan.arbiter && scan.executable) {
    FoundFile& file = found("arbiter", *scan.executable, &is_new);
    file.pids.insert(pid);
    if (is_new) {
      bpf_program* programs[] = {skel_->progs.grant, skel_->progs.revoke, skel_->progs.released,
                                 skel_->progs.pass_over, skel_->progs.slot_freed};
      attach_usdt(*scan.executable, kArbiterProbes, 5, programs);
    }
    if (!arbiters_.count(scan.pid)) {
      // The shim installed beside the arbiter is attached before any tenant maps it, so
      // tenants that start during the session are traced from their first launch.
      const std::string root = "/proc/" + std::to_string(scan.pid) + "/root";
      const std::string dir = scan.executable->path.substr(0, scan.executable->path.rfind('/'));
      for (const char* relative :
           {"/../lib/libquanta.so", "/../lib/quanta/libquanta.so", "/libquanta.so"}) {
        if (auto shim = file_at(root, dir + relative)) adopt("shim", *shim, 0);
      }
      Arbiter& arbiter = arbiters_[scan.pid];
      arbiter.view.pid = pid;
      arbiter.view.binary = scan.executable->path;
      const uint8_t yes = 1;
      bpf_map_update_elem(bpf_map__fd(skel_->maps.arbiters), &pid, &yes, BPF_ANY);
      if (auto socket = find_admin_socket(scan.pid)) {
        arbiter.view.admin_socket = *socket;
      } else {
        arbiter.view.status_error = "no listening admin socket found";
      }
      refresh_arbiter(arbiter);
      arbiter.first_status = arbiter.last_status;
    }
    arbiters_[scan.pid].shm = scan.shm;
  }
  if (scan.shim) {
    adopt("shim", *scan.shim, pid);
    managed_.insert(pid);
    tenant_shm_[scan.pid] = scan.shm;
  }
  if (scan.driver) adopt("driver", *scan.driver, pid);
  if ((scan.shim || scan.driver) && !names_.count(pid)) {
    names_[pid] = pod_of_process(scan.pid);
    comms_[pid] = scan.comm;
  }
}

void Tracer::adopt(const std::string& kind, const MappedFile& mapped, uint32_t pid) {
  if (kind == "driver" && !options_.driver) return;
  bool is_new = false;
  FoundFile& file = found(kind, mapped, &is_new);
  if (pid != 0) file.pids.insert(pid);
  if (!is_new) return;
  if (kind == "shim") {
    bpf_program* programs[] = {skel_->progs.gate_wait_begin, skel_->progs.gate_wait_end,
                               skel_->progs.drain_begin, skel_->progs.release};
    attach_usdt(mapped, kShimProbes, 4, programs);
  } else {
    attach_driver(mapped);
  }
}

void Tracer::scan_new_processes() {
  std::set<pid_t> alive;
  for (pid_t pid : list_pids()) {
    alive.insert(pid);
    // Arbiters map pod regions as pods come: looked at again every time.
    if (scanned_.count(pid) && !arbiters_.count(pid)) continue;
    scanned_.insert(pid);
    if (auto scan = scan_process(pid)) consider(*scan);
  }
  // Forget exited pids so a reused pid is looked at afresh.
  for (auto it = scanned_.begin(); it != scanned_.end();) {
    it = alive.count(*it) ? std::next(it) : scanned_.erase(it);
  }
}

void Tracer::refresh_arbiter(Arbiter& arbiter) {
  if (arbiter.view.admin_socket.empty()) return;
  std::string error;
  auto status =
      query_status(static_cast<pid_t>(arbiter.view.pid), arbiter.view.admin_socket, &error);
  if (!status) {
    if (arbiter.view.status_error.empty()) spdlog::warn("{}", error);
    arbiter.view.status_error = error;
    return;
  }
  arbiter.view.status_error.clear();
  arbiter.view.scope = status->value("scope", "");
  for (const auto& gpu : status->value("gpus", nlohmann::json::array())) {
    for (const auto& tenant : gpu.value("tenants", nlohmann::json::array())) {
      const uint32_t pid = tenant.value("pid", 0u);
      if (pid == 0) continue;
      names_[pid] = PodName{tenant.value("pod", ""), "arbiter"};
      arbiter_of_[pid] = arbiter.view.pid;
      managed_.insert(pid);
    }
  }
  arbiter.last_status = std::move(status);
}

void Tracer::resolve(uint32_t tgid) {
  if (names_.count(tgid)) return;
  if (auto scan = scan_process(static_cast<pid_t>(tgid))) {
    scanned_.insert(static_cast<pid_t>(tgid));
    consider(*scan);
  }
  if (!names_.count(tgid)) {
    names_[tgid] = pod_of_process(static_cast<pid_t>(tgid));
    comms_[tgid] = process_comm(static_cast<pid_t>(tgid));
  }
}

// A tenant belongs to the arbiter whose shared-memory regions it maps.
void Tracer::link_tenants() {
  for (const auto& [pid, shm] : tenant_shm_) {
    if (arbiter_of_.count(static_cast<uint32_t>(pid))) continue;
    for (const auto& [arbiter_pid, arbiter] : arbiters_) {
      const bool shares = std::any_of(shm.begin(), shm.end(),
                                      [&](const FileId& id) { return arbiter.shm.count(id) != 0; });
      if (shares) {
        arbiter_of_[static_cast<uint32_t>(pid)] = static_cast<uint32_t>(arbiter_pid);
        break;
      }
    }
  }
}

void Tracer::start() {
  skel_.reset(session_bpf__open());
  if (!skel_) throw TraceError("cannot open the session BPF object: " + errno_text(errno));
  skel_->rodata->sync_events = !options_.perfetto_file.empty() || !options_.svg_file.empty();
  btf_ = !options_.raw_tracepoints && btf_tracepoint_usable("sched_switch");
  view_.tracepoints = btf_ ? "tp_btf" : "raw_tp";
  bpf_program__set_autoload(skel_->progs.sched_wakeup_btf, btf_);
  bpf_program__set_autoload(skel_->progs.sched_switch_btf, btf_);
  bpf_program__set_autoload(skel_->progs.sched_wakeup_raw, !btf_);
  bpf_program__set_autoload(skel_->progs.sched_switch_raw, !btf_);
  if (int err = session_bpf__load(skel_.get()); err != 0) {
    throw TraceError("cannot load the session BPF programs (root and kernel BTF needed): " +
                     errno_text(err));
  }
  struct {
    bpf_program* prog;
    const char* name;
  } tracepoints[] = {
      {btf_ ? skel_->progs.sched_wakeup_btf : skel_->progs.sched_wakeup_raw, "sched_wakeup"},
      {btf_ ? skel_->progs.sched_switch_btf : skel_->progs.sched_switch_raw, "sched_switch"},
  };
  for (const auto& tp : tracepoints) {
    bpf_link* link = bpf_program__attach(tp.prog);
    const std::string what = std::string(btf_ ? "tp_btf/" : "raw_tp/") + tp.name;
    if (!link) throw TraceError("cannot attach " + what + ": " + errno_text(errno));
    links_.emplace_back(link);
    view_.attached.push_back(AttachRecord{"tracepoint " + what, "", 1, {}});
  }
  ring_.reset(ring_buffer__new(bpf_map__fd(skel_->maps.events), on_event, this, nullptr));
  if (!ring_) throw TraceError("cannot open the event ring buffer: " + errno_text(errno));

  // Libraries the loader would hand a new process, attached before any process maps them.
  for (const std::string& path : loader_paths("libquanta.so")) {
    if (auto shim = file_at("/", path)) adopt("shim", *shim, 0);
  }
  for (const std::string& path : loader_paths("libcuda.so.1")) {
    if (auto driver = file_at("/", path)) adopt("driver", *driver, 0);
  }
  scan_new_processes();
  link_tenants();
  nvml_.refresh();
  // The session proper starts once every probe found so far is attached: what fired while
  // they were being attached (seconds, on a busy node) is dropped with its counts, so the
  // session's figures and the arbiters' counters cover the same time.
  ring_buffer__consume(ring_.get());
  events_.clear();
  start_ns_ = monotonic_ns();
  counters_at_start_ = read_counters();
  // The arbiters' counters at the same moment: the session's baseline. An arbiter says when
  // it read them (`taken_ns`); its loop is single-threaded, so every grant it counted fired
  // its probe before that time and none after: from there the session and its counters
  // cover the same grants.
  for (auto& [pid, arbiter] : arbiters_) {
    refresh_arbiter(arbiter);
    arbiter.first_status = arbiter.last_status;
    if (arbiter.first_status)
      start_ns_ = std::max(start_ns_, arbiter.first_status->value("taken_ns", uint64_t{0}));
  }
  last_scan_ns_ = monotonic_ns();
  size_t shims = 0, drivers = 0, users = 0;
  for (const auto& file : view_.files) {
    shims += file.kind == "shim";
    drivers += file.kind == "driver";
    users += file.kind != "arbiter" ? file.pids.size() : 0;
  }
  spdlog::info(
      "Tracing for {} s (Ctrl-C to end): {} arbiter(s), {} libquanta.so and {} libcuda.so.1 "
      "file(s), {} process(es) using them; scheduler tracepoints {}",
      options_.duration_s, arbiters_.size(), shims, drivers, users, view_.tracepoints);
}

void Tracer::run() {
  view_.duration_s =
      run_bounded(std::chrono::duration<double>(options_.duration_s), {}, [this](int timeout_ms) {
        ring_buffer__poll(ring_.get(), timeout_ms);
        for (uint32_t tgid : std::set<uint32_t>(unresolved_)) resolve(tgid);
        unresolved_.clear();
        const uint64_t now = monotonic_ns();
        if (now - last_scan_ns_ >= 250000000ull) {
          last_scan_ns_ = now;
          scan_new_processes();
          for (auto& [pid, arbiter] : arbiters_) refresh_arbiter(arbiter);
          nvml_.refresh();
        }
        link_tenants();
      });
}

// The programs' counters, summed over CPUs.
std::vector<uint64_t> Tracer::read_counters() const {
  const int cpus = std::max(libbpf_num_possible_cpus(), 1);
  std::vector<uint64_t> per_cpu(static_cast<size_t>(cpus));
  std::vector<uint64_t> counters(QUANTA_CNT_COUNT, 0);
  for (uint32_t i = 0; i < QUANTA_CNT_COUNT; ++i) {
    if (bpf_map_lookup_elem(bpf_map__fd(skel_->maps.counters), &i, per_cpu.data()) != 0) continue;
    for (uint64_t v : per_cpu) counters[i] += v;
  }
  return counters;
}

SessionView Tracer::finish() {
  const uint64_t end_ns = stop_probes();
  count_probes();
  build_session_model(end_ns);
  view_gpus();
  view_processes();
  note_what_is_missing();
  return std::move(view_);
}

// The arbiters' counters first, and the session ends when they were read (the earliest
// reading, so no grant one of them has not counted is in it); then nothing fires, and what
// the probes sent meanwhile is read and its processes named.
uint64_t Tracer::stop_probes() {
  uint64_t end_ns = UINT64_MAX;
  for (auto& [pid, arbiter] : arbiters_) {
    refresh_arbiter(arbiter);
    if (arbiter.last_status && arbiter.last_status->contains("taken_ns"))
      end_ns = std::min(end_ns, arbiter.last_status->value("taken_ns", end_ns));
  }
  if (end_ns == UINT64_MAX || end_ns < start_ns_) end_ns = monotonic_ns();
  links_.clear();  // detach: nothing fires after this
  ring_buffer__consume(ring_.get());
  for (uint32_t tgid : std::set<uint32_t>(unresolved_)) resolve(tgid);
  nvml_.refresh();
  link_tenants();
  return end_ns;
}

// The programs' counters over the session.
void Tracer::count_probes() {
  std::vector<uint64_t> counters = read_counters();
  for (uint32_t i = 0; i < QUANTA_CNT_COUNT; ++i)
    counters[i] -= std::min(counters[i], counters_at_start_[i]);
  for (uint32_t i = 0; i < QUANTA_CNT_COUNT; ++i)
    view_.probes_fired[kCounterNames[i]] = counters[i];
  view_.events_lost = counters[QUANTA_CNT_EVENTS_LOST];
  view_.procs_dropped = counters[QUANTA_CNT_PROCS_DROPPED];
  view_.events = events_.size();
  if (view_.events_lost) {
    view_.notes.push_back(std::to_string(view_.events_lost) +
                          " events did not fit the ring buffer: switches and timelines miss them");
  }
}

// The model of holds, waits and switches from the events up to `end_ns`, each GPU's holder
// and last grant at the start seeded from the arbiters' first status.
void Tracer::build_session_model(uint64_t end_ns) {
  ModelInput input;
  for (const quanta_session_event& e : events_) {
    if (e.ts_ns <= end_ns) input.events.push_back(e);
  }
  for (const auto& [pid, arbiter] : arbiters_) input.arbiters.insert(static_cast<uint32_t>(pid));
  input.arbiter_of = arbiter_of_;
  input.start_ns = start_ns_;
  input.end_ns = end_ns;
  for (const auto& [pid, arbiter] : arbiters_) {
    if (!arbiter.first_status) continue;
    for (const auto& gpu : arbiter.first_status->value("gpus", nlohmann::json::array())) {
      const auto& holder = gpu.value("holder", nlohmann::json());
      const GpuKey key{static_cast<uint32_t>(pid), gpu.value("index", 0u)};
      if (holder.is_object() && holder.contains("slot"))
        input.seed_holders[key] = holder.value("slot", 0u);
      if (gpu.value("last_granted", nlohmann::json()).is_number_unsigned())
        input.seed_granted[key] = gpu.value("last_granted", 0u);
    }
  }
  view_.model = build_model(std::move(input));
  if (view_.model.unattributed) {
    view_.notes.push_back(std::to_string(view_.model.unattributed) +
                          " shim events came from processes whose arbiter was not found");
  }
}

// Every GPU an arbiter served or the model saw, with the arbiter's own grant and switch
// counts over the session.
void Tracer::view_gpus() {
  for (auto& [pid, arbiter] : arbiters_) {
    view_.arbiters.push_back(arbiter.view);
    if (!arbiter.last_status) continue;
    std::map<uint32_t, nlohmann::json> first;
    if (arbiter.first_status) {
      for (const auto& gpu : arbiter.first_status->value("gpus", nlohmann::json::array()))
        first[gpu.value("index", 0u)] = gpu;
    }
    for (const auto& gpu : arbiter.last_status->value("gpus", nlohmann::json::array())) {
      const GpuKey key{static_cast<uint32_t>(pid), gpu.value("index", 0u)};
      GpuView& view = view_.gpus[key];
      view.key = key;
      view.uuid = gpu.value("uuid", "");
      view.scope = arbiter.view.scope;
      auto before = first.find(key.index);
      if (before != first.end() && gpu.contains("switches") &&
          before->second.contains("switches")) {
        view.arbiter_grants =
            gpu.value("grants", uint64_t{0}) - before->second.value("grants", uint64_t{0});
        view.arbiter_switches =
            gpu.value("switches", uint64_t{0}) - before->second.value("switches", uint64_t{0});
      }
      if (!view_.model.gpus.count(key)) view_.model.gpus[key].key = key;
    }
  }
  for (const auto& [key, gpu] : view_.model.gpus) {
    if (!view_.gpus.count(key)) view_.gpus[key].key = key;
  }
}

// The process `tgid` in the view, named (its pod, its command, managed or not) when first seen.
ProcessView& Tracer::process_view(uint32_t tgid) {
  ProcessView& p = view_.processes[tgid];
  if (p.pid == 0) {
    p.pid = tgid;
    auto name = names_.find(tgid);
    if (name != names_.end()) {
      p.pod = name->second.pod;
      p.pod_source = name->second.source;
    }
    auto comm = comms_.find(tgid);
    p.comm = comm != comms_.end() ? comm->second : process_comm(static_cast<pid_t>(tgid));
    p.managed = managed_.count(tgid) != 0;
  }
  return p;
}

// Processes: the GPUs they held or waited for, their driver statistics and synchronisations,
// and NVML's GPUs for one the model did not place.
void Tracer::view_processes() {
  for (const auto& [key, gpu] : view_.model.gpus) {
    const std::string& uuid = view_.gpus[key].uuid;
    auto note_gpu = [&](uint32_t tgid) {
      if (tgid == 0) return;
      ProcessView& p = process_view(tgid);
      if (!uuid.empty()) p.gpus.insert(uuid);
    };
    for (const auto& hold : gpu.holds) note_gpu(hold.tgid);
    for (const auto& wait : gpu.waits) note_gpu(wait.tgid);
  }
  read_driver_maps();
  for (const auto& e : events_) {
    if (e.kind != QUANTA_EV_SYNC) continue;
    process_view(e.tgid).spans.push_back(SyncSpan{e.tid, e.a, e.ts_ns, e.b, e.c, e.slot != 0});
  }
  for (auto& [tgid, p] : view_.processes) {
    if (p.gpus.empty()) {
      auto nvml = nvml_.gpus_by_pid().find(static_cast<pid_t>(tgid));
      if (nvml != nvml_.gpus_by_pid().end()) p.gpus = nvml->second;
    }
  }
}

// The driver probes' maps: launch-to-completion and sync-wait histograms, launches and syncs
// per process (this tracer's own calls left out).
void Tracer::read_driver_maps() {
  for_each_entry<quanta_driver_key, quanta_hist>(
      bpf_map__fd(skel_->maps.driver_hists),
      [this](const quanta_driver_key& key, const quanta_hist& raw) {
        if (key.tgid == self_) return;
        ProcessView& p = process_view(key.tgid);
        (key.kind == QUANTA_DRIVER_LAUNCH_TO_COMPLETION ? p.launch_to_completion : p.sync_wait)
            .add(raw);
      });
  for_each_entry<uint32_t, quanta_driver_proc>(
      bpf_map__fd(skel_->maps.procs), [this](uint32_t tgid, const quanta_driver_proc& raw) {
        if (tgid == self_) return;
        ProcessView& p = process_view(tgid);
        p.launches = raw.launched;
        p.syncs = raw.syncs;
      });
}

void Tracer::note_what_is_missing() {
  if (!nvml_.available()) view_.notes.push_back(nvml_.note());
  if (view_.procs_dropped) {
    view_.notes.push_back(std::to_string(view_.procs_dropped) +
                          " driver calls came from processes beyond the " +
                          std::to_string(QUANTA_SESSION_MAX_PROCS) + " the session keeps");
  }
  if (arbiters_.empty()) view_.notes.push_back("no quanta-arbiter runs on this node");
}

void check_options(const SessionOptions& options) {
  const bool index =
      !options.gpu.empty() && options.gpu.find_first_not_of("0123456789") == std::string::npos;
  if (!options.gpu.empty() && !index && options.gpu.rfind("GPU-", 0) != 0 &&
      options.gpu.rfind("MIG-", 0) != 0) {
    throw TraceError("--gpu '" + options.gpu +
                     "' is neither a GPU index nor a GPU or MIG UUID: want 0, 1, ... or GPU-... "
                     "or MIG-..., as quantactl status shows them");
  }
  if (options.svg_window_s < 0)
    throw TraceError("--svg-window must be 0 (automatic) or more seconds");
}

// --gpu as every Quanta command takes a GPU: its UUID, or its index on the arbiter that
// serves it. An index two arbiters use is refused, naming their UUIDs.
std::string gpu_named(const SessionView& view, const std::string& wanted) {
  if (wanted.empty() || wanted.find_first_not_of("0123456789") != std::string::npos) return wanted;
  std::vector<std::string> uuids;
  for (const auto& [key, gpu] : view.gpus) {
    if (std::to_string(key.index) == wanted && !gpu.uuid.empty()) uuids.push_back(gpu.uuid);
  }
  if (uuids.size() == 1) return uuids[0];
  if (uuids.empty()) {
    throw TraceError("--gpu " + wanted + ": no GPU of that index was served in this session (" +
                     std::to_string(view.gpus.size()) + " seen); name it by UUID");
  }
  std::string list;
  for (const std::string& u : uuids) list += (list.empty() ? "" : ", ") + u;
  throw TraceError("--gpu " + wanted + " is ambiguous (several arbiters): " + list +
                   "; name it by UUID");
}

// --pod as every quantactl command takes a pod (common/pod_key.h), among the pods seen.
std::string pod_named(const SessionView& view, const std::string& wanted) {
  if (wanted.empty()) return wanted;
  std::set<std::string> known;
  for (const auto& [tgid, process] : view.processes) {
    if (!process.pod.empty()) known.insert(process.pod);
  }
  std::string ambiguous;
  const std::string key = common::resolve_pod_name(known, wanted, &ambiguous);
  if (!ambiguous.empty()) throw TraceError("--pod " + ambiguous);
  return key.empty() ? wanted : key;
}

void write_file(const std::string& path, const std::string& text, const char* what) {
  std::ofstream out(path);
  if (!out)
    throw TraceError(std::string("cannot write the ") + what + " to " + path + ": " +
                     errno_text(errno));
  out << text;
  if (!out.flush()) throw TraceError(std::string("cannot write the ") + what + " to " + path);
}

}  // namespace

int run_session(const SessionOptions& options) {
  check_options(options);
  Tracer tracer(options);
  tracer.start();
  tracer.run();
  SessionView view = tracer.finish();
  view.gpu_filter = gpu_named(view, options.gpu);
  view.pod_filter = pod_named(view, options.pod);
  view.perfetto_file = options.perfetto_file;
  view.svg_file = options.svg_file;
  if (!options.perfetto_file.empty())
    write_file(options.perfetto_file, perfetto_trace(view).dump() + "\n", "Perfetto trace");
  if (!options.svg_file.empty())
    write_file(options.svg_file, svg_timeline(view, options.svg_window_s), "SVG timeline");
  if (options.json) {
    std::cout << report_json(view).dump(2) << std::endl;
  } else {
    print_report(view, std::cout);
  }
  return 0;
}

}  // namespace quanta::bpf
