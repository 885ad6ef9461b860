// Chrome trace event JSON: complete events ("X") nest by time on one row, so every row is
// built from non-overlapping spans (holds and the waits between them; driver spans in
// lanes) and children are clipped to their parent.
#include "bpf/perfetto.h"

#include <algorithm>
#include <map>

namespace quanta::bpf {
namespace {

using nlohmann::json;
using Spans = std::vector<std::pair<uint64_t, uint64_t>>;

Spans merged(Spans spans) {
  std::sort(spans.begin(), spans.end());
  Spans out;
  for (const auto& s : spans) {
    if (s.second <= s.first) continue;
    if (!out.empty() && s.first <= out.back().second) {
      out.back().second = std::max(out.back().second, s.second);
    } else {
      out.push_back(s);
    }
  }
  return out;
}

const char* ended_how(const HoldRecord& hold) {
  if (hold.passed_over) return "passed over";
  if (hold.holder_exited) return "holder exited";
  if (hold.released) return "released";
  return "holding at the end, or the GPU moved on";
}

}  // namespace

std::vector<int> assign_lanes(const Spans& spans) {
  std::vector<uint64_t> lane_end;
  std::vector<int> lanes;
  for (const auto& [start, end] : spans) {
    size_t lane = 0;
    while (lane < lane_end.size() && lane_end[lane] > start) ++lane;
    if (lane == lane_end.size()) lane_end.push_back(0);
    lane_end[lane] = end;
    lanes.push_back(static_cast<int>(lane));
  }
  return lanes;
}

Spans subtract(Spans from, Spans cut) {
  from = merged(std::move(from));
  cut = merged(std::move(cut));
  Spans out;
  size_t j = 0;
  for (auto [start, end] : from) {
    while (j < cut.size() && cut[j].second <= start) ++j;
    size_t k = j;
    while (start < end) {
      if (k >= cut.size() || cut[k].first >= end) {
        out.emplace_back(start, end);
        break;
      }
      if (cut[k].first > start) out.emplace_back(start, cut[k].first);
      start = std::max(start, cut[k].second);
      ++k;
    }
  }
  return out;
}

namespace {

// The trace's events as they are written: metadata rows, complete spans and instants, in
// microseconds from the session's start.
class TraceEvents {
 public:
  explicit TraceEvents(uint64_t t0) : t0_(t0) {}

  void meta(const char* what, int pid, int tid, const json& args) {
    json e = {{"name", what}, {"ph", "M"}, {"pid", pid}, {"args", args}};
    if (tid >= 0) e["tid"] = tid;
    events_.push_back(std::move(e));
  }
  void span(const std::string& name, const char* cat, int pid, int tid, uint64_t start,
            uint64_t end, json args) {
    if (end < start) end = start;
    events_.push_back({{"name", name},
                       {"cat", cat},
                       {"ph", "X"},
                       {"pid", pid},
                       {"tid", tid},
                       {"ts", us(start)},
                       {"dur", static_cast<double>(end - start) / 1e3},
                       {"args", std::move(args)}});
  }
  void instant(const char* name, int pid, int tid, uint64_t at) {
    events_.push_back({{"name", name},
                       {"cat", name},
                       {"ph", "i"},
                       {"s", "t"},
                       {"pid", pid},
                       {"tid", tid},
                       {"ts", us(at)}});
  }
  json take() { return std::move(events_); }

