// What the arbiter says about the GPU, checked against what proves it independently:
// a live /metrics scrape against promtool, the catalogue in docs/metrics.md (both ways)
// and `quantactl status`; contention attribution, per-pod utilisation and capacity against
// simgpu's execution log; the endpoint against clients that stall; `quantactl top` in a
// real terminal (tmux) with a pod name full of escape sequences.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "tests/integration/harness.h"
#include "tests/support/http.h"

namespace quanta::integration {
namespace {

using nlohmann::json;
using test_support::connect_tcp;

// ---------------------------------------------------------------------------------------
// Scraping and reading the text format.

struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

struct Scrape {
  int status = 0;
  std::string body;
  std::map<std::string, std::string> types;  // family -> counter/gauge/histogram
  std::vector<Sample> samples;

  // Samples of `name` whose labels include every one of `want`.
  std::vector<const Sample*> find(const std::string& name,
                                  const std::map<std::string, std::string>& want = {}) const {
    std::vector<const Sample*> out;
    for (const Sample& s : samples) {
      if (s.name != name) continue;
      bool ok = true;
      for (const auto& [k, v] : want) {
        auto it = s.labels.find(k);
        ok = ok && it != s.labels.end() && it->second == v;
      }
      if (ok) out.push_back(&s);
    }
    return out;
  }
  // The one sample; NaN (and a test failure) when there is not exactly one.
  double value(const std::string& name, const std::map<std::string, std::string>& want = {}) const {
    const auto found = find(name, want);
    if (found.size() != 1) {
      std::string labels;
      for (const auto& [k, v] : want) labels += k + "=" + v + " ";
      ADD_FAILURE() << found.size() << " samples of " << name << " {" << labels << "}";
      return std::nan("");
    }
    return found[0]->value;
  }
};

void parse_exposition(Scrape* s) {
  std::istringstream lines(s->body);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("# TYPE ", 0) == 0) {
      std::istringstream f(line.substr(7));
      std::string name, type;
      f >> name >> type;
      s->types[name] = type;
      continue;
    }
    if (line.empty() || line[0] == '#') continue;
    Sample sample;
    size_t i = line.find_first_of("{ ");
    sample.name = line.substr(0, i);
    if (line[i] == '{') {
      ++i;
      while (line[i] != '}') {
        const size_t eq = line.find('=', i);
        const std::string key = line.substr(i, eq - i);
        std::string value;
        size_t k = eq + 2;  // past ="
        for (; line[k] != '"'; ++k) {
          if (line[k] == '\\') {
            ++k;
            value += line[k] == 'n' ? '\n' : line[k];
          } else {
            value += line[k];
          }
        }
        sample.labels[key] = value;
        i = k + 1;
        if (line[i] == ',') ++i;
      }
      ++i;
    }
    try {
      sample.value = std::stod(line.substr(i + 1));
    } catch (const std::exception&) {
      ADD_FAILURE() << "not a sample line: " << line;
      continue;
    }
    s->samples.push_back(sample);
  }
}

Scrape http_get(const std::string& address, const std::string& path) {
  const test_support::HttpAnswer answer = test_support::http_get(address, path);
  Scrape s;
  s.status = answer.status;
  s.body = answer.body;
  if (s.status != 0 && path == "/metrics") parse_exposition(&s);
  return s;
}

// The endpoint's address, from the arbiter's status.
std::string metrics_address(const World& world) {
  const json status = world.admin({{"cmd", "status"}});
  return status.is_object() ? status.value("metrics_listen", "") : "";
}

bool require_tool(const char* tool, const char* package) {
  if (std::system((std::string("command -v ") + tool + " >/dev/null 2>&1").c_str()) == 0)
    return true;
  if (std::getenv("QUANTA_REQUIRE_BPF") != nullptr) {
    ADD_FAILURE() << tool << " is not installed (Debian package " << package << ")";
  }
  return false;
}

// Runs a shell command; its exit status and what it printed.
std::pair<int, std::string> shell(const std::string& command) {
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return {-1, ""};
  std::string out;
  char buf[4096];
  while (fgets(buf, sizeof buf, p) != nullptr) out += buf;
  const int rc = pclose(p);
  return {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, out};
}

// The documented families: `| \`quanta_x\` | type | ...` rows of docs/metrics.md.
std::map<std::string, std::string> catalogue() {
  std::ifstream in(QUANTA_SOURCE_DIR "/docs/metrics.md");
  std::map<std::string, std::string> out;
  const std::regex row(R"(^\| `(quanta_[a-z_]+)` \| (counter|gauge|histogram) \|)");
  std::string line;
  std::smatch m;
  while (std::getline(in, line)) {
    if (std::regex_search(line, m, row)) out[m[1]] = m[2];
  }
  return out;
}

std::string metrics_toml(const std::string& more = "") {
  return "[metrics]\nlisten = \"127.0.0.1:0\"\n" + more;
}

// Like eventually(), for predicates that spawn a process: looks every 100 ms.
template <typename Predicate>
bool within(double timeout_s, Predicate predicate) {
  const uint64_t deadline = monotonic_ns() + static_cast<uint64_t>(timeout_s * 1e9);
  while (!predicate()) {
    if (monotonic_ns() > deadline) return false;
    sleep_ms(100);
  }
  return true;
}

