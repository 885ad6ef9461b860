// Unit tests of the observing side over a view of the node (node_view.h), built here as the
// arbiter builds it, with accounting fed from the real Scheduler: the figures behind /metrics
// and `quantactl top` (figures_of), and the top and explain answers (admin_views.cpp). No
// daemon, socket or region: what a view says, and what the observer makes of it.
#include "arbiter/observing/figures.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "arbiter/observing/admin_views.h"
#include "arbiter/observing/node_view.h"
#include "tests/arbiter/timeline.h"

namespace quanta::arbiter {
namespace {

constexpr uint64_t kGiB = 1ull << 30;
constexpr pid_t kArbiterPid = 42;

common::Policy policy(uint32_t weight, common::Priority priority, uint64_t memory_limit = 0) {
  common::Policy p;
  p.weight = weight;
  p.priority = priority;
  p.memory_limit = memory_limit;
  return p;
}

// Two pods on one GPU from 1000 ms: ns/a holds first and is revoked after its 20 ms quantum
// (1 ms drain) while ns/b waits from 1005 ms; b holds from 1021 ms to 1040 ms, the view's
// instant. a's processes ran 30 ms of device time by the driver's count.
class FiguresOfTwoPods : public ::testing::Test {
 protected:
  void SetUp() override {
    t.add(0, 1, "ns/a");
    t.add(1, 2, "ns/b");
    t.acct.busy_reported(t.now);
    t.acct.tick({{"ns/a", 0.5}, {"ns/b", 0.5}}, t.now);
    t.want(0, true);
    t.run(5 * kMs, 0);
    t.want(1, true);
    t.run(10 * kMs, 0);
    t.run(5 * kMs, 0);
    t.now += 1 * kMs;
    t.release(0);
    t.run(19 * kMs, 1);
    t.acct.add_busy("ns/a", 30 * kMs);
    t.acct.busy_reported(t.now);
    t.acct.advance(t.now);

    reading.ok = true;
    reading.at_ns = t.now;
    reading.processes = {{100, 1 * kGiB}, {101, 2 * kGiB}, {555, 3 * kGiB}, {kArbiterPid, 1}};
  }

