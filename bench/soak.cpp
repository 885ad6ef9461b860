// `soak`: 64 tenants on one simulated GPU for --minutes, with random kills, arbiter
// restarts, live policy changes (`quantactl set`) and allocation churn. Counts invariant
// violations (must be 0), follows the handoff p99 over the run and the arbiter's RSS and
// descriptor count over time (must stay flat). Every random choice comes from one seed
// (QUANTA_SOAK_SEED replays a run), and every event is kept in the report. Every pod is
// registered with a cgroup of its own, as a node's containers are; a tenant the arbiter
// does not list (so it runs ungated) is a violation.
#include <dirent.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "bench/scenarios.h"
#include "bench/stats.h"

namespace quanta::bench {

namespace {

using Ms = std::chrono::milliseconds;

constexpr int kTenants = 64;
constexpr int kBatchPods = 4;    // b0..b3
constexpr int kBatchSlots = 44;  // batch tenants in pods b0..b3
constexpr int kChurnPods = 2;    // c0, c1
constexpr int kChurnSlots = 16;  // allocation churn in capped pods c0, c1
constexpr int kKeeperPods = 2;   // k0, k1
constexpr int kKeepers = 4;      // in pods k0, k1: hold a known amount for the whole run
static_assert(kBatchSlots + kChurnSlots + kKeepers == kTenants);
constexpr uint64_t kMi = 1ull << 20;
constexpr uint64_t kContext = 16 * kMi;      // QUANTA_CONTEXT_OVERHEAD of every tenant
constexpr uint64_t kKeeperHolds = 64 * kMi;  // two allocations of 32 MiB each
constexpr uint64_t kKept = (kKeepers / kKeeperPods) * (kContext + kKeeperHolds);  // per pod
constexpr int kChurnMaxMi = 96;  // a churner holds one allocation of 16..96 MiB at a time
// The ledger charges every context (docs/memory-caps.md), so a churn pod's cap holds each
// of its slots' context and largest allocation, and two more for processes that died and
// are not reclaimed yet: no context charge is ever refused. The cap is met by one slot per
// pod that asks for the whole cap at once (its own context is already charged: always
// denied, and a denial never reserves anything).
constexpr int kChurnPerPod = kChurnSlots / kChurnPods;
constexpr uint64_t kChurnCap = 1024 * kMi;
static_assert(kChurnCap >= kContext + (kChurnPerPod - 1 + 2) * (kContext + kChurnMaxMi * kMi),
              "the cap holds the over-reaching slot's context, the other slots' and two more");
constexpr double kIdleBoundMs = 3000;  // lease (1 s) + downtime (<= 0.5 s) + a loaded machine
constexpr double kWarmupS = 5;

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

struct ArbiterSample {
  double t_s;
  pid_t pid;
  long rss_kib;
  int fds;
  int tenants;
};

long rss_kib(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::strtol(line.c_str() + 6, nullptr, 10);
  }
  return -1;
}

int fd_count(pid_t pid) {
  int count = 0;
  if (DIR* dir = opendir(("/proc/" + std::to_string(pid) + "/fd").c_str())) {
    while (dirent* entry = readdir(dir)) count += entry->d_name[0] != '.';
    closedir(dir);
  }
  return count;
}

// simgpu's execution log read as it grows: idle gaps and handoffs on device 0. Lines are
// appended as slices end, and slices of one device never overlap, so they arrive in order.
class LogFollower {
 public:
  explicit LogFollower(std::string path) : path_(std::move(path)) {}

