// Unit tests of what the arbiter measures and shows, driven with a fake clock: the
// accounting timeline (phases, the waiter x holder matrix, histograms) fed from the real
// Scheduler the way the arbiter feeds it, capacity arithmetic, the Prometheus text, the
// [metrics] config keys and quantactl's views (escaping, explain's verdicts).
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "arbiter/observing/capacity.h"
#include "arbiter/observing/figures.h"
#include "arbiter/observing/metrics_text.h"
#include "arbiter/observing/wait_budget.h"
#include "arbiter/scheduling/accounting.h"
#include "arbiter/scheduling/scheduler.h"
#include "arbiter/serving/tenant_protocol.h"
#include "common/wire.h"
#include "config/node_config.h"
#include "tests/arbiter/sched_sim.h"
#include "tests/arbiter/timeline.h"

namespace quanta::arbiter {
namespace {

uint64_t phase(const PodAccount& p, Phase ph) {
  return p.totals.phase_ns[static_cast<size_t>(ph)];
}

uint64_t behind(const GpuAccounting& acct, const std::string& waiter, const std::string& holder) {
  const PodAccount* w = acct.pod(waiter);
  AccountId id = kNobody;
  if (const PodAccount* h = acct.pod(holder)) id = h->id;
  auto it = w->totals.waited_behind_ns.find(id);
  return it == w->totals.waited_behind_ns.end() ? 0 : it->second;
}

TEST(Accounting, WaitsAreChargedToTheHolderAndDrainsToTheDrainer) {
  Timeline t;
  t.add(0, 1, "ns/a");
  t.add(1, 2, "ns/b");
  t.want(0, true);
  ASSERT_EQ(t.state(0), TenantState::kHolding);
  t.run(5 * kMs, 0);
  t.want(1, true);  // b waits from 5 ms
  ASSERT_EQ(t.state(1), TenantState::kWaiting);
  t.run(10 * kMs, 0);
  t.run(5 * kMs, 0);  // a's quantum (20 ms) ends: revoked
  ASSERT_EQ(t.state(0), TenantState::kRevoking);
  t.now += 1 * kMs;  // a drains 1 ms
  t.release(0);
  ASSERT_EQ(t.state(1), TenantState::kHolding);
  t.acct.advance(t.now);

  const PodAccount& a = *t.acct.pod("ns/a");
  const PodAccount& b = *t.acct.pod("ns/b");
  EXPECT_EQ(phase(a, Phase::kRunning), 20 * kMs);
  EXPECT_EQ(phase(a, Phase::kDraining), 1 * kMs);
  EXPECT_EQ(a.totals.held_ns, 21 * kMs) << "grant to release, the drain included";
  EXPECT_EQ(phase(b, Phase::kWaiting), 16 * kMs);
  EXPECT_EQ(phase(b, Phase::kIdle), 5 * kMs);
  EXPECT_EQ(behind(t.acct, "ns/b", "ns/a"), 16 * kMs)
      << "a held the GPU, then drained, while b waited";
  EXPECT_EQ(b.wait.count(), 1u);
  EXPECT_EQ(b.wait.sum_ns(), 16 * kMs);
  EXPECT_EQ(a.drain.count(), 1u);
  EXPECT_EQ(a.drain.sum_ns(), 1 * kMs);
  EXPECT_EQ(a.totals.grants, 1u);
  EXPECT_EQ(b.totals.grants, 1u);
  EXPECT_EQ(t.acct.switches(), 1u);
  EXPECT_EQ(t.acct.handoff().count(), 1u) << "b was waiting when a's hold ended";
  EXPECT_EQ(t.acct.held_ns(), 21 * kMs);
}

TEST(Accounting, EveryPhaseAddsUpToThePodsTimeOnTheGpu) {
  Timeline t;
  t.add(0, 1, "ns/a");
  t.add(1, 2, "ns/b");
  const uint64_t start = t.now;
  t.want(0, true);
  t.want(1, true);
  for (int i = 0; i < 50; ++i) {
    const SlotId holder =
        t.state(0) == TenantState::kHolding || t.state(0) == TenantState::kRevoking ? 0 : 1;
    t.run(3 * kMs, holder);
    if (t.state(holder) == TenantState::kRevoking) {
      t.now += 500'000;
      t.release(holder);
    }
  }
  t.acct.advance(t.now);
  for (const char* key : {"ns/a", "ns/b"}) {
    const PodAccount& p = *t.acct.pod(key);
    uint64_t sum = 0;
    for (uint64_t ns : p.totals.phase_ns) sum += ns;
    EXPECT_EQ(sum, t.now - start) << key;
    EXPECT_GT(p.totals.grants, 2u) << key;
  }
  // Whoever waited, waited behind the other (never behind itself, never nobody here).
  EXPECT_EQ(phase(*t.acct.pod("ns/a"), Phase::kWaiting), behind(t.acct, "ns/a", "ns/b"));
  EXPECT_EQ(phase(*t.acct.pod("ns/b"), Phase::kWaiting), behind(t.acct, "ns/b", "ns/a"));
}

TEST(Accounting, AHolderThatIgnoresARevokeIsCountedAndDrainsUntilItReleases) {
  Timeline t;
  t.add(0, 1, "ns/stuck");
  t.add(1, 2, "ns/next");
  t.want(0, true);
  t.run(1 * kMs, 0);
  t.want(1, true);
  t.run(20 * kMs, 0);  // revoked at quantum end
  ASSERT_EQ(t.state(0), TenantState::kRevoking);
  t.now += 100 * kMs;  // revoke_timeout passes without a release
  t.pass();
  ASSERT_EQ(t.state(0), TenantState::kPassedOver);
  ASSERT_EQ(t.state(1), TenantState::kHolding);
  t.acct.advance(t.now);
  const PodAccount& stuck = *t.acct.pod("ns/stuck");
  EXPECT_EQ(stuck.totals.revoke_timeouts, 1u);
  EXPECT_EQ(stuck.phase, Phase::kDraining);
  t.now += 30 * kMs;
  t.release(0);  // it resumes and releases at last
  t.acct.advance(t.now);
  EXPECT_EQ(stuck.drain.count(), 1u);
  EXPECT_EQ(stuck.drain.sum_ns(), 130 * kMs) << "revoke to release, the pass-over included";
  EXPECT_EQ(behind(t.acct, "ns/next", "ns/stuck"), 120 * kMs);
}

// A shim that ends its own quantum is never revoked: it stops launching at the end the
// arbiter published and releases once its work is done. That tail is a drain, counted as
// a revoked holder's is, not time running.
TEST(Accounting, AHolderThatEndsItsOwnQuantumDrainsFromThatEnd) {
  Timeline t;
  t.add(0, 1, "ns/self");
  t.add(1, 2, "ns/next");
  t.ends_own_quantum(0);
  t.want(0, true);
  const uint64_t granted = t.now;
  t.run(1 * kMs, 0);
  t.want(1, true);
  ASSERT_EQ(t.state(1), TenantState::kWaiting);
  t.run(10 * kMs, 0);
  const uint64_t end = t.self_end();
  ASSERT_GT(end, t.now) << "the holder's own end is published";
  t.now = end + 3 * kMs;  // it drains 3 ms past its end, with no pass in between
  t.release(0);
  ASSERT_EQ(t.state(1), TenantState::kHolding);
  t.acct.advance(t.now);
  const PodAccount& self = *t.acct.pod("ns/self");
  EXPECT_EQ(phase(self, Phase::kRunning), end - granted);
  EXPECT_EQ(phase(self, Phase::kDraining), 3 * kMs);
  EXPECT_EQ(self.totals.held_ns, end + 3 * kMs - granted) << "the drain is held time too";
  EXPECT_EQ(self.drain.count(), 1u);
  EXPECT_EQ(self.drain.sum_ns(), 3 * kMs);
  EXPECT_EQ(behind(t.acct, "ns/next", "ns/self"), end + 3 * kMs - granted - 1 * kMs);
}

TEST(Accounting, ADepartedPodKeepsItsHistoryForExplainThenIsForgotten) {
  Timeline t;
  t.add(0, 1, "ns/a");
  t.want(0, true);
  for (int i = 0; i < 5; ++i) {
    t.run(1'000 * kMs, 0);
    t.acct.tick({{"ns/a", 1.0}}, t.now);
  }
  const PodAccount& a = *t.acct.pod("ns/a");
  EXPECT_EQ(a.history.size(), 6u);  // arrival mark and five ticks
  const PodSample* s = t.acct.sample_before(a, t.now, 2'000 * kMs);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->at_ns, t.now - 2'000 * kMs);
  EXPECT_EQ(a.totals.held_ns - s->totals.held_ns, 2'000 * kMs);
  t.remove(0);
  ASSERT_NE(t.acct.pod("ns/a"), nullptr);
  EXPECT_EQ(t.acct.pod("ns/a")->tenants, 0u);
  t.now += GpuAccounting::kRetainNs + 1;
  t.acct.tick({}, t.now);
  EXPECT_EQ(t.acct.pod("ns/a"), nullptr);
}

TEST(Accounting, WantDroppedWhileWaitingIsIdleTimeAndNoGrant) {
  Timeline t;
  t.add(0, 1, "ns/a");
  t.add(1, 2, "ns/b");
  t.want(0, true);
  t.run(1 * kMs, 0);
  t.want(1, true);
  t.run(4 * kMs, 0);
  t.want(1, false);  // b gave up before its turn: the scheduler's state says so at settle
  t.run(5 * kMs, 0);
  t.acct.advance(t.now);
  const PodAccount& b = *t.acct.pod("ns/b");
  EXPECT_EQ(phase(b, Phase::kWaiting), 4 * kMs);
  EXPECT_EQ(b.totals.grants, 0u);
  EXPECT_EQ(b.wait.count(), 0u)
      << "a wait that never ended in a grant is not a want-to-grant sample";
}

// ---------------------------------------------------------------------------------------

PodLoad load(uint32_t weight, double demand, double max_share = 1, double min_share = 0,
             common::Priority priority = common::Priority::kBatch) {
  PodLoad p;
  p.weight = weight;
  p.demand = demand;
  p.max_share = max_share;
  p.min_share = min_share;
  p.priority = priority;
  return p;
}

// The accounting folds time into a pod's totals only when its phase or the holder changes.
// This checks it against the plain way of counting: after every pass, integrate each pod's
// phase (from its tenants' states then) and the wait behind the holder then, over a seeded
// random run of arrivals, departures, wants, busy and idle holders and releases.
TEST(Accounting, FoldedTotalsEqualStepByStepIntegration) {
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    uint64_t rng = seed * 0x9e3779b97f4a7c15ull;
    auto next = [&](uint64_t n) {
      rng ^= rng << 13;
      rng ^= rng >> 7;
      rng ^= rng << 17;
      return rng % n;
    };
    Timeline t;
    constexpr SlotId kSlots = 6;
    const std::string keys[] = {"ns/a", "ns/b", "ns/c", "ns/d"};
    const PodId pod_of[kSlots] = {0, 1, 2, 3, 0, 1};  // a and b have two processes each
    bool present[kSlots] = {};
    struct Expected {
      std::array<uint64_t, kPhaseCount> phase{};
      std::map<std::string, uint64_t> behind;  // holder's key ("" = nobody)
      uint64_t held = 0;
      uint32_t tenants = 0;
    };
    std::map<std::string, Expected> expected;
    uint64_t gpu_held = 0;
    // The states after the last pass hold until this one.
    auto integrate = [&](uint64_t dt) {
      std::map<std::string, Phase> phase;
      std::string holding, drainer;
      bool occupied = false;
      for (SlotId s = 0; s < kSlots; ++s) {
        if (!present[s]) continue;
        const std::string& key = keys[pod_of[s]];
        const TenantState st = t.state(s);
        Phase p = Phase::kIdle;
        if (st == TenantState::kHolding) p = Phase::kRunning;
        if (st == TenantState::kRevoking || st == TenantState::kPassedOver) p = Phase::kDraining;
        if (st == TenantState::kWaiting) p = Phase::kWaiting;
        // A pod's phase is its most active tenant's: running, draining, waiting, idle.
        const auto rank = [](Phase ph) {
          return ph == Phase::kRunning ? 0 : ph == Phase::kDraining ? 1 : ph == Phase::kWaiting ? 2 : 3;
        };
        auto [it, fresh] = phase.emplace(key, p);
        if (!fresh && rank(p) < rank(it->second)) it->second = p;
        if (st == TenantState::kHolding) holding = key;
        const bool drains = st == TenantState::kRevoking || st == TenantState::kPassedOver;
        if (drains && (drainer.empty() || st == TenantState::kRevoking)) drainer = key;
        if (st == TenantState::kHolding || st == TenantState::kRevoking) {
          occupied = true;
          expected[key].held += dt;
        }
      }
      const std::string holder = holding.empty() ? drainer : holding;
      for (const auto& [key, p] : phase) {
        expected[key].phase[static_cast<size_t>(p)] += dt;
        if (p == Phase::kWaiting) expected[key].behind[holder] += dt;
      }
      if (occupied) gpu_held += dt;
    };
    auto step = [&](uint64_t dt) {
      integrate(dt);
      t.now += dt;
    };
    auto check = [&] {
      t.acct.advance(t.now);
      for (const auto& [key, e] : expected) {
        const PodAccount* p = t.acct.pod(key);
        ASSERT_NE(p, nullptr) << key;
        for (size_t ph = 0; ph < kPhaseCount; ++ph)
          EXPECT_EQ(p->totals.phase_ns[ph], e.phase[ph]) << key << " " << phase_name(Phase(ph));
        EXPECT_EQ(p->totals.held_ns, e.held) << key;
        for (const auto& [holder, ns] : e.behind) {
          EXPECT_EQ(behind(t.acct, key, holder), ns) << key << " behind '" << holder << "'";
        }
      }
      EXPECT_EQ(t.acct.held_ns(), gpu_held);
    };
    for (int event = 0; event < 400; ++event) {
      step(next(4) * kMs + next(1000) * 1000);
      const SlotId s = static_cast<SlotId>(next(kSlots));
      switch (next(6)) {
        case 0:
          if (present[s]) {
            present[s] = false;
            t.remove(s);
          } else {
            present[s] = true;
            t.add(s, pod_of[s], keys[pod_of[s]]);
            t.pass();
          }
          break;
        case 1:
        case 2:
          if (present[s]) t.want(s, next(3) != 0);
          break;
        case 3:
          if (present[s] && t.state(s) == TenantState::kRevoking) t.release(s);
          break;
        default:
          for (SlotId h = 0; h < kSlots; ++h) {
            if (present[h] && t.state(h) == TenantState::kHolding && next(2) == 0) t.busy(h);
          }
          t.pass();
          break;
      }
      if (event % 37 == 0) check();
      if (::testing::Test::HasFailure()) return;
    }
    check();
  }
}

TEST(Capacity, ANewcomerGetsWhatTheWeightsAndDemandsLeave) {
  EXPECT_NEAR(expected_shares({load(1, 1), load(2, 1)}, 1).back(), 0.25, 1e-6);
  EXPECT_NEAR(expected_shares({load(1, 0.1)}, 1).back(), 0.9, 1e-6)
      << "a mostly idle pod leaves the rest";
  EXPECT_NEAR(expected_shares({load(4, 1, 0.2)}, 1).back(), 0.8, 1e-6)
      << "a capped pod leaves the rest";
  const auto with_interactive =
      expected_shares({load(1, 0.3, 1, 0, common::Priority::kInteractive), load(1, 1)}, 1);
  EXPECT_NEAR(with_interactive[0], 0.3, 1e-6);
  EXPECT_NEAR(with_interactive.back(), 0.35, 1e-6);
  EXPECT_NEAR(expected_shares({load(1, 1, 1, 0.5)}, 1).back(), 0.25, 1e-6)
      << "the minimum first, then weights divide what is left";
  const auto best_effort = expected_shares({load(1, 1, 1, 0, common::Priority::kBestEffort)}, 1);
  EXPECT_NEAR(best_effort[0], 0.0, 1e-6);
  EXPECT_NEAR(best_effort.back(), 1.0, 1e-6);
}

TEST(Capacity, AHalfBusyGpuWhoseMemoryIsPromisedFitsNoFortyPercentPod) {
  // 10 GiB GPU; one pod capped at 7 GiB uses 1.6 GiB and wants the GPU half of the time.
  PodLoad big = load(1, 0.5);
  big.memory_cap = 7ull << 30;
  big.memory_used = 1638ull << 20;
  config::FitProbe forty, twenty;
  ASSERT_EQ(config::parse_fit_probe("0.25", "40%", &forty), "");
  ASSERT_EQ(config::parse_fit_probe("25%", "2Gi", &twenty), "");
  const GpuCapacity c = gpu_capacity({big}, 10ull << 30, 0, 255, {forty, twenty});
  EXPECT_EQ(c.memory_caps, 7ull << 30);
  EXPECT_EQ(c.memory_unpromised, 3ull << 30);
  EXPECT_NEAR(c.new_pod_share, 0.5, 1e-6) << "there is GPU time for a newcomer";
  ASSERT_EQ(c.fits.size(), 2u);
  EXPECT_EQ(c.fits[0], 0u) << "4 GiB is not there, however idle the GPU looks";
  EXPECT_EQ(c.fits[1], 1u);
}

TEST(Capacity, FitsCountSharesAndPromisedMinimums) {
  config::FitProbe quarter;
  ASSERT_EQ(config::parse_fit_probe("0.25", "0", &quarter), "");
  EXPECT_EQ(gpu_capacity({load(1, 1)}, 1ull << 30, 0, 255, {quarter}).fits[0], 3u)
      << "beside a greedy weight-1 pod, three newcomers still get a quarter each";
  EXPECT_EQ(gpu_capacity({}, 1ull << 30, 0, 255, {quarter}).fits[0], 4u);
  EXPECT_EQ(gpu_capacity({}, 1ull << 30, 0, 2, {quarter}).fits[0], 2u) << "tenant slots run out";
  // An idle pod promised 70% leaves time now, but only one quarter can still be promised.
  const GpuCapacity c = gpu_capacity({load(1, 0.05, 1, 0.7)}, 1ull << 30, 0, 255, {quarter});
  EXPECT_NEAR(c.promised_min_share, 0.7, 1e-9);
  EXPECT_EQ(c.fits[0], 1u);
  // Uncapped pods and unmanaged processes promise what they use.
  PodLoad uncapped = load(1, 0);
  uncapped.memory_used = 3ull << 30;
  EXPECT_EQ(gpu_capacity({uncapped}, 8ull << 30, 1ull << 30, 255, {}).memory_unpromised,
            4ull << 30);
}

// Minimums promised to pods that may use the GPU but run nowhere yet still bind: no new
// minimum fits beside a GPU promised whole, though the time is free now.
TEST(Capacity, MinimumsOfPodsNotRunningHereStillLeaveNoRoom) {
  config::FitProbe tenth;
  ASSERT_EQ(config::parse_fit_probe("0.1", "0", &tenth), "");
  const GpuCapacity c = gpu_capacity({}, 1ull << 30, 0, 255, {tenth}, 1.0);
  EXPECT_NEAR(c.promised_min_share, 1.0, 1e-9);
  EXPECT_EQ(c.fits[0], 0u);
  EXPECT_NEAR(c.new_pod_share, 1.0, 1e-6) << "the time is free now";
  EXPECT_EQ(gpu_capacity({load(1, 1, 1, 0.3)}, 1ull << 30, 0, 255, {tenth}, 0.5).fits[0], 5u)
      << "0.5 promised in all, 0.3 of it to the pod here";
}

TEST(Capacity, ProbesRefuseWhatTheyCannotMean) {
  config::FitProbe p;
  EXPECT_NE(config::parse_fit_probe("0", "1Gi", &p), "");
  EXPECT_NE(config::parse_fit_probe("1.5", "1Gi", &p), "");
  EXPECT_NE(config::parse_fit_probe("0.5", "lots", &p).find("memory \"lots\""), std::string::npos);
  // What a refusal quotes is escaped: the message stays one line.
  EXPECT_NE(config::parse_fit_probe("0.5\n", "1Gi", &p).find("share \"0.5\\x0a\" is not allowed"),
            std::string::npos);
  EXPECT_NE(config::parse_fit_probe("0.5", "1\nGi", &p).find("memory \"1\\x0aGi\": memory size"),
            std::string::npos);
  EXPECT_NE(config::parse_fit_probe("0.5", "1\n%", &p).find("memory \"1\\x0a%\": a percentage"),
            std::string::npos);
  EXPECT_NE(config::parse_fit_probe("0.5", "140%", &p), "");
  ASSERT_EQ(config::parse_fit_probe("50%", "25%", &p), "");
  EXPECT_EQ(p.memory_on(8ull << 30), 2ull << 30);
  EXPECT_EQ(p.share_label, "50%");
}

// ---------------------------------------------------------------------------------------

TEST(MetricsConfig, FitProbesParseAndRefuseBadValues) {
  config::NodeConfig d = config::parse_config("", "t.toml");
  ASSERT_EQ(d.metrics.fit_probes.size(), 2u);
  EXPECT_EQ(d.metrics.fit_probes[0].share_label, "0.25");
  EXPECT_EQ(d.metrics.fit_probes[0].memory_label, "25%");
  config::NodeConfig c = config::parse_config(
      "[metrics]\nfit_probes = [{share = \"25%\", memory = \"10Gi\"}]\n", "t.toml");
  ASSERT_EQ(c.metrics.fit_probes.size(), 1u);
  EXPECT_EQ(c.metrics.fit_probes[0].memory_bytes, 10ull << 30);
  auto refusal = [](const std::string& text) {
    try {
      config::parse_config(text, "t.toml");
    } catch (const config::ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  std::string e = refusal("[metrics]\nfit_probes = [{share = 2, memory = \"1Gi\"}]\n");
  EXPECT_NE(e.find("metrics.fit_probes"), std::string::npos) << e;
  EXPECT_NE(e.find("t.toml:2:"), std::string::npos) << e;
  e = refusal("[metrics]\nfit_probes = [{share = 0.5}]\n");
  EXPECT_NE(e.find("needs share and memory"), std::string::npos) << e;
  e = refusal("[metrics]\nfit_probes = [{share = 0.5, memory = \"1Gi\", colour = 1}]\n");
  EXPECT_NE(e.find("unknown key \"colour\""), std::string::npos) << e;
  e = refusal(
      "[metrics]\nfit_probes = [{share = 0.5, memory = \"1Gi\"}, {share = 0.5, memory = "
      "\"1Gi\"}]\n");
  EXPECT_NE(e.find("twice"), std::string::npos) << e;
  e = refusal("[metrics]\nfit_probes = \"0.25\"\n");
  EXPECT_NE(e.find("a list of"), std::string::npos) << e;
}

// ---------------------------------------------------------------------------------------

TEST(MetricsText, LabelValuesAreEscapedAndKeptValidUtf8) {
  EXPECT_EQ(escape_label_value("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
  EXPECT_EQ(escape_label_value("caf\xc3\xa9"), "caf\xc3\xa9");
  EXPECT_EQ(escape_label_value("bad\xff"), "bad\xef\xbf\xbd");
  EXPECT_EQ(escape_label_value("\x1b[31m"), "\xef\xbf\xbd[31m");
  EXPECT_EQ(escape_label_value("\xc0\x80"), "\xef\xbf\xbd\xef\xbf\xbd") << "overlong NUL";
}

TEST(Figures, NodeFitsCountAMigGpuThroughItsInstancesOnly) {
  // A GPU in MIG mode and its two managed instances: the instances' room is the GPU's, so
  // the node counts it once; a whole GPU beside them counts as itself.
  std::vector<GpuFigures> gpus(4);
  gpus[0].uuid = "GPU-a";
  gpus[0].capacity.fits = {4, 8};
  gpus[1].uuid = "MIG-a1";
  gpus[1].parent = "GPU-a";
  gpus[1].capacity.fits = {1, 2};
  gpus[2].uuid = "MIG-a2";
  gpus[2].parent = "GPU-a";
  gpus[2].capacity.fits = {1, 1};
  gpus[3].uuid = "GPU-b";
  gpus[3].capacity.fits = {3, 5};
  EXPECT_EQ(sum_node_fits(gpus, 2), (std::vector<uint32_t>{5, 8}));
  EXPECT_TRUE(gpus[0].mig_parent);
  EXPECT_FALSE(gpus[1].mig_parent);
  EXPECT_FALSE(gpus[3].mig_parent);
  // MIG instances listed without their GPU (a driver listing them at the top level).
  std::vector<GpuFigures> instances(gpus.begin() + 1, gpus.begin() + 3);
  EXPECT_EQ(sum_node_fits(instances, 2), (std::vector<uint32_t>{2, 3}));
  // Fewer fits than probes: the missing ones count 0.
  std::vector<GpuFigures> one(1);
  one[0].capacity.fits = {2};
  EXPECT_EQ(sum_node_fits(one, 2), (std::vector<uint32_t>{2, 0}));
}

NodeFigures sample_figures() {
  NodeFigures f;
  f.scope = "s";
  f.hostname = "node-1";
  f.version = "0.1.0";
  f.generation = 2;
  f.probes = config::MetricsConfig::default_fit_probes();
  f.node_fits = {1, 2};
  f.refusals["no-pod"] = 3;
  GpuFigures g;
  g.uuid = "GPU-1";
  g.identity.model = "Model \"X\"";
  g.capacity.fits = {1, 2};
  PodFigures p;
  p.key = "ns/evil\"pod\n\xff";
  std::tie(p.namespace_name, p.pod_name) = split_pod_key(p.key);
  p.policy.memory_limit = 1 << 30;
  p.wait.add(3 * kMs);
  p.totals.phase_ns[0] = 1'500'000'001;
  p.waited_behind = {{"ns/other", 2 * kMs}, {"", 1 * kMs}};
  p.wait_budget_s = 0.02;
  g.pods.push_back(p);
  ProcessFigures proc;
  proc.pid = 42;
  proc.container = "main";
  proc.nvml_memory = 7;
  g.processes[p.key].push_back(proc);
  f.gpus.push_back(g);
  return f;
}

TEST(MetricsText, RendersEveryFamilyOnceWithExactSecondsAndHostileNamesEscaped) {
  const std::string text = render_prometheus(sample_figures());
  EXPECT_NE(
      text.find(
          "quanta_pod_time_seconds_total{gpu=\"0\",UUID=\"GPU-1\",model_name=\"Model \\\"X\\\"\""),
      std::string::npos);
  EXPECT_NE(text.find("pod=\"evil\\\"pod\\n\xef\xbf\xbd\",state=\"running\"} 1.500000001\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("holder_namespace=\"\",holder_pod=\"(none)\"} 0.001\n"), std::string::npos);
  EXPECT_NE(text.find("holder_namespace=\"ns\",holder_pod=\"other\"} 0.002\n"), std::string::npos);
  EXPECT_NE(text.find("quanta_pod_wait_seconds_bucket{"), std::string::npos);
  EXPECT_NE(text.find("le=\"0.005\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("quanta_arbiter_admissions_refused_total{reason=\"no-pod\"} 3\n"),
            std::string::npos);
  EXPECT_NE(text.find("quanta_arbiter_admissions_refused_total{reason=\"unregistered\"} 0\n"),
            std::string::npos);
  EXPECT_NE(text.find("container=\"main\",pid=\"42\"} 7\n"), std::string::npos);
  // One TYPE line per family.
  size_t types = 0;
  for (size_t at = text.find("# TYPE quanta_pod_weight "); at != std::string::npos;
       at = text.find("# TYPE quanta_pod_weight ", at + 1))
    ++types;
  EXPECT_EQ(types, 1u);
}

// The catalogue is one table: every family it lists is rendered, once, in its order, and
// nothing is rendered that it does not list.
TEST(MetricsText, EveryFamilyOfTheCatalogueIsRenderedOnceInTheCataloguesOrder) {
  const std::string text = render_prometheus(sample_figures());
  std::vector<std::string> rendered;
  for (size_t at = text.find("# TYPE "); at != std::string::npos; at = text.find("# TYPE ", at + 1)) {
    const size_t name = at + 7;
    rendered.push_back(text.substr(name, text.find(' ', name) - name));
  }
  EXPECT_EQ(rendered, metric_families());
  EXPECT_GE(rendered.size(), 40u);
}

TEST(MetricsText, PromtoolFindsNothingToLint) {
  if (std::system("command -v promtool >/dev/null 2>&1") != 0) {
    if (std::getenv("QUANTA_REQUIRE_BPF") != nullptr)
      FAIL() << "promtool is not installed (Debian package prometheus)";
    GTEST_SKIP() << "promtool is not installed (Debian package prometheus)";
  }
  const std::string path = "/tmp/quanta-metrics-lint-" + std::to_string(getpid()) + ".prom";
  {
    std::ofstream out(path);
    out << render_prometheus(sample_figures());
  }
  const std::string command = "promtool check metrics < " + path + " 2>&1";
  FILE* p = popen(command.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string said;
  char buf[512];
  while (fgets(buf, sizeof buf, p) != nullptr) said += buf;
  const int rc = pclose(p);
  std::remove(path.c_str());
  EXPECT_EQ(rc, 0) << said;
  EXPECT_EQ(said, "") << said;
}

TEST(Figures, PodKeysSplitIntoNamespaceAndName) {
  EXPECT_EQ(split_pod_key("prod/web"), (std::pair<std::string, std::string>{"prod", "web"}));
  EXPECT_EQ(split_pod_key("dev-pod"), (std::pair<std::string, std::string>{"default", "dev-pod"}));
  EXPECT_EQ(split_pod_key("uid:1234"), (std::pair<std::string, std::string>{"", "uid:1234"}));
}

TEST(Figures, RefusalTextsMapToTheirReasons) {
  EXPECT_STREQ(
      refusal_reason(
          "pid 7 (cgroup /x) is not in a registered container and this node does not admit "
          "unregistered processes (allow_unregistered = false): running ungated"),
      "unregistered");
  EXPECT_STREQ(
      refusal_reason(
          "pid 7 is not in a registered container and names no pod: set QUANTA_POD=<name>"),
      "no-pod");
  EXPECT_STREQ(refusal_reason(other_protocol_refusal(common::kWireVersion - 1)), "version");
  EXPECT_STREQ(refusal_reason("something new"), "other");
}

// ---------------------------------------------------------------------------------------

// The wait budget a weighted pod is promised bounds the waits the scheduler gives it: with
// weights 3:1 and 4:1:1 a weight-1 pod waits several quanta of the heavier pods, as its
// weight entitles it, and its p99 stays within the budget (one quantum of each other pod
// would be far below it).
TEST(WaitBudget, CoversTheWaitsTheWeightsGiveEveryPod) {
  using quanta::arbiter::testing::Sim;
  for (const std::vector<uint32_t>& weights :
       {std::vector<uint32_t>{3, 1}, std::vector<uint32_t>{4, 1, 1}, std::vector<uint32_t>{1, 1}}) {
    SchedulerOptions o;
    o.quantum_ns = 20 * common::kNsPerMs;
    Sim sim(o);
    for (size_t i = 0; i < weights.size(); ++i) {
      common::Policy p;
      p.weight = weights[i];
      sim.add(static_cast<SlotId>(i), static_cast<PodId>(i + 1), p);
      sim.busy(static_cast<SlotId>(i));
      sim.depth(static_cast<SlotId>(i), 2);
    }
    sim.run_for(6 * common::kNsPerSec);
    const std::vector<TenantReport> reports = sim.sched.report(sim.now);
    std::vector<BudgetTenant> tenants;
    for (const TenantReport& r : reports)
      tenants.push_back({std::to_string(r.pod), weights[r.pod - 1], common::Priority::kBatch,
                         r.quantum_ns, true});
    const BudgetTimings timings{o.quantum_ns, o.quantum_min_ns, o.quantum_slack_ppm};
    for (const TenantReport& r : reports) {
      const uint64_t budget = wait_budget_ns(tenants, std::to_string(r.pod), weights[r.pod - 1],
                                             common::Priority::kBatch, timings);
      EXPECT_GT(r.wait_p99_ns, 0u);
      EXPECT_LE(r.wait_p99_ns, budget) << "weight " << weights[r.pod - 1] << " of " << weights.size()
                                       << " pods: p99 wait " << r.wait_p99_ns / 1e6
                                       << " ms over its budget " << budget / 1e6 << " ms";
      // The budget is no slacker than it must be: the quanta and at most their drains.
      EXPECT_LE(budget, r.wait_p99_ns * 5 / 2 + o.quantum_ns) << "weight " << weights[r.pod - 1];
    }
  }
}

TEST(WaitBudget, ClassesAndRoundingFollowTheSchedulersRules) {
  const BudgetTimings t{20'000'000, 1'000'000, 0};
  using common::Priority;
  const std::vector<BudgetTenant> tenants = {
      {"ml/big", 3, Priority::kBatch, 20'000'000, true},
      {"ml/small", 1, Priority::kBatch, 20'000'000, true},
      {"ml/web", 1, Priority::kInteractive, 5'000'000, true},
      {"ml/notebook", 1, Priority::kBestEffort, 20'000'000, true},
      {"ml/idle", 8, Priority::kBatch, 20'000'000, false},
  };
  // small: three quanta of big (weight 3), one round of the interactive pod above it, each
  // followed by up to a quantum of queued work; the best-effort and idle pods do not count.
  EXPECT_EQ(wait_budget_ns(tenants, "ml/small", 1, Priority::kBatch, t),
            2 * (3 * 20'000'000u + 5'000'000u));
  // big: one quantum of small (it runs a third of big's quantum, in whole quanta).
  EXPECT_EQ(wait_budget_ns(tenants, "ml/big", 3, Priority::kBatch, t),
            2 * (20'000'000u + 5'000'000u));
  // web: the minimum hold of a lower-class holder and its hand-off, no other interactive pod.
  EXPECT_EQ(wait_budget_ns(tenants, "ml/web", 1, Priority::kInteractive, t), 2'000'000u);
  EXPECT_EQ(wait_budget_ns(tenants, "ml/notebook", 1, Priority::kBestEffort, t), 0u);
  // Slack stretches every quantum.
  const BudgetTimings slack{20'000'000, 1'000'000, 100'000};
  EXPECT_EQ(wait_budget_ns(tenants, "ml/big", 3, Priority::kBatch, slack),
            (20'000'000u + 5'000'000u) * 21 / 10);
  EXPECT_EQ(round_up_to_wait_bucket(60'000'000), 100'000'000u);
  EXPECT_EQ(round_up_to_wait_bucket(100'000'000), 100'000'000u);
  EXPECT_EQ(round_up_to_wait_bucket(100'000'001), 250'000'000u);
  EXPECT_EQ(round_up_to_wait_bucket(20'000'000'000), 20'000'000'000u);
}

}  // namespace
}  // namespace quanta::arbiter
