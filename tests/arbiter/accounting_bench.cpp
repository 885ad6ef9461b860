// What the hold timeline costs the arbiter: one decision pass over N busy tenants taking
// turns (the scheduler's decide with a release and a grant) with and without the
// accounting calls the arbiter makes around it (released, granted, revoked, settle).
#include <benchmark/benchmark.h>

#include <memory>
#include <string>

#include "arbiter/scheduling/accounting.h"
#include "arbiter/scheduling/scheduler.h"

namespace quanta::arbiter {
namespace {

void BM_DecisionPass(benchmark::State& state) {
  const auto tenants = static_cast<SlotId>(state.range(0));
  const bool accounting = state.range(1) != 0;
  SchedulerOptions options;
  options.quantum_ns = 1'000'000;
  Scheduler sched(options);
  GpuAccounting acct;
  uint64_t now = 1'000'000'000;
  for (SlotId s = 0; s < tenants; ++s) {
    sched.set_pod_policy(s, common::Policy{});
    sched.add_tenant(s, s, now);
    if (accounting) acct.add_tenant(s, "bench/pod-" + std::to_string(s), now);
    sched.set_want(s, true, now);
  }
  uint64_t passes = 0;
  for (auto _ : state) {
    now += 1'100'000;  // past the holder's quantum: revoke, release, grant the next
    for (SlotId s = 0; s < tenants; ++s) {
      if (sched.state(s) == TenantState::kRevoking) {
        sched.released(s, now);
        if (accounting) acct.released(s, now);
      }
      sched.set_activity(s, now, 500'000, now);
    }
    for (const Action& a : sched.decide(now)) {
      if (!accounting) continue;
      if (a.kind == Action::Kind::kGrant) acct.granted(a.slot, now);
      if (a.kind == Action::Kind::kRevoke) acct.revoked(a.slot, now);
      if (a.kind == Action::Kind::kPassOver) acct.passed_over(a.slot, now);
    }
    if (accounting) acct.settle(sched, now);
    ++passes;
    if (accounting && passes % 1000 == 0) acct.tick({}, now);  // about once a second of passes
  }
  benchmark::DoNotOptimize(acct.switches());
}

BENCHMARK(BM_DecisionPass)->ArgsProduct({{8, 64}, {0, 1}})->ArgNames({"tenants", "accounting"});

}  // namespace
}  // namespace quanta::arbiter

BENCHMARK_MAIN();
