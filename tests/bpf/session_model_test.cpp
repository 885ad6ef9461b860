// The pairing rules of `quanta-trace session` on hand-made event streams: which grants are
// switches, where a handoff starts and how it splits, the two instruments' agreement, the
// attribution of waits to holders, and the timelines built from it (no BPF, no root).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "bpf/perfetto.h"
#include "bpf/pod_names.h"
#include "bpf/session_report.h"
#include "bpf/svg_timeline.h"
#include "bpf/switch_model.h"

namespace quanta::bpf {
namespace {

constexpr uint32_t kArbiter = 100;
constexpr uint32_t kTenantA = 201;
constexpr uint32_t kTenantB = 202;

// Events of one session, in the order written (the model sorts them by time anyway).
class Stream {
 public:
  Stream& at(uint64_t ts, uint32_t kind, uint32_t tgid, uint32_t slot, uint64_t a = 0,
             uint64_t b = 0, uint64_t c = 0, uint64_t d = 0, uint32_t device = 0,
             uint32_t tid = 0) {
    quanta_session_event e{};
    e.ts_ns = ts;
    e.kind = kind;
    e.tgid = tgid;
    e.tid = tid ? tid : tgid;
    e.device = device;
    e.slot = slot;
    e.a = a;
    e.b = b;
    e.c = c;
    e.d = d;
    events_.push_back(e);
    return *this;
  }
  Stream& grant(uint64_t ts, uint32_t slot, uint64_t own = 0, uint32_t arbiter = kArbiter,
                uint32_t device = 0) {
    return at(ts, QUANTA_EV_GRANT, arbiter, slot, own, 20'000'000, 0, 0, device);
  }
  Stream& release(uint64_t ts, uint32_t tgid, uint32_t slot, uint64_t own = 0,
                  uint32_t device = 0) {
    return at(ts, QUANTA_EV_RELEASE, tgid, slot, own, 0, 0, 0, device);
  }
  Stream& wait_begin(uint64_t ts, uint32_t tgid, uint32_t slot, uint32_t device = 0) {
    return at(ts, QUANTA_EV_GATE_WAIT_BEGIN, tgid, slot, 0, 0, 0, 0, device);
  }
  Stream& wait_end(uint64_t ts, uint32_t tgid, uint32_t slot, uint64_t own_wait = 0,
                   uint64_t own_end = 0, uint64_t woken = 0, uint64_t on_cpu = 0,
                   uint32_t device = 0) {
    return at(ts, QUANTA_EV_GATE_WAIT_END, tgid, slot, own_wait, own_end, woken, on_cpu, device);
  }

  Model build(std::map<uint32_t, uint32_t> arbiter_of = {},
              std::set<uint32_t> arbiters = {kArbiter},
              std::map<GpuKey, uint32_t> seeds = {}) const {
    ModelInput input;
    input.events = events_;
    input.arbiters = std::move(arbiters);
    input.arbiter_of = std::move(arbiter_of);
    input.seed_holders = std::move(seeds);
    input.start_ns = 0;
    input.end_ns = 1'000'000'000;
    return build_model(input);
  }