double busy_fraction(const std::vector<Slice>& slices, pid_t pid, uint64_t from, uint64_t to) {
  const auto busy = busy_by_pid(slices, from, to);
  auto it = busy.find(pid);
  return it == busy.end() ? 0.0 : static_cast<double>(it->second) / static_cast<double>(to - from);
}

// ---------------------------------------------------------------------------------------

TEST(Metrics, LiveScrapeIsCleanMatchesTheCatalogueAndAgreesWithQuantactlStatus) {
  ArbiterConfig config;
  config.pods = {{"demo/light", 1, ""}, {"demo/heavy", 4, "2Gi"}, {"demo/capped", 1, "1Gi"}};
  config.nvml_interval = "200ms";
  config.extra = metrics_toml();
  // A context costs 300 MiB on this simulated GPU, as on a real one: the arbiter measures it
  // and charges it, so the capped pod's 1 GiB holds its context and one 512 MiB allocation.
  World world("metrics-scrape", config, WorldExtras{.sim_env = {{"SIMGPU_CONTEXT_MEMORY", "300Mi"}}});
  world.start_arbiter();
  Child light = world.spawn_tenant({"batch", "--seconds", "6"}, "demo/light", true);
  Child heavy = world.spawn_tenant({"batch", "--seconds", "6"}, "demo/heavy", true);
  // 300 Mi of context and 512 Mi fit the 1 Gi cap; the next three 512 Mi do not.
  Child capped = world.spawn_tenant(
      {"alloc", "--count", "4", "--bytes", "512Mi", "--hold-ms", "5000"}, "demo/capped", true);
  // A process that names no pod is refused (and runs ungated).
  Child nameless = world.spawn_tenant({"alloc", "--count", "1", "--bytes", "1Mi"}, "", true);
  EXPECT_EQ(nameless.wait(20), 0) << nameless.err();
  sleep_ms(3000);

  const std::string address = metrics_address(world);
  ASSERT_FALSE(address.empty()) << world.arbiter_log();
  const json before = world.admin({{"cmd", "status"}});
  // A scrape is served from a snapshot at most MetricsServer::kFreshNs (100 ms) old: wait
  // that long so the one served was taken after `before`.
  sleep_ms(150);
  const Scrape scrape = http_get(address, "/metrics");
  const json after = world.admin({{"cmd", "status"}});
  ASSERT_EQ(scrape.status, 200) << world.arbiter_log();
  ASSERT_TRUE(before.value("ok", false) && after.value("ok", false));

  if (require_tool("promtool", "prometheus")) {
    const std::string path = "/tmp/quanta-scrape-" + std::to_string(getpid()) + ".prom";
    std::ofstream(path) << scrape.body;
    const auto [rc, said] = shell("promtool check metrics < " + path);
    std::remove(path.c_str());
    EXPECT_EQ(rc, 0) << said;
    EXPECT_EQ(said, "") << said;
  }

  // The catalogue and the scrape name the same families, with the same types.
  const auto documented = catalogue();
  ASSERT_GT(documented.size(), 35u) << "docs/metrics.md lost its tables";
  for (const auto& [name, type] : documented) {
    auto it = scrape.types.find(name);
    if (it == scrape.types.end()) {
      ADD_FAILURE() << name << " is documented but not exported";
    } else {
      EXPECT_EQ(it->second, type) << name;
    }
  }
  for (const auto& [name, type] : scrape.types) {
    EXPECT_EQ(documented.count(name), 1u) << name << " is exported but not in docs/metrics.md";
  }

  // Figures agree with quantactl status (taken just before and just after the scrape).
  EXPECT_EQ(scrape.value("quanta_arbiter_generation"), before.value("generation", 0));
  const std::string uuid = before["gpus"][0].value("uuid", "");
  EXPECT_EQ(
      scrape.find("quanta_gpu_info", {{"UUID", uuid}, {"gpu", "0"}, {"model_name", "simgpu H100"}})
          .size(),
      1u);
  std::map<std::string, json> tenant_before, tenant_after;
  for (const json& t : before["gpus"][0]["tenants"]) tenant_before[t.value("pod", "")] = t;
  for (const json& t : after["gpus"][0]["tenants"]) tenant_after[t.value("pod", "")] = t;
  for (const char* name : {"light", "heavy", "capped"}) {
    const std::string key = std::string("demo/") + name;
    SCOPED_TRACE(key);
    ASSERT_EQ(tenant_before.count(key), 1u);
    const json& b = tenant_before[key];
    const json& a = tenant_after[key];
    const std::map<std::string, std::string> pod = {{"namespace", "demo"}, {"pod", name}};
    EXPECT_EQ(scrape.value("quanta_pod_weight", pod), b.value("weight", 0));
    EXPECT_EQ(scrape.value("quanta_pod_memory_used_bytes", pod), b.value("pod_memory_used", 0ull));
    EXPECT_EQ(scrape.value("quanta_process_memory_used_bytes",
                           {{"pod", name}, {"pid", std::to_string(b.value("pid", 0))}}),
              b.value("memory_used", 0ull));
    if (b.value("memory_cap", 0ull) == 0) {
      EXPECT_TRUE(scrape.find("quanta_pod_memory_limit_bytes", pod).empty())
          << "a pod without a cap has no limit series";
    } else {
      EXPECT_EQ(scrape.value("quanta_pod_memory_limit_bytes", pod), b.value("memory_cap", 0ull));
    }
    EXPECT_NEAR(scrape.value("quanta_pod_target_share_ratio", pod), b.value("target_share", 0.0),
                0.05);
    EXPECT_NEAR(scrape.value("quanta_pod_achieved_share_ratio", pod),
                b.value("achieved_share", 0.0), 0.08);
    const double grants = scrape.value("quanta_pod_grants_total", pod);
    EXPECT_GE(grants, b.value("grants", 0ull));
    EXPECT_LE(grants, a.value("grants", 0ull));
    EXPECT_EQ(scrape.value("quanta_pod_revoke_timeouts_total", pod),
              b.value("revoke_timeouts", 0ull));
    EXPECT_EQ(scrape.value("quanta_pod_info", {{"pod", name}, {"priority", "batch"}}), 1);
  }
  // The pod's time adds up to its life so far, split by state.
  double total = 0;
  for (const char* state : {"running", "waiting", "draining", "idle"})
    total += scrape.value("quanta_pod_time_seconds_total", {{"pod", "light"}, {"state", state}});
  EXPECT_GT(total, 2.0);
  EXPECT_LT(total, 8.0);
  EXPECT_GT(scrape.value("quanta_pod_waited_behind_seconds_total",
                         {{"pod", "light"}, {"holder_namespace", "demo"}, {"holder_pod", "heavy"}}),
            0.5);
  EXPECT_EQ(scrape.value("quanta_pod_alloc_denied_total", {{"pod", "capped"}}), 3);
  EXPECT_GE(scrape.value("quanta_arbiter_admissions_refused_total", {{"reason", "no-pod"}}), 1);
  EXPECT_EQ(scrape.value("quanta_arbiter_tenant_connections"), 3);
  EXPECT_GT(scrape.value("quanta_gpu_switches_total", {{"gpu", "0"}}), 10);
  EXPECT_GT(scrape.value("quanta_gpu_handoff_seconds_count", {{"gpu", "0"}}), 10);
  EXPECT_EQ(scrape.value("quanta_gpu_memory_caps_bytes", {{"gpu", "0"}}), 3.0 * (1ull << 30));

  const Scrape health = http_get(address, "/healthz");
  EXPECT_EQ(health.status, 200);
  EXPECT_EQ(health.body, "ok\n");
  EXPECT_EQ(light.wait(30), 0) << light.err();
  EXPECT_EQ(heavy.wait(30), 0) << heavy.err();
  EXPECT_EQ(capped.wait(30), 0) << capped.err();
  EXPECT_EQ(capped.json().value("oom", -1), 3) << capped.out();
}