  // Reads what was appended; gaps at switches go to the current window.
  void poll(uint64_t warm_from_ns, std::vector<std::string>* violations) {
    std::ifstream in(path_);
    if (!in) return;
    in.seekg(static_cast<std::streamoff>(offset_));
    std::string line;
    while (std::getline(in, line)) {
      if (in.eof()) break;  // a line still being written: read it next time
      offset_ += line.size() + 1;
      std::istringstream fields(line);
      std::string kind, context;
      int device = 0;
      long pid = 0;
      unsigned long long start = 0, end = 0;
      if (!(fields >> kind >> device >> context >> pid >> start >> end) || kind != "slice" ||
          device != 0)
        continue;
      if (last_end_ != 0 && start > last_end_) {
        const uint64_t gap = start - last_end_;
        if (pid != last_pid_) window_.push_back(static_cast<double>(gap) / 1000.0);
        if (start >= warm_from_ns && static_cast<double>(gap) / 1e6 > longest_idle_ms_) {
          longest_idle_ms_ = static_cast<double>(gap) / 1e6;
          if (longest_idle_ms_ > kIdleBoundMs && violations->size() < 200) {
            violations->push_back("the GPU sat idle " +
                                  std::to_string(static_cast<int>(longest_idle_ms_)) +
                                  " ms while batch tenants waited");
          }
        }
      } else if (last_end_ != 0 && pid != last_pid_) {
        window_.push_back(0);
      }
      last_end_ = std::max<uint64_t>(last_end_, end);
      last_pid_ = pid;
      ++slices_;
    }
  }

  // Closes the current window of handoffs: {t_s, handoffs, p50_us, p99_us}.
  Json close_window(double t_s) {
    Json out = {{"t_s", std::round(t_s)}, {"handoffs", window_.size()}};
    if (!window_.empty()) {
      out["p50_us"] = std::round(percentile(window_, 50).value_or(0) * 10) / 10;
      out["p99_us"] = std::round(percentile(window_, 99).value_or(0) * 10) / 10;
    }
    window_.clear();
    return out;
  }

  double longest_idle_ms() const { return longest_idle_ms_; }
  uint64_t slices() const { return slices_; }

 private:
  std::string path_;
  uint64_t offset_ = 0;
  uint64_t last_end_ = 0;
  long last_pid_ = 0;
  std::vector<double> window_;
  double longest_idle_ms_ = 0;
  uint64_t slices_ = 0;
};

struct Slot {
  std::string pod;
  enum Kind { batch, churn, overreach, keeper } kind = batch;
  Process process;
  bool running = false;
  bool killed = false;  // by the soak itself
  int started = 0;
  double started_s = 0;     // when its process started, in the run's seconds
  int unlisted = 0;         // status samples in a row that did not list its process
  double next_start_s = 0;  // an over-reaching slot waits 1-3 s between its runs
};

// The median of the samples in [from, to) of the run (after each arbiter's warm-up).
template <typename Field>
std::optional<double> median_between(const std::vector<ArbiterSample>& samples, double from,
                                     double to, Field field) {
  std::vector<double> values;
  for (const ArbiterSample& s : samples)
    if (s.t_s >= from && s.t_s < to) values.push_back(field(s));
  if (values.empty()) return std::nullopt;
  return percentile(values, 50);
}

// The pods of a soak: b0..b3 batch (weights 1, 2, 4, 8), c0..c1 capped churn pods, k0..k1
// keepers capped at 1 GiB; 20 ms quanta; the tenants' context overhead.
ArbiterSettings soak_settings() {
  ArbiterSettings settings;
  settings.quantum = "20ms";
  settings.context_overhead =
      std::to_string(kContext / kMi) + "Mi";  // registered pods take the arbiter's
  static const int kWeights[] = {1, 2, 4, 8};
  const std::string churn_cap = std::to_string(kChurnCap / kMi) + "Mi";
  for (int i = 0; i < kBatchPods; ++i)
    settings.pods.push_back({"b" + std::to_string(i), kWeights[i % 4], "", "", "", ""});
  for (int i = 0; i < kChurnPods; ++i)
    settings.pods.push_back({"c" + std::to_string(i), 1, "", "", churn_cap, ""});
  for (int i = 0; i < kKeeperPods; ++i)
    settings.pods.push_back({"k" + std::to_string(i), 1, "", "", "1Gi", ""});
  return settings;
}

// The 64 slots: batch tenants over b0..b3, churners over c0..c1 (the first of each pod's
// slots over-reaches its cap), keepers over k0..k1.
std::vector<Slot> soak_slots() {
  std::vector<Slot> slots(kTenants);
  for (int i = 0; i < kTenants; ++i) {
    if (i < kBatchSlots) {
      slots[i].pod = "b" + std::to_string(i % kBatchPods);
    } else if (i < kBatchSlots + kChurnSlots) {
      const int churn = i - kBatchSlots;
      slots[i].pod = "c" + std::to_string(churn % kChurnPods);
      slots[i].kind = churn < kChurnPods ? Slot::overreach : Slot::churn;
    } else {
      slots[i].pod = "k" + std::to_string((i - kBatchSlots - kChurnSlots) % kKeeperPods);
      slots[i].kind = Slot::keeper;
    }
  }
  return slots;
}

// What happened over the run, for the report.
struct SoakCounts {
  long tenants_started = 0, kills = 0, restarts = 0, policy_changes = 0, clean_exits = 0,
       oom_denials = 0, overreach_exits = 0, overreach_denials = 0;
};

// One soak run against a started arbiter: every step of the loop (tenants started and
// reaped, a tenant killed, the arbiter restarted, a weight changed, the arbiter sampled and
// the ledgers checked, the simgpu log followed), then the end's checks and the report.
class Soak {
 public:
  Soak(const Bench& bench, Run& run, ArbiterSettings settings, double run_s, uint64_t seed)
      : bench_(bench),
        run_(run),
        settings_(std::move(settings)),
        run_s_(run_s),
        rng_(seed),
        slots_(soak_slots()),
        begin_(std::chrono::steady_clock::now()),
        log_(simgpu_log(run)),
        warm_from_ns_(monotonic_now_ns() + static_cast<uint64_t>(kWarmupS * 1e9)),
        next_kill_(uniform(1, 3)),
        next_restart_(uniform(15, 30)),
        window_s_(std::max(10.0, run_s / 12)),
        next_window_(window_s_) {}

