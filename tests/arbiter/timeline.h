// A GPU's accounting fed from the real Scheduler on a fake clock, as the arbiter feeds it
// (Arbiter::sync_and_decide and apply): scheduler events in, the actions it returns reported
// to the accounting, then a settle. The accounting and figures tests drive it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "arbiter/scheduling/accounting.h"
#include "arbiter/scheduling/scheduler.h"
#include "common/policy.h"

namespace quanta::arbiter {

constexpr uint64_t kMs = 1'000'000;

class Timeline {
 public:
  Timeline() {
    SchedulerOptions o;
    o.quantum_ns = 20 * kMs;
    o.idle_release_ns = 2 * kMs;
    o.revoke_timeout_ns = 100 * kMs;
    sched_ = std::make_unique<Scheduler>(o);
  }
  void add(SlotId slot, PodId pod, const std::string& key) {
    sched_->set_pod_policy(pod, common::Policy{});
    sched_->add_tenant(slot, pod, now);
    acct.add_tenant(slot, key, now);
  }
  void remove(SlotId slot) {
    sched_->remove_tenant(slot, now);
    acct.remove_tenant(slot, now);
    pass();
  }
  // A busy holder: it launches all the time and keeps work queued.
  void busy(SlotId slot) { sched_->set_activity(slot, now, 5 * kMs, now); }
  void want(SlotId slot, bool w) {
    sched_->set_want(slot, w, now);
    pass();
  }
  void ends_own_quantum(SlotId slot) { sched_->set_ends_own_quantum(slot, true); }
  uint64_t self_end() const { return sched_->self_end_ns(); }
  void release(SlotId slot) {
    const uint64_t own_end = sched_->self_end_ns();
    if (sched_->state(slot) == TenantState::kHolding && sched_->holder() == slot && own_end != 0 &&
        own_end < now)
      acct.drained_own_quantum(slot, own_end);
    sched_->released(slot, now);
    acct.released(slot, now);
    pass();
  }
  void pass() {
    for (const Action& a : sched_->decide(now)) {
      if (a.kind == Action::Kind::kGrant) acct.granted(a.slot, now);
      if (a.kind == Action::Kind::kRevoke) acct.revoked(a.slot, now);
      if (a.kind == Action::Kind::kPassOver) acct.passed_over(a.slot, now);
    }
    acct.settle(*sched_, now);
  }
  void run(uint64_t ns, SlotId holder) {
    now += ns;
    busy(holder);
    pass();
  }
  TenantState state(SlotId slot) const { return sched_->state(slot); }

  uint64_t now = 1'000 * kMs;
  GpuAccounting acct;

 private:
  std::unique_ptr<Scheduler> sched_;
};

}  // namespace quanta::arbiter