// Three batch pods with weights 1:2:4: each pod's time running and its waits behind each
// neighbour, as `quantactl explain` tells them, against the slices simgpu's engine ran.
TEST(Metrics, ContentionAttributionAgreesWithTheExecutionLog) {
  ArbiterConfig config;
  config.pods = {{"att/a", 1, ""}, {"att/b", 2, ""}, {"att/c", 4, ""}};
  config.nvml_interval = "200ms";
  config.extra = metrics_toml();
  World world("metrics-attribution", config);
  world.start_arbiter();
  std::map<std::string, Child> tenants;
  for (const char* pod : {"att/a", "att/b", "att/c"})
    tenants[pod] = world.spawn_tenant({"batch", "--seconds", "5", "--kernel-ms", "2"}, pod, true);
  std::map<std::string, pid_t> pid_of;
  for (auto& [pod, child] : tenants) {
    ASSERT_EQ(child.wait(40), 0) << child.err();
    pid_of[pod] = child.json().value("pid", 0);
  }
  const std::vector<Slice> slices = read_sim_log(world.sim_log_path());
  ASSERT_GT(slices.size(), 100u);
  std::map<pid_t, uint64_t> busy = busy_by_pid(slices, 0, UINT64_MAX);
  uint64_t all = 0;
  for (auto& [pid, ns] : busy) all += ns;

  std::map<std::string, json> explain;
  for (auto& [pod, pid] : pid_of) {
    explain[pod] = world.admin({{"cmd", "explain"}, {"pod", pod}});
    ASSERT_TRUE(explain[pod].value("ok", false)) << explain[pod].dump();
    ASSERT_EQ(explain[pod]["gpus"].size(), 1u);
  }
  for (auto& [pod, pid] : pid_of) {
    SCOPED_TRACE(pod);
    const json& g = explain[pod]["gpus"][0];
    const double logged = static_cast<double>(busy[pid]) / 1e9;
    const double held = g["phases"].value("running", 0.0) + g["phases"].value("draining", 0.0);
    // The engine runs a pod's work only while it holds the grant (or drains): held time
    // covers the busy time, and exceeds it by handoffs and the idle tail of each hold.
    EXPECT_GE(held, 0.97 * logged) << "held " << held << " s, the engine ran it " << logged << " s";
    EXPECT_LE(held, 1.15 * logged + 0.1)
        << "held " << held << " s, the engine ran it " << logged << " s";
    // Its share of the device time matches its share of the holds.
    EXPECT_NEAR(
        static_cast<double>(busy[pid]) / static_cast<double>(all),
        held /
            [&] {
              double sum = 0;
              for (auto& [p, e] : explain)
                sum += e["gpus"][0]["phases"].value("running", 0.0) +
                       e["gpus"][0]["phases"].value("draining", 0.0);
              return sum;
            }(),
        0.03);
    // A closed-loop batch pod wants the GPU whenever it does not hold it, so while it
    // waited, each neighbour held the GPU about as long as the engine ran that neighbour.
    std::map<std::string, double> behind;
    for (const json& b : g["behind"]) behind[b.value("pod", "")] = b.value("seconds", 0.0);
    for (auto& [other, other_pid] : pid_of) {
      if (other == pod) continue;
      const double ran = static_cast<double>(busy[other_pid]) / 1e9;
      EXPECT_NEAR(behind[other], ran, 0.15 * ran + 0.15) << "waiting behind " << other;
    }
    EXPECT_LT(behind[""], 0.3) << "waits with nobody holding the GPU are handoffs only";
  }
  // The weights show through: c got about four times a's time.
  const double a = static_cast<double>(busy[pid_of["att/a"]]),
               c = static_cast<double>(busy[pid_of["att/c"]]);
  EXPECT_NEAR(c / a, 4.0, 1.0);
  // And the words name the neighbour that delayed `a` most.
  Child explain_a = world.spawn(
      {QUANTACTL_BINARY, "--admin-socket", world.admin_socket(), "explain", "att/a"}, {});
  ASSERT_EQ(explain_a.wait(10), 0) << explain_a.err();
  EXPECT_NE(explain_a.out().find("mostly att/c's."), std::string::npos) << explain_a.out();
  EXPECT_NE(explain_a.out().find("(it has left the GPU)"), std::string::npos) << explain_a.out();
}

