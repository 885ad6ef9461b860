// `churn`: pods arriving, sleeping, waking and leaving beside a best-effort pod and a
// capped one, plus seeded random arrivals and departures. Every figure comes from simgpu's
// log: the longest a pod that wanted the GPU (each is a closed-loop batch process while it
// runs) went without device time, and over each 1 s window in which no pod came or went,
// how far each pod's share was from what it is promised (weights within a class, strict
// classes, the ceiling). Native time slicing gives every process the same.
#include <algorithm>
#include <cmath>
#include <random>

#include "bench/scenarios.h"
#include "bench/stats.h"

namespace quanta::bench {

namespace {

struct ChurnPod {
  std::string name;
  int weight = 1;
  std::string priority = "batch";  // batch | best-effort
  double max_share = 1.0;
  // When its processes run, as fractions of the run: [from, to) each.
  std::vector<std::pair<double, double>> runs;
};

std::vector<ChurnPod> churn_pods() {
  std::vector<ChurnPod> pods = {
      {"first", 1, "batch", 1.0, {{0.0, 1.0}}},
      {"best-effort", 1, "best-effort", 1.0, {{0.0, 1.0}}},
      {"capped", 1, "batch", 0.1, {{0.0, 1.0}}},
      {"second", 1, "batch", 1.0, {{0.25, 1.0}}},  // arrives after the first ran a while
      {"sleeper", 2, "batch", 1.0, {{0.0, 0.25}, {0.5, 1.0}}},
      {"leaver", 1, "batch", 1.0, {{0.0, 0.75}}},
  };
  std::mt19937 random(7);  // seeded: every run churns alike
  std::uniform_int_distribution<int> weight(1, 4);
  std::uniform_int_distribution<int> quarter(0, 3);
  for (int i = 0; i < 3; ++i) {
    const double from = quarter(random) / 4.0;
    const double to = std::min(1.0, from + (1 + quarter(random)) / 4.0);
    pods.push_back({"random-" + std::to_string(i), weight(random), "batch", 1.0, {{from, to}}});
  }
  return pods;
}

// What each active pod is promised: best-effort only when no batch pod is active; within
// the class, by weight, each up to its ceiling (the rest shared again).
std::vector<double> promised(const std::vector<const ChurnPod*>& active) {
  std::vector<double> share(active.size(), 0.0);
  bool batch = false;
  for (const ChurnPod* pod : active) batch |= pod->priority == "batch";
  std::vector<size_t> open;
  for (size_t i = 0; i < active.size(); ++i) {
    if ((active[i]->priority == "batch") == batch) open.push_back(i);
  }
  double left = 1.0;
  while (left > 1e-9 && !open.empty()) {
    double weights = 0;
    for (size_t i : open) weights += active[i]->weight;
    std::vector<size_t> still;
    double given = 0;
    for (size_t i : open) {
      if (share[i] + left * active[i]->weight / weights >= active[i]->max_share) {
        given += active[i]->max_share - share[i];
        share[i] = active[i]->max_share;
      } else {
        still.push_back(i);
      }
    }
    if (still.size() == open.size()) {
      for (size_t i : open) share[i] += left * active[i]->weight / weights;
      break;
    }
    left -= given;
    open = std::move(still);
  }
  return share;
}

struct Spawned {
  size_t pod;
  uint64_t from_ns;
  uint64_t to_ns;
  Process process;
};

// Every process of every pod, each started by simgpu's clock at its run's start (`start`
// plus its fraction of `run_ns`) and running to its end.
std::vector<Spawned> spawn_pods(const Bench& bench, Run& run, const std::vector<ChurnPod>& pods,
                                uint64_t start, uint64_t run_ns) {
  const int64_t offset = realtime_minus_monotonic_ns();
  std::vector<Spawned> spawned;
  for (size_t p = 0; p < pods.size(); ++p) {
    for (const auto& [from, to] : pods[p].runs) {
      const uint64_t from_ns = start + static_cast<uint64_t>(from * static_cast<double>(run_ns));
      const uint64_t to_ns = start + static_cast<uint64_t>(to * static_cast<double>(run_ns));
      const double length = static_cast<double>(to_ns - from_ns) / 1e9;
      std::vector<std::string> argv{bench.paths().tenant,
                                    "batch",
                                    "--kernel-ms",
                                    "2",
                                    "--depth",
                                    "2",
                                    "--seconds",
                                    std::to_string(length),
                                    "--json",
                                    "--start-at",
                                    std::to_string(static_cast<int64_t>(from_ns) + offset)};
      spawned.push_back({p, from_ns, to_ns, run.spawn(argv, pods[p].name, true, pods[p].name)});
    }
  }
  return spawned;
}

// Waits: the longest stretch each process went without a slice while it ran, by pod, and
// the longest of the batch pods, of the best-effort pod and of the capped pod.
void add_waits(Json& out, const std::vector<ChurnPod>& pods, const std::vector<Spawned>& spawned,
               const SimLog& log) {
  Json waits = Json::object();
  double max_wait = 0, best_effort_wait = 0, capped_wait = 0;
  std::string max_wait_pod;
  for (const Spawned& s : spawned) {
    uint64_t previous = s.from_ns, longest = 0;
    for (const Slice& slice : log.slices) {
      if (slice.pid != s.process.pid() || slice.device != 0) continue;
      const uint64_t until = std::min(slice.start_ns, s.to_ns);
      if (until > previous) longest = std::max(longest, until - previous);
      previous = std::max(previous, slice.end_ns);
    }
    if (s.to_ns > previous) longest = std::max(longest, s.to_ns - previous);
    const double ms = static_cast<double>(longest) / 1e6;
    const std::string& name = pods[s.pod].name;
    waits[name] = std::max(waits.value(name, 0.0), ms);
    if (pods[s.pod].priority == "best-effort") {
      best_effort_wait = std::max(best_effort_wait, ms);
    } else if (pods[s.pod].max_share < 1.0) {
      capped_wait = std::max(capped_wait, ms);  // it waits for its own ceiling too
    } else if (ms > max_wait) {
      max_wait = ms;
      max_wait_pod = name;
    }
  }
  out["max_wait_ms"] = figure(max_wait, 1);
  out["max_wait_pod"] = max_wait_pod;
  out["best_effort_max_wait_ms"] = figure(best_effort_wait, 1);
  out["capped_max_wait_ms"] = figure(capped_wait, 1);
  out["waits_ms"] = waits;
}

// Share error over each 1 s window in which the set of running processes did not change:
// how far each pod's share of the device time was from what it is promised.
void add_share_errors(Json& out, const std::vector<ChurnPod>& pods,
                      const std::vector<Spawned>& spawned, const SimLog& log, uint64_t start,
                      uint64_t run_ns) {
  Json windows = Json::array();
  double max_error = 0;
  for (uint64_t from = start; from + 1'000'000'000ull <= start + run_ns; from += 1'000'000'000ull) {
    const Window window{from, from + 1'000'000'000ull};
    bool steady = true;
    std::vector<const ChurnPod*> active;
    std::vector<pid_t> pids;
    for (const Spawned& s : spawned) {
      const bool covers = s.from_ns + 200'000'000ull <= window.start_ns && s.to_ns >= window.end_ns;
      const bool touches = s.from_ns < window.end_ns && s.to_ns > window.start_ns;
      if (touches && !covers) steady = false;
      if (covers) {
        active.push_back(&pods[s.pod]);
        pids.push_back(s.process.pid());
      }
    }
    if (!steady || active.empty()) continue;
    const auto busy = busy_ns_by_pid(log, window, 0);
    double total = 0;
    for (pid_t pid : pids) total += busy.count(pid) ? static_cast<double>(busy.at(pid)) : 0.0;
    if (total <= 0) continue;
    const std::vector<double> target = promised(active);
    double error = 0;
    for (size_t i = 0; i < active.size(); ++i) {
      const double got =
          (busy.count(pids[i]) ? static_cast<double>(busy.at(pids[i])) : 0.0) / total;
      error = std::max(error, std::fabs(got - target[i]) * 100);
    }
    max_error = std::max(max_error, error);
    windows.push_back({{"start_s", figure(static_cast<double>(from - start) / 1e9, 1)},
                       {"pods", active.size()},
                       {"share_error_pp", figure(error, 2)}});
  }
  out["windows"] = windows;
  out["max_share_error_pp"] = windows.empty() ? Json(nullptr) : figure(max_error, 2);
}

Json run_churn_config(const Bench& bench, bool quanta, double seconds) {
  Json out = Json::object();
  const std::string missing = quanta ? bench.missing_for_quanta() : bench.missing_for_tenants();
  if (!missing.empty()) {
    out["max_wait_ms"] = out["max_share_error_pp"] = nullptr;
    add_note(out, missing);
    return out;
  }
  const std::vector<ChurnPod> pods = churn_pods();
  Run run(bench, quanta ? "churn-quanta" : "churn-native", quanta);
  if (quanta) {
    ArbiterSettings arbiter;
    for (const ChurnPod& pod : pods) {
      arbiter.pods.push_back(PodPolicy{pod.name, pod.weight, pod.priority,
                                       pod.max_share < 1.0 ? std::to_string(pod.max_share) : "", "",
                                       ""});
    }
    const std::string why = run.start_arbiter(arbiter);
    if (!why.empty()) {
      out["max_wait_ms"] = out["max_share_error_pp"] = nullptr;
      add_note(out, why);
      return out;
    }
  }
  const double lead_s = 1.0;
  const uint64_t start = monotonic_now_ns() + static_cast<uint64_t>(lead_s * 1e9);
  const uint64_t run_ns = static_cast<uint64_t>(seconds * 1e9);
  std::vector<Spawned> spawned = spawn_pods(bench, run, pods, start, run_ns);
  if (quanta) {
    // Every process, those that start later included, is ready (and must be a tenant of
    // its pod) by the first start; the first second is in no window of the share error.
    sleep_until_monotonic(start);
    out["admission"] = run.check_admission(std::chrono::seconds(10)).to_json();
  }
  for (Spawned& s : spawned) {
    const ExitStatus status =
        s.process.wait(std::chrono::milliseconds(static_cast<int64_t>((seconds + 30) * 1000)));
    if (!status.exited || status.code != 0)
      add_note(out, pods[s.pod].name + ": " + status.describe());
  }
  if (quanta) run.note_refusals();
  SimLog log = run.sim_log();
  if (log.slices.empty()) {
    out["max_wait_ms"] = out["max_share_error_pp"] = nullptr;
    add_note(out, "simgpu wrote no execution log");
    return out;
  }
  add_waits(out, pods, spawned, log);
  add_share_errors(out, pods, spawned, log, start, run_ns);
  return out;
}

}  // namespace

Json run_churn(const Bench& bench) {
  const double seconds = bench.seconds(12.0, 4.0);
  Json out = {{"scenario", "churn"}};
  Json pods = Json::array();
  for (const ChurnPod& pod : churn_pods()) {
    Json runs = Json::array();
    for (const auto& [from, to] : pod.runs)
      runs.push_back({figure(from * seconds, 2), figure(to * seconds, 2)});
    pods.push_back({{"name", pod.name},
                    {"weight", pod.weight},
                    {"priority", pod.priority},
                    {"max_share", pod.max_share},
                    {"runs_s", runs}});
  }
  out["workload"] = {{"seconds", seconds}, {"kernel_ms", 2}, {"depth", 2}, {"pods", pods}};
  if (!bench.sim()) {
    add_note(out, "churn reads simgpu's execution log: run it with --gpu sim");
    return out;
  }
  out["native"] = guarded("native", [&] { return run_churn_config(bench, false, seconds); });
  out["quanta"] = guarded("quanta", [&] { return run_churn_config(bench, true, seconds); });
  auto value = [&](const char* config, const char* key) -> std::optional<double> {
    const Json& v = out[config][key];
    return v.is_number() ? std::optional<double>(v.get<double>()) : std::nullopt;
  };
  const std::optional<double> error_ratio =
      ratio(value("quanta", "max_share_error_pp"), value("native", "max_share_error_pp"));
  out["share_error_ratio"] = figure(error_ratio, 3);
  out["targets"] = {
      {"max_share_error_pp",
       target("quanta max_share_error_pp <= 3 over every window with a steady set of pods",
              value("quanta", "max_share_error_pp"), 3.0, true, 2)},
      {"share_error_ratio",
       target("quanta's worst window error at most half native's", error_ratio, 0.5, true, 3)}};
  return out;
}

}  // namespace quanta::bench
