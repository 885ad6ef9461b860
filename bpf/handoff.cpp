// quanta-trace handoff: attaches handoff.bpf.c to the quanta:* USDT probes of a binary or
// library and reports handoff latency and gate wait per device, plus an optional
// Chrome/Perfetto timeline of grants, releases, holds, waits and handoffs.
#include "bpf/handoff.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "bpf/histogram.h"
#include "bpf/tools.h"
#include "bpf/trace_run.h"
#include "handoff.skel.h"

namespace quanta::bpf {
namespace {

struct SkeletonDeleter {
  void operator()(handoff_bpf* skel) const { handoff_bpf__destroy(skel); }
};
struct LinkDeleter {
  void operator()(bpf_link* link) const { bpf_link__destroy(link); }
};
struct RingBufferDeleter {
  void operator()(ring_buffer* rb) const { ring_buffer__free(rb); }
};

const char* const kProbeNames[QUANTA_PROBE_COUNT] = {"gate_wait_begin", "gate_wait_end", "release",
                                                     "grant"};

struct DeviceHists {
  Histogram handoff;
  Histogram gate_wait;
};

std::map<uint32_t, DeviceHists> read_hists(handoff_bpf* skel) {
  std::map<uint32_t, DeviceHists> result;
  const int fd = bpf_map__fd(skel->maps.hists);
  quanta_handoff_key key{};
  quanta_handoff_key next{};
  quanta_handoff_key* prev = nullptr;
  while (bpf_map_get_next_key(fd, prev, &next) == 0) {
    quanta_hist raw{};
    if (bpf_map_lookup_elem(fd, &next, &raw) == 0) {
      auto& entry = result[next.device];
      (next.kind == QUANTA_HIST_HANDOFF ? entry.handoff : entry.gate_wait).add(raw);
    }
    key = next;
    prev = &key;
  }
  return result;
}

std::vector<uint64_t> read_probe_counts(handoff_bpf* skel) {
  const int cpus = libbpf_num_possible_cpus();
  std::vector<uint64_t> totals(QUANTA_PROBE_COUNT, 0);
  std::vector<uint64_t> per_cpu(static_cast<size_t>(std::max(cpus, 1)));
  const int fd = bpf_map__fd(skel->maps.probe_counts);
  for (uint32_t probe = 0; probe < QUANTA_PROBE_COUNT; ++probe) {
    if (bpf_map_lookup_elem(fd, &probe, per_cpu.data()) != 0) continue;
    for (uint64_t v : per_cpu) totals[probe] += v;
  }
  return totals;
}

int collect_event(void* ctx, void* data, size_t size) {
  if (size < sizeof(quanta_handoff_event)) return 0;
  auto* events = static_cast<std::vector<quanta_handoff_event>*>(ctx);
  events->push_back(*static_cast<const quanta_handoff_event*>(data));
  return 0;
}

// Chrome trace JSON (Perfetto opens it): probes as instants, gate waits, holds (grant to
// release of the same device and slot) and handoffs (release to the next slot's wait end)
// as complete events. Timestamps are microseconds from the first event.
nlohmann::json build_timeline(std::vector<quanta_handoff_event> events, uint64_t lost) {
  std::sort(events.begin(), events.end(),
            [](const auto& a, const auto& b) { return a.ts_ns < b.ts_ns; });
  const uint64_t t0 = events.empty() ? 0 : events.front().ts_ns;
  auto us = [t0](uint64_t ts_ns) { return static_cast<double>(ts_ns - t0) / 1e3; };
  nlohmann::json trace = nlohmann::json::array();
  std::map<std::pair<uint32_t, uint32_t>, uint64_t> grant_ts;  // (device, slot) -> ts
  std::map<uint32_t, quanta_handoff_event> pending_release;    // device -> release
  for (const auto& e : events) {
    const nlohmann::json args = {{"device", e.device}, {"slot", e.slot}};
    auto event = [&](const char* name, const char* ph, double ts_us) {
      nlohmann::json j = {{"name", name}, {"cat", "quanta"}, {"ph", ph},    {"ts", ts_us},
                          {"pid", e.pid}, {"tid", e.tid},    {"args", args}};
      if (ph[0] == 'i') j["s"] = "t";
      return j;
    };
    switch (e.probe) {
      case QUANTA_PROBE_GRANT:
        trace.push_back(event("grant", "i", us(e.ts_ns)));
        grant_ts[{e.device, e.slot}] = e.ts_ns;
        break;
      case QUANTA_PROBE_RELEASE: {
        trace.push_back(event("release", "i", us(e.ts_ns)));
        auto granted = grant_ts.find({e.device, e.slot});
        if (granted != grant_ts.end() && granted->second <= e.ts_ns) {
          auto hold = event("hold", "X", us(granted->second));
          hold["dur"] = static_cast<double>(e.ts_ns - granted->second) / 1e3;
          trace.push_back(std::move(hold));
          grant_ts.erase(granted);
        }
        pending_release[e.device] = e;
        break;
      }
      case QUANTA_PROBE_GATE_WAIT_BEGIN:
        trace.push_back(event("gate_wait_begin", "i", us(e.ts_ns)));
        break;
      case QUANTA_PROBE_GATE_WAIT_END: {
        const uint64_t begin = e.value_ns <= e.ts_ns - t0 ? e.ts_ns - e.value_ns : t0;
        auto wait = event("gate_wait", "X", us(begin));
        wait["dur"] = static_cast<double>(e.ts_ns - begin) / 1e3;
        wait["args"]["wait_ns"] = e.value_ns;
        trace.push_back(std::move(wait));
        auto rel = pending_release.find(e.device);
        if (rel != pending_release.end() && rel->second.slot != e.slot) {
          auto handoff = event("handoff", "X", us(rel->second.ts_ns));
          handoff["dur"] = static_cast<double>(e.ts_ns - rel->second.ts_ns) / 1e3;
          handoff["args"]["from_slot"] = rel->second.slot;
          handoff["args"]["from_pid"] = rel->second.pid;
          trace.push_back(std::move(handoff));
          pending_release.erase(rel);
        }
        break;
      }
      default:
        break;
    }
  }
  return {{"traceEvents", std::move(trace)},
          {"displayTimeUnit", "ns"},
          {"otherData", {{"source", "quanta-trace handoff"}, {"events_lost", lost}, {"first_event_ns", t0}}}};
}

// Checks that `path` is an ELF file and returns its absolute path.
std::string checked_binary(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    throw TraceError("binary '" + path + "' does not exist or is not a regular file");
  }
  const std::string binary = std::filesystem::absolute(path, ec).string();
  char magic[4] = {};
  std::ifstream file(binary, std::ios::binary);
  if (!file.read(magic, sizeof magic) || std::memcmp(magic,
                                                     "\x7f"
                                                     "ELF",
                                                     4) != 0) {
    throw TraceError("binary '" + binary + "' is not an ELF executable or shared library");
  }
  return binary;
}

}  // namespace