// One pod keeps the GPU busy, one runs 2 ms requests 50 times a second: each pod's
// utilisation is its own busy fraction, as the engine ran it, not one value for both.
// The shim ends its own quantum at the end the arbiter publishes, so the arbiter never
// revokes it: the tail in which it waits for its queued work after that end is still a
// drain, in its pod's drain histogram, its draining time and what explain says.
TEST(Metrics, HoldersThatEndTheirOwnQuantaAreSeenDraining) {
  ArbiterConfig config;
  config.extra = metrics_toml();
  World world("metrics-own-drains", config);
  world.start_arbiter();
  Child one = world.spawn_tenant({"batch", "--seconds", "4", "--kernel-ms", "3", "--depth", "2"},
                                 "drains/one", true);
  Child two = world.spawn_tenant({"batch", "--seconds", "4", "--kernel-ms", "3", "--depth", "2"},
                                 "drains/two", true);
  sleep_ms(3000);
  const Scrape scrape = http_get(metrics_address(world), "/metrics");
  const json explain = world.admin({{"cmd", "explain"}, {"pod", "drains/one"}});
  const json status = world.admin({{"cmd", "status"}});
  ASSERT_EQ(one.wait(30), 0) << one.err();
  ASSERT_EQ(two.wait(30), 0) << two.err();
  ASSERT_EQ(scrape.status, 200);
  const double grants = scrape.value("quanta_pod_grants_total", {{"pod", "one"}});
  const double drains = scrape.value("quanta_pod_drain_seconds_count", {{"pod", "one"}});
  EXPECT_GT(grants, 20) << "two busy tenants with 20 ms quanta take turns";
  ASSERT_GT(status["gpus"][0]["ended_by_holder"].get<uint64_t>(), 10u)
      << "the holders end their own quanta: " << status.dump();
  EXPECT_GT(drains, grants / 4) << "a holder with queued work drains past its quantum's end";
  const double drained_s =
      scrape.value("quanta_pod_time_seconds_total", {{"pod", "one"}, {"state", "draining"}});
  EXPECT_GT(drained_s, 0.01);
  ASSERT_TRUE(explain.value("ok", false)) << explain.dump();
  EXPECT_GT(explain["gpus"][0]["phases"]["draining"].get<double>(), 0.01) << explain.dump();
}

// The start time is read once: were it worked out again at each scrape (now minus uptime)
// it would move by the clocks' jitter, and QuantaArbiterRestarting (changes() of it) would
// count every move as a restart.
TEST(Metrics, TheStartTimeStaysTheSameFromScrapeToScrape) {
  ArbiterConfig config;
  config.extra = metrics_toml();
  World world("metrics-start-time", config);
  world.start_arbiter();
  const std::string address = metrics_address(world);
  // Busy tenants make each observation pass take a while, as on a working node.
  Child one = world.spawn_tenant({"batch", "--seconds", "6", "--kernel-ms", "2", "--depth", "2"},
                                 "start-time/one", true);
  Child two = world.spawn_tenant({"batch", "--seconds", "6", "--kernel-ms", "2", "--depth", "2"},
                                 "start-time/two", true);
  std::set<double> seen;
  for (int i = 0; i < 50; ++i) {
    const Scrape scrape = http_get(address, "/metrics");
    ASSERT_EQ(scrape.status, 200);
    seen.insert(scrape.value("quanta_arbiter_start_time_seconds", {}));
    sleep_ms(100);
  }
  ASSERT_EQ(one.wait(30), 0) << one.err();
  ASSERT_EQ(two.wait(30), 0) << two.err();
  EXPECT_EQ(seen.size(), 1u) << "quanta_arbiter_start_time_seconds took " << seen.size()
                             << " values in 50 scrapes, from " << std::fixed << *seen.begin()
                             << " to " << *seen.rbegin();
}

