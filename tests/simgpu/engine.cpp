// The lazily computed device timeline. Every call takes the device lock, reads the clock
// and first advances the timeline to that instant, so a submission always lands at the
// device's present and every past decision was made with what was known at that time.
#include "tests/simgpu/engine.h"

#include <fcntl.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>

namespace quanta::simgpu {
namespace {

// How often the engine checks that the processes owning contexts are alive: a killed
// tenant's queued work stops taking device time within this long.
constexpr uint64_t kReapIntervalNs = 10'000'000;
// The last stretch before a predicted completion is spun rather than slept: a timer
// wake-up overshoots by tens of microseconds, which would be a visible error on 1 ms.
constexpr uint64_t kSpinNs = 60'000;

std::atomic<int> g_log_fd{-2};

int log_fd(const char* path) {
  int fd = g_log_fd.load(std::memory_order_acquire);
  if (fd != -2) return fd;
  int opened = path[0] ? open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644) : -1;
  int expected = -2;
  if (!g_log_fd.compare_exchange_strong(expected, opened)) {
    if (opened >= 0) close(opened);
    return expected;
  }
  return opened;
}

// `exact`: the deadline is the predicted completion itself, worth spinning the last stretch
// for; otherwise it is a lower bound to re-check at, and sleeping is enough.
void sleep_until_ns(uint64_t deadline, bool exact) {
  thread_local bool slack_set = false;
  if (!slack_set) {
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    slack_set = true;
  }
  const uint64_t spin = exact ? kSpinNs : 0;
  uint64_t now = monotonic_ns();
  if (deadline > now + spin) {
    const uint64_t wake = deadline - spin;
    timespec ts{static_cast<time_t>(wake / 1'000'000'000), static_cast<long>(wake % 1'000'000'000)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr) == EINTR) {
    }
  }
  while (monotonic_ns() < deadline) {
    __builtin_ia32_pause();
  }
}

}  // namespace

uint64_t monotonic_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ULL + static_cast<uint64_t>(ts.tv_nsec);
}

bool DeviceEngine::register_context(int32_t pid, int& slot, uint64_t& generation,
                                    uint64_t& context_id) {
  DeviceLock lock(dev_);
  advance(monotonic_ns());
  for (int i = 0; i < kMaxContexts; ++i) {
    ContextSlot& c = dev_.contexts[i];
    if (c.live) continue;
    if (dev_.engine.running == i) end_slice(dev_.engine.clock_ns);
    const uint64_t gen = c.generation + 1;
    std::memset(static_cast<void*>(&c), 0, sizeof c);
    c.live = 1;
    c.pid = pid;
    c.generation = gen;
    c.context_id = state_->next_context_id.fetch_add(1);
    c.usage_index = -1;
    if (ProcessUsage* p = find_process(dev_, pid, true)) {
      p->contexts++;
      c.usage_index = static_cast<int32_t>(p - dev_.processes);
    }
    slot = i;
    generation = gen;
    context_id = c.context_id;
    return true;
  }
  return false;
}

void DeviceEngine::unregister_context(int slot, uint64_t generation) {
  DeviceLock lock(dev_);
  advance(monotonic_ns());
  ContextSlot& c = dev_.contexts[slot];
  if (!c.live || c.generation != generation) return;
  if (dev_.engine.running == slot) end_slice(dev_.engine.clock_ns);
  c.live = 0;
  c.executed = c.submitted;
  if (ProcessUsage* p = find_process(dev_, c.pid, false)) {
    if (p->contexts > 0) p->contexts--;
  }
}

Ticket DeviceEngine::submit(int slot, uint64_t generation, uint64_t duration_ns) {
  DeviceLock lock(dev_);
  advance(monotonic_ns());
  ContextSlot& c = dev_.contexts[slot];
  Ticket t{device_, slot, generation, 0};
  if (!c.live || c.generation != generation) return t;
  c.submitted += duration_ns;
  t.value = c.submitted;
  return t;
}

Ticket DeviceEngine::tail(int slot, uint64_t generation) {
  DeviceLock lock(dev_);
  const ContextSlot& c = dev_.contexts[slot];
  Ticket t{device_, slot, generation, 0};
  if (c.live && c.generation == generation) t.value = c.submitted;
  return t;
}

bool DeviceEngine::complete_locked(const Ticket& t) const {
  const ContextSlot& c = dev_.contexts[t.slot];
  return !c.live || c.generation != t.generation || c.executed >= t.value;
}

bool DeviceEngine::is_complete(const Ticket& t) {
  if (t.slot < 0) return true;
  DeviceLock lock(dev_);
  advance(monotonic_ns());
  return complete_locked(t);
}

void DeviceEngine::wait(const Ticket& t) {
  if (t.slot < 0) return;
  while (true) {
    uint64_t deadline = 0;
    bool exact = false;
    {
      DeviceLock lock(dev_);
      const uint64_t now = monotonic_ns();
      advance(now);
      if (complete_locked(t)) return;
      deadline = predict_locked(t, now, exact);
    }
    sleep_until_ns(deadline, exact);
  }
}

