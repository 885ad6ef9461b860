#include "arbiter/observing/wait_budget.h"

#include <algorithm>
#include <map>

#include "arbiter/scheduling/accounting.h"

namespace quanta::arbiter {

uint64_t wait_budget_ns(const std::vector<BudgetTenant>& tenants, const std::string& pod,
                        uint32_t weight, common::Priority priority, const BudgetTimings& timings) {
  if (priority == common::Priority::kBestEffort) return 0;
  uint64_t own_quantum = 0;
  struct Other {
    uint32_t weight = 1;
    common::Priority priority = common::Priority::kBatch;
    uint64_t round_ns = 0;  // one quantum of each of its active tenants
  };
  std::map<std::string, Other> others;
  for (const BudgetTenant& t : tenants) {
    if (t.pod == pod) {
      own_quantum = std::max(own_quantum, t.quantum_ns);
      continue;
    }
    if (!t.active || t.priority > priority) continue;
    Other& o = others[t.pod];
    o.weight = std::max<uint32_t>(t.weight, 1);
    o.priority = t.priority;
    o.round_ns += t.quantum_ns;
  }
  if (own_quantum == 0) own_quantum = timings.quantum_ns;
  const uint64_t own_weight = std::max<uint32_t>(weight, 1);

  // An interactive pod preempts a lower-class holder once it has held the minimum, and
  // then waits for its hand-off (the old holder drains beside it).
  uint64_t wait_ns = priority == common::Priority::kInteractive ? 2 * timings.quantum_min_ns : 0;
  uint64_t quanta_ns = 0;
  for (const auto& [name, o] : others) {
    if (o.round_ns == 0) continue;
    uint64_t rounds = 1;
    if (o.priority == priority) {
      // Its fair time while this pod runs one quantum, in whole rounds of its tenants.
      const uint64_t fair = own_quantum * o.weight / own_weight;
      rounds = std::max<uint64_t>(1, (fair + o.round_ns - 1) / o.round_ns);
    }
    quanta_ns += rounds * o.round_ns;
  }
  // Each quantum may end `quantum_slack` late, and its holder may keep up to a quantum of
  // work queued, which drains before the next grant.
  const uint64_t slack = quanta_ns / 1'000'000 * timings.quantum_slack_ppm +
                         quanta_ns % 1'000'000 * timings.quantum_slack_ppm / 1'000'000;
  return wait_ns + quanta_ns + slack + quanta_ns;
}

uint64_t round_up_to_wait_bucket(uint64_t ns) {
  for (uint64_t bound : LatencyHistogram::kBoundsNs)
    if (ns <= bound) return bound;
  return ns;
}

}  // namespace quanta::arbiter