  // Until the run's time is up, or 200 violations.
  void loop() {
    while (seconds_since(begin_) < run_s_) {
      const double t = seconds_since(begin_);
      start_and_reap(t);
      if (t >= next_kill_) kill_a_tenant(t);
      if (t >= next_restart_ && t < run_s_ - 15) restart_arbiter(t);
      if (t >= next_policy_) change_a_weight(t);
      if (t >= next_sample_) sample_arbiter(t);
      log_.poll(warm_from_ns_, &violations_);
      if (t >= next_window_) {
        windows_.push_back(log_.close_window(t));
        next_window_ = t + window_s_;
      }
      if (!violations_.empty() && violations_.size() >= 200) break;
      std::this_thread::sleep_for(Ms(100));
    }
  }

  // The run's last window closes before the teardown, whose kills of every tenant at once
  // leave gaps at switches that say nothing about handoffs (reported, not judged). Keepers
  // still hold their memory at the end; then everything stops and nothing may be left.
  void finish() {
    log_.poll(warm_from_ns_, &violations_);
    windows_.push_back(log_.close_window(seconds_since(begin_)));
    for (auto& slot : slots_) {
      if (slot.running && slot.process.running()) {
        slot.killed = true;
        kill(slot.process.pid(), SIGKILL);
      }
    }
    for (auto& slot : slots_) reap(slot);
    std::this_thread::sleep_for(Ms(1500));
    check_nothing_left();
    if (counts_.overreach_exits > 0 && counts_.overreach_denials == 0)
      violation("no allocation was ever denied at a churn pod's cap: the cap was not exercised");
    log_.poll(warm_from_ns_, &violations_);
    Json teardown = log_.close_window(seconds_since(begin_));
    teardown["teardown"] = true;
    windows_.push_back(teardown);
  }

  // Handoff p99 drift: the run's last window against its first.
  Json handoff_drift(bool* ok) const {
    std::vector<double> p99s;
    for (const auto& w : windows_)
      if (w.contains("p99_us") && !w.contains("teardown"))
        p99s.push_back(w["p99_us"].get<double>());
    Json handoff = {{"windows", windows_}, {"window_s", window_s_}};
    *ok = true;
    if (p99s.size() >= 2) {
      const double first = p99s.front(), last = p99s[p99s.size() - 1];
      handoff["first_p99_us"] = first;
      handoff["last_p99_us"] = last;
      handoff["drift_us"] = std::round((last - first) * 10) / 10;
      handoff["bound"] = "last window's p99 at most 3x the first's plus 2 ms";
      *ok = last <= 3 * first + 2000;
    } else {
      handoff["note"] = "fewer than two windows with handoffs";
    }
    handoff["ok"] = *ok;
    return handoff;
  }