bool DeviceEngine::completion_time(const Ticket& t, uint64_t& time_ns) {
  if (t.slot < 0) return false;
  DeviceLock lock(dev_);
  advance(monotonic_ns());
  const ContextSlot& c = dev_.contexts[t.slot];
  if (!c.live || c.generation != t.generation || c.executed < t.value) return false;
  // Oldest record first: a point on a boundary belongs to the slice that reached it.
  const uint32_t count = c.ring_count;
  for (uint32_t k = 0; k < count; ++k) {
    const SliceRecord& r = c.ring[(c.ring_next + kSliceRing - count + k) % kSliceRing];
    if (r.exec_start <= t.value && t.value <= r.exec_end) {
      time_ns = r.time_start + (t.value - r.exec_start);
      return true;
    }
  }
  return false;
}

uint64_t DeviceEngine::busy_ns() {
  DeviceLock lock(dev_);
  advance(monotonic_ns());
  return dev_.engine.busy_ns;
}

namespace {

// Busy time in the buckets that overlap [from, to), the bucket holding `from` counted in
// proportion to the part of it inside the window (work is taken as spread evenly in it).
uint64_t busy_between(const UtilBuckets& u, uint64_t from, uint64_t to) {
  const uint64_t first = from / kUtilBucketNs;
  const uint64_t last = to / kUtilBucketNs;
  uint64_t busy = 0;
  for (int k = 0; k < kUtilBuckets; ++k) {
    const uint64_t id = u.id[k];
    if (id < first || id > last || u.busy_ns[k] == 0) continue;
    if (id == first && from % kUtilBucketNs != 0) {
      const uint64_t inside = (id + 1) * kUtilBucketNs - from;
      busy += static_cast<uint64_t>(static_cast<double>(u.busy_ns[k]) *
                                    static_cast<double>(std::min(inside, kUtilBucketNs)) /
                                    static_cast<double>(kUtilBucketNs));
    } else {
      busy += u.busy_ns[k];
    }
  }
  return std::min(busy, to - from);
}

void add_busy(UtilBuckets& u, uint64_t from, uint64_t to) {
  while (from < to) {
    const uint64_t id = from / kUtilBucketNs;
    const uint64_t upto = std::min(to, (id + 1) * kUtilBucketNs);
    const int k = static_cast<int>(id % kUtilBuckets);
    if (u.id[k] != id) {
      u.id[k] = id;
      u.busy_ns[k] = 0;
    }
    u.busy_ns[k] += upto - from;
    from = upto;
  }
}

unsigned percent(uint64_t busy, uint64_t window) {
  if (window == 0) return 0;
  return static_cast<unsigned>(std::min<uint64_t>(100, (busy * 100 + window / 2) / window));
}

}  // namespace

unsigned DeviceEngine::utilization_percent() {
  DeviceLock lock(dev_);
  const uint64_t now = monotonic_ns();
  advance(now);
  // Whole buckets back to a full second before the current one: 0.9-1 s of device time.
  const uint64_t current = now / kUtilBucketNs;
  const uint64_t first = current >= kUtilBuckets - 1 ? current - (kUtilBuckets - 1) : 0;
  const uint64_t from = first * kUtilBucketNs;
  return percent(busy_between(dev_.engine.util, from, now), now - from);
}

size_t DeviceEngine::process_utilization(uint64_t since_ns, uint64_t now, ProcessBusy* out,
                                         size_t capacity) {
  DeviceLock lock(dev_);
  advance(now);
  const uint64_t horizon = now > kUtilWindowNs ? now - kUtilWindowNs : 0;
  const uint64_t from = std::max(since_ns, horizon);
  size_t n = 0;
  for (const ProcessUsage& p : dev_.processes) {
    if (p.pid == 0 || from >= now) continue;
    const uint64_t busy = busy_between(p.util, from, now);
    if (busy == 0 && p.contexts == 0) continue;
    if (n < capacity) out[n] = ProcessBusy{p.pid, busy, now - from};
    ++n;
  }
  return n;
}

void DeviceEngine::account_busy(uint64_t from, uint64_t to) {
  Engine& e = dev_.engine;
  add_busy(e.util, from, to);
  const ContextSlot& c = dev_.contexts[e.running];
  ProcessUsage* p = nullptr;
  if (c.usage_index >= 0 && c.usage_index < kMaxProcesses &&
      dev_.processes[c.usage_index].pid == c.pid) {
    p = &dev_.processes[c.usage_index];
  }
  if (p == nullptr) return;  // its process's entry was reclaimed: nobody to charge
  p->busy_ns += to - from;
  add_busy(p->util, from, to);
}

int DeviceEngine::pick_next() const {
  const int first = dev_.engine.last_ran < 0 ? 0 : dev_.engine.last_ran + 1;
  for (int k = 0; k < kMaxContexts; ++k) {
    const int i = (first + k) % kMaxContexts;
    const ContextSlot& c = dev_.contexts[i];
    if (c.live && c.executed < c.submitted) return i;
  }
  return -1;
}