 private:
  double us(uint64_t ns) const { return ns > t0_ ? static_cast<double>(ns - t0_) / 1e3 : 0.0; }
  uint64_t t0_;
  json events_ = json::array();
};

double us_of(uint64_t ns) {
  return static_cast<double>(ns) / 1e3;
}

// (slot, grant) -> the switch into that grant.
using SwitchesInto = std::map<std::pair<uint32_t, uint64_t>, const SwitchRecord*>;
// (pod, pid) -> the row of that process on its GPU's track (0: not selected).
using ProcessRows = std::map<std::pair<std::string, uint32_t>, int>;

// The GPU's "switches" row: each complete handoff into a selected pod, with its phases.
SwitchesInto switch_spans(TraceEvents& out, const SessionView& view, const GpuModel& gpu, int pid) {
  SwitchesInto into;
  for (const SwitchRecord& sw : gpu.switches) {
    if (!view.pod_selected(sw.to_tgid)) continue;
    into[{sw.to_slot, sw.grant_ns}] = &sw;
    if (!sw.complete) continue;
    out.span(view.pod_of(sw.from_tgid) + " -> " + view.pod_of(sw.to_tgid), "handoff", pid, 1,
             sw.start_ns, sw.end_ns,
             {{"kind", switch_kind_name(sw.kind)},
              {"handoff_us", us_of(sw.handoff_ns())},
              {"arbiter_us", us_of(sw.arbiter_ns)},
              {"wakeup_us", us_of(sw.wakeup_ns)},
              {"run_queue_us", us_of(sw.run_queue_ns)},
              {"gate_exit_us", us_of(sw.gate_exit_ns)},
              {"self_reported_us", sw.has_own ? json(us_of(sw.own_handoff_ns)) : json()}});
  }
  return into;
}

// A row per process that held or waited for the GPU, named by its pod, in pod order.
ProcessRows process_rows(TraceEvents& out, const SessionView& view, const GpuModel& gpu, int pid) {
  ProcessRows rows;
  for (const auto& hold : gpu.holds) rows[{view.pod_of(hold.tgid), hold.tgid}] = 0;
  for (const auto& wait : gpu.waits) rows[{view.pod_of(wait.tgid), wait.tgid}] = 0;
  int next_tid = 10;
  for (auto& [who, tid] : rows) {
    if (!view.pod_selected(who.second)) continue;
    tid = next_tid++;
    const std::string name =
        who.first + (who.second ? " (pid " + std::to_string(who.second) + ")" : "");
    out.meta("thread_name", pid, tid, {{"name", name}});
    out.meta("thread_sort_index", pid, tid, {{"sort_index", tid}});
  }
  return rows;
}

// Each hold as a quantum on its process's row, with its first launch, its drain and its
// revoke; returns the held spans per process and counts the quanta granted in the session.
std::map<uint32_t, Spans> hold_spans(TraceEvents& out, const SessionView& view, const GpuModel& gpu,
                                     int pid, const ProcessRows& rows, const SwitchesInto& into,
                                     uint64_t& quanta) {
  std::map<uint32_t, Spans> held;
  for (const HoldRecord& hold : gpu.holds) {
    auto row = rows.find({view.pod_of(hold.tgid), hold.tgid});
    if (row == rows.end() || !view.pod_selected(hold.tgid)) continue;
    const int tid = row->second;
    held[hold.tgid].emplace_back(hold.grant_ns, hold.end_ns);
    json args = {{"slot", hold.slot},
                 {"pid", hold.tgid},
                 {"quantum_ms", static_cast<double>(hold.quantum_ns) / 1e6},
                 {"ended", ended_how(hold)}};
    if (hold.before_session) args["held_before_the_session"] = true;
    if (!hold.before_session) ++quanta;
    out.span("quantum", "quantum", pid, tid, hold.grant_ns, hold.end_ns, args);
    if (auto sw = into.find({hold.slot, hold.grant_ns}); sw != into.end() && sw->second->complete) {
      out.span("first launch", "handoff", pid, tid, hold.grant_ns,
               std::min(sw->second->end_ns, hold.end_ns),
               {{"wakeup_us", us_of(sw->second->wakeup_ns)},
                {"run_queue_us", us_of(sw->second->run_queue_ns)},
                {"gate_exit_us", us_of(sw->second->gate_exit_ns)}});
    }
    if (hold.released && hold.drain_begin_ns >= hold.grant_ns && hold.drain_begin_ns <= hold.end_ns)
      out.span("drain", "drain", pid, tid, hold.drain_begin_ns, hold.end_ns, json::object());
    if (hold.revoke_ns >= hold.grant_ns && hold.revoke_ns <= hold.end_ns)
      out.instant("revoke", pid, tid, hold.revoke_ns);
  }
  return held;
}

// Each wait on its process's row, less the times the process held the GPU meanwhile.
void wait_spans(TraceEvents& out, const SessionView& view, const GpuModel& gpu, int pid,
                const ProcessRows& rows, std::map<uint32_t, Spans>& held) {
  std::map<uint32_t, Spans> waited;
  for (const WaitRecord& wait : gpu.waits) {
    if (view.pod_selected(wait.tgid)) waited[wait.tgid].emplace_back(wait.begin_ns, wait.end_ns);
  }
  for (auto& [tgid, spans] : waited) {
    auto row = rows.find({view.pod_of(tgid), tgid});
    if (row == rows.end()) continue;
    for (const auto& [start, end] : subtract(spans, held[tgid]))
      out.span("wait", "wait", pid, row->second, start, end, json::object());
  }
}

// A track per GPU that was not idle all session; returns the quanta granted in the session.
uint64_t gpu_tracks(TraceEvents& out, const SessionView& view) {
  uint64_t quanta = 0;
  int track = 0;
  for (const GpuKey& key : view.reported_gpus()) {
    const GpuModel& gpu = view.model.gpus.at(key);
    if (gpu.holds.empty() && gpu.waits.empty()) continue;  // idle all session
    const int pid = ++track;
    out.meta("process_name", pid, -1, {{"name", view.gpu_label(key)}});
    out.meta("process_sort_index", pid, -1, {{"sort_index", pid}});
    out.meta("thread_name", pid, 1, {{"name", "switches"}});
    out.meta("thread_sort_index", pid, 1, {{"sort_index", 0}});
    const SwitchesInto into = switch_spans(out, view, gpu, pid);
    const ProcessRows rows = process_rows(out, view, gpu, pid);
    std::map<uint32_t, Spans> held = hold_spans(out, view, gpu, pid, rows, into, quanta);
    wait_spans(out, view, gpu, pid, rows, held);
  }
  return quanta;
}

// One process's libcuda.so.1 calls, in lanes so that none overlaps another on its row.
void driver_rows(TraceEvents& out, int driver_pid, uint32_t tgid, const ProcessView& process,
                 int& next_tid) {
  std::vector<SyncSpan> spans = process.spans;
  std::sort(spans.begin(), spans.end(), [](const auto& a, const auto& b) {
    const uint64_t sa = a.oldest_launch_ns ? a.oldest_launch_ns : a.entry_ns;
    const uint64_t sb = b.oldest_launch_ns ? b.oldest_launch_ns : b.entry_ns;
    return sa < sb;
  });
  Spans outer;
  for (const auto& s : spans) {
    const uint64_t start = s.oldest_launch_ns && s.oldest_launch_ns < s.return_ns
                               ? s.oldest_launch_ns
                               : std::min(s.entry_ns, s.return_ns);
    outer.emplace_back(start, s.return_ns);
  }
  const std::vector<int> lanes = assign_lanes(outer);
  std::map<int, int> lane_tid;
  const std::string base =
      process.pod + " (pid " + std::to_string(tgid) + (process.managed ? ", shim)" : ", native)");
  for (size_t i = 0; i < spans.size(); ++i) {
    auto [it, inserted] = lane_tid.emplace(lanes[i], 0);
    if (inserted) {
      it->second = next_tid++;
      out.meta("thread_name", driver_pid, it->second,
               {{"name", lanes[i] == 0 ? base : base + " #" + std::to_string(lanes[i] + 1)}});
    }
    const SyncSpan& s = spans[i];
    if (s.oldest_launch_ns && s.oldest_launch_ns < s.return_ns) {
      out.span("launch to completion", "driver", driver_pid, it->second, outer[i].first,
               s.return_ns, {{"completed", s.completed}});
    }
    if (!s.query) {
      out.span("sync", "driver", driver_pid, it->second, std::max(s.entry_ns, outer[i].first),
               s.return_ns, json::object());
    }
  }
}

// libcuda.so.1 calls of every traced process, managed or not, on one track.
void driver_track(TraceEvents& out, const SessionView& view) {
  const int driver_pid = 1000;
  bool driver_named = false;
  int next_tid = 1;
  for (const auto& [tgid, process] : view.processes) {
    if (!view.process_selected(process) || process.spans.empty()) continue;
    if (!driver_named) {
      out.meta("process_name", driver_pid, -1,
               {{"name", "libcuda.so.1 calls: launch to completion, sync waits"}});
      out.meta("process_sort_index", driver_pid, -1, {{"sort_index", driver_pid}});
      driver_named = true;
    }
    driver_rows(out, driver_pid, tgid, process, next_tid);
  }
}

}  // namespace

json perfetto_trace(const SessionView& view) {
  TraceEvents out(view.model.start_ns);
  const uint64_t quanta = gpu_tracks(out, view);
  driver_track(out, view);
  return {{"traceEvents", out.take()},
          {"displayTimeUnit", "ns"},
          {"otherData",
           {{"source", "quanta-trace session"},
            {"duration_s", view.duration_s},
            {"quanta", quanta},
            {"events_lost", view.events_lost}}}};
}

}  // namespace quanta::bpf
