// Launch statistics and the queued-work estimate the arbiter reads in GateChannel: launch
// counts published in batches, last_launch_ns stamped only when someone can use it, the
// completions tracked while they matter, the in-flight limit, and the inflight estimate the
// device thread clears once the process went idle.
//
// While others wait for the GPU, or the arbiter's in-flight limit binds, every gated launch
// records an event from the binding's ring (WorkTracker) on its own stream, and inflight_ns is
// the real queued work: launches not yet seen complete times the measured device time of one.
// A tracked launch that finds the estimate cleared publishes one kernel's worth at once, and
// the device thread of a tracked holder polls even when nothing is queued, so a process that
// is slow to launch again after a completion never looks idle while its next kernel runs.
// A holder whose kernel still runs therefore never looks idle, however long the kernel. The
// in-flight limit holds a launcher before the gate until its queued work is below the limit
// (so it keeps at most one launch beyond it); a launch held longer than kLimitWaitMaxNs passes,
// so work that waits on this process's own later launches (streams waiting on each other's
// events) can never deadlock it. Without contention nothing is recorded and launches cost what
// they did before.
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
// otherwise about once per coarse clock tick (4 ms here; note_launch reads that clock only
// every few launches of a thread that keeps launching), which keeps the untracked estimate
// alive. The gap average divides the time between stamps by the launches between them.
#include "shim/interpose/real_driver.h"
#include "shim/link/link_state.h"

