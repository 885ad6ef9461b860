// quanta-trace handoff: attaches handoff.bpf.c to the quanta:* USDT probes of a binary or
// library (handoff_session.h) and reports handoff latency and gate wait per device, plus an
// optional Chrome/Perfetto timeline of grants, releases, holds, waits and handoffs.
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bpf/handoff_model.h"
#include "bpf/handoff_session.h"
#include "bpf/histogram.h"
#include "bpf/tools.h"
#include "bpf/trace_run.h"

namespace quanta::bpf {
namespace {

// Chrome trace JSON (Perfetto opens it): probes as instants, gate waits, holds (grant to
// release of the same device and slot) and handoffs (pair_handoffs) as complete events.
// Timestamps are microseconds from the first event.
nlohmann::json build_timeline(std::vector<quanta_handoff_event> events, uint64_t lost) {
  std::stable_sort(events.begin(), events.end(),
                   [](const auto& a, const auto& b) { return a.ts_ns < b.ts_ns; });
  const uint64_t t0 = events.empty() ? 0 : events.front().ts_ns;
  auto us = [t0](uint64_t ts_ns) { return static_cast<double>(ts_ns - t0) / 1e3; };
  auto event = [](const char* name, const char* ph, double ts_us, uint32_t pid, uint32_t tid,
                  uint32_t device, uint32_t slot) {
    nlohmann::json j = {{"name", name}, {"cat", "quanta"}, {"ph", ph},
                        {"ts", ts_us},  {"pid", pid},      {"tid", tid},
                        {"args", {{"device", device}, {"slot", slot}}}};
    if (ph[0] == 'i') j["s"] = "t";
    return j;
  };
  nlohmann::json trace = nlohmann::json::array();
  std::map<std::pair<uint32_t, uint32_t>, uint64_t> grant_ts;  // (device, slot) -> ts
  for (const auto& e : events) {
    switch (e.probe) {
      case QUANTA_PROBE_GRANT:
        trace.push_back(event("grant", "i", us(e.ts_ns), e.pid, e.tid, e.device, e.slot));
        grant_ts[{e.device, e.slot}] = e.ts_ns;
        break;
      case QUANTA_PROBE_RELEASE: {
        trace.push_back(event("release", "i", us(e.ts_ns), e.pid, e.tid, e.device, e.slot));
        auto granted = grant_ts.find({e.device, e.slot});
        if (granted != grant_ts.end() && granted->second <= e.ts_ns) {
          auto hold = event("hold", "X", us(granted->second), e.pid, e.tid, e.device, e.slot);
          hold["dur"] = static_cast<double>(e.ts_ns - granted->second) / 1e3;
          trace.push_back(std::move(hold));
          grant_ts.erase(granted);
        }
        break;
      }
      case QUANTA_PROBE_GATE_WAIT_BEGIN:
        trace.push_back(event("gate_wait_begin", "i", us(e.ts_ns), e.pid, e.tid, e.device, e.slot));
        break;
      case QUANTA_PROBE_GATE_WAIT_END: {
        const uint64_t begin = e.value_ns <= e.ts_ns - t0 ? e.ts_ns - e.value_ns : t0;
        auto wait = event("gate_wait", "X", us(begin), e.pid, e.tid, e.device, e.slot);
        wait["dur"] = static_cast<double>(e.ts_ns - begin) / 1e3;
        wait["args"]["wait_ns"] = e.value_ns;
        trace.push_back(std::move(wait));
        break;
      }
      default:
        break;
    }
  }
  for (const Handoff& h : pair_handoffs(events)) {
    auto handoff = event("handoff", "X", us(h.released_ns), h.to_pid, h.to_tid, h.device,
                         h.to_slot);
    handoff["dur"] = h.us;
    handoff["args"]["from_slot"] = h.from_slot;
    handoff["args"]["from_pid"] = h.from_pid;
    trace.push_back(std::move(handoff));
  }
  return {{"traceEvents", std::move(trace)},
          {"displayTimeUnit", "ns"},
          {"otherData", {{"source", "quanta-trace handoff"}, {"events_lost", lost}, {"first_event_ns", t0}}}};
}

}  // namespace

int run_handoff(const HandoffOptions& options) {
  HandoffSession session(options.binaries, options.pids, !options.timeline_file.empty());
  const std::vector<std::string>& binaries = session.binaries();
  if (!session.grant_attached()) {
    spdlog::info(
        "no quanta:grant probe in the binaries given: holds are not shown (add "
        "--binary quanta-arbiter)");
  }

  spdlog::info("Tracing quanta:* probes in {} for {} s (Ctrl-C to end)", fmt::join(binaries, ", "),
               options.duration_s);
  const double elapsed =
      run_bounded(std::chrono::duration<double>(options.duration_s), options.pids,
                  [&session](int timeout_ms) { session.poll(timeout_ms); });
  session.stop();

  const std::vector<quanta_handoff_event>& events = session.events();
  const auto hists = session.hists();
  const auto counts = session.probe_counts();
  Histogram all_handoff;
  Histogram all_wait;
  for (const auto& [device, h] : hists) {
    all_handoff.add(h.handoff);
    all_wait.add(h.gate_wait);
  }
  const uint64_t lost = session.events_lost();

  if (!options.timeline_file.empty()) {
    std::ofstream out(options.timeline_file);
    if (!out) throw TraceError("cannot write timeline " + options.timeline_file);
    out << build_timeline(events, lost).dump() << '\n';
    if (!out.flush()) throw TraceError("cannot write timeline " + options.timeline_file);
    if (lost) spdlog::warn("timeline misses {} events: the ring buffer was full", lost);
  }

  if (options.json) {
    nlohmann::json probes;
    for (int probe = 0; probe < QUANTA_PROBE_COUNT; ++probe)
      probes[kHandoffProbeNames[probe]] = counts[probe];
    nlohmann::json devices = nlohmann::json::array();
    for (const auto& [device, h] : hists) {
      devices.push_back({{"device", device},
                         {"handoff_latency", h.handoff.to_json()},
                         {"gate_wait", h.gate_wait.to_json()}});
    }
    nlohmann::json report = {{"tool", "handoff"},
                             {"binary", binaries.front()},
                             {"binaries", binaries},
                             {"duration_s", elapsed},
                             {"probes", probes},
                             {"handoff_latency", all_handoff.to_json()},
                             {"gate_wait", all_wait.to_json()},
                             {"devices", std::move(devices)}};
    if (!options.timeline_file.empty()) {
      report["timeline"] = {
          {"file", options.timeline_file}, {"events", events.size()}, {"events_lost", lost}};
    }
    std::cout << report.dump(2) << std::endl;
  } else {
    std::cout << "probes fired:";
    for (int probe = 0; probe < QUANTA_PROBE_COUNT; ++probe) {
      std::cout << ' ' << kHandoffProbeNames[probe] << '=' << counts[probe];
    }
    std::cout << '\n';
    if (hists.empty()) std::cout << "no handoffs or gate waits seen\n";
    for (const auto& [device, h] : hists) {
      std::cout << "\ndevice " << device << '\n';
      h.handoff.print(std::cout, "handoff latency (release -> gate_wait_end of a slot already waiting)");
      h.gate_wait.print(std::cout, "gate wait");
    }
  }

  if (!options.prometheus_file.empty()) {
    std::ofstream out(options.prometheus_file);
    if (!out) throw TraceError("cannot write " + options.prometheus_file);
    const char* handoff = "quanta_handoff_latency_seconds";
    const char* wait = "quanta_gate_wait_seconds";
    write_prometheus_header(out, handoff,
                            "Time from a release on a device to the gate wait end of the next slot already waiting.");
    for (const auto& [device, h] : hists) {
      h.handoff.write_prometheus(out, handoff, "device=\"" + std::to_string(device) + "\"");
    }
    write_prometheus_header(out, wait, "Time a tenant waited at the launch gate.");
    for (const auto& [device, h] : hists) {
      h.gate_wait.write_prometheus(out, wait, "device=\"" + std::to_string(device) + "\"");
    }
    if (!out.flush()) throw TraceError("cannot write " + options.prometheus_file);
  }
  return 0;
}

}  // namespace quanta::bpf