  // RSS and descriptors: the median of the run's last third against its first third,
  // leaving out each arbiter's first 5 s.
  Json arbiter_growth(bool* flat) const {
    std::vector<ArbiterSample> steady;
    for (const ArbiterSample& s : samples_) {
      double since = 0;
      for (double start : incarnation_starts_)
        if (start <= s.t_s) since = start;
      if (s.t_s - since >= 5 && s.rss_kib > 0) steady.push_back(s);
    }
    Json arbiter = {{"restarts", counts_.restarts}};
    Json series = Json::array();
    for (const ArbiterSample& s : samples_)
      series.push_back({{"t_s", s.t_s},
                        {"pid", s.pid},
                        {"rss_kib", s.rss_kib},
                        {"fds", s.fds},
                        {"tenants", s.tenants}});
    arbiter["samples"] = series;
    *flat = true;
    auto rss = [](const ArbiterSample& s) { return double(s.rss_kib); };
    auto fds = [](const ArbiterSample& s) { return double(s.fds); };
    const auto rss_first = median_between(steady, 0, run_s_ / 3, rss);
    const auto rss_last = median_between(steady, run_s_ * 2 / 3, run_s_ + 1, rss);
    const auto fds_first = median_between(steady, 0, run_s_ / 3, fds);
    const auto fds_last = median_between(steady, run_s_ * 2 / 3, run_s_ + 1, fds);
    if (rss_first && rss_last && fds_first && fds_last) {
      arbiter["rss_first_third_kib"] = *rss_first;
      arbiter["rss_last_third_kib"] = *rss_last;
      arbiter["fds_first_third"] = *fds_first;
      arbiter["fds_last_third"] = *fds_last;
      arbiter["bound"] =
          "last third's median RSS within max(8 MiB, 50%) and descriptors within 32 of the "
          "first third's";
      *flat = *rss_last <= *rss_first + std::max(8192.0, *rss_first * 0.5) &&
              *fds_last <= *fds_first + 32;
    } else {
      arbiter["note"] = "too few steady samples to judge";
    }
    arbiter["flat"] = *flat;
    return arbiter;
  }

  const SoakCounts& counts() const { return counts_; }
  const Json& restarts() const { return restart_events_; }
  const std::vector<std::string>& violations() const { return violations_; }
  const LogFollower& log() const { return log_; }

 private:
  // The run's simgpu log, from the environment it gives its children.
  static std::string simgpu_log(Run& run) {
    std::string path;
    for (const std::string& entry : run.environment("", false).materialize()) {
      if (entry.rfind("SIMGPU_LOG=", 0) == 0) path = entry.substr(11);
    }
    return path;
  }

  double uniform(double a, double b) { return std::uniform_real_distribution<double>(a, b)(rng_); }
  size_t pick(size_t n) {
    return static_cast<size_t>(std::uniform_int_distribution<size_t>(0, n - 1)(rng_));
  }

  void violation(const std::string& what) {
    if (violations_.size() < 200) violations_.push_back(what);
    spdlog::warn("soak: violation: {}", what);
  }

  // The tenant command line of a slot's kind, and what its process holds at most beyond
  // its context.
  std::vector<std::string> tenant_argv(const Slot& slot, uint64_t* holds) {
    std::vector<std::string> argv{bench_.paths().tenant, "--json"};
    *holds = 0;
    if (slot.kind == Slot::batch) {
      argv.insert(argv.end(),
                  {"batch", "--seconds", std::to_string(static_cast<int>(uniform(4, 15))),
                   "--kernel-ms", std::to_string(static_cast<int>(uniform(1, 4))), "--depth", "2"});
    } else if (slot.kind == Slot::churn) {
      const int mi = static_cast<int>(uniform(16, kChurnMaxMi));
      *holds = static_cast<uint64_t>(mi) * kMi;
      argv.insert(argv.end(), {"alloc", "--bytes", std::to_string(mi) + "Mi", "--count",
                               std::to_string(static_cast<int>(uniform(200, 1500))), "--free",
                               "--hold-ms", "2"});
    } else if (slot.kind == Slot::overreach) {
      argv.insert(argv.end(), {"alloc", "--bytes", std::to_string(kChurnCap / kMi) + "Mi",
                               "--count", std::to_string(static_cast<int>(uniform(20, 100))),
                               "--free", "--hold-ms", "20"});
    } else {
      *holds = kKeeperHolds;
      argv.insert(argv.end(), {"alloc", "--bytes", "32Mi", "--count", "2", "--hold-ms",
                               std::to_string(static_cast<long>((run_s_ + 120) * 1000))});
    }
    return argv;
  }

