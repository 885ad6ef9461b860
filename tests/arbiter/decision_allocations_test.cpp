// The arbiter's decision pass allocates nothing once its tenants are known: busy tenants
// taking turns (revoke at the quantum's end, release, grant the next) through the
// scheduler and the accounting calls the arbiter makes around it. This binary replaces the
// global operator new to count allocations while a test asks it to.
#include <gtest/gtest.h>

#include <cstdlib>
#include <new>
#include <string>

#include "arbiter/scheduling/accounting.h"
#include "arbiter/scheduling/scheduler.h"
#include "common/clock.h"

namespace {

thread_local bool t_counting = false;
thread_local size_t t_allocations = 0;

// Counts the allocations made by `body` on this thread.
template <typename Body>
size_t allocations_in(Body&& body) {
  t_allocations = 0;
  t_counting = true;
  body();
  t_counting = false;
  return t_allocations;
}

}  // namespace

void* operator new(std::size_t size) {
  if (t_counting) ++t_allocations;
  if (void* p = std::malloc(size != 0 ? size : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}

namespace quanta::arbiter {
namespace {

using common::kNsPerMs;
using common::kNsPerSec;

// `tenants` busy tenants of cycling weights on one GPU, driven pass by pass as
// sync_and_decide drives them.
struct BusyGpu {
  Scheduler sched;
  GpuAccounting acct;
  uint64_t now = 1 * kNsPerSec;
  uint64_t switches = 0;
  SlotId tenants;
  BusyGpu(SchedulerOptions options, SlotId count) : sched(options), tenants(count) {
    for (SlotId s = 0; s < tenants; ++s) {
      common::Policy policy;
      policy.weight = 1u << (s % 4);
      sched.set_pod_policy(s, policy);
      sched.add_tenant(s, s, now);
      acct.add_tenant(s, "team/pod-" + std::to_string(s), now);
      sched.set_want(s, true, now);
    }
  }
  // One pass `step` later: a revoked holder has released, every tenant launched just now.
  void pass(uint64_t step) {
    now += step;
    for (SlotId s = 0; s < tenants; ++s) {
      if (sched.state(s) == TenantState::kRevoking) {
        sched.set_want(s, true, now);
        sched.released(s, now);
        acct.released(s, now);
      }
      sched.set_activity(s, now, 500 * common::kNsPerUs, now);
    }
    for (const Action& a : sched.decide(now)) {
      if (a.kind == Action::Kind::kGrant) {
        acct.granted(a.slot, now);
        ++switches;
      }
      if (a.kind == Action::Kind::kRevoke) acct.revoked(a.slot, now);
      if (a.kind == Action::Kind::kPassOver) acct.passed_over(a.slot, now);
    }
    acct.settle(sched, now);
  }
};

TEST(DecisionAllocations, TakingTurnsAllocatesNothingOnceTheTenantsAreKnown) {
  for (const SlotId tenants : {2u, 8u, 64u}) {
    SCOPED_TRACE(std::to_string(tenants) + " tenants");
    SchedulerOptions options;
    options.quantum_ns = 20 * kNsPerMs;
    BusyGpu gpu(options, tenants);
    // Warm-up: every tenant granted and revoked many times, and each log as long as its
    // window gets (the longest: the waits explain looks back on).
    const uint64_t steady = gpu.now + GpuAccounting::kHistoryNs + 2 * kNsPerSec;
    while (gpu.now < steady) gpu.pass(10 * kNsPerMs);
    const uint64_t switches_before = gpu.switches;
    const size_t allocations = allocations_in([&] {
      for (int i = 0; i < 400; ++i) gpu.pass(10 * kNsPerMs);
    });
    ASSERT_GE(gpu.switches - switches_before, 50u) << "the tenants took turns";
    EXPECT_EQ(allocations, 0u) << "allocations in 400 passes";
  }
}

}  // namespace
}  // namespace quanta::arbiter