TEST(Metrics, PerPodUtilisationIsEachPodsOwnBusyTime) {
  ArbiterConfig config;
  config.nvml_interval = "200ms";
  config.extra = metrics_toml();
  World world("metrics-utilisation", config);
  world.start_arbiter();
  Child busy =
      world.spawn_tenant({"batch", "--seconds", "7", "--kernel-ms", "2"}, "util/busy", true);
  Child light = world.spawn_tenant(
      {"requests", "--seconds", "7", "--rate", "50", "--kernel-ms", "2"}, "util/light", true);
  sleep_ms(5500);
  const std::string address = metrics_address(world);
  const uint64_t at = monotonic_ns();
  const Scrape scrape = http_get(address, "/metrics");
  ASSERT_EQ(scrape.status, 200);
  ASSERT_EQ(busy.wait(30), 0) << busy.err();
  ASSERT_EQ(light.wait(30), 0) << light.err();
  EXPECT_EQ(scrape.find("quanta_gpu_utilization_source_info", {{"source", "driver"}}).size(), 1u);
  const std::vector<Slice> slices = read_sim_log(world.sim_log_path());
  // The stats window is 5 s (give or take the tick); NVML's figures lag by a sample.
  const uint64_t from = at - 5'000'000'000ull;
  const double busy_logged = busy_fraction(slices, busy.json().value("pid", 0), from, at);
  const double light_logged = busy_fraction(slices, light.json().value("pid", 0), from, at);
  const double busy_util = scrape.value("quanta_pod_utilization_ratio", {{"pod", "busy"}});
  const double light_util = scrape.value("quanta_pod_utilization_ratio", {{"pod", "light"}});
  EXPECT_NEAR(busy_util, busy_logged, 0.08);
  EXPECT_NEAR(light_util, light_logged, 0.05);
  EXPECT_NEAR(light_logged, 0.10, 0.04) << "the light pod's own duty cycle";
  EXPECT_GT(busy_util - light_util, 0.3) << "every pod shows one value";
  EXPECT_NEAR(scrape.value("quanta_gpu_busy_ratio", {{"gpu", "0"}}), busy_logged + light_logged,
              0.1);
  // The light pod holds the grant longer than it keeps the GPU busy (the idle tail before
  // its release): held share and utilisation are different figures.
  EXPECT_GE(scrape.value("quanta_pod_achieved_share_ratio", {{"pod", "light"}}), light_util - 0.02);
}