void DeviceEngine::end_slice(uint64_t end) {
  Engine& e = dev_.engine;
  if (e.running < 0) return;
  if (end > e.slice_start_ns) {
    log_slice(e.running, e.slice_start_ns, end);
    e.last_ran = e.running;
    e.last_end_ns = end;
  }
  e.running = -1;
}

void DeviceEngine::log_slice(int slot, uint64_t start, uint64_t end) {
  const int fd = log_fd(state_->log_path);
  if (fd < 0) return;
  const ContextSlot& c = dev_.contexts[slot];
  char line[160];
  const int n =
      std::snprintf(line, sizeof line, "slice %d %llu %d %llu %llu\n", device_,
                    static_cast<unsigned long long>(c.context_id), c.pid,
                    static_cast<unsigned long long>(start), static_cast<unsigned long long>(end));
  if (n > 0) {
    // One write per line on an O_APPEND descriptor keeps lines whole across processes.
    [[maybe_unused]] ssize_t written = write(fd, line, static_cast<size_t>(n));
  }
}

void DeviceEngine::advance(uint64_t now) {
  Engine& e = dev_.engine;
  if (now - e.last_reap_ns > kReapIntervalNs) {
    e.last_reap_ns = now;
    reap_dead_processes(dev_);
  }
  while (e.clock_ns < now) {
    if (e.running < 0) {
      const int next = pick_next();
      if (next < 0) {
        e.clock_ns = now;
        return;
      }
      uint64_t start = e.clock_ns;
      if (e.last_ran >= 0 && e.last_ran != next)
        start = std::max(start, e.last_end_ns + state_->switch_ns);
      e.running = next;
      e.slice_start_ns = start;
      ContextSlot& c = dev_.contexts[next];
      SliceRecord* last =
          c.ring_count ? &c.ring[(c.ring_next + kSliceRing - 1) % kSliceRing] : nullptr;
      // A context that simply keeps the engine extends its record instead of pushing one.
      if (last == nullptr || last->exec_end != c.executed ||
          last->time_start + (last->exec_end - last->exec_start) != start) {
        c.ring[c.ring_next] = SliceRecord{start, c.executed, c.executed};
        c.ring_next = (c.ring_next + 1) % kSliceRing;
        c.ring_count = std::min<uint32_t>(c.ring_count + 1, kSliceRing);
      }
    }
    ContextSlot& c = dev_.contexts[e.running];
    if (!c.live || c.executed >= c.submitted) {
      end_slice(std::max(e.clock_ns, e.slice_start_ns));
      continue;
    }
    const uint64_t run_from = std::max(e.clock_ns, e.slice_start_ns);
    if (run_from >= now) {  // still inside the switch's dead time
      e.clock_ns = now;
      return;
    }
    const uint64_t slice_end = e.slice_start_ns + state_->timeslice_ns;
    const uint64_t t_end = std::min({run_from + (c.submitted - c.executed), slice_end, now});
    c.executed += t_end - run_from;
    c.ring[(c.ring_next + kSliceRing - 1) % kSliceRing].exec_end = c.executed;
    e.busy_ns += t_end - run_from;
    account_busy(run_from, t_end);
    e.clock_ns = t_end;
    if (c.executed >= c.submitted || t_end >= slice_end) end_slice(t_end);
  }
}

uint64_t DeviceEngine::predict_locked(const Ticket& t, uint64_t now, bool& exact) const {
  const Engine& e = dev_.engine;
  const ContextSlot& c = dev_.contexts[t.slot];
  const uint64_t remaining = t.value - c.executed;
  const uint64_t slice_end = e.slice_start_ns + state_->timeslice_ns;
  uint64_t predicted = now;
  exact = false;
  if (e.running == t.slot) {
    predicted = std::max(e.clock_ns, e.slice_start_ns) + remaining;
    bool others_waiting = false;
    for (int i = 0; i < kMaxContexts && !others_waiting; ++i) {
      const ContextSlot& o = dev_.contexts[i];
      others_waiting = i != t.slot && o.live && o.executed < o.submitted;
    }
    exact = !others_waiting || predicted <= slice_end;
    if (!exact) predicted = slice_end;
  } else if (e.running >= 0) {
    // It cannot start before the running slice ends (at its time slice or when its work
    // runs out) and the switch's dead time passes:
    // a lower bound, so sleeping to it never oversleeps the completion.
    const ContextSlot& r = dev_.contexts[e.running];
    const uint64_t running_done =
        std::max(e.clock_ns, e.slice_start_ns) + (r.submitted - std::min(r.submitted, r.executed));
    predicted =
        std::max(std::min(slice_end, running_done), e.clock_ns) + state_->switch_ns + remaining;
  } else {
    predicted = e.clock_ns + state_->switch_ns;
  }
  return std::max(predicted, now + 2'000);
}

}  // namespace quanta::simgpu