  // The view the arbiter would take now (Observer::view).
  NodeView view() {
    NodeView v;
    v.taken_ns = t.now;
    v.scope = "node-1";
    v.started_ns = 400 * kMs;
    v.probes = {{0.25, 10 * kGiB, 0, "0.25", "10Gi"}};
    v.self = kArbiterPid;
    GpuView g;
    g.index = 0;
    g.uuid = "GPU-0";
    g.identity.model = "Sim H200";
    g.identity.memory_total = 80 * kGiB;
    g.reading = &reading;
    g.accounting = &t.acct;
    g.timings = {20 * kMs, 1 * kMs, 100'000};
    g.window_ns = 30 * kMs;
    g.shares = {{{"ns/a", 1, common::Priority::kBatch, 20 * kMs, false}, 0.5, 16 * kMs},
                {{"ns/b", 3, common::Priority::kBatch, 20 * kMs, true}, 0.5, 2 * kMs}};
    if (a_present) g.tenants.push_back({0, 100, "ns/a", t.state(0), 1 * kGiB, "trainer"});
    g.tenants.push_back({1, 101, "ns/b", t.state(1), 2 * kGiB, ""});
    if (a_registered) g.registered["ns/a"] = {policy(1, common::Priority::kBatch), 1 * kGiB, 0};
    g.registered["ns/b"] = {policy(3, common::Priority::kBatch, 8 * kGiB), 2 * kGiB, 7};
    g.holder = "ns/b";
    g.free_slots = 254;
    v.gpus.push_back(g);
    return v;
  }

  static const PodFigures& pod(const GpuFigures& g, const std::string& key) {
    for (const PodFigures& p : g.pods) {
      if (p.key == key) return p;
    }
    throw std::runtime_error("no pod " + key + " in the figures");
  }

  Timeline t;
  GpuReading reading;
  bool a_present = true;
  bool a_registered = true;
};

TEST_F(FiguresOfTwoPods, SharesAreWhatEachPodHeldOverTheWindow) {
  const NodeFigures f = figures_of(view());
  ASSERT_EQ(f.gpus.size(), 1u);
  const GpuFigures& g = f.gpus[0];
  EXPECT_DOUBLE_EQ(pod(g, "ns/a").achieved_share, 21.0 / 40) << "20 ms running + 1 ms drain";
  EXPECT_DOUBLE_EQ(pod(g, "ns/b").achieved_share, 19.0 / 40);
  EXPECT_DOUBLE_EQ(g.held_ratio, 1.0) << "someone held the GPU all the window";
  EXPECT_EQ(pod(g, "ns/a").window_ns, 40 * kMs);
  EXPECT_EQ(pod(g, "ns/b").window_phase_ns[static_cast<size_t>(Phase::kWaiting)], 16 * kMs);
  ASSERT_EQ(pod(g, "ns/b").window_behind.size(), 1u);
  EXPECT_EQ(pod(g, "ns/b").window_behind[0], (std::pair<std::string, uint64_t>{"ns/a", 16 * kMs}));
  EXPECT_EQ(g.holder, "ns/b");
  EXPECT_EQ(g.switches, 1u);
  EXPECT_DOUBLE_EQ(pod(g, "ns/a").target_share, 0.5);
  EXPECT_EQ(pod(g, "ns/a").wait_p99_ns, 16 * kMs);
  EXPECT_DOUBLE_EQ(f.uptime_s, 0.64);
}

TEST_F(FiguresOfTwoPods, PoliciesAndMemoryComeFromTheRegisteredPods) {
  const GpuFigures g = figures_of(view()).gpus[0];
  EXPECT_EQ(pod(g, "ns/b").policy.weight, 3u);
  EXPECT_EQ(pod(g, "ns/b").policy.memory_limit, 8 * kGiB);
  EXPECT_EQ(pod(g, "ns/b").alloc_denied, 7u);
  EXPECT_EQ(g.memory_used, 3 * kGiB) << "the live pods' regions, summed";
  ASSERT_TRUE(pod(g, "ns/b").wait_budget_s.has_value()) << "batch pods are promised a wait";
  EXPECT_GT(*pod(g, "ns/b").wait_budget_s, 0.0);
  EXPECT_EQ(pod(g, "ns/b").namespace_name, "ns");
  EXPECT_EQ(pod(g, "ns/b").pod_name, "b");
}

TEST_F(FiguresOfTwoPods, ProcessesAreListedByPodAndTheRestOfNvmlIsUnmanaged) {
  const GpuFigures g = figures_of(view()).gpus[0];
  ASSERT_EQ(g.processes.at("ns/a").size(), 1u);
  const ProcessFigures& a = g.processes.at("ns/a")[0];
  EXPECT_EQ(a.pid, 100);
  EXPECT_EQ(a.container, "trainer");
  EXPECT_EQ(a.memory_used, 1 * kGiB);
  EXPECT_EQ(a.nvml_memory, std::optional<uint64_t>(1 * kGiB));
  EXPECT_EQ(g.processes.at("ns/b")[0].state, "holding");
  EXPECT_EQ(g.unmanaged_processes, 1u) << "pid 555; the arbiter's own pid is nobody's";
  EXPECT_EQ(g.unmanaged_memory, 3 * kGiB);
}

TEST_F(FiguresOfTwoPods, TheDriversBusyTimeIsTheUtilizationWhereItReportsIt) {
  GpuFigures g = figures_of(view()).gpus[0];
  EXPECT_STREQ(g.utilization_source, "holds");
  EXPECT_DOUBLE_EQ(pod(g, "ns/a").utilization, 21.0 / 40) << "without the driver: the holds";

  reading.process_busy_supported = true;
  g = figures_of(view()).gpus[0];
  EXPECT_STREQ(g.utilization_source, "driver");
  EXPECT_DOUBLE_EQ(pod(g, "ns/a").utilization, 30.0 / 40);
  EXPECT_DOUBLE_EQ(pod(g, "ns/b").utilization, 0.0);
  EXPECT_DOUBLE_EQ(g.busy_ratio, 30.0 / 40);

  reading.ok = false;  // a failed reading lists nothing and reports no busy time
  g = figures_of(view()).gpus[0];
  EXPECT_STREQ(g.utilization_source, "holds");
  EXPECT_EQ(g.unmanaged_processes, 0u);
  EXPECT_FALSE(g.processes.at("ns/a")[0].nvml_memory.has_value());
}

TEST_F(FiguresOfTwoPods, CapacityCountsTheLivePodsCapsAndTheUnmanagedMemory) {
  GpuFigures g = figures_of(view()).gpus[0];
  EXPECT_EQ(g.capacity.memory_total, 80 * kGiB);
  EXPECT_EQ(g.capacity.memory_caps, 8 * kGiB) << "b's cap; a has none";
  EXPECT_EQ(g.capacity.memory_promised, 12 * kGiB)
      << "b's cap, what uncapped a uses (1 GiB) and the unmanaged pid's 3 GiB";
  ASSERT_EQ(g.capacity.fits.size(), 1u);
  const uint32_t fits = g.capacity.fits[0];
  EXPECT_EQ(figures_of(view()).node_fits, std::vector<uint32_t>{fits});

  g = [&] {
    NodeView v = view();
    v.gpus[0].free_slots = 0;  // no slot left: nothing more fits
    return figures_of(v).gpus[0];
  }();
  EXPECT_EQ(g.capacity.fits[0], 0u);
}

TEST_F(FiguresOfTwoPods, ADepartedPodIsKeptButCountsNeitherLoadNorMemory) {
  t.remove(0);
  t.now += 5 * kMs;
  t.acct.advance(t.now);
  a_present = false;
  const GpuFigures g = figures_of(view()).gpus[0];
  EXPECT_FALSE(pod(g, "ns/a").live);
  EXPECT_TRUE(pod(g, "ns/b").live);
  EXPECT_EQ(g.memory_used, 2 * kGiB);
  EXPECT_FALSE(pod(g, "ns/a").wait_budget_s.has_value()) << "no promise to a pod that left";
  EXPECT_EQ(g.processes.count("ns/a"), 0u);

  const nlohmann::json top = top_answer(figures_of(view()));
  ASSERT_EQ(top["gpus"][0]["pods"].size(), 1u) << top.dump();
  EXPECT_EQ(top["gpus"][0]["pods"][0]["pod"], "ns/b");
}

TEST_F(FiguresOfTwoPods, TopGivesEachLivePodsShareAndTheFitsOfTheGpuAndTheNode) {
  const nlohmann::json top = top_answer(figures_of(view()));
  ASSERT_EQ(top["ok"], true);
  EXPECT_EQ(top["scope"], "node-1");
  const nlohmann::json& g = top["gpus"][0];
  EXPECT_EQ(g["model"], "Sim H200");
  EXPECT_EQ(g["holder"], "ns/b");
  ASSERT_EQ(g["pods"].size(), 2u);
  const nlohmann::json& a = g["pods"][0];
  EXPECT_EQ(a["pod"], "ns/a");
  EXPECT_DOUBLE_EQ(a["achieved_share"].get<double>(), 21.0 / 40);
  EXPECT_DOUBLE_EQ(a["phases"]["running"].get<double>(), 20.0 / 40);
  EXPECT_EQ(a["tenants"], 1);
  EXPECT_EQ(g["pods"][1]["behind"][0]["pod"], "ns/a");
  ASSERT_EQ(g["fits"].size(), 1u);
  EXPECT_EQ(g["fits"][0]["share"], "0.25");
  EXPECT_EQ(g["fits"][0]["memory"], "10Gi");
  EXPECT_EQ(top["node_fits"][0]["pods"], g["fits"][0]["pods"]);
}

TEST_F(FiguresOfTwoPods, ExplainTellsThePodsShareTargetAndWhomItWaitedBehind) {
  const nlohmann::json e = explain_answer(view(), "b", 10);
  ASSERT_EQ(e["ok"], true) << e.dump();
  EXPECT_EQ(e["pod"], "ns/b") << "a name alone resolves to the one pod with it";
  const nlohmann::json& g = e["gpus"][0];
  EXPECT_EQ(g["live"], true);
  EXPECT_DOUBLE_EQ(g["span_s"].get<double>(), 0.04) << "the pod is 40 ms old";
  EXPECT_DOUBLE_EQ(g["achieved_share"].get<double>(), 19.0 / 40);
  EXPECT_DOUBLE_EQ(g["target_share"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(g["phases"]["waiting"].get<double>(), 0.016);
  EXPECT_EQ(g["behind"][0]["pod"], "ns/a");
  EXPECT_EQ(g["waits"]["count"], 1);
  EXPECT_DOUBLE_EQ(g["waits"]["max_ms"].get<double>(), 16.0);
  EXPECT_EQ(g["weight"], 3);
  EXPECT_EQ(g["memory_limit"], 8 * kGiB);
  EXPECT_EQ(g["alloc_denied"], 7);
  ASSERT_EQ(g["slices"].size(), 1u);
  EXPECT_EQ(g["slices"][0]["behind"], "ns/a");
  ASSERT_EQ(g["neighbours"].size(), 1u);
  EXPECT_EQ(g["neighbours"][0]["pod"], "ns/a");
  EXPECT_DOUBLE_EQ(g["neighbours"][0]["achieved_share"].get<double>(), 21.0 / 40);
}

TEST_F(FiguresOfTwoPods, ExplainTellsADepartedPodUpToItsDepartureWithTheLastPolicyItHad) {
  t.remove(0);
  const uint64_t left = t.now;
  t.now += 2'000 * kMs;
  t.acct.advance(t.now);
  a_present = false;
  a_registered = false;
  NodeView v = view();
  v.last_policy["ns/a"] = policy(5, common::Priority::kInteractive);
  const nlohmann::json e = explain_answer(v, "ns/a", 60);
  ASSERT_EQ(e["ok"], true) << e.dump();
  const nlohmann::json& g = e["gpus"][0];
  EXPECT_EQ(g["live"], false);
  EXPECT_DOUBLE_EQ(g["span_s"].get<double>(), static_cast<double>(left - 1000 * kMs) / 1e9)
      << "not through the silence after it left";
  EXPECT_DOUBLE_EQ(g["achieved_share"].get<double>(), 21.0 / 40);
  EXPECT_EQ(g["weight"], 5);
  EXPECT_EQ(g["priority"], "interactive");
  EXPECT_FALSE(g.contains("memory_used")) << "its region went with its registration";
}

TEST_F(FiguresOfTwoPods, ExplainRefusesAnUnknownOrAmbiguousNameNamingThePodsKnown) {
  nlohmann::json e = explain_answer(view(), "ns/c", 10);
  EXPECT_EQ(e["ok"], false);
  EXPECT_EQ(e["error"], "no pod ns/c on any GPU in the last 5 minutes; pods known: ns/a, ns/b");

  t.add(2, 3, "other/b");
  e = explain_answer(view(), "b", 10);
  EXPECT_EQ(e["ok"], false);
  EXPECT_NE(e["error"].get<std::string>().find("ns/b"), std::string::npos) << e.dump();
  EXPECT_NE(e["error"].get<std::string>().find("other/b"), std::string::npos) << e.dump();
}

TEST(Figures, AGpuWhoseMigInstancesAreManagedCountsThroughThem) {
  Timeline whole, instance;
  NodeView v;
  v.probes = {{0.5, 1 * kGiB, 0, "0.5", "1Gi"}};
  for (auto [uuid, parent, acct] :
       {std::tuple{"GPU-a", "", &whole.acct}, std::tuple{"MIG-a1", "GPU-a", &instance.acct}}) {
    GpuView g;
    g.uuid = uuid;
    g.parent = parent;
    g.identity.memory_total = 40 * kGiB;
    g.accounting = acct;
    g.free_slots = 256;
    v.gpus.push_back(g);
  }
  const NodeFigures f = figures_of(v);
  EXPECT_TRUE(f.gpus[0].mig_parent);
  EXPECT_FALSE(f.gpus[1].mig_parent);
  EXPECT_GT(f.gpus[0].capacity.fits[0], 0u);
  EXPECT_EQ(f.node_fits, std::vector<uint32_t>{f.gpus[1].capacity.fits[0]})
      << "the GPU's capacity is its instances'";
}

}  // namespace
}  // namespace quanta::arbiter
