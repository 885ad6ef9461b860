// The scheduler's policy, driven event by event with a fake clock: weighted shares,
// lone tenants, idle and stopped holders, overrun charging, lag bound, priorities and
// max-share ceilings.
#include "arbiter/scheduler.h"

#include <gtest/gtest.h>

#include <map>

#include "common/clock.h"

namespace quanta::arbiter {
namespace {

using common::kNsPerMs;
using common::kNsPerSec;

// A simulated GPU: tenants that always want the GPU (or not), release promptly when
// revoked (or never), and a clock that jumps to the scheduler's next deadline.
class Sim {
 public:
  explicit Sim(SchedulerOptions o = {}) : sched(o) {}

  void add(SlotId slot, PodId pod, common::Policy policy = {}) {
    sched.set_pod_policy(pod, policy);
    sched.add_tenant(slot, pod, now);
  }
  void want(SlotId slot, bool w = true) { sched.set_want(slot, w, now); }
  // Busy tenants launch continuously, publishing `queued_ns` of queued work while holding.
  void busy(SlotId slot, bool b = true, uint64_t queued_ns = 1) {
    busy_[slot] = b;
    queued_[slot] = queued_ns;
  }
  void stopped(SlotId slot, bool s = true) { stopped_[slot] = s; }

  // Returns true when releases came back (a decision must follow at once).
  bool step() {
    for (auto& [slot, b] : busy_) {
      if (b && sched.holder() == slot) sched.set_activity(slot, now, queued_[slot], now);
    }
    auto actions = sched.decide(now);
    for (const Action& a : actions) {
      log.push_back(a);
      if (a.kind == Action::Kind::kGrant) held_since_[a.slot] = now;
      if (a.kind == Action::Kind::kRevoke && !stopped_[a.slot]) {
        pending_release_.push_back(a.slot);
      }
      if (a.kind == Action::Kind::kRevoke || a.kind == Action::Kind::kPassOver) close(a.slot);
    }
    // Releases come back promptly (50 us later) as a doorbell would deliver them.
    if (!pending_release_.empty()) {
      now += 50 * common::kNsPerUs;
      for (SlotId s : pending_release_) sched.released(s, now);
      pending_release_.clear();
      return true;
    }
    return false;
  }

  // Runs until `until`, jumping from deadline to deadline.
  void run_until(uint64_t until) {
    while (now < until) {
      if (step()) continue;
      uint64_t next = sched.next_deadline();
      if (next == 0 || next > until) next = until;
      if (next <= now) next = now + 1;
      // Account holding time up to the jump.
      now = next;
    }
    if (auto h = sched.holder()) close(*h), held_since_[*h] = now;
  }

  double share(SlotId slot) const {
    uint64_t total = 0;
    for (auto& [s, ns] : held_) total += ns;
    auto it = held_.find(slot);
    return total == 0 || it == held_.end() ? 0.0 : static_cast<double>(it->second) / total;
  }
  uint64_t held_ns(SlotId slot) const {
    auto it = held_.find(slot);
    return it == held_.end() ? 0 : it->second;
  }
  size_t count(Action::Kind kind, SlotId slot) const {
    size_t n = 0;
    for (const Action& a : log) n += (a.kind == kind && a.slot == slot) ? 1 : 0;
    return n;
  }

  Scheduler sched;
  uint64_t now = 1 * kNsPerSec;
  std::vector<Action> log;