  void spawn(Slot& slot, int index) {
    uint64_t holds = 0;
    const std::vector<std::string> argv = tenant_argv(slot, &holds);
    Environment env = run_.environment(slot.pod, true);
    // The arbiter hands its context overhead to the tenants it admits; this covers a
    // process that starts while it is down, until it joins.
    env.set("QUANTA_CONTEXT_OVERHEAD", std::to_string(kContext / kMi) + "Mi");
    const std::string base =
        run_.dir() + "/t" + std::to_string(index) + "-" + std::to_string(slot.started);
    try {
      slot.process = run_.spawn_tenant(argv, slot.pod, env, base + ".out", base + ".err");
      most_held_[slot.process.pid()] = kContext + holds;
      slot.running = true;
      slot.killed = false;
      slot.started_s = seconds_since(begin_);
      slot.unlisted = 0;
      ++slot.started;
      ++counts_.tenants_started;
    } catch (const std::exception& error) {
      violation(std::string("could not start a tenant: ") + error.what());
    }
  }

  // A tenant that ended by itself must have ended cleanly.
  void reap(Slot& slot) {
    if (!slot.running || slot.process.running()) return;
    slot.running = false;
    const ExitStatus status = slot.process.wait(Ms(0));
    if (const std::string refusal = shim_refusal(read_file(slot.process.stderr_path()));
        !refusal.empty())
      violation("tenant pid " + std::to_string(slot.process.pid()) + " of pod " + slot.pod +
                " was not placed by the arbiter: " + refusal);
    if (slot.killed) return;
    const Json report = Json::parse(read_file(slot.process.stdout_path()), nullptr, false);
    const bool ok = status.exited && status.code == 0 && report.is_object() &&
                    report.value("ok", false) && report.value("error_count", 0) == 0;
    if (!ok) {
      violation("tenant pid " + std::to_string(slot.process.pid()) + " of pod " + slot.pod +
                " ended with " + status.describe() + ": " +
                last_line(read_file(slot.process.stderr_path())));
      return;
    }
    ++counts_.clean_exits;
    counts_.oom_denials += report.value("oom", 0l);
    if (slot.kind == Slot::overreach) {
      // Its runs end in milliseconds (denials hold nothing): pace them.
      slot.next_start_s = seconds_since(begin_) + uniform(1, 3);
      ++counts_.overreach_exits;
      counts_.overreach_denials += report.value("oom", 0l);
    }
  }

  // Reaps every slot and starts up to four that are free. A process that starts while the
  // arbiter is down runs uncapped until it joins (the node's enforce mode decides that,
  // docs/reliability.md): no slot asks for the whole cap just before a restart, so a late
  // join never brings an allocation past it.
  void start_and_reap(double t) {
    int spawned_now = 0;
    const bool restart_near = next_restart_ - t < 2 && t < run_s_ - 15;
    for (int i = 0; i < kTenants; ++i) {
      reap(slots_[i]);
      if (!slots_[i].running && spawned_now < 4 && t >= slots_[i].next_start_s &&
          !(restart_near && slots_[i].kind == Slot::overreach)) {
        spawn(slots_[i], i);
        ++spawned_now;
      }
    }
  }

  // A random tenant that is not a keeper, SIGKILLed wherever it is.
  void kill_a_tenant(double t) {
    const size_t i = pick(kBatchSlots + kChurnSlots);
    if (slots_[i].running && slots_[i].process.running()) {
      slots_[i].killed = true;
      kill(slots_[i].process.pid(), SIGKILL);
      ++counts_.kills;
    }
    next_kill_ = t + uniform(0.5, 2.5);
  }

