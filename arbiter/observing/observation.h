// The arbiter's instruments beside its scheduling state: the metrics endpoint, the
// once-a-second tick that records history, and what only they need to remember (refusals
// by reason, container names, NVML busy time already charged). NVML's sampler is the
// arbiter's own (reconciliation reads it too).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "arbiter/loop/event_loop.h"
#include "arbiter/observing/metrics_server.h"
#include "arbiter/observing/nvml_sampler.h"
#include "common/policy.h"

namespace quanta::arbiter {

inline constexpr uint64_t kObservationTickNs = 1'000'000'000;

struct Observation {
  std::unique_ptr<MetricsServer> server;
  Timer tick;
  std::map<std::string, uint64_t> refusals;
  std::map<pid_t, std::string> containers;  // pid -> its registration's container name
  std::map<std::string, common::Policy> last_policy;  // pods with history, as last seen
  // Per GPU: the reading last charged and each pid's busy total charged so far.
  std::vector<uint64_t> reading_at_ns;
  std::vector<std::map<pid_t, uint64_t>> busy_charged;
  std::string hostname;
  // Unix time the arbiter started, read once: worked out again at every scrape it would
  // move by the clocks' jitter, and Prometheus' changes() would count each move a restart.
  double start_time_s = 0;
};

}  // namespace quanta::arbiter