// The GPU looks half idle and its memory mostly free, yet 7 of its 10 GiB are promised to
// one pod's cap: no new pod that needs 40% of the memory fits, and the metric says so.
TEST(Capacity, AHalfBusyGpuWithMostMemoryPromisedFitsNoFortyPercentPod) {
  ArbiterConfig config;
  config.pods = {{"cap/big", 1, "7Gi"}};
  config.nvml_interval = "200ms";
  config.extra = metrics_toml(
      "fit_probes = [{share = 0.25, memory = \"40%\"}, {share = 0.25, memory = \"20%\"}]\n");
  World world("capacity", config, WorldExtras{.sim_env = {{"SIMGPU_MEMORY", "10Gi"}}});
  world.start_arbiter();
  Child memory = world.spawn_tenant(
      {"alloc", "--count", "1", "--bytes", "1Gi", "--hold-ms", "8000"}, "cap/big", true);
  Child work = world.spawn_tenant(
      {"requests", "--seconds", "7", "--rate", "250", "--kernel-ms", "2"}, "cap/big", true);
  sleep_ms(5000);
  const uint64_t at = monotonic_ns();
  const Scrape scrape = http_get(metrics_address(world), "/metrics");
  ASSERT_EQ(scrape.status, 200) << world.arbiter_log();
  ASSERT_EQ(work.wait(30), 0) << work.err();
  const std::vector<Slice> slices = read_sim_log(world.sim_log_path());
  const double logged =
      busy_fraction(slices, work.json().value("pid", 0), at - 4'000'000'000ull, at);
  EXPECT_NEAR(logged, 0.5, 0.15) << "the engine ran the GPU about half the time";

  const std::map<std::string, std::string> gpu = {{"gpu", "0"}};
  const double total = scrape.value("quanta_gpu_memory_total_bytes", gpu);
  EXPECT_EQ(total, 10.0 * (1ull << 30));
  EXPECT_NEAR(scrape.value("quanta_gpu_busy_ratio", gpu), logged, 0.15) << "it looks half busy";
  EXPECT_LT(scrape.value("quanta_gpu_memory_used_bytes", gpu), 0.2 * total) << "and mostly free";
  EXPECT_EQ(scrape.value("quanta_gpu_memory_caps_bytes", gpu), 7.0 * (1ull << 30));
  EXPECT_EQ(scrape.value("quanta_gpu_memory_unpromised_bytes", gpu), 3.0 * (1ull << 30));
  EXPECT_GE(scrape.value("quanta_gpu_new_pod_share_ratio", gpu), 0.4) << "GPU time is there";
  EXPECT_EQ(
      scrape.value("quanta_gpu_pods_fit", {{"gpu", "0"}, {"share", "0.25"}, {"memory", "40%"}}), 0)
      << "but 4 GiB is not";
  EXPECT_EQ(scrape.value("quanta_node_pods_fit", {{"share", "0.25"}, {"memory", "40%"}}), 0);
  EXPECT_EQ(
      scrape.value("quanta_gpu_pods_fit", {{"gpu", "0"}, {"share", "0.25"}, {"memory", "20%"}}), 1);
  memory.signal(SIGKILL);
}

// The whole GPU is promised (minimums 0.9 and 0.1) and both pods want it all the time: the
// figures say so. Each pod's minimum is exported, a newcomer would get nothing and no pod of
// a 10% share fits, whatever the weights alone would suggest; `quantactl top` agrees.
TEST(Capacity, GuaranteedMinimumsLeaveNoRoomOnAFullyPromisedGpu) {
  ArbiterConfig config;
  config.nvml_interval = "200ms";
  config.extra = metrics_toml("fit_probes = [{share = 0.1, memory = \"1%\"}]\n") +
                 "[pod.\"min/most\"]\nmin_share = 0.9\n[pod.\"min/rest\"]\nmin_share = 0.1\n";
  World world("capacity-minimums", config);
  world.start_arbiter();
  Child most = world.spawn_tenant({"batch", "--seconds", "7", "--kernel-ms", "2"}, "min/most", true);
  Child rest = world.spawn_tenant({"batch", "--seconds", "7", "--kernel-ms", "2"}, "min/rest", true);
  sleep_ms(4000);
  const Scrape scrape = http_get(metrics_address(world), "/metrics");
  ASSERT_EQ(scrape.status, 200) << world.arbiter_log();
  Child top = world.spawn(
      {QUANTACTL_BINARY, "--admin-socket", world.admin_socket(), "top", "--once"}, {});
  ASSERT_EQ(top.wait(10), 0) << top.err();
  ASSERT_EQ(most.wait(30), 0) << most.err();
  ASSERT_EQ(rest.wait(30), 0) << rest.err();

  EXPECT_NEAR(scrape.value("quanta_pod_min_share_ratio", {{"pod", "most"}}), 0.9, 1e-9);
  EXPECT_NEAR(scrape.value("quanta_pod_min_share_ratio", {{"pod", "rest"}}), 0.1, 1e-9);
  const std::map<std::string, std::string> gpu = {{"gpu", "0"}};
  EXPECT_LT(scrape.value("quanta_gpu_new_pod_share_ratio", gpu), 0.02);
  EXPECT_EQ(scrape.value("quanta_gpu_pods_fit", {{"gpu", "0"}, {"share", "0.1"}, {"memory", "1%"}}),
            0);
  EXPECT_EQ(scrape.value("quanta_node_pods_fit", {{"share", "0.1"}, {"memory", "1%"}}), 0);
  EXPECT_NEAR(scrape.value("quanta_gpu_min_share_promised_ratio", gpu), 1.0, 1e-9);
  EXPECT_NE(top.out().find("a new batch pod would get 0.0%"), std::string::npos) << top.out();
  EXPECT_NE(top.out().find("minimums promised 100.0%"), std::string::npos) << top.out();
}

// Clients that connect and say nothing, send half a request, or never read what they
// asked for: the arbiter keeps scheduling and answering its admin socket, and a proper
// scrape is still served beside them.
TEST(Metrics, StallingClientsNeverHoldUpTheArbiter) {
  ArbiterConfig config;
  config.nvml_interval = "200ms";
  config.extra = metrics_toml();
  World world("metrics-stall", config);
  world.start_arbiter();
  Child a = world.spawn_tenant({"batch", "--seconds", "6"}, "stall/a", true);
  Child b = world.spawn_tenant({"batch", "--seconds", "6"}, "stall/b", true);
  const std::string address = metrics_address(world);
  ASSERT_FALSE(address.empty());
  sleep_ms(500);
  const int silent = connect_tcp(address);
  const int half = connect_tcp(address);
  const int deaf = connect_tcp(address);
  ASSERT_GE(silent, 0);
  ASSERT_GE(half, 0);
  ASSERT_GE(deaf, 0);
  const std::string partial = "GET /metrics HTTP/1.1\r\nHost: x";
  ASSERT_EQ(write(half, partial.data(), partial.size()), static_cast<ssize_t>(partial.size()));
  const std::string pipelined = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
  for (int i = 0; i < 20; ++i)
    ASSERT_EQ(write(deaf, pipelined.data(), pipelined.size()),
              static_cast<ssize_t>(pipelined.size()));

  auto grants = [&] {
    const json s = world.admin({{"cmd", "status"}});
    uint64_t n = 0;
    for (const json& t : s["gpus"][0]["tenants"]) n += t.value("grants", 0ull);
    return n;
  };
  const uint64_t grants_before = grants();
  uint64_t slowest = 0;
  for (int i = 0; i < 20; ++i) {
    const uint64_t t0 = monotonic_ns();
    const json s = world.admin({{"cmd", "status"}});
    slowest = std::max(slowest, monotonic_ns() - t0);
    ASSERT_TRUE(s.value("ok", false));
    sleep_ms(50);
  }
  EXPECT_LT(slowest, 500'000'000u) << "the admin socket waited behind the stalled HTTP clients";
  EXPECT_GT(grants() - grants_before, 10u) << "scheduling stalled";
  const uint64_t t0 = monotonic_ns();
  const Scrape scrape = http_get(address, "/metrics");
  EXPECT_EQ(scrape.status, 200);
  EXPECT_LT(monotonic_ns() - t0, 3'000'000'000u);
  close(silent);
  close(half);
  close(deaf);
  EXPECT_EQ(a.wait(30), 0) << a.err();
  EXPECT_EQ(b.wait(30), 0) << b.err();
}

// --- the endpoint against clients that want it down ---------------------------------------

// The arbiter's resident memory, in KiB.
uint64_t rss_kib(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6));
  return 0;
}