 private:
  void close(SlotId slot) {
    auto it = held_since_.find(slot);
    if (it == held_since_.end()) return;
    held_[slot] += now - it->second;
    held_since_.erase(it);
  }
  std::map<SlotId, bool> busy_;
  std::map<SlotId, uint64_t> queued_;
  std::map<SlotId, bool> stopped_;
  std::map<SlotId, uint64_t> held_since_;
  std::map<SlotId, uint64_t> held_;
  std::vector<SlotId> pending_release_;
};

common::Policy weight(uint32_t w) {
  common::Policy p;
  p.weight = w;
  return p;
}

TEST(Scheduler, WeightedSharesConvergeToOneTwoFour) {
  Sim sim;
  sim.add(1, 1, weight(1));
  sim.add(2, 2, weight(2));
  sim.add(3, 3, weight(4));
  for (SlotId s : {1u, 2u, 3u}) sim.want(s), sim.busy(s);
  sim.run_until(sim.now + 10 * kNsPerSec);
  EXPECT_NEAR(sim.share(1), 1.0 / 7, 0.01);
  EXPECT_NEAR(sim.share(2), 2.0 / 7, 0.01);
  EXPECT_NEAR(sim.share(3), 4.0 / 7, 0.01);
}

TEST(Scheduler, LoneTenantIsNeverRevoked) {
  Sim sim;
  sim.add(1, 1);
  sim.want(1);
  sim.busy(1);
  sim.run_until(sim.now + 5 * kNsPerSec);
  EXPECT_EQ(sim.count(Action::Kind::kGrant, 1), 1u);
  EXPECT_EQ(sim.count(Action::Kind::kRevoke, 1), 0u);
}

TEST(Scheduler, IdleHolderIsRevokedEarlyWhenOthersWait) {
  SchedulerOptions o;
  o.quantum_ns = 50 * kNsPerMs;
  o.idle_release_ns = 2 * kNsPerMs;
  Sim sim(o);
  sim.add(1, 1);
  sim.add(2, 2);
  sim.want(1);
  sim.step();
  ASSERT_EQ(sim.sched.holder(), 1u);
  // Tenant 1 launched once at the grant and then went quiet; tenant 2 starts waiting.
  const uint64_t last_launch = sim.now;
  sim.sched.set_activity(1, sim.now, 0, sim.now);
  sim.want(1, false);
  sim.now += 1 * kNsPerMs;
  sim.want(2);
  sim.step();
  EXPECT_EQ(sim.sched.holder(), 1u) << "revoked before idle_release elapsed";
  sim.now = sim.sched.next_deadline();
  sim.step();
  sim.step();
  EXPECT_EQ(sim.sched.holder(), 2u);
  EXPECT_LE(sim.now, last_launch + 2 * kNsPerMs + 100 * common::kNsPerUs)
      << "revoke waited for the quantum";
}

TEST(Scheduler, OverrunIsChargedToTheHolder) {
  SchedulerOptions o;
  o.quantum_ns = 10 * kNsPerMs;
  Sim sim(o);
  sim.add(1, 1);
  sim.add(2, 2);
  sim.want(1);
  sim.want(2);
  sim.busy(1);
  sim.busy(2);
  sim.step();
  SlotId first = *sim.sched.holder();
  SlotId second = first == 1 ? 2 : 1;
  // The first holder overruns its 10 ms quantum by 30 ms before releasing.
  sim.now += 40 * kNsPerMs;
  sim.stopped(first);
  sim.step();  // revoke
  sim.now += 1 * kNsPerMs;
  sim.sched.released(first, sim.now);
  sim.stopped(first, false);
  sim.step();
  ASSERT_EQ(sim.sched.holder(), second);
  // Equal weights: the second tenant now gets about the overrun back before the first
  // holds again (four 10 ms quanta, not one).
  uint64_t start = sim.now;
  size_t grants_before = sim.count(Action::Kind::kGrant, first);
  while (sim.count(Action::Kind::kGrant, first) == grants_before && sim.now < start + kNsPerSec) {
    uint64_t next = sim.sched.next_deadline();
    sim.now = next > sim.now ? next : sim.now + 1;
    sim.step();
  }
  EXPECT_GE(sim.now - start, 35 * kNsPerMs);
}

TEST(Scheduler, WakingTenantCannotMonopolise) {
  SchedulerOptions o;
  o.quantum_ns = 10 * kNsPerMs;
  Sim sim(o);
  sim.add(1, 1);
  sim.add(2, 2);
  sim.want(1);
  sim.busy(1);
  sim.run_until(sim.now + 5 * kNsPerSec);  // tenant 2 idles while 1 runs alone
  sim.want(2);
  sim.busy(2);
  uint64_t start = sim.now;
  uint64_t held1_before = sim.held_ns(1);
  sim.run_until(start + 200 * kNsPerMs);
  // Without the lag bound tenant 2 would hold the GPU for the whole 200 ms; with it,
  // tenant 1 gets about half.
  EXPECT_GE(sim.held_ns(1) - held1_before, 70 * kNsPerMs);
}

TEST(Scheduler, TenantsWakingTogetherDoNotStackLagCredit) {
  SchedulerOptions o;
  o.quantum_ns = 20 * kNsPerMs;
  Sim sim(o);
  for (SlotId s = 1; s <= 8; ++s) sim.add(s, s);
  sim.want(1);
  sim.busy(1);
  sim.run_until(sim.now + 500 * kNsPerMs);  // a lone holder while the others set up
  for (SlotId s = 2; s <= 8; ++s) sim.want(s), sim.busy(s);
  uint64_t before = sim.held_ns(1);
  sim.run_until(sim.now + 480 * kNsPerMs);  // three rounds of eight 20 ms quanta
  EXPECT_GE(sim.held_ns(1) - before, 40 * kNsPerMs)
      << "the early tenant starved behind stacked lag credit";
}

TEST(Scheduler, ProcessesOfAPodWakingTogetherDoNotStackLagCredit) {
  SchedulerOptions o;
  o.quantum_ns = 20 * kNsPerMs;
  Sim sim(o);
  for (SlotId s = 1; s <= 8; ++s) sim.add(s, 1);
  sim.want(1);
  sim.busy(1);
  sim.run_until(sim.now + 500 * kNsPerMs);
  for (SlotId s = 2; s <= 8; ++s) sim.want(s), sim.busy(s);
  uint64_t before = sim.held_ns(1);
  sim.run_until(sim.now + 480 * kNsPerMs);
  EXPECT_GE(sim.held_ns(1) - before, 40 * kNsPerMs)
      << "the early process starved behind stacked lag credit";
}

TEST(Scheduler, StoppedHolderIsPassedOverAfterTimeout) {
  SchedulerOptions o;
  o.quantum_ns = 10 * kNsPerMs;
  o.revoke_timeout_ns = 100 * kNsPerMs;
  Sim sim(o);
  sim.add(1, 1);
  sim.add(2, 2);
  sim.want(1);
  sim.busy(1);
  sim.step();
  ASSERT_EQ(sim.sched.holder(), 1u);
  sim.stopped(1);
  sim.want(2);
  sim.busy(2);
  sim.run_until(sim.now + 50 * kNsPerMs);
  EXPECT_EQ(sim.sched.state(1), TenantState::kRevoking);
  EXPECT_EQ(sim.count(Action::Kind::kGrant, 2), 0u);
  sim.run_until(sim.now + 100 * kNsPerMs);
  EXPECT_EQ(sim.count(Action::Kind::kPassOver, 1), 1u);
  EXPECT_EQ(sim.sched.state(1), TenantState::kPassedOver);
  EXPECT_EQ(sim.sched.holder(), 2u);
  // When it resumes it releases its (even) turn and waits like anyone else.
  sim.stopped(1, false);
  sim.sched.released(1, sim.now);
  EXPECT_EQ(sim.sched.state(1), TenantState::kWaiting);
  auto report = sim.sched.report(sim.now);
  ASSERT_EQ(report.size(), 2u);
  EXPECT_EQ(report[0].pass_overs, 1u);
}

TEST(Scheduler, KilledHolderGrantMovesOnAtOnce) {
  Sim sim;
  sim.add(1, 1);
  sim.add(2, 2);
  sim.want(1);
  sim.busy(1);
  sim.step();
  sim.want(2);
  sim.sched.remove_tenant(1, sim.now);
  sim.step();
  EXPECT_EQ(sim.sched.holder(), 2u);
}

TEST(Scheduler, InteractivePreemptsBatchAfterMinimumHold) {
  SchedulerOptions o;
  o.quantum_ns = 50 * kNsPerMs;
  o.quantum_min_ns = 1 * kNsPerMs;
  Sim sim(o);
  common::Policy interactive;
  interactive.priority = common::Priority::kInteractive;
  sim.add(1, 1);
  sim.add(2, 2, interactive);
  sim.want(1);
  sim.busy(1);
  sim.step();
  sim.now += 10 * kNsPerMs;
  sim.want(2);
  uint64_t asked = sim.now;
  sim.step();
  sim.step();
  EXPECT_EQ(sim.sched.holder(), 2u);
  EXPECT_LE(sim.now - asked, 1 * kNsPerMs);
}

TEST(Scheduler, InteractiveStartsWhileThePreemptedHolderDrains) {
  SchedulerOptions o;
  o.quantum_ns = 50 * kNsPerMs;
  o.quantum_min_ns = 1 * kNsPerMs;
  Sim sim(o);
  common::Policy interactive;
  interactive.priority = common::Priority::kInteractive;
  sim.add(1, 1);
  sim.add(2, 2, interactive);
  sim.want(1);
  sim.busy(1);
  sim.step();
  sim.now += 10 * kNsPerMs;
  sim.stopped(1);  // its 20 ms kernel is still running: no release yet
  sim.want(2);
  sim.step();
  EXPECT_EQ(sim.sched.holder(), 2u) << "the interactive tenant waited for the drain";
  EXPECT_EQ(sim.sched.draining(), 1u);
  EXPECT_EQ(sim.sched.state(1), TenantState::kRevoking);
  // The drain ends 15 ms later; the batch tenant is charged up to its release.
  sim.now += 15 * kNsPerMs;
  sim.sched.released(1, sim.now);
  EXPECT_FALSE(sim.sched.draining().has_value());
  EXPECT_EQ(sim.sched.holder(), 2u);
  EXPECT_EQ(sim.sched.state(1), TenantState::kWaiting);
}

TEST(Scheduler, InteractiveOvertakesAHolderAlreadyDrainingForABatchWaiter) {
  SchedulerOptions o;
  o.quantum_ns = 20 * kNsPerMs;
  Sim sim(o);
  common::Policy interactive;
  interactive.priority = common::Priority::kInteractive;
  sim.add(1, 1);
  sim.add(2, 2);
  sim.add(3, 3, interactive);
  sim.want(1);
  sim.busy(1);
  sim.step();
  sim.want(2);
  sim.stopped(1);  // its queued kernels take a while to drain
  sim.run_until(sim.now + 25 * kNsPerMs);
  ASSERT_EQ(sim.sched.state(1), TenantState::kRevoking) << "quantum end did not revoke";
  EXPECT_EQ(sim.sched.holder(), 1u);
  sim.want(3);
  sim.step();
  EXPECT_EQ(sim.sched.holder(), 3u) << "the interactive tenant waited for a batch drain";
  EXPECT_EQ(sim.sched.draining(), 1u);
  EXPECT_EQ(sim.sched.state(2), TenantState::kWaiting) << "batch hand-over must stay strict";
  // The interactive request ends before the drain does: the batch waiter still waits.
  sim.want(3, false);
  sim.sched.set_activity(3, sim.now, 0, sim.now);
  sim.run_until(sim.now + 5 * kNsPerMs);
  EXPECT_EQ(sim.count(Action::Kind::kGrant, 2), 0u)
      << "a batch tenant started beside a draining one";
  sim.sched.released(1, sim.now);
  sim.step();
  EXPECT_EQ(sim.sched.holder(), 2u);
}

TEST(Scheduler, BatchHandOverWaitsForTheRelease) {
  SchedulerOptions o;
  o.quantum_ns = 20 * kNsPerMs;
  Sim sim(o);
  sim.add(1, 1);
  sim.add(2, 2);
  sim.want(1);
  sim.busy(1);
  sim.step();
  sim.want(2);
  sim.stopped(1);
  sim.run_until(sim.now + 100 * kNsPerMs);
  EXPECT_EQ(sim.sched.holder(), 1u);
  EXPECT_FALSE(sim.sched.draining().has_value());
  EXPECT_EQ(sim.count(Action::Kind::kGrant, 2), 0u)
      << "a batch tenant started before the holder released";
}

TEST(Scheduler, WithoutDrainOverlapInteractiveWaitsForTheRelease) {
  SchedulerOptions o;
  o.quantum_ns = 50 * kNsPerMs;
  o.quantum_min_ns = 1 * kNsPerMs;
  o.drain_overlap = false;
  Sim sim(o);
  common::Policy interactive;
  interactive.priority = common::Priority::kInteractive;
  sim.add(1, 1);
  sim.add(2, 2, interactive);
  sim.want(1);
  sim.busy(1);
  sim.step();
  sim.now += 10 * kNsPerMs;
  sim.stopped(1);
  sim.want(2);
  sim.step();
  EXPECT_EQ(sim.sched.holder(), 1u);
  EXPECT_EQ(sim.sched.state(1), TenantState::kRevoking);
  sim.now += 15 * kNsPerMs;
  sim.sched.released(1, sim.now);
  sim.step();
  EXPECT_EQ(sim.sched.holder(), 2u);
}

TEST(Scheduler, InteractiveWaitsForTheMinimumHold) {
  SchedulerOptions o;
  o.quantum_ns = 50 * kNsPerMs;
  o.quantum_min_ns = 5 * kNsPerMs;
  Sim sim(o);
  common::Policy interactive;
  interactive.priority = common::Priority::kInteractive;
  sim.add(1, 1);
  sim.add(2, 2, interactive);
  sim.want(1);
  sim.busy(1);
  sim.step();
  uint64_t granted = sim.now;
  sim.want(2);
  sim.run_until(granted + 4 * kNsPerMs);
  EXPECT_EQ(sim.sched.holder(), 1u);
  sim.run_until(granted + 5 * kNsPerMs + 100 * common::kNsPerUs);
  EXPECT_EQ(sim.sched.holder(), 2u);
}

TEST(Scheduler, BestEffortRunsOnlyWhenNobodyElseWants) {
  SchedulerOptions o;
  o.quantum_ns = 10 * kNsPerMs;
  Sim sim(o);
  common::Policy be;
  be.priority = common::Priority::kBestEffort;
  sim.add(1, 1);
  sim.add(2, 2, be);
  sim.want(1);
  sim.want(2);
  sim.busy(1);
  sim.busy(2);
  sim.run_until(sim.now + 1 * kNsPerSec);
  EXPECT_EQ(sim.held_ns(2), 0u) << "best-effort ran while batch wanted the GPU";
  sim.want(1, false);
  sim.busy(1, false);
  sim.sched.set_activity(1, sim.now, 0, sim.now);
  sim.run_until(sim.now + 100 * kNsPerMs);
  EXPECT_GT(sim.held_ns(2), 80 * kNsPerMs) << "best-effort starved on an idle GPU";
}

TEST(Scheduler, MaxShareCeilingHoldsOnAnIdleGpu) {
  Sim sim;
  common::Policy capped;
  capped.max_share_ppm = 300000;  // 0.3
  sim.add(1, 1, capped);
  sim.want(1);
  sim.busy(1);
  sim.run_until(sim.now + 5 * kNsPerSec);
  double share = static_cast<double>(sim.held_ns(1)) / (5.0 * kNsPerSec);
  EXPECT_NEAR(share, 0.3, 0.03);
}

TEST(Scheduler, MaxShareCeilingHoldsUnderContention) {
  Sim sim;
  common::Policy capped = weight(10);
  capped.max_share_ppm = 200000;
  sim.add(1, 1, capped);
  sim.add(2, 2, weight(1));
  for (SlotId s : {1u, 2u}) sim.want(s), sim.busy(s);
  sim.run_until(sim.now + 5 * kNsPerSec);
  EXPECT_NEAR(sim.share(1), 0.2, 0.03);
}

TEST(Scheduler, LiveWeightChangeAppliesAtNextDecision) {
  Sim sim;
  sim.add(1, 1, weight(1));
  sim.add(2, 2, weight(1));
  for (SlotId s : {1u, 2u}) sim.want(s), sim.busy(s);
  sim.run_until(sim.now + 2 * kNsPerSec);
  EXPECT_NEAR(sim.share(1), 0.5, 0.02);
  sim.sched.set_pod_policy(2, weight(3));
  uint64_t h1 = sim.held_ns(1), h2 = sim.held_ns(2);
  sim.run_until(sim.now + 4 * kNsPerSec);
  double d1 = static_cast<double>(sim.held_ns(1) - h1),
         d2 = static_cast<double>(sim.held_ns(2) - h2);
  EXPECT_NEAR(d2 / (d1 + d2), 0.75, 0.03);
}

TEST(Scheduler, PodShareDoesNotGrowWithItsProcessCount) {
  Sim sim;
  sim.add(1, 1);
  sim.add(2, 2);
  sim.add(3, 2);
  sim.add(4, 2);
  for (SlotId s : {1u, 2u, 3u, 4u}) sim.want(s), sim.busy(s);
  sim.run_until(sim.now + 4 * kNsPerSec);
  EXPECT_NEAR(sim.share(1), 0.5, 0.02);
  EXPECT_NEAR(sim.share(2), sim.share(3), 0.03);
}

TEST(Scheduler, ReportShowsTargetAndAchievedShares) {
  Sim sim;
  sim.add(1, 1, weight(1));
  sim.add(2, 2, weight(3));
  for (SlotId s : {1u, 2u}) sim.want(s), sim.busy(s);
  sim.run_until(sim.now + 6 * kNsPerSec);
  auto r = sim.sched.report(sim.now);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_NEAR(r[0].target_share, 0.25, 1e-9);
  EXPECT_NEAR(r[1].target_share, 0.75, 1e-9);
  EXPECT_NEAR(r[0].achieved_share, 0.25, 0.03);
  EXPECT_NEAR(r[1].achieved_share, 0.75, 0.03);
  EXPECT_GT(r[0].wait_p99_ns, 0u);
}

TEST(Scheduler, QuantumStretchesToCoverLongKernels) {
  SchedulerOptions o;
  o.quantum_ns = 10 * kNsPerMs;
  o.quantum_max_ns = 100 * kNsPerMs;
  Sim sim(o);
  sim.add(1, 1);
  sim.want(1);
  sim.step();
  EXPECT_EQ(sim.sched.quantum_for(1), 10 * kNsPerMs);
  for (int i = 0; i < 50; ++i) sim.sched.set_activity(1, sim.now, 15 * kNsPerMs, sim.now);
  EXPECT_GE(sim.sched.quantum_for(1), 55 * kNsPerMs) << "four 15 ms kernels do not fit the quantum";
  for (int i = 0; i < 50; ++i) sim.sched.set_activity(1, sim.now, 500 * kNsPerMs, sim.now);
  EXPECT_EQ(sim.sched.quantum_for(1), 100 * kNsPerMs) << "the node's quantum_max bounds it";
  common::Policy own;
  own.quantum_ns = 5 * kNsPerMs;
  sim.sched.set_pod_policy(1, own);
  EXPECT_EQ(sim.sched.quantum_for(1), 5 * kNsPerMs) << "a pod's own quantum is kept";
}

TEST(Scheduler, InflightLimitShrinksWhileAnInteractiveTenantIsActive) {
  SchedulerOptions o;
  o.quantum_ns = 20 * kNsPerMs;
  o.quantum_min_ns = 1 * kNsPerMs;
  Sim sim(o);
  common::Policy interactive;
  interactive.priority = common::Priority::kInteractive;
  sim.add(1, 1);
  EXPECT_EQ(sim.sched.inflight_limit_for(1, sim.now), 20 * kNsPerMs);
  sim.add(2, 2, interactive);
  sim.want(2);
  EXPECT_EQ(sim.sched.inflight_limit_for(1, sim.now), 1 * kNsPerMs);
  EXPECT_EQ(sim.sched.inflight_limit_for(2, sim.now), 20 * kNsPerMs);
  sim.want(2, false);
  sim.now += 2 * kNsPerSec;
  sim.step();
  EXPECT_EQ(sim.sched.inflight_limit_for(1, sim.now), 20 * kNsPerMs)
      << "long-idle interactive tenant still limits";
}

// Worst share error, in points, of 64 busy tenants (weights 1, 2, 4, 8 cycling) over the
// 7.1 s a bench run measures after 0.5 s of warm-up; queued(slot) is the GPU time each
// tenant keeps queued while it holds (what stretches its quantum).
template <typename Queued>
double sixty_four_tenant_error(SchedulerOptions o, Queued queued) {
  Sim sim(o);
  constexpr uint32_t kWeights[] = {1, 2, 4, 8};
  for (SlotId s = 0; s < 64; ++s) sim.add(s, s, weight(kWeights[s % 4]));
  for (SlotId s = 0; s < 64; ++s) sim.want(s), sim.busy(s, true, queued(s));
  sim.run_until(sim.now + 500 * kNsPerMs);
  std::map<SlotId, uint64_t> warm;
  for (SlotId s = 0; s < 64; ++s) warm[s] = sim.held_ns(s);
  sim.run_until(sim.now + 7100 * kNsPerMs);
  double total = 0;
  for (SlotId s = 0; s < 64; ++s) total += static_cast<double>(sim.held_ns(s) - warm[s]);
  double worst = 0;
  for (SlotId s = 0; s < 64; ++s) {
    double share = static_cast<double>(sim.held_ns(s) - warm[s]) / total;
    worst = std::max(worst, std::abs(share - kWeights[s % 4] / 240.0) * 100);
  }
  return worst;
}

TEST(Scheduler, SixtyFourTenantsShareWithinThreePoints) {
  // Every tenant keeps 25 ms queued: stretched, that is the 100 ms quantum_max each, and a
  // round of 64 such holds (6.4 s) is as long as the whole measurement, so shares would be
  // set by where the rounds happen to stop.
  auto long_queues = [](SlotId) { return 25 * kNsPerMs; };
  SchedulerOptions o;
  {
    Sim sim(o);
    for (SlotId s = 0; s < 64; ++s) sim.add(s, s);
    for (SlotId s = 0; s < 64; ++s) sim.want(s);
    sim.step();
    for (int i = 0; i < 50; ++i)
      sim.sched.set_activity(*sim.sched.holder(), sim.now, 25 * kNsPerMs, sim.now);
    EXPECT_EQ(sim.sched.quantum_for(*sim.sched.holder()), o.quantum_ns)
        << "with 64 active tenants a round of stretched quanta would outlast the share window";
  }
  // Without noise the scheduler does far better than the bench's 3 points; 1 point still
  // fails the stretched rounds (about 1.5 points here).
  EXPECT_LT(sixty_four_tenant_error(o, long_queues), 1.0);
  EXPECT_LT(sixty_four_tenant_error(
                o, [](SlotId s) { return s % 4 == 0 ? 25 * kNsPerMs : 4 * kNsPerMs; }),
            1.0);
}

TEST(Scheduler, FewTenantsStillStretchTheirQuantum) {
  SchedulerOptions o;
  o.quantum_ns = 10 * kNsPerMs;
  o.quantum_max_ns = 100 * kNsPerMs;
  Sim sim(o);
  for (SlotId s = 0; s < 5; ++s) sim.add(s, s);
  for (SlotId s = 0; s < 5; ++s) sim.want(s);
  sim.step();
  SlotId h = *sim.sched.holder();
  for (int i = 0; i < 50; ++i) sim.sched.set_activity(h, sim.now, 20 * kNsPerMs, sim.now);
  EXPECT_GE(sim.sched.quantum_for(h), 75 * kNsPerMs) << "five tenants' round fits the window";
}

}  // namespace
}  // namespace quanta::arbiter