  void restart_arbiter(double t) {
    const double down_ms = uniform(20, 500);
    restart_events_.push_back({{"t_s", std::round(t * 10) / 10},
                               {"event", "arbiter SIGKILL"},
                               {"down_ms", std::round(down_ms)}});
    kill(run_.arbiter_pid(), SIGKILL);
    std::this_thread::sleep_for(Ms(static_cast<int>(down_ms)));
    if (std::string why = run_.start_arbiter(settings_); !why.empty())
      violation("the arbiter did not restart: " + why);
    ++counts_.restarts;
    arbiter_started_s_ = seconds_since(begin_);
    incarnation_starts_.push_back(arbiter_started_s_);
    next_restart_ = t + uniform(25, 50);
  }

  // `quantactl set` of a random batch pod's weight, as an operator would.
  void change_a_weight(double t) {
    const std::string pod = "b" + std::to_string(pick(kBatchPods));
    const std::string weight = std::to_string(1 + pick(8));
    Process ctl = Process::spawn({bench_.paths().quantactl, "--admin-socket", run_.admin_socket(),
                                  "set", Run::pod_key(pod), "weight=" + weight},
                                 run_.environment("", false), run_.dir() + "/ctl.out",
                                 run_.dir() + "/ctl.err");
    const ExitStatus status = ctl.wait(Ms(5000));
    if (status.exited && status.code == 0)
      ++counts_.policy_changes;
    else if (t - arbiter_started_s_ > 3)
      violation("quantactl set " + pod + " weight=" + weight + " failed (" + status.describe() +
                "): " + last_line(read_file(run_.dir() + "/ctl.err")));
    next_policy_ = t + uniform(1, 4);
  }

  // Every two seconds: the arbiter's status, its ledgers checked against what the listed
  // processes hold, and its RSS and descriptors.
  void sample_arbiter(double t) {
    next_sample_ = t + 2;
    const pid_t pid = run_.arbiter_pid();
    const Json status = admin_request(run_.admin_socket(), {{"cmd", "status"}});
    if (status.is_null() || !status.value("ok", false)) {
      if (t - arbiter_started_s_ > 3 && ++unreachable_ >= 3)
        violation("the arbiter's admin socket did not answer for 6 s");
      return;
    }
    unreachable_ = 0;
    int tenants = 0;
    std::map<std::string, uint64_t> pod_used;
    std::map<std::string, uint64_t> pod_most;  // what the listed processes can hold
    std::set<pid_t> listed;
    for (const auto& gpu : status["gpus"]) {
      for (const auto& tenant : gpu["tenants"]) {
        ++tenants;
        listed.insert(tenant.value("pid", 0));
        const std::string pod = tenant.value("pod", "");
        const uint64_t used = tenant.value("pod_memory_used", 0ull);
        const uint64_t cap = tenant.value("memory_cap", 0ull);
        pod_used[pod] = used;
        auto most = most_held_.find(tenant.value("pid", 0));
        pod_most[pod] += most != most_held_.end() ? most->second : 0;
        if (cap != 0 && used > cap)
          violation("pod " + pod + "'s ledger " + std::to_string(used) + " passed its cap " +
                    std::to_string(cap));
      }
    }
    check_listed(t, listed);
    check_churn_ledgers(t, pod_used, pod_most);
    check_keeper_ledgers(t, pod_used);
    if (pid > 0)
      samples_.push_back({std::round(t * 10) / 10, pid, rss_kib(pid), fd_count(pid), tenants});
  }

  // Every tenant that has run 3 s under an arbiter up for 3 s is listed in its pod: one
  // missing from two samples in a row was not admitted and runs ungated.
  void check_listed(double t, const std::set<pid_t>& listed) {
    for (Slot& slot : slots_) {
      if (!slot.running || !slot.process.running() || listed.count(slot.process.pid()) != 0 ||
          t - slot.started_s < 3 || t - arbiter_started_s_ < 3) {
        slot.unlisted = 0;
        continue;
      }
      if (++slot.unlisted == 2)
        violation("tenant pid " + std::to_string(slot.process.pid()) + " of pod " + slot.pod +
                  " has run " + std::to_string(static_cast<int>(t - slot.started_s)) +
                  " s but the arbiter does not list it: not admitted, so it runs ungated");
    }
  }