int run_handoff(const HandoffOptions& options) {
  if (options.binaries.empty()) throw TraceError("handoff needs --binary PATH");
  std::vector<std::string> binaries;
  for (const std::string& path : options.binaries) binaries.push_back(checked_binary(path));
  require_processes(options.pids);

  std::unique_ptr<handoff_bpf, SkeletonDeleter> skel(handoff_bpf__open());
  if (!skel) throw TraceError("cannot open the handoff BPF object: " + errno_text(errno));
  skel->rodata->emit_events = !options.timeline_file.empty();
  if (!skel->rodata->emit_events) {
    // No timeline: the ring buffer stays empty, so give it the smallest legal size.
    bpf_map__set_max_entries(skel->maps.events, static_cast<uint32_t>(::getpagesize()));
  }
  if (int err = handoff_bpf__load(skel.get()); err != 0) {
    throw TraceError("cannot load the handoff BPF programs (root needed): " + errno_text(err));
  }

  bpf_program* programs[QUANTA_PROBE_COUNT] = {
      skel->progs.handle_gate_wait_begin, skel->progs.handle_gate_wait_end,
      skel->progs.handle_release, skel->progs.handle_grant};
  std::vector<std::unique_ptr<bpf_link, LinkDeleter>> links;
  std::vector<pid_t> targets = options.pids;
  if (targets.empty()) targets.push_back(-1);  // every process that maps the binary
  bool grant_found = false;
  for (int probe = 0; probe < QUANTA_PROBE_COUNT; ++probe) {
    bool found = false;
    for (const std::string& binary : binaries) {
      for (pid_t pid : targets) {
        bpf_link* link = bpf_program__attach_usdt(programs[probe], pid, binary.c_str(), "quanta",
                                                  kProbeNames[probe], nullptr);
        if (!link) {
          const int err = errno;
          if (err == ENOENT) break;  // not in this binary; maybe in another
          throw TraceError("cannot attach USDT probe quanta:" + std::string(kProbeNames[probe]) +
                           " in '" + binary + "'" +
                           (pid > 0 ? " for pid " + std::to_string(pid) : std::string()) + ": " +
                           errno_text(err));
        }
        links.emplace_back(link);
        found = true;
      }
    }
    if (probe == QUANTA_PROBE_GRANT) {
      grant_found = found;
    } else if (!found) {
      throw TraceError("binary '" + binaries.front() + "'" +
                       (binaries.size() > 1 ? " (nor any other --binary)" : "") +
                       " has no USDT probe quanta:" + kProbeNames[probe] +
                       " (name the executable or library built with Quanta's probes)");
    }
  }
  if (!grant_found) {
    spdlog::info(
        "no quanta:grant probe in the binaries given: holds are not shown (add "
        "--binary quanta-arbiter)");
  }

  std::vector<quanta_handoff_event> events;
  std::unique_ptr<ring_buffer, RingBufferDeleter> rb;
  if (!options.timeline_file.empty()) {
    rb.reset(ring_buffer__new(bpf_map__fd(skel->maps.events), collect_event, &events, nullptr));
    if (!rb) throw TraceError("cannot open the event ring buffer: " + errno_text(errno));
  }

  spdlog::info("Tracing quanta:* probes in {} for {} s (Ctrl-C to end)", fmt::join(binaries, ", "),
               options.duration_s);
  const double elapsed = run_bounded(
      std::chrono::duration<double>(options.duration_s), options.pids, [&rb](int timeout_ms) {
        if (rb) {
          ring_buffer__poll(rb.get(), timeout_ms);
        } else {
          std::this_thread::sleep_for(std::chrono::milliseconds(timeout_ms));
        }
      });
  links.clear();
  if (rb) ring_buffer__consume(rb.get());

  const auto hists = read_hists(skel.get());
  const auto counts = read_probe_counts(skel.get());
  Histogram all_handoff;
  Histogram all_wait;
  for (const auto& [device, h] : hists) {
    all_handoff.add(h.handoff);
    all_wait.add(h.gate_wait);
  }
  const uint64_t lost = skel->bss->events_lost;

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
      probes[kProbeNames[probe]] = counts[probe];
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
      std::cout << ' ' << kProbeNames[probe] << '=' << counts[probe];
    }
    std::cout << '\n';
    if (hists.empty()) std::cout << "no handoffs or gate waits seen\n";
    for (const auto& [device, h] : hists) {
      std::cout << "\ndevice " << device << '\n';
      h.handoff.print(std::cout, "handoff latency (release -> next slot's gate_wait_end)");
      h.gate_wait.print(std::cout, "gate wait");
    }
  }

  if (!options.prometheus_file.empty()) {
    std::ofstream out(options.prometheus_file);
    if (!out) throw TraceError("cannot write " + options.prometheus_file);
    const char* handoff = "quanta_handoff_latency_seconds";
    const char* wait = "quanta_gate_wait_seconds";
    write_prometheus_header(out, handoff,
                            "Time from a release on a device to the next slot's gate wait end.");
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