namespace quanta::shim {

namespace {

constexpr uint64_t kLimitWaitMaxNs = 20 * kNsPerMs;  // beyond 2 x max(kernel, limit), at most
constexpr uint64_t kRetirePollMinNs = 250 * 1000;    // device thread: completion polls
constexpr uint64_t kRetirePollMaxNs = kNsPerMs;
// After its tracked work completed, a process counts as busy this much longer: a launcher
// that waited for that work launches again within it, even on a loaded machine, so a busy
// holder is never called idle between two kernels.
constexpr uint64_t kTrackedIdleGraceNs = kNsPerMs;

// Retires tracked launches that completed, oldest first; returns how many.
uint32_t retire(Binding* binding, uint64_t now) {
  auto query = QUANTA_REAL(cuEventQuery);
  WorkTracker& work = binding->work;
  uint32_t retired = 0;
  for (;;) {
    uint64_t tail = work.tail.load(std::memory_order_acquire);
    if (tail >= work.head.load(std::memory_order_acquire)) break;
    TrackedLaunch& entry = work.ring[tail % kTrackedLaunches];
    if (entry.sequence.load(std::memory_order_acquire) != tail + 1) break;  // still recording
    const uint64_t launched = entry.launch_ns;
    const CUresult state = query && entry.event ? query(entry.event) : CUDA_SUCCESS;
    if (state == CUDA_ERROR_NOT_READY) break;
    // Any other answer (an error: its context is gone) retires it too.
    if (!work.tail.compare_exchange_strong(tail, tail + 1, std::memory_order_acq_rel)) continue;
    ++retired;
    // One launch's device time: from its launch or the previous completion, whichever is later
    // (a queued launch starts when the one before it ends), to when it was seen complete.
    const uint64_t previous = work.last_retire_ns.load(std::memory_order_relaxed);
    const uint64_t start = launched > previous ? launched : previous;
    if (now > start) {
      const uint64_t took = now - start;
      const uint64_t average = work.kernel_ns.load(std::memory_order_relaxed);
      work.kernel_ns.store(average == 0 ? took : average - average / 4 + took / 4,
                           std::memory_order_relaxed);
    }
    work.last_retire_ns.store(now, std::memory_order_relaxed);
  }
  if (retired != 0) {
    work.retired.fetch_add(1, std::memory_order_release);
    if (work.held.load(std::memory_order_seq_cst) != 0) private_wake_all(&work.retired);
  }
  return retired;
}

bool below(const WorkTracker& work, uint64_t limit) {
  const uint64_t queued = work.outstanding();
  if (queued == 0) return true;
  const uint64_t kernel = work.kernel_ns.load(std::memory_order_relaxed);
  return kernel != 0 && queued * kernel < limit;  // unmeasured: one launch at a time
}

}  // namespace

void wait_below_limit(Binding* binding, uint64_t limit) {
  WorkTracker& work = binding->work;
  if (below(work, limit)) return;
  InLink guard;  // the event queries are the shim's own calls
  const uint64_t begin = monotonic_ns();
  for (;;) {
    const uint64_t now = monotonic_ns();
    retire(binding, now);
    if (below(work, limit)) return;
    const uint64_t kernel = work.kernel_ns.load(std::memory_order_relaxed);
    const uint64_t longest = 2 * (kernel > limit ? kernel : limit) + kLimitWaitMaxNs;
    if (now - begin > longest) return;
    uint64_t slice = kernel / 4;
    if (slice < 50 * 1000) slice = 50 * 1000;
    if (slice > kNsPerMs) slice = kNsPerMs;
    const uint32_t seen = work.retired.load(std::memory_order_acquire);
    work.held.fetch_add(1, std::memory_order_seq_cst);
    if (!below(work, limit)) private_wait(&work.retired, seen, slice);
    work.held.fetch_sub(1, std::memory_order_relaxed);
  }
}

void track_launch(Binding* binding, CUcontext context, CUstream stream) {
  WorkTracker& work = binding->work;
  uint64_t head = work.head.load(std::memory_order_relaxed);
  do {
    if (head - work.tail.load(std::memory_order_acquire) >= kTrackedLaunches) {
      work.skipped.fetch_add(1, std::memory_order_relaxed);  // the ring is full: enough known
      return;
    }
  } while (!work.head.compare_exchange_weak(head, head + 1, std::memory_order_acq_rel,
                                            std::memory_order_relaxed));
  // The entry is this thread's until its sequence is published: its previous launch retired.
  TrackedLaunch& entry = work.ring[head % kTrackedLaunches];
  InLink guard;
  auto create = QUANTA_REAL(cuEventCreate);
  auto destroy = QUANTA_REAL(cuEventDestroy_v2);
  auto record = QUANTA_REAL(cuEventRecord);
  if (context == nullptr) {
    auto get_current = QUANTA_REAL(cuCtxGetCurrent);
    if (get_current) get_current(&context);
  }
  bool recorded = false;
  for (int attempt = 0; attempt < 2 && create && record && !recorded; ++attempt) {
    if (entry.event == nullptr || entry.context != context || attempt > 0) {
      if (entry.event && destroy) destroy(entry.event);
      entry.event = nullptr;
      if (create(&entry.event, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) entry.event = nullptr;
      entry.context = context;
    }
    recorded = entry.event != nullptr && record(entry.event, stream) == CUDA_SUCCESS;
  }
  if (!recorded && entry.event && destroy) {
    destroy(entry.event);  // a launch it cannot follow counts as done at once
    entry.event = nullptr;
  }
  entry.launch_ns = monotonic_ns();
  entry.sequence.store(head + 1, std::memory_order_release);
  // The device thread publishes the queued work at its next poll; until then an estimate
  // already cleared (the previous launch completed and the process took a while to launch
  // again) would tell the arbiter that this holder, its kernel running, is idle.
  const Route* route = binding->route.load(std::memory_order_acquire);
  if (route && route->channel->inflight_ns.load(std::memory_order_relaxed) == 0) {
    const uint64_t kernel = work.kernel_ns.load(std::memory_order_relaxed);
    route->channel->inflight_ns.store(kernel != 0 ? kernel : 1, std::memory_order_relaxed);
  }
}

// Launches counted here and added to GateChannel::launches in batches (at each activity
// stamp, every kLaunchFlushBatch launches and when the thread ends).
QUANTA_TLS constinit uint32_t t_pending_launches[kMaxGpus] = {};
QUANTA_TLS constinit uint64_t t_clocked_tick[kMaxGpus] = {};
QUANTA_TLS constinit uint32_t t_unclocked_skip[kMaxGpus] = {};
QUANTA_TLS constinit uint32_t t_unclocked_left[kMaxGpus] = {};
uint64_t g_coarse_tick_ns = 4 * kNsPerMs;

void publish_pending_launches(uint32_t index) {
  const uint32_t pending = t_pending_launches[index];
  if (pending == 0) return;
  t_pending_launches[index] = 0;
  const Route* route = g_bindings[index].route.load(std::memory_order_acquire);
  if (route) route->channel->launches.fetch_add(pending, std::memory_order_relaxed);
}

void note_launch_rest(Binding* binding, const Route* route, uint32_t index, uint32_t pending) {
  if (route->control->header.waiters.load(std::memory_order_relaxed) != 0) {
    stamp_launch(binding, route, index, 0);
    return;
  }
  if (t_unclocked_left[index] != 0) {
    --t_unclocked_left[index];
  } else {
    const uint64_t tick = coarse_ns();
    uint32_t skip = 0;
    if (tick == t_clocked_tick[index]) {
      skip = 2 * t_unclocked_skip[index] + 1;
      if (skip > kMaxUnclockedLaunches) skip = kMaxUnclockedLaunches;
    }
    t_clocked_tick[index] = tick;
    t_unclocked_skip[index] = skip;
    t_unclocked_left[index] = skip;
    if (tick != binding->stamped_tick.load(std::memory_order_relaxed)) {
      stamp_launch(binding, route, index, tick);
      return;
    }
  }
  if (pending >= kLaunchFlushBatch) publish_pending_launches(index);
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
  // Tracked completions say exactly what is queued (refresh_inflight publishes them).
  if (binding->tracking.load(std::memory_order_relaxed)) return;
  const uint64_t estimate = 2 * average + 1;
  if (channel->inflight_ns.load(std::memory_order_relaxed) != estimate)
    channel->inflight_ns.store(estimate, std::memory_order_relaxed);
}

// A stamp made while nobody waited (stamped_tick set) may be older than the latest launch:
// by the rest of its coarse tick, and by the launches note_launch then counted without
// reading the clock (never more than the thread made in the tick before, so at a steady
// rate about one tick more). It counts from the end of that tick, which at a steady rate
// still keeps the estimate alive until the next launch; with others waiting every launch is
// stamped precisely.
uint64_t refresh_inflight(Binding* binding, const Route* route, uint64_t now) {
  GateChannel* channel = route->channel;
  WorkTracker& work = binding->work;
  if (work.outstanding() != 0) {
    InLink guard;
    retire(binding, now);
  }
  const uint64_t queued = work.outstanding();
  const uint64_t published = channel->inflight_ns.load(std::memory_order_relaxed);
  if (queued != 0) {
    const uint64_t kernel = work.kernel_ns.load(std::memory_order_relaxed);
    const uint64_t estimate = kernel != 0 ? queued * kernel : 1;
    if (published != estimate) channel->inflight_ns.store(estimate, std::memory_order_relaxed);
    uint64_t again = kernel / 4;  // finer than idle_release needs; only a holder has work queued
    if (again < kRetirePollMinNs) again = kRetirePollMinNs;
    return again < kRetirePollMaxNs ? again : kRetirePollMaxNs;
  }
  // A holder whose launches are tracked is looked at every poll even with nothing queued:
  // its next launch publishes an estimate that only this thread retires.
  const bool watched = (route->slot->turn.load(std::memory_order_relaxed) & 1u) != 0 &&
                       should_track(route);
  if (published == 0) return watched ? kRetirePollMaxNs : 0;
  // Empty (or never tracked): the estimate lapses a little after the last launch or
  // completion, so a launcher about to queue its next launch is not called idle in between.
  uint64_t last = channel->last_launch_ns.load(std::memory_order_relaxed);
  if (binding->stamped_tick.load(std::memory_order_relaxed) != 0) last += g_coarse_tick_ns;
  const uint64_t retired_at = work.last_retire_ns.load(std::memory_order_relaxed);
  uint64_t expires;
  if (binding->tracking.load(std::memory_order_relaxed)) {
    expires = (retired_at > last ? retired_at : last) + kTrackedIdleGraceNs;
  } else {
    expires = last + published + kInflightClearSlackNs;
  }
  if (now >= expires) {
    channel->inflight_ns.store(0, std::memory_order_relaxed);
    binding->quiet_turn = route->slot->turn.load(std::memory_order_acquire);
    return watched ? kRetirePollMaxNs : 0;
  }
  return expires - now;
}

// Only a holder's work running out is rung about: the arbiter itself looks at a holder that
// had nothing queued when it read it last (at the grant, say), so a turn that has not yet
// been busy needs no ring. Checked at every poll, not only when the estimate is cleared,
// so a quiet whose waiters were published just after this thread read the count is rung
// about at the next poll.
void ring_when_quiet(Binding* binding, const Route* route) {
  const uint32_t turn = route->slot->turn.load(std::memory_order_acquire);
  if (route->channel->inflight_ns.load(std::memory_order_relaxed) != 0 || !(turn & 1u)) {
    binding->quiet_rung_turn = 0;
    return;
  }
  if (binding->quiet_turn != turn || binding->quiet_rung_turn == turn ||
      binding->ended_turn.load(std::memory_order_relaxed) == turn ||  // released ahead
      route->control->header.waiters.load(std::memory_order_relaxed) == 0)
    return;
  binding->quiet_rung_turn = turn;
  ring_doorbell();
}

void activity_reset_in_child() {
  for (Binding& binding : g_bindings) {
    binding.stamped_tick.store(0);
    binding.stamped_launches.store(0);
    binding.gap_average_ns.store(0);
    binding.busy_run.store(0);
    binding.tracking.store(0);
    binding.quiet_turn = 0;
    binding.quiet_rung_turn = 0;
    binding.grant_watch = GrantWatch{};
    // Events of the parent's contexts mean nothing here; the entries are reused afresh.
    for (TrackedLaunch& entry : binding.work.ring) {
      entry.sequence.store(0);
      entry.event = nullptr;
      entry.context = nullptr;
    }
    binding.work.head.store(0);
    binding.work.tail.store(0);
    binding.work.held.store(0);
    binding.work.kernel_ns.store(0);
    binding.work.last_retire_ns.store(0);
  }
  for (uint32_t& pending : t_pending_launches) pending = 0;
  for (uint64_t& tick : t_clocked_tick) tick = 0;
  for (uint32_t& skip : t_unclocked_skip) skip = 0;
  for (uint32_t& left : t_unclocked_left) left = 0;
}

}  // namespace quanta::shim
