// The arbiter's instruments beside its scheduling state: the metrics endpoint, the
// once-a-second tick that charges NVML's busy time to pods and records history, and the view
// of live state (node_view.h) that the figures (figures.cpp) and the top and explain answers
// (admin_views.cpp) are worked out from, and what `quantactl status` tells. It reads the
// node through ObservedNode and writes nothing of it but the GPUs' accounting: NVML's busy
// time, the history tick, and bringing the hold timeline up to the instant it reads. Runs on
// the event loop; the endpoint's own thread reads only the figures it is handed.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "arbiter/loop/event_loop.h"
#include "arbiter/node_state.h"
#include "arbiter/observing/admin_views.h"
#include "arbiter/observing/metrics_server.h"
#include "arbiter/observing/node_view.h"
#include "arbiter/observing/nvml_sampler.h"
#include "arbiter/state/pod_registry.h"
#include "common/policy.h"
#include "config/node_config.h"

namespace quanta::arbiter {

struct NodeFigures;

inline constexpr uint64_t kObservationTickNs = 1'000'000'000;

// What the observer reads of the node. The references outlive the observer (the core
// declares it after them, so it is destroyed first).
struct ObservedNode {
  const config::NodeConfig& config;
  // The managed GPUs, in index order; the observer writes only their `accounting`.
  const std::vector<std::unique_ptr<Gpu>>& gpus;
  const std::map<pid_t, Process>& processes;
  const PodRegistry& pods;
  const NvmlSampler& nvml;
  uint64_t generation = 0;
  uint64_t started_ns = 0;  // CLOCK_MONOTONIC, when this arbiter started
  // What the shims charge per context and where the figure came from (fixed at start).
  nlohmann::json context_overhead;
  // Tenant connections open now (the tenant server's count).
  std::function<size_t()> tenant_connections;
};

class Observer {
 public:
  // Starts the tick on `loop`, and the metrics endpoint when [metrics] listen is set (throws
  // with one line when it cannot listen there), then takes the first tick.
  Observer(EventLoop& loop, ObservedNode node);
  ~Observer();
  Observer(const Observer&) = delete;
  Observer& operator=(const Observer&) = delete;

  // A tenant or admission refused for `reason` (counted by its kind, refusal_reason()).
  void refused(const std::string& reason);
  std::string metrics_address() const;  // "HOST:PORT" served, "" when not

  // Live state at `now` as the observing side reads it: accounting brought up to `now`,
  // NVML's busy time charged, no other change.
  NodeView view(uint64_t now);
  // The figures of view(now), for `quantactl top` and the endpoint.
  std::shared_ptr<const NodeFigures> figures(uint64_t now);
  // What `quantactl status` tells (status_answer), read from the live state at `now`;
  // nothing is computed or changed here.
  NodeStatus status(uint64_t now) const;

  // The once-a-second work (the loop's timer calls it): NVML's busy time charged, each GPU's
  // target shares recorded in its history, departed processes and pods forgotten, the
  // endpoint's figures renewed.
  void tick();

 private:
  // Device time NVML saw each managed pid run since the last reading, charged to its pod.
  void charge_nvml_busy();
  GpuView view_gpu(Gpu& gpu, const std::vector<GpuReading>* readings, uint64_t now);
  GpuStatus status_of_gpu(const Gpu& gpu, uint64_t now) const;

  EventLoop& loop_;
  ObservedNode node_;
  std::unique_ptr<MetricsServer> server_;
  Timer tick_timer_;
  std::map<std::string, uint64_t> refusals_;
  std::map<pid_t, std::string> containers_;  // pid -> its registration's container name
  std::map<std::string, common::Policy> last_policy_;  // pods with history, as last seen
  // Per GPU: the reading last charged and each pid's busy total charged so far.
  std::vector<uint64_t> reading_at_ns_;
  std::vector<std::map<pid_t, uint64_t>> busy_charged_;
  std::string hostname_;
  // Unix time the arbiter started, read once: worked out again at every scrape it would
  // move by the clocks' jitter, and Prometheus' changes() would count each move a restart.
  double start_time_s_ = 0;
};

}  // namespace quanta::arbiter