size_t open_descriptors(pid_t pid) {
  size_t n = 0;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec))
    ++n;
  return n;
}

// /healthz answered 200, and how long it took.
std::pair<bool, uint64_t> healthz(const std::string& address) {
  const uint64_t t0 = monotonic_ns();
  const Scrape s = http_get(address, "/healthz");
  return {s.status == 200 && s.body == "ok\n", monotonic_ns() - t0};
}

World abuse_world(const std::string& name) {
  ArbiterConfig config;
  config.extra = metrics_toml();
  return World(name, config);
}

TEST(MetricsAbuse, AHeaderBombIsCutAtTheHeadLimitAndTheArbiterStaysSmall) {
  World world = abuse_world("metrics-header-bomb");
  world.start_arbiter();
  const std::string address = metrics_address(world);
  ASSERT_FALSE(address.empty()) << world.arbiter_log();
  ASSERT_TRUE(healthz(address).first);
  const pid_t arbiter = world.arbiter_pid();
  const uint64_t before = rss_kib(arbiter);

  // One request whose header block never ends: up to 48 MiB of header lines.
  const int fd = connect_tcp(address);
  ASSERT_GE(fd, 0);
  timeval tv{2, 0};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  std::string chunk = "GET /metrics HTTP/1.1\r\n";
  while (chunk.size() < 64 * 1024) chunk += "X-Bomb: " + std::string(100, 'a') + "\r\n";
  size_t sent = 0;
  while (sent < (48u << 20)) {
    const ssize_t n = send(fd, chunk.data(), chunk.size(), MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  std::string answer;
  char buf[4096];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof buf, 0)) > 0) answer.append(buf, static_cast<size_t>(n));
  close(fd);
  EXPECT_LT(sent, 32u << 20) << "the endpoint kept reading an endless header block";
  if (!answer.empty()) {
    EXPECT_EQ(answer.rfind("HTTP/1.1 431", 0), 0u) << answer.substr(0, 200);
  }
  // Many short header lines within the byte limit are refused too.
  std::string many = "GET /metrics HTTP/1.1\r\n";
  for (int i = 0; i < 200; ++i) many += "a: b\r\n";
  many += "\r\n";
  const int fd2 = connect_tcp(address);
  ASSERT_GE(fd2, 0);
  ASSERT_EQ(write(fd2, many.data(), many.size()), static_cast<ssize_t>(many.size()));
  answer.clear();
  while ((n = read(fd2, buf, sizeof buf)) > 0) answer.append(buf, static_cast<size_t>(n));
  close(fd2);
  EXPECT_EQ(answer.rfind("HTTP/1.1 431", 0), 0u) << answer.substr(0, 200);

  const uint64_t after = rss_kib(arbiter);
  EXPECT_LT(after, before + 16 * 1024) << "the arbiter grew from " << before << " KiB to " << after << " KiB";
  EXPECT_TRUE(healthz(address).first);
  EXPECT_EQ(http_get(address, "/metrics").status, 200);
}

