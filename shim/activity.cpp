// Launch statistics and the queued-work estimate the arbiter reads in GateChannel: launch
// counts published in batches, last_launch_ns stamped only when someone can use it, and the
// inflight estimate the link thread clears once the process went idle.
//
// The arbiter revokes a holder early only when inflight_ns is 0 and it launched nothing for
// idle_release; a process that launches once per completed kernel (gaps as long as its
// kernels) must not look idle between launches, so while launches keep coming at most
// kBusyGapNs apart the estimate is two average gaps, and the link thread clears it once that
// long passed without a launch.
//
// A precise clock read per launch costs more than the rest of the gate, so launches are
// counted per thread and last_launch_ns is stamped precisely only when someone can use it:
// at every launch while other tenants wait for this GPU (ControlHeader::waiters; the arbiter
// decides idleness only then, and counts from the moment it published the waiters), and
// otherwise at the first launch of each coarse clock tick (4 ms here), which keeps the
// estimate alive for the adaptive quantum. The gap average divides the time between stamps
// by the launches between them.
#include "shim/link_state.h"

namespace quanta::shim {

// Launches counted here and added to GateChannel::launches in batches (at each activity
// stamp, every kLaunchFlushBatch launches and when the thread ends).
QUANTA_TLS uint32_t t_pending_launches[kMaxGpus] = {};
uint64_t g_coarse_tick_ns = 4 * kNsPerMs;

void publish_pending_launches(uint32_t index) {
  const uint32_t pending = t_pending_launches[index];
  if (pending == 0) return;
  t_pending_launches[index] = 0;
  const Route* route = g_bindings[index].route.load(std::memory_order_acquire);
  if (route) route->channel->launches.fetch_add(pending, std::memory_order_relaxed);
}

void stamp_launch(Binding* binding, const Route* route, uint32_t index, uint64_t tick) {
  GateChannel* channel = route->channel;
  const uint32_t pending = t_pending_launches[index];
  t_pending_launches[index] = 0;
  const uint64_t launches =
      channel->launches.fetch_add(pending, std::memory_order_relaxed) + pending;
  const uint64_t now = monotonic_ns();
  binding->stamped_tick.store(tick, std::memory_order_relaxed);
  const uint64_t previous = channel->last_launch_ns.load(std::memory_order_relaxed);
  const uint64_t previous_launches = binding->stamped_launches.load(std::memory_order_relaxed);
  binding->stamped_launches.store(launches, std::memory_order_relaxed);
  channel->last_launch_ns.store(now, std::memory_order_relaxed);
  if (previous == 0 || now <= previous) return;
  const uint64_t count = launches > previous_launches ? launches - previous_launches : 1;
  const uint64_t gap = (now - previous) / count;
  if (gap >= kBusyGapNs) {
    if (binding->busy_run.load(std::memory_order_relaxed) != 0)
      binding->busy_run.store(0, std::memory_order_relaxed);
    return;
  }
  uint64_t average = binding->gap_average_ns.load(std::memory_order_relaxed);
  average = average - average / 8 + gap / 8;
  binding->gap_average_ns.store(average, std::memory_order_relaxed);
  // A single short gap is no stream (a request that waited at the gate, then the next one
  // on schedule): only a run of them says work keeps being queued.
  const uint32_t run = binding->busy_run.load(std::memory_order_relaxed);
  if (run < kBusyRunLaunches) {
    binding->busy_run.store(run + 1, std::memory_order_relaxed);
    return;
  }
  const uint64_t estimate = 2 * average + 1;
  if (channel->inflight_ns.load(std::memory_order_relaxed) != estimate)
    channel->inflight_ns.store(estimate, std::memory_order_relaxed);
}

// A stamp made while nobody waited (stamped_tick set) may be up to one coarse tick older
// than the latest launch, so it counts from the end of that tick.
uint64_t expire_inflight(const Binding* binding, const Route* route, uint64_t now) {
  GateChannel* channel = route->channel;
  const uint64_t estimate = channel->inflight_ns.load(std::memory_order_relaxed);
  if (estimate == 0) return 0;
  const uint64_t stale =
      binding->stamped_tick.load(std::memory_order_relaxed) != 0 ? g_coarse_tick_ns : 0;
  const uint64_t expires = channel->last_launch_ns.load(std::memory_order_relaxed) + stale +
                           estimate + kInflightClearSlackNs;
  if (now >= expires) {
    channel->inflight_ns.store(0, std::memory_order_relaxed);
    return 0;
  }
  return expires - now;
}

void activity_reset_in_child() {
  for (Binding& binding : g_bindings) {
    binding.stamped_tick.store(0);
    binding.stamped_launches.store(0);
    binding.gap_average_ns.store(0);
    binding.busy_run.store(0);
  }
  for (uint32_t& pending : t_pending_launches) pending = 0;
}

}  // namespace quanta::shim
