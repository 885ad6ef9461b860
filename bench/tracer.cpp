// Records the shim's handoff probes through tracefs uprobes beside a run, or runs
// quanta-trace handoff and reads its timeline when tracefs cannot be used.
#include "bench/tracer.h"

#include "bench/stats.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <thread>

namespace quanta::bench {

HandoffTracer::HandoffTracer(Run& run, double seconds) : run_(run), seconds_(seconds) {
  const Paths& paths = run.bench().paths();
  if (!file_exists(paths.shim)) {
    error_ = "libquanta.so is not built";
    return;
  }
  // First choice: the probes as uprobes through tracefs, which keeps every hit with its
  // thread, so a handoff counts only when the next tenant was already waiting.
  std::string uprobe_error;
  try {
    // Each with the shim's own clock: `release` its stamp (argument 3), `gate_wait_end`
    // the time waited and its stamp (3, 4), both read before the probe's trap, which on
    // a virtual machine can cost more than the handoff it would otherwise be timed in.
    uprobes_ = std::make_unique<UprobeSession>(paths.shim, "quanta",
                                               std::vector<ProbeRequest>{{"release", {3}}, {"gate_wait_end", {3, 4}}});
    attached_ = true;
    source_ = "tracefs uprobes";
    return;
  } catch (const std::exception& failure) {
    uprobe_error = std::string("tracefs uprobes: ") + failure.what();
  }
  if (!file_exists(paths.trace)) {
    error_ = uprobe_error + "; quanta-trace is not built";
    return;
  }
  timeline_path_ = run.dir() + "/handoff-timeline.json";
  trace_ = std::make_unique<Process>(run.spawn({paths.trace, "handoff", "--binary", paths.shim, "--duration",
                                                std::to_string(seconds), "--json", "--timeline", timeline_path_},
                                               "", false, "trace"));
  // Attached once it announces the session; loading BPF takes a few hundred ms.
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < until) {
    if (read_file(trace_->stderr_path()).find("Tracing") != std::string::npos) {
      attached_ = true;
      source_ = "quanta-trace";
      error_ = uprobe_error + "; measured with quanta-trace handoff instead";
      return;
    }
    if (!trace_->running()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::string tail = last_line(read_file(trace_->stderr_path()));
  error_ = uprobe_error + "; quanta-trace handoff did not attach either" + (tail.empty() ? std::string() : " (" + tail + ")");
  trace_->stop(std::chrono::milliseconds(500));
  trace_.reset();
}

HandoffTracer::~HandoffTracer() = default;

void HandoffTracer::note_tenants(const std::vector<pid_t>& pids, const std::vector<int>& devices) {
  devices_ = devices;
  for (size_t i = 0; i < pids.size(); ++i) {
    std::error_code error;
    for (const auto& task : std::filesystem::directory_iterator("/proc/" + std::to_string(pids[i]) + "/task", error)) {
      tenant_of_tid_[static_cast<uint32_t>(std::stoul(task.path().filename().string()))] = static_cast<int>(i);
    }
  }
}

std::vector<Handoff> HandoffTracer::finish() {
  std::vector<Handoff> handoffs;
  if (uprobes_) {
    auto hits = uprobes_->collect();
    handoffs = handoffs_from_hits(hits, tenant_of_tid_, devices_);
    if (uprobes_->lost() > 0) error_ += "; the trace buffer overwrote " + std::to_string(uprobes_->lost()) + " events";
    uprobes_.reset();
    return handoffs;
  }
  if (!trace_) return handoffs;
  ExitStatus status = trace_->wait(std::chrono::milliseconds(static_cast<int64_t>((seconds_ + 15) * 1000)));
  if (!status.exited || status.code != 0) {
    error_ = "quanta-trace handoff ended with " + status.describe() + ": " + last_line(read_file(trace_->stderr_path()));
    return handoffs;
  }
  try {
    auto timeline = nlohmann::json::parse(read_file(timeline_path_));
    // Event times are microseconds from the first event, whose CLOCK_MONOTONIC time the
    // timeline keeps.
    const uint64_t first_ns = timeline.contains("otherData") ? timeline["otherData"].value("first_event_ns", uint64_t{0}) : 0;
    if (first_ns == 0) error_ = "the quanta-trace timeline has no otherData.first_event_ns, so no handoff can be placed in the window";
    // A handoff follows its successor's gate_wait, so a process with one gate_wait so far
    // is passing its gate for the first time.
    std::map<int, int> waits_of_pid;
    for (const auto& event : timeline.at("traceEvents")) {
      const std::string name = event.value("name", "");
      const int pid = event.value("pid", 0);
      if (name == "gate_wait") ++waits_of_pid[pid];
      if (name != "handoff" || !event.contains("dur")) continue;
      const uint64_t released_ns = first_ns + static_cast<uint64_t>(event.value("ts", 0.0) * 1e3);
      handoffs.push_back({released_ns, event["dur"].get<double>(), waits_of_pid[pid] <= 1});
    }
    uint64_t lost = timeline.contains("otherData") ? timeline["otherData"].value("events_lost", uint64_t{0}) : 0;
    if (lost > 0) error_ += (error_.empty() ? "" : "; ") + std::string("quanta-trace lost ") + std::to_string(lost) + " timeline events";
  } catch (const std::exception& parse_error) {
    error_ = std::string("cannot read the quanta-trace timeline: ") + parse_error.what();
  }
  return handoffs;
}

std::vector<double> steady_durations(const std::vector<Handoff>& handoffs, const Window& window) {
  std::vector<double> out;
  for (const auto& handoff : handoffs) {
    if (!handoff.first_pass && handoff.released_ns >= window.start_ns && handoff.released_ns < window.end_ns)
      out.push_back(handoff.us);
  }
  return out;
}

nlohmann::json whole_run_figures(const std::vector<Handoff>& handoffs) {
  std::vector<double> us;
  for (const auto& handoff : handoffs) us.push_back(handoff.us);
  return {{"handoffs", us.size()}, {"p50_us", figure(percentile(us, 50), 1)}, {"p99_us", figure(percentile(us, 99), 1)}};
}

}  // namespace quanta::bench