TEST(MetricsAbuse, SlowlorisConnectionsNeverStarveHealthzAndAreClosedAtTheHeadDeadline) {
  World world = abuse_world("metrics-slowloris");
  world.start_arbiter();
  const std::string address = metrics_address(world);
  ASSERT_FALSE(address.empty()) << world.arbiter_log();
  // More stalled request heads than the endpoint holds connections.
  std::vector<int> stalled;
  const std::string partial = "GET /metrics HTTP/1.1\r\nHost: x\r\n";
  for (int i = 0; i < 200; ++i) {
    const int fd = connect_tcp(address);
    if (fd < 0) break;
    if (write(fd, partial.data(), partial.size()) != static_cast<ssize_t>(partial.size())) {
      close(fd);
      break;
    }
    stalled.push_back(fd);
  }
  ASSERT_GE(stalled.size(), 100u);
  uint64_t slowest = 0;
  for (int i = 0; i < 10; ++i) {
    const auto [ok, ns] = healthz(address);
    EXPECT_TRUE(ok) << "probe " << i;
    slowest = std::max(slowest, ns);
  }
  EXPECT_LT(slowest, 2'000'000'000u) << "/healthz waited behind stalled clients";
  EXPECT_EQ(http_get(address, "/metrics").status, 200);
  // Past the head deadline (3 s) every stalled connection has been closed by the endpoint.
  sleep_ms(4000);
  size_t closed = 0;
  for (int fd : stalled) {
    timeval tv{0, 200000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char c;
    if (read(fd, &c, 1) <= 0 && errno != EAGAIN && errno != EWOULDBLOCK) ++closed;
    close(fd);
  }
  EXPECT_EQ(closed, stalled.size()) << "connections that never finished their head stayed open";
}

TEST(MetricsAbuse, AConnectionFloodHoldsBoundedDescriptorsAndMemory) {
  World world = abuse_world("metrics-flood");
  world.start_arbiter();
  const std::string address = metrics_address(world);
  ASSERT_FALSE(address.empty()) << world.arbiter_log();
  const pid_t arbiter = world.arbiter_pid();
  sleep_ms(200);
  const size_t fds_before = open_descriptors(arbiter);
  const uint64_t rss_before = rss_kib(arbiter);
  std::vector<int> idle;
  for (int i = 0; i < 600; ++i) {
    const int fd = connect_tcp(address);
    if (fd < 0) break;
    idle.push_back(fd);
  }
  ASSERT_GE(idle.size(), 300u);
  sleep_ms(300);
  const size_t fds_during = open_descriptors(arbiter);
  EXPECT_LE(fds_during, fds_before + 64 + 4) << "the endpoint holds a descriptor per flooding connection";
  const auto [ok, ns] = healthz(address);
  EXPECT_TRUE(ok);
  EXPECT_LT(ns, 2'000'000'000u);
  EXPECT_EQ(http_get(address, "/metrics").status, 200);
  EXPECT_LT(rss_kib(arbiter), rss_before + 16 * 1024);
  for (int fd : idle) close(fd);
}

// `quantactl top` in a real terminal (tmux): it refreshes, shows every pod, a pod name
// made of escape sequences never reaches the terminal (the title and colours untouched),
// and q ends it.
TEST(Top, RefreshesInATerminalAndShowsHostileNamesAsText) {
  if (!require_tool("tmux", "tmux")) GTEST_SKIP() << "tmux is not installed";
  ArbiterConfig config;
  World world("top", config);
  world.start_arbiter();
  const std::string evil = "evil\x1b]2;pwned\x07\x1b[31mred";
  Child plain = world.spawn_tenant({"batch", "--seconds", "10"}, "demo/plain", true);
  Child hostile = world.spawn_tenant({"batch", "--seconds", "10"}, evil, true);
  const std::string server = "quanta-top-" + std::to_string(getpid());
  const std::string tmux = "tmux -L " + server + " -f /dev/null";
  const std::string command = std::string(QUANTACTL_BINARY) + " --admin-socket " +
                              world.admin_socket() + " top --interval 200ms";
  // The tmux server (and quantactl in it) go with the test, however it ends.
  struct KillServer {
    std::string tmux;
    ~KillServer() { shell(tmux + " kill-server"); }
  } kill_server{tmux};
  ASSERT_EQ(shell(tmux + " new-session -d -s top -x 200 -y 40 '" + command + "'").first, 0);
  auto capture = [&] { return shell(tmux + " capture-pane -p -t top").second; };
  std::string first;
  ASSERT_TRUE(within(10, [&] {
    first = capture();
    return first.find("demo/plain") != std::string::npos;
  })) << first;
  // The arbiter refuses such a name at the door (pod names are letters, digits and
  // . _ - / : @ + =), so it never reaches the view, raw or escaped.
  EXPECT_EQ(first.find("evil"), std::string::npos) << first;
  EXPECT_NE(first.find("GPU 0"), std::string::npos) << first;
  EXPECT_NE(first.find("pods that still fit"), std::string::npos) << first;
  EXPECT_EQ(first.find("pwned\x07"), std::string::npos);
  const std::string title = shell(tmux + " display-message -p -t top '#{pane_title}'").second;
  EXPECT_EQ(title.find("pwned"), std::string::npos)
      << "the pod name retitled the terminal: " << title;
  const std::string styled = shell(tmux + " capture-pane -p -e -t top").second;
  EXPECT_EQ(styled.find("\x1b[31m"), std::string::npos) << "the pod name coloured the terminal";
  std::string later;
  EXPECT_TRUE(within(5,
                     [&] {
                       later = capture();
                       return later.substr(0, later.find('\n')) !=
                              first.substr(0, first.find('\n'));
                     }))
      << "the view did not refresh:\n"
      << later;
  ASSERT_EQ(shell(tmux + " send-keys -t top q").first, 0);
  EXPECT_TRUE(within(5, [&] { return shell(tmux + " has-session -t top").first != 0; }))
      << "q did not end quantactl top";
  shell(tmux + " kill-server");
  plain.signal(SIGKILL);
  hostile.signal(SIGKILL);
}

}  // namespace
}  // namespace quanta::integration
