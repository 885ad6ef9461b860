// The scheduler's drain switch (quantactl drain): no grant while it is set, the holder
// revoked at once, idle() once the holder released, waiters served again after it clears.
#include <gtest/gtest.h>

#include <algorithm>

#include "arbiter/scheduling/scheduler.h"
#include "common/clock.h"

namespace quanta::arbiter {
namespace {

using common::kNsPerMs;

bool has(const std::vector<Action>& actions, Action::Kind kind, SlotId slot) {
  return std::find(actions.begin(), actions.end(), Action{kind, slot}) != actions.end();
}

bool any_grant(const std::vector<Action>& actions) {
  return std::any_of(actions.begin(), actions.end(),
                     [](const Action& a) { return a.kind == Action::Kind::kGrant; });
}

class DrainSwitch : public ::testing::Test {
 protected:
  DrainSwitch() : sched(options()) {
    sched.set_pod_policy(1, {});
    sched.set_pod_policy(2, {});
    sched.add_tenant(0, 1, now);
    sched.add_tenant(1, 2, now);
  }
  static SchedulerOptions options() {
    SchedulerOptions o;
    o.quantum_ns = 20 * kNsPerMs;
    o.revoke_timeout_ns = 100 * kNsPerMs;
    return o;
  }
  std::vector<Action> decide_at(uint64_t t) {
    now = t;
    return sched.decide(now);
  }

  Scheduler sched;
  uint64_t now = 1000 * kNsPerMs;
};

TEST_F(DrainSwitch, DrainedGpuGrantsNobody) {
  sched.set_draining(true);
  EXPECT_TRUE(sched.drain_requested());
  sched.set_want(0, true, now);
  sched.set_want(1, true, now);
  const uint64_t start = now;
  for (uint64_t t = start; t < start + 2000 * kNsPerMs; t += 10 * kNsPerMs) {
    ASSERT_FALSE(any_grant(decide_at(t))) << "granted while drained at t=" << t;
  }
  EXPECT_TRUE(sched.idle());
  EXPECT_EQ(sched.state(0), TenantState::kWaiting);
  EXPECT_EQ(sched.state(1), TenantState::kWaiting);
}

TEST_F(DrainSwitch, HolderIsRevokedAtOnceAndGpuIsIdleAfterItsRelease) {
  sched.set_want(0, true, now);
  ASSERT_TRUE(has(decide_at(now), Action::Kind::kGrant, 0));
  EXPECT_FALSE(sched.idle());
  // A lone holder is never revoked for a quantum's end; a drain revokes it at once.
  sched.set_activity(0, now, kNsPerMs, now);
  sched.set_draining(true);
  auto actions = decide_at(now + kNsPerMs);
  EXPECT_TRUE(has(actions, Action::Kind::kRevoke, 0));
  EXPECT_FALSE(sched.idle()) << "idle before the holder released its queued work";
  sched.released(0, now + 3 * kNsPerMs);
  EXPECT_FALSE(any_grant(decide_at(now + 3 * kNsPerMs)));
  EXPECT_TRUE(sched.idle());
}

TEST_F(DrainSwitch, HungHolderIsPassedOverAndNobodyElseIsGranted) {
  sched.set_want(0, true, now);
  sched.set_want(1, true, now);
  ASSERT_TRUE(any_grant(decide_at(now)));
  const SlotId holder = *sched.holder();
  const SlotId other = holder == 0 ? 1 : 0;
  sched.set_draining(true);
  EXPECT_TRUE(has(decide_at(now + kNsPerMs), Action::Kind::kRevoke, holder));
  // It never releases: passed over after revoke_timeout, and the waiter still gets nothing.
  auto late = decide_at(now + 200 * kNsPerMs);
  EXPECT_TRUE(has(late, Action::Kind::kPassOver, holder));
  EXPECT_FALSE(any_grant(late));
  EXPECT_EQ(sched.state(other), TenantState::kWaiting);
  // Its queued work may still run: the GPU is not idle until it releases (or exits).
  EXPECT_FALSE(sched.idle());
  sched.released(holder, now + 300 * kNsPerMs);
  EXPECT_FALSE(any_grant(decide_at(now + 300 * kNsPerMs)));
  EXPECT_TRUE(sched.idle());
}

TEST_F(DrainSwitch, UndrainServesTheWaitersAgain) {
  sched.set_draining(true);
  sched.set_want(1, true, now);
  EXPECT_FALSE(any_grant(decide_at(now)));
  sched.set_draining(false);
  EXPECT_FALSE(sched.drain_requested());
  EXPECT_TRUE(has(decide_at(now + kNsPerMs), Action::Kind::kGrant, 1));
  EXPECT_FALSE(sched.idle());
}

TEST_F(DrainSwitch, InteractiveWaiterCannotOvertakeADrain) {
  common::Policy interactive;
  interactive.priority = common::Priority::kInteractive;
  sched.set_pod_policy(2, interactive);
  sched.set_want(0, true, now);
  ASSERT_TRUE(has(decide_at(now), Action::Kind::kGrant, 0));
  sched.set_draining(true);
  sched.set_want(1, true, now + 2 * kNsPerMs);
  auto actions = decide_at(now + 2 * kNsPerMs);
  EXPECT_FALSE(any_grant(actions)) << "drain_overlap let an interactive tenant in";
  sched.released(0, now + 3 * kNsPerMs);
  EXPECT_FALSE(any_grant(decide_at(now + 3 * kNsPerMs)));
  EXPECT_TRUE(sched.idle());
}

}  // namespace
}  // namespace quanta::arbiter