  // A churn pod's ledger never holds more than its listed processes can (a context and one
  // allocation each, killed ones included until the arbiter lets them go); more for three
  // samples (6 s) is a byte counted twice or never given back.
  void check_churn_ledgers(double t, const std::map<std::string, uint64_t>& pod_used,
                           std::map<std::string, uint64_t>& pod_most) {
    for (int c = 0; c < kChurnPods; ++c) {
      const std::string pod = "c" + std::to_string(c);
      auto it = pod_used.find(Run::pod_key(pod));
      const bool over = it != pod_used.end() && it->second > pod_most[Run::pod_key(pod)] &&
                        t - arbiter_started_s_ > 3 && t > kWarmupS;
      churn_excess_[pod] = over ? churn_excess_[pod] + 1 : 0;
      if (churn_excess_[pod] == 3)
        violation("pod " + pod + "'s ledger is " + std::to_string(it->second) +
                  " while its processes can hold at most " +
                  std::to_string(pod_most[Run::pod_key(pod)]));
    }
  }

  // The keepers hold exactly kKept per pod for the whole run; a ledger that stays off for
  // three samples (6 s) lost or double-counted bytes.
  void check_keeper_ledgers(double t, const std::map<std::string, uint64_t>& pod_used) {
    for (int k = 0; k < kKeeperPods; ++k) {
      const std::string pod = "k" + std::to_string(k);
      auto it = pod_used.find(Run::pod_key(pod));
      const bool off =
          it != pod_used.end() && it->second != kKept && t - arbiter_started_s_ > 3 && t > kWarmupS;
      keeper_mismatch_[pod] = off ? keeper_mismatch_[pod] + 1 : 0;
      if (keeper_mismatch_[pod] == 3)
        violation("pod " + pod + "'s ledger is " + std::to_string(it->second) +
                  " while its process holds " + std::to_string(kKept));
    }
  }

  // With every process gone: no tenant listed, no byte left in a ledger.
  void check_nothing_left() {
    const Json after = admin_request(run_.admin_socket(), {{"cmd", "status"}});
    if (!after.is_object()) {
      violation("the arbiter's admin socket did not answer at the end");
      return;
    }
    for (const auto& gpu : after["gpus"]) {
      if (!gpu["tenants"].empty())
        violation("tenants still listed after every process was gone: " + gpu["tenants"].dump());
      if (gpu.value("memory_used", 0ull) != 0)
        violation("the GPU's ledgers still hold " + gpu["memory_used"].dump() +
                  " bytes after every process was gone");
    }
  }

