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

json perfetto_trace(const SessionView& view) {
  const uint64_t t0 = view.model.start_ns;
  auto us = [t0](uint64_t ns) { return ns > t0 ? static_cast<double>(ns - t0) / 1e3 : 0.0; };
  json events = json::array();
  auto meta = [&](const char* what, int pid, int tid, const json& args) {
    json e = {{"name", what}, {"ph", "M"}, {"pid", pid}, {"args", args}};
    if (tid >= 0) e["tid"] = tid;
    events.push_back(std::move(e));
  };
  auto span = [&](const std::string& name, const char* cat, int pid, int tid, uint64_t start,
                  uint64_t end, json args) {
    if (end < start) end = start;
    events.push_back({{"name", name},
                      {"cat", cat},
                      {"ph", "X"},
                      {"pid", pid},
                      {"tid", tid},
                      {"ts", us(start)},
                      {"dur", static_cast<double>(end - start) / 1e3},
                      {"args", std::move(args)}});
  };

  uint64_t quanta = 0;
  int track = 0;
  for (const GpuKey& key : view.reported_gpus()) {
    const GpuModel& gpu = view.model.gpus.at(key);
    if (gpu.holds.empty() && gpu.waits.empty()) continue;  // idle all session
    const int pid = ++track;
    meta("process_name", pid, -1, {{"name", view.gpu_label(key)}});
    meta("process_sort_index", pid, -1, {{"sort_index", pid}});
    meta("thread_name", pid, 1, {{"name", "switches"}});
    meta("thread_sort_index", pid, 1, {{"sort_index", 0}});

    std::map<std::pair<uint32_t, uint64_t>, const SwitchRecord*> into;  // (slot, grant) -> switch
    for (const SwitchRecord& sw : gpu.switches) {
      if (!view.pod_selected(sw.to_tgid)) continue;
      into[{sw.to_slot, sw.grant_ns}] = &sw;
      if (!sw.complete) continue;
      span(view.pod_of(sw.from_tgid) + " -> " + view.pod_of(sw.to_tgid), "handoff", pid, 1,
           sw.start_ns, sw.end_ns,
           {{"kind", switch_kind_name(sw.kind)},
            {"handoff_us", static_cast<double>(sw.handoff_ns()) / 1e3},
            {"arbiter_us", static_cast<double>(sw.arbiter_ns) / 1e3},
            {"wakeup_us", static_cast<double>(sw.wakeup_ns) / 1e3},
            {"run_queue_us", static_cast<double>(sw.run_queue_ns) / 1e3},
            {"gate_exit_us", static_cast<double>(sw.gate_exit_ns) / 1e3},
            {"self_reported_us",
             sw.has_own ? json(static_cast<double>(sw.own_handoff_ns) / 1e3) : json()}});
    }

    // A row per process, named by its pod, in pod order.
    std::map<std::pair<std::string, uint32_t>, int> rows;
    for (const auto& hold : gpu.holds) rows[{view.pod_of(hold.tgid), hold.tgid}] = 0;
    for (const auto& wait : gpu.waits) rows[{view.pod_of(wait.tgid), wait.tgid}] = 0;
    int next_tid = 10;
    for (auto& [who, tid] : rows) {
      if (!view.pod_selected(who.second)) continue;
      tid = next_tid++;
      const std::string name =
          who.first + (who.second ? " (pid " + std::to_string(who.second) + ")" : "");
      meta("thread_name", pid, tid, {{"name", name}});
      meta("thread_sort_index", pid, tid, {{"sort_index", tid}});
    }
    std::map<uint32_t, Spans> held, waited;
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
      span("quantum", "quantum", pid, tid, hold.grant_ns, hold.end_ns, args);
      if (auto sw = into.find({hold.slot, hold.grant_ns});
          sw != into.end() && sw->second->complete) {
        span("first launch", "handoff", pid, tid, hold.grant_ns,
             std::min(sw->second->end_ns, hold.end_ns),
             {{"wakeup_us", static_cast<double>(sw->second->wakeup_ns) / 1e3},
              {"run_queue_us", static_cast<double>(sw->second->run_queue_ns) / 1e3},
              {"gate_exit_us", static_cast<double>(sw->second->gate_exit_ns) / 1e3}});
      }
      if (hold.released && hold.drain_begin_ns >= hold.grant_ns &&
          hold.drain_begin_ns <= hold.end_ns)
        span("drain", "drain", pid, tid, hold.drain_begin_ns, hold.end_ns, json::object());
      if (hold.revoke_ns >= hold.grant_ns && hold.revoke_ns <= hold.end_ns) {
        events.push_back({{"name", "revoke"},
                          {"cat", "revoke"},
                          {"ph", "i"},
                          {"s", "t"},
                          {"pid", pid},
                          {"tid", tid},
                          {"ts", us(hold.revoke_ns)}});
      }
    }
    for (const WaitRecord& wait : gpu.waits) {
      if (view.pod_selected(wait.tgid)) waited[wait.tgid].emplace_back(wait.begin_ns, wait.end_ns);
    }
    for (auto& [tgid, spans] : waited) {
      auto row = rows.find({view.pod_of(tgid), tgid});
      if (row == rows.end()) continue;
      for (const auto& [start, end] : subtract(spans, held[tgid]))
        span("wait", "wait", pid, row->second, start, end, json::object());
    }
  }

  // libcuda.so.1 calls of every traced process, managed or not.
  const int driver_pid = 1000;
  bool driver_named = false;
  int next_tid = 1;
  for (const auto& [tgid, process] : view.processes) {
    if (!view.process_selected(process) || process.spans.empty()) continue;
    if (!driver_named) {
      meta("process_name", driver_pid, -1,
           {{"name", "libcuda.so.1 calls: launch to completion, sync waits"}});
      meta("process_sort_index", driver_pid, -1, {{"sort_index", driver_pid}});
      driver_named = true;
    }
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
        meta("thread_name", driver_pid, it->second,
             {{"name", lanes[i] == 0 ? base : base + " #" + std::to_string(lanes[i] + 1)}});
      }
      const SyncSpan& s = spans[i];
      if (s.oldest_launch_ns && s.oldest_launch_ns < s.return_ns) {
        span("launch to completion", "driver", driver_pid, it->second, outer[i].first, s.return_ns,
             {{"completed", s.completed}});
      }
      if (!s.query) {
        span("sync", "driver", driver_pid, it->second, std::max(s.entry_ns, outer[i].first),
             s.return_ns, json::object());
      }
    }
  }

  return {{"traceEvents", std::move(events)},
          {"displayTimeUnit", "ns"},
          {"otherData",
           {{"source", "quanta-trace session"},
            {"duration_s", view.duration_s},
            {"quanta", quanta},
            {"events_lost", view.events_lost}}}};
}

}  // namespace quanta::bpf
