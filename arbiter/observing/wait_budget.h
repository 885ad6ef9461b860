// The longest wait for a grant a pod's priority class promises it on a GPU, from the
// tenants there now: what quanta_pod_wait_budget_seconds exports and QuantaWaitOverBudget
// compares the pod's p99 wait with. Pure, so tests build any GPU they like.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/policy.h"

namespace quanta::arbiter {

// One tenant on the GPU, with its pod's weight and class.
struct BudgetTenant {
  std::string pod;
  uint32_t weight = 1;  // its pod's weight
  common::Priority priority = common::Priority::kBatch;
  uint64_t quantum_ns = 0;
  bool active = false;  // wants the GPU or holds it
};

struct BudgetTimings {
  uint64_t quantum_ns = 0;      // the node quantum: the pod's own when it has no tenant listed
  uint64_t quantum_min_ns = 0;  // minimum hold, and what a non-interactive holder keeps queued
  uint32_t quantum_slack_ppm = 0;
};

// The wait `pod` is promised, in ns, before rounding; 0 for best-effort (no promise).
// Between two grants of a pod of weight w and quantum q, another pod of its class and
// weight W runs q * W / w of GPU time, in whole rounds of its active tenants' quanta (a
// weight-1 pod beside a weight-3 one waits three quanta, not one); a pod of a higher class
// runs one round of its quanta. Each of those quanta may end `quantum_slack` late and its
// holder may keep up to a quantum of work queued, which drains before the next grant. An
// interactive pod also waits out the minimum hold of a lower-class holder and its hand-off.
uint64_t wait_budget_ns(const std::vector<BudgetTenant>& tenants, const std::string& pod,
                        uint32_t weight, common::Priority priority, const BudgetTimings& timings);

// `ns` rounded up to the next bound of the wait histogram's buckets (LatencyHistogram): the
// finest a p99 read from that histogram can be compared with, so a pod whose every wait
// is within its budget never has a p99 above the exported one.
uint64_t round_up_to_wait_bucket(uint64_t ns);

}  // namespace quanta::arbiter