  const Bench& bench_;
  Run& run_;
  const ArbiterSettings settings_;
  const double run_s_;
  std::mt19937_64 rng_;
  std::vector<Slot> slots_;
  const std::chrono::steady_clock::time_point begin_;
  LogFollower log_;
  const uint64_t warm_from_ns_;
  std::vector<std::string> violations_;
  SoakCounts counts_;
  // The most each process can hold, as the ledger counts it: its context and its largest
  // allocation that fits the cap.
  std::map<pid_t, uint64_t> most_held_;
  Json restart_events_ = Json::array();
  std::vector<ArbiterSample> samples_;
  Json windows_ = Json::array();
  double arbiter_started_s_ = 0;
  std::vector<double> incarnation_starts_ = {0};
  double next_kill_, next_restart_, next_policy_ = 2, next_sample_ = 1;
  const double window_s_;
  double next_window_;
  int unreachable_ = 0;
  std::map<std::string, int> keeper_mismatch_;  // consecutive samples a keeper's ledger was off
  std::map<std::string, int> churn_excess_;     // ... a churn pod's ledger passed what it holds
};

// The soak's report: workload, events, violations, handoff drift and the arbiter's growth,
// and one summary line on stderr.
Json soak_report(Json out, const Soak& soak, double minutes, uint64_t seed) {
  bool drift_ok = true, flat = true;
  const Json handoff = soak.handoff_drift(&drift_ok);
  const Json arbiter = soak.arbiter_growth(&flat);
  const SoakCounts& n = soak.counts();
  const std::vector<std::string>& violations = soak.violations();
  out["minutes"] = minutes;
  out["seed"] = seed;
  out["workload"] = {
      {"tenants", kTenants},
      {"batch", kBatchSlots},
      {"churn", kChurnSlots},
      {"keepers", kKeepers},
      {"pods", "b0..b3 batch (weights 1,2,4,8, changed live), c0..c1 churn (" +
                   std::to_string(kChurnCap / kMi) + "Mi" +
                   " caps; one slot each asks for the whole cap), k0..k1 keepers (two "
                   "processes each, 64Mi + context held per process)"}};
  out["events"] = {{"tenants_started", n.tenants_started},
                   {"clean_exits", n.clean_exits},
                   {"kills", n.kills},
                   {"arbiter_restarts", n.restarts},
                   {"policy_changes", n.policy_changes},
                   {"oom_denials", n.oom_denials},
                   {"cap_denials", n.overreach_denials},
                   {"slices_logged", soak.log().slices()},
                   {"restarts", soak.restarts()}};
  out["violations"] = violations.size();
  out["violation_list"] = violations;
  out["longest_idle_ms"] = std::round(soak.log().longest_idle_ms() * 10) / 10;
  out["idle_bound_ms"] = kIdleBoundMs;
  out["handoff"] = handoff;
  out["arbiter"] = arbiter;
  const bool failed = !violations.empty() || !drift_ok || !flat;
  out["failed"] = failed;

  std::string summary =
      "soak: " + std::to_string(minutes) + " min, seed " + std::to_string(seed) + ": " +
      std::to_string(violations.size()) + " violations; " + std::to_string(n.tenants_started) +
      " tenants started, " + std::to_string(n.kills) + " killed, " + std::to_string(n.restarts) +
      " arbiter restarts, " + std::to_string(n.policy_changes) + " policy changes; longest idle " +
      std::to_string(static_cast<int>(soak.log().longest_idle_ms())) + " ms";
  if (handoff.contains("first_p99_us"))
    summary += "; handoff p99 " + handoff["first_p99_us"].dump() + " -> " +
               handoff["last_p99_us"].dump() + " us";
  if (arbiter.contains("rss_first_third_kib"))
    summary += "; arbiter RSS " + arbiter["rss_first_third_kib"].dump() + " -> " +
               arbiter["rss_last_third_kib"].dump() + " KiB, fds " +
               arbiter["fds_first_third"].dump() + " -> " + arbiter["fds_last_third"].dump();
  summary += failed ? " — FAILED" : " — ok";
  std::fprintf(stderr, "%s\n", summary.c_str());
  for (const std::string& v : violations) std::fprintf(stderr, "  violation: %s\n", v.c_str());
  return out;
}

}  // namespace

Json run_soak(const Bench& bench) {
  Json out = {{"scenario", "soak"}};
  if (!bench.sim()) {
    add_note(out,
             "the soak runs on simgpu only (--gpu sim): it kills tenants and restarts the arbiter "
             "at random");
    out["failed"] = true;
    return out;
  }
  if (std::string missing = bench.missing_for_quanta(); !missing.empty()) {
    add_note(out, missing);
    out["failed"] = true;
    return out;
  }
  const double minutes = bench.minutes().value_or(bench.quick() ? 0.5 : 2.0);
  const char* given_seed = std::getenv("QUANTA_SOAK_SEED");
  const uint64_t seed =
      given_seed != nullptr
          ? std::strtoull(given_seed, nullptr, 10)
          : static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  spdlog::info("soak: {} tenants for {} min, seed {} (replay with QUANTA_SOAK_SEED={})", kTenants,
               minutes, seed, seed);

  Run run(bench, "soak", true, SimSettings{});
  const ArbiterSettings settings = soak_settings();
  if (std::string why = run.start_arbiter(settings); !why.empty()) {
    add_note(out, "quanta-arbiter: " + why);
    out["failed"] = true;
    return out;
  }
  Soak soak(bench, run, settings, minutes * 60.0, seed);
  soak.loop();
  soak.finish();
  return soak_report(std::move(out), soak, minutes, seed);
}

}  // namespace quanta::bench