 private:
  std::vector<quanta_session_event> events_;
};

const GpuModel& only_gpu(const Model& model) {
  EXPECT_EQ(model.gpus.size(), 1u);
  return model.gpus.begin()->second;
}

auto everyone = [](uint32_t) { return true; };

TEST(SessionModel, ReleaseThenGrantIsOneSwitchSplitIntoItsParts) {
  Stream s;
  s.wait_begin(50, kTenantA, 0)
      .grant(60, 0)
      .wait_end(70, kTenantA, 0)
      .wait_begin(150, kTenantB, 1)
      .at(900, QUANTA_EV_DRAIN_BEGIN, kTenantA, 0)
      .release(1000, kTenantA, 0)
      .at(1030, QUANTA_EV_RELEASED, kArbiter, 0)
      .grant(1040, 1)
      // Woken 10 after the grant, on a CPU 20 later, out of the gate 30 after that.
      .wait_end(1100, kTenantB, 1, 950, 1100, 1050, 1070);
  const Model model = s.build();
  const GpuModel& gpu = only_gpu(model);
  ASSERT_EQ(gpu.switches.size(), 1u) << "the first grant had no predecessor: not a switch";
  const SwitchRecord& sw = gpu.switches[0];
  EXPECT_TRUE(sw.complete);
  EXPECT_EQ(sw.kind, SwitchKind::kAfterRelease);
  EXPECT_EQ(sw.from_tgid, kTenantA);
  EXPECT_EQ(sw.to_tgid, kTenantB);
  EXPECT_EQ(sw.handoff_ns(), 100u);
  EXPECT_EQ(sw.arbiter_ns, 40u);
  EXPECT_TRUE(sw.has_notice);
  EXPECT_EQ(sw.notice_ns, 30u);
  EXPECT_EQ(sw.decide_ns, 10u);
  EXPECT_EQ(sw.wakeup_ns, 10u);
  EXPECT_EQ(sw.run_queue_ns, 20u);
  EXPECT_EQ(sw.gate_exit_ns, 30u);
  EXPECT_EQ(sw.arbiter_ns + sw.wakeup_ns + sw.run_queue_ns + sw.gate_exit_ns, sw.handoff_ns());
  ASSERT_EQ(gpu.holds.size(), 2u);
  EXPECT_TRUE(gpu.holds[0].released);
  EXPECT_EQ(gpu.holds[0].drain_begin_ns, 900u);
  EXPECT_EQ(gpu.holds[0].tgid, kTenantA);
  EXPECT_EQ(gpu.grants, 2u);
}

TEST(SessionModel, OwnClocksGiveTheSameHandoffFromTheirOwnReadings) {
  Stream s;
  s.grant(10, 0, 9)
      .wait_begin(20, kTenantB, 1)
      .release(1000, kTenantA, 0, /*own released*/ 990)
      .grant(1040, 1, 1035)
      .wait_end(1100, kTenantB, 1, /*own wait*/ 1070, /*own end*/ 1090);
  const Model model = s.build();
  const SwitchRecord& sw = only_gpu(model).switches.at(0);
  ASSERT_TRUE(sw.has_own);
  EXPECT_EQ(sw.own_handoff_ns, 100u) << "own end 1090 - own release 990";
  const Agreement a = agreement(model, [](const GpuKey&) { return true; });
  EXPECT_EQ(a.switches, 1u);
  EXPECT_DOUBLE_EQ(a.ebpf_p50_ns, 100);
  EXPECT_DOUBLE_EQ(a.own_p50_ns, 100);
  EXPECT_DOUBLE_EQ(a.difference, 0);
}

TEST(SessionModel, GrantWhileThePreviousHolderDrainsIsOverlappedAndStartsAtTheGrant) {
  Stream s;
  s.grant(10, 0).wait_begin(20, kTenantA, 0).wait_end(30, kTenantA, 0);
  s.wait_begin(100, kTenantB, 1).grant(500, 1).wait_end(560, kTenantB, 1).release(900, kTenantA, 0);
  const Model model = s.build();
  const SwitchRecord& sw = only_gpu(model).switches.at(0);
  EXPECT_EQ(sw.kind, SwitchKind::kOverlapped);
  EXPECT_EQ(sw.start_ns, 500u);
  EXPECT_EQ(sw.handoff_ns(), 60u);
  EXPECT_EQ(sw.arbiter_ns, 0u);
}

TEST(SessionModel, AnIdleGpuCountsFromTheNextTenantsAsk) {
  Stream s;
  s.grant(10, 0).wait_begin(11, kTenantA, 0).wait_end(12, kTenantA, 0).release(100, kTenantA, 0);
  s.wait_begin(5000, kTenantB, 1).grant(5040, 1).wait_end(5100, kTenantB, 1);
  const Model model = s.build();
  const SwitchRecord& sw = only_gpu(model).switches.at(0);
  EXPECT_EQ(sw.kind, SwitchKind::kGpuIdle);
  EXPECT_EQ(sw.start_ns, 5000u);
  EXPECT_EQ(sw.handoff_ns(), 100u);
}

TEST(SessionModel, AHolderThatNeverReleasesIsGoneAndItsHoldEndsAtTheSwitch) {
  Stream s;
  s.wait_begin(5, kTenantA, 0).grant(10, 0).wait_end(12, kTenantA, 0);
  s.wait_begin(20, kTenantB, 1).grant(700, 1).wait_end(720, kTenantB, 1);
  const Model model = s.build();
  const GpuModel& gpu = only_gpu(model);
  EXPECT_EQ(gpu.switches.at(0).kind, SwitchKind::kHolderGone);
  EXPECT_EQ(gpu.holds.at(0).end_ns, 700u);
  EXPECT_FALSE(gpu.holds.at(0).released);
}

TEST(SessionModel, AHolderThatExitsEndsItsHoldWhereTheArbiterFreedItsSlot) {
  Stream s;
  s.wait_begin(5, kTenantA, 0).grant(10, 0).wait_end(12, kTenantA, 0).wait_begin(20, kTenantB, 1);
  s.at(400, QUANTA_EV_SLOT_FREED, kArbiter, 0).grant(410, 1).wait_end(450, kTenantB, 1);
  const Model model = s.build();
  const GpuModel& gpu = only_gpu(model);
  EXPECT_EQ(gpu.holds.at(0).end_ns, 400u);
  EXPECT_TRUE(gpu.holds.at(0).holder_exited);
  ASSERT_EQ(gpu.switches.size(), 1u);
  EXPECT_EQ(gpu.switches[0].kind, SwitchKind::kHolderGone);
  EXPECT_EQ(gpu.switches[0].start_ns, 410u) << "no release: measured from the grant";
  // The last holder leaving at the end of a session does not hold on to the session's end.
  Stream last;
  last.wait_begin(5, kTenantA, 0)
      .grant(10, 0)
      .wait_end(12, kTenantA, 0)
      .at(90, QUANTA_EV_SLOT_FREED, kArbiter, 0);
  const Model ended = last.build();
  EXPECT_EQ(only_gpu(ended).holds.at(0).end_ns, 90u);
}

TEST(SessionModel, AGrantBackToTheSameSlotIsNoSwitchAndAReleaseOfNothingClosesNothing) {
  Stream s;
  s.release(5, kTenantB, 1);  // the link's first look at a never-granted slot
  s.wait_begin(8, kTenantA, 0).grant(10, 0).wait_end(12, kTenantA, 0).release(100, kTenantA, 0);
  s.wait_begin(150, kTenantA, 0).grant(200, 0).wait_end(210, kTenantA, 0);
  const Model model = s.build();
  const GpuModel& gpu = only_gpu(model);
  EXPECT_TRUE(gpu.switches.empty());
  EXPECT_EQ(gpu.grants, 2u);
  EXPECT_EQ(gpu.holds.size(), 2u);
}

TEST(SessionModel, ASwitchWithoutAGateExitYetIsCountedButIncomplete) {
  Stream s;
  s.grant(10, 0).release(100, kTenantA, 0).grant(120, 1);
  const Model model = s.build();
  const GpuModel& gpu = only_gpu(model);
  ASSERT_EQ(gpu.switches.size(), 1u);
  EXPECT_FALSE(gpu.switches[0].complete);
  const GpuStats stats = gpu_stats(gpu, everyone);
  EXPECT_EQ(stats.switches, 1u);
  EXPECT_EQ(stats.complete, 0u);
  EXPECT_EQ(stats.handoff.count(), 0u);
}

TEST(SessionModel, TwoArbitersWithTheSameDeviceIndexesStayApart) {
  constexpr uint32_t kOther = 300;
  constexpr uint32_t kTenantC = 401, kTenantD = 402;
  Stream s;
  s.grant(10, 0).grant(11, 0, 0, kOther);
  s.wait_begin(20, kTenantB, 1).wait_begin(21, kTenantD, 1);
  s.release(100, kTenantA, 0).release(101, kTenantC, 0);
  s.grant(110, 1).grant(111, 1, 0, kOther);
  s.wait_end(130, kTenantB, 1).wait_end(150, kTenantD, 1);
  const Model model =
      s.build({{kTenantA, kArbiter}, {kTenantB, kArbiter}, {kTenantC, kOther}, {kTenantD, kOther}},
              {kArbiter, kOther});
  ASSERT_EQ(model.gpus.size(), 2u);
  const auto& mine = model.gpus.at(GpuKey{kArbiter, 0});
  const auto& theirs = model.gpus.at(GpuKey{kOther, 0});
  ASSERT_EQ(mine.switches.size(), 1u);
  ASSERT_EQ(theirs.switches.size(), 1u);
  EXPECT_EQ(mine.switches[0].handoff_ns(), 30u);
  EXPECT_EQ(theirs.switches[0].handoff_ns(), 49u);
  EXPECT_EQ(model.unattributed, 0u);
}

TEST(SessionModel, ShimEventsOfAnUnknownArbiterAreCountedNotGuessed) {
  Stream s;
  s.wait_begin(20, kTenantB, 1);
  const Model model = s.build({}, {kArbiter, 300});
  EXPECT_EQ(model.unattributed, 1u);
}

TEST(SessionModel, TheHolderWhenTheSessionBeganMakesTheFirstGrantASwitch) {
  Stream s;
  s.wait_begin(20, kTenantB, 1).release(100, kTenantA, 0).grant(130, 1).wait_end(150, kTenantB, 1);
  const Model unseeded = s.build();
  EXPECT_TRUE(only_gpu(unseeded).switches.empty()) << "without the arbiter's word, no predecessor";
  const Model model = s.build({}, {kArbiter}, {{GpuKey{kArbiter, 0}, 0}});
  const GpuModel& gpu = only_gpu(model);
  ASSERT_EQ(gpu.switches.size(), 1u);
  EXPECT_EQ(gpu.switches[0].kind, SwitchKind::kAfterRelease);
  EXPECT_EQ(gpu.switches[0].handoff_ns(), 50u);
  EXPECT_TRUE(gpu.holds.at(0).before_session);
  EXPECT_EQ(gpu.holds.at(0).tgid, kTenantA);
}

TEST(SessionModel, WaitsAreAttributedToWhoeverHeldTheGpu) {
  Stream s;
  s.wait_begin(0, kTenantA, 0).grant(0, 0).wait_end(0, kTenantA, 0);
  s.wait_begin(100'000'000, kTenantB, 1);
  s.release(300'000'000, kTenantA, 0);
  s.grant(310'000'000, 1).wait_end(310'000'000, kTenantB, 1).release(500'000'000, kTenantB, 1);
  const Model model = s.build();
  const GpuModel& gpu = only_gpu(model);
  auto pod_of = [](uint32_t tgid) {
    return tgid == kTenantA ? std::string("ns/a") : std::string("ns/b");
  };
  const auto times = attribute(gpu, 0, 1'000'000'000, pod_of);
  EXPECT_NEAR(times.at("ns/a").held_s, 0.3, 1e-9);
  EXPECT_NEAR(times.at("ns/b").held_s, 0.19, 1e-9);
  EXPECT_NEAR(times.at("ns/b").waiting_s, 0.21, 1e-9);
  EXPECT_NEAR(times.at("ns/b").waited_on.at("ns/a"), 0.2, 1e-9);
  EXPECT_NEAR(times.at("ns/b").waited_unheld_s, 0.01, 1e-9);
}

TEST(SessionModel, StatsSelectAPodsOwnHandoffsWaitsAndDrains) {
  Stream s;
  s.wait_begin(1, kTenantA, 0).grant(2, 0).wait_end(3, kTenantA, 0);
  s.wait_begin(10, kTenantB, 1)
      .at(50, QUANTA_EV_REVOKE, kArbiter, 0)
      .at(60, QUANTA_EV_DRAIN_BEGIN, kTenantA, 0);
  s.release(100, kTenantA, 0).grant(110, 1).wait_end(130, kTenantB, 1);
  const Model model = s.build();
  const GpuModel& gpu = only_gpu(model);
  const GpuStats b = gpu_stats(gpu, [](uint32_t tgid) { return tgid == kTenantB; });
  EXPECT_EQ(b.switches, 1u);
  EXPECT_EQ(b.gate_wait.count(), 1u);
  EXPECT_EQ(b.drain.count(), 0u);
  const GpuStats a = gpu_stats(gpu, [](uint32_t tgid) { return tgid == kTenantA; });
  EXPECT_EQ(a.switches, 0u);
  EXPECT_EQ(a.drain.count(), 1u);
  EXPECT_EQ(a.drain.sum_ns(), 40u);
  EXPECT_EQ(a.revoke_to_release.sum_ns(), 50u);
}

TEST(SessionTimeline, SubtractCutsWaitsWhereQuantaBegin) {
  const auto out = subtract({{0, 100}, {150, 160}}, {{50, 70}, {90, 155}});
  const std::vector<std::pair<uint64_t, uint64_t>> expected = {{0, 50}, {70, 90}, {155, 160}};
  EXPECT_EQ(out, expected);
}

TEST(SessionTimeline, LanesNeverHoldOverlappingSpans) {
  const auto lanes = assign_lanes({{0, 10}, {5, 20}, {10, 12}, {12, 30}, {21, 22}});
  const std::vector<int> expected = {0, 1, 0, 0, 1};
  EXPECT_EQ(lanes, expected);
}

SessionView two_tenant_view() {
  Stream s;
  for (int round = 0; round < 5; ++round) {
    const uint64_t t = static_cast<uint64_t>(round) * 1'000'000;
    s.wait_begin(t + 1, kTenantA, 0).grant(t + 10, 0).wait_end(t + 20, kTenantA, 0);
    s.wait_begin(t + 30, kTenantB, 1);
    s.at(t + 400'000, QUANTA_EV_REVOKE, kArbiter, 0)
        .at(t + 400'100, QUANTA_EV_DRAIN_BEGIN, kTenantA, 0);
    s.release(t + 450'000, kTenantA, 0).grant(t + 450'050, 1).wait_end(t + 450'100, kTenantB, 1);
    s.at(t + 900'000, QUANTA_EV_REVOKE, kArbiter, 1).release(t + 950'000, kTenantB, 1);
  }
  SessionView view;
  view.duration_s = 1;
  view.model = s.build();
  const GpuKey key{kArbiter, 0};
  view.gpus[key] =
      GpuView{key, "GPU-00000000-0000-0000-0000-000000000000", "test", std::nullopt, std::nullopt};
  view.processes[kTenantA].pid = kTenantA;
  view.processes[kTenantA].pod = "ns/<a & \"b\">";
  view.processes[kTenantA].managed = true;
  view.processes[kTenantB].pid = kTenantB;
  view.processes[kTenantB].pod = "ns/b";
  view.processes[kTenantB].spans.push_back(SyncSpan{kTenantB, 500'000, 600'000, 450'200, 1, false});
  return view;
}

TEST(SessionTimeline, PerfettoHasAQuantumPerGrantAndRowsThatNest) {
  const SessionView view = two_tenant_view();
  const nlohmann::json trace = perfetto_trace(view);
  ASSERT_TRUE(trace.contains("traceEvents"));
  size_t quanta = 0;
  std::map<std::pair<int, int>, std::vector<std::pair<double, double>>> rows;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "X") {
      rows[{e["pid"].get<int>(), e["tid"].get<int>()}].emplace_back(
          e["ts"].get<double>(), e["ts"].get<double>() + e["dur"].get<double>());
      if (e["name"] == "quantum") ++quanta;
    }
  }
  EXPECT_EQ(quanta, only_gpu(view.model).grants);
  // Complete events on one row are disjoint or nested, never crossing.
  for (auto& [row, spans] : rows) {
    std::sort(spans.begin(), spans.end(), [](auto& a, auto& b) {
      return a.first < b.first || (a.first == b.first && a.second > b.second);
    });
    std::vector<double> open_ends;
    for (const auto& [start, end] : spans) {
      while (!open_ends.empty() && open_ends.back() <= start + 1e-9) open_ends.pop_back();
      if (!open_ends.empty()) {
        EXPECT_LE(end, open_ends.back() + 1e-9) << "crossing spans on row " << row.second;
      }
      open_ends.push_back(end);
    }
  }
}

TEST(SessionTimeline, SvgIsSelfContainedAndEscapesNames) {
  const SessionView view = two_tenant_view();
  const std::string svg = svg_timeline(view, 0);
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_EQ(svg.find("<script"), std::string::npos);
  EXPECT_EQ(svg.find("href"), std::string::npos) << "no external references";
  EXPECT_NE(svg.find("ns/&lt;a &amp; &quot;b&quot;&gt;"), std::string::npos);
  EXPECT_EQ(svg.find("<a &"), std::string::npos);
}

TEST(SessionReport, JsonCarriesPerGpuAndPerPodHistograms) {
  const SessionView view = two_tenant_view();
  const nlohmann::json report = report_json(view);
  ASSERT_EQ(report["gpus"].size(), 1u);
  const auto& gpu = report["gpus"][0];
  EXPECT_EQ(gpu["switches"], 9);
  EXPECT_EQ(gpu["handoff"]["count"], 9);
  EXPECT_EQ(gpu["drain"]["count"], 5);
  EXPECT_EQ(gpu["pods"].size(), 2u);
  std::ostringstream text;
  print_report(view, text);
  EXPECT_NE(text.str().find("handoff latency"), std::string::npos);
  EXPECT_NE(text.str().find("Contention attribution"), std::string::npos);
}

TEST(PodNames, PodUidComesFromCgroupfsAndSystemdKubepodsPaths) {
  EXPECT_EQ(
      pod_uid_from_cgroup(
          "0::/kubepods/burstable/pod3f1c5d2e-8a9b-4c7d-9e0f-123456789abc/cri-containerd-1\n"),
      "3f1c5d2e-8a9b-4c7d-9e0f-123456789abc");
  EXPECT_EQ(pod_uid_from_cgroup(
                "0::/kubepods.slice/kubepods-besteffort.slice/"
                "kubepods-besteffort-pod3f1c5d2e_8a9b_4c7d_9e0f_123456789abc.slice/x.scope\n"),
            "3f1c5d2e-8a9b-4c7d-9e0f-123456789abc");
  EXPECT_EQ(pod_uid_from_cgroup("0::/user.slice/user-0.slice/session-1.scope\n"), "");
}

}  // namespace
}  // namespace quanta::bpf
