// The launch gate: per-thread marks, the asymmetric barrier the link thread uses on a
// revoke, the fast path (plain stores to this thread's lines and a few loads) and the slow
// path (ask for the GPU, wake the arbiter, sleep on the turn word).
#include <linux/membarrier.h>
#include <pthread.h>
#include <sys/sdt.h>

#include "common/futex.h"
#include "shim/base/log.h"
#include "shim/base/spin.h"
#include "shim/link/link_state.h"

namespace quanta::shim {

QUANTA_TLS constinit bool t_in_link = false;

namespace {

// Bindings this thread is inside, innermost last: one per link_gate_enter not yet left (a
// multi-device cooperative launch enters one gate per device before its real call).
constexpr uint32_t kMaxEntered = 16;
QUANTA_TLS uint32_t t_gate_depth = 0;
QUANTA_TLS Binding* t_entered[kMaxEntered] = {};
QUANTA_TLS bool t_track[kMaxEntered] = {};  // the entry's launch records a completion event

// The revoke handshake (a launcher marks itself inside, then reads the turn; the link thread
// sees the even turn, then waits until no launcher is inside) needs a store-load barrier
// between the mark and the turn read. A lock-prefixed instruction per launch costs tens of
// nanoseconds, so each thread marks a line of its own with a plain store, and the link
// thread, on the rare revoke, issues membarrier(PRIVATE_EXPEDITED): a full barrier on every
// thread of the process, after which each launcher either shows its mark or reads the even
// turn. Where membarrier is unavailable (old kernel, seccomp), the marks are seq_cst stores.
struct alignas(64) ThreadGate {
  std::atomic<uint32_t> owner{0};         // 1 while a live thread owns the record
  std::atomic<uint8_t> inside[kMaxGpus];  // per binding: nesting of this thread's entries
};
ThreadGate g_thread_gates[kMaxGateThreads];
std::atomic<uint32_t> g_thread_gates_used{0};  // records ever claimed (the link thread scans these)
std::atomic<uint32_t> g_asymmetric{0};         // 1: membarrier registered, marks are plain stores
std::atomic<uint32_t> g_thread_key_state{0};   // 0 none, 1 creating, 2 created, 3 failed
pthread_key_t g_thread_key;
QUANTA_TLS ThreadGate* t_gate = nullptr;
QUANTA_TLS bool t_gate_claimed = false;  // tried once (the record may still be nullptr: pool full)

// pthread key destructor: the thread ends, its counts are published and its record freed.
void thread_gate_exit(void* record) {
  for (uint32_t index = 0; index < kMaxGpus; ++index) publish_pending_launches(index);
  if (record != t_gate || t_gate == nullptr) return;  // no record of its own (pool full)
  t_gate = nullptr;
  static_cast<ThreadGate*>(record)->owner.store(0, std::memory_order_release);
}

void claim_thread_gate() {
  t_gate_claimed = true;
  uint32_t key_state = g_thread_key_state.load(std::memory_order_acquire);
  if (key_state == 0 &&
      g_thread_key_state.compare_exchange_strong(key_state, 1, std::memory_order_acq_rel)) {
    key_state = pthread_key_create(&g_thread_key, &thread_gate_exit) == 0 ? 2 : 3;
    g_thread_key_state.store(key_state, std::memory_order_release);
  }
  while ((key_state = g_thread_key_state.load(std::memory_order_acquire)) == 1) cpu_relax();
  if (key_state != 2) return;  // no way to free a record at thread exit: use the shared counter
  for (uint32_t i = 0; i < kMaxGateThreads; ++i) {
    uint32_t expected = 0;
    if (!g_thread_gates[i].owner.compare_exchange_strong(expected, 1, std::memory_order_acq_rel))
      continue;
    // Raised before the first mark, so a link thread that sees the mark scans this record.
    uint32_t used = g_thread_gates_used.load(std::memory_order_relaxed);
    while (used < i + 1 &&
           !g_thread_gates_used.compare_exchange_weak(used, i + 1, std::memory_order_seq_cst)) {
    }
    t_gate = &g_thread_gates[i];
    pthread_setspecific(g_thread_key, t_gate);
    return;
  }
  // Pool full: only the pending launch counts need the destructor.
  pthread_setspecific(g_thread_key, &g_thread_key_state);
}

// Marks this thread inside the gate of `binding`; the caller reads the turn next.
inline void mark_inside(Binding* binding) {
  ThreadGate* gate = t_gate;
  if (__builtin_expect(gate == nullptr, 0)) {
    binding->launchers_inside.fetch_add(1, std::memory_order_seq_cst);
    return;
  }
  std::atomic<uint8_t>& mark = gate->inside[binding_index(binding)];
  const uint8_t value = static_cast<uint8_t>(mark.load(std::memory_order_relaxed) + 1);
  if (__builtin_expect(g_asymmetric.load(std::memory_order_relaxed) != 0, 1)) {
    mark.store(value, std::memory_order_relaxed);
    std::atomic_signal_fence(
        std::memory_order_seq_cst);  // the compiler keeps the turn read after it
  } else {
    mark.store(value, std::memory_order_seq_cst);
  }
}

inline void mark_outside(Binding* binding) {
  ThreadGate* gate = t_gate;
  if (__builtin_expect(gate == nullptr, 0)) {
    binding->launchers_inside.fetch_sub(1, std::memory_order_release);
    return;
  }
  std::atomic<uint8_t>& mark = gate->inside[binding_index(binding)];
  mark.store(static_cast<uint8_t>(mark.load(std::memory_order_relaxed) - 1),
             std::memory_order_release);
}

void record_wait(const Route* route, uint64_t waited_ns, uint64_t end_ns) {
  GateChannel* channel = route->channel;
  channel->gate_waits.fetch_add(1, std::memory_order_relaxed);
  channel->gate_wait_ns.fetch_add(waited_ns, std::memory_order_relaxed);
  uint64_t max = channel->gate_wait_max_ns.load(std::memory_order_relaxed);
  while (waited_ns > max && !channel->gate_wait_max_ns.compare_exchange_weak(
                                max, waited_ns, std::memory_order_relaxed)) {
  }
  // end_ns: this shim's own clock, which quanta-trace checks its kernel timestamps against.
  DTRACE_PROBE4(quanta, gate_wait_end, route->gpu_index, route->slot_index, waited_ns, end_ns);
}

// An odd turn grants the GPU unless this process's device thread ended it at its quantum's
// end (link_thread.cpp): launchers then wait as after a revoke. The device thread stores
// ended_turn before its launcher barrier, so a launcher marked inside after the barrier
// reads it here, and one marked before is waited out. (The short gate never gets here with
// the turn ended: the device thread raised the binding's tracking flag, which sends it to
// enter().)
inline bool granted(const Binding* binding, uint32_t turn) {
  return (turn & 1u) != 0 && binding->ended_turn.load(std::memory_order_seq_cst) != turn;
}

// The slow path: ask for the GPU, wake the arbiter, sleep on the turn word. Returns true
// with this thread marked inside, either granted or passing because the lease lapsed or the
// slot is no longer this process's; false (not marked) when, instead of passing ungated,
// the launch is refused because the node refuses CUDA to this process now.
//
// GateChannel::want is set here and stays set through the grant: it is cleared only by the
// release (link_thread.cpp), which knows whether a launcher still waits, so the arbiter
// sees a tenant that keeps work coming as wanting the GPU through grant and release.
bool gate_slow(Binding* binding, const Route* route) {
  const uint64_t begin = monotonic_ns();
  DTRACE_PROBE2(quanta, gate_wait_begin, route->gpu_index, route->slot_index);
  binding->gate_waiting.fetch_add(1, std::memory_order_seq_cst);
  for (;;) {
    const Route* current = binding->route.load(std::memory_order_acquire);
    if (current) route = current;
    mark_inside(binding);
    const uint32_t turn = route->slot->turn.load(std::memory_order_seq_cst);
    if (granted(binding, turn)) break;
    mark_outside(binding);
    const uint64_t now = monotonic_ns();
    const bool passing =
        lease_stale(route->control, now) || !owns_slot(route);
    if (passing && g_process.denied.load(std::memory_order_acquire)) {
      binding->gate_waiting.fetch_sub(1, std::memory_order_seq_cst);
      return false;
    }
    if (lease_stale(route->control, now)) {
      binding->lapsed.store(1, std::memory_order_relaxed);
      if (!binding->lapse_logged.exchange(1, std::memory_order_relaxed)) {
        QUANTA_LOG_WARN(
            "the arbiter's lease on %s lapsed: launches run ungated until it is back (memory "
            "caps stay)",
            binding->uuid);
      }
      mark_inside(binding);
      break;
    }
    if (!owns_slot(route)) {
      mark_inside(binding);  // not ours now: ungated
      break;
    }
    // Only a want the arbiter has not seen is rung about: one kept through the grant (a
    // revoked holder back at its gate) is read with the release, and the arbiter reads
    // every want at each pass and at every heartbeat, so a waiter costs it one look at most
    // however long it waits. A release clears the want only while no launcher waits here.
    if (route->channel->want.load(std::memory_order_relaxed) == 0) {
      route->channel->want.store(1, std::memory_order_seq_cst);
      ring_doorbell();
    }
    common::futex_wait(&route->slot->turn, turn, kGateWaitSliceNs);
  }
  binding->gate_waiting.fetch_sub(1, std::memory_order_seq_cst);
  const uint64_t end = monotonic_ns();
  record_wait(route, end - begin, end);
  note_launch(binding, route);
  return true;
}

}  // namespace

bool anyone_inside(const Binding* binding) {
  if (binding->launchers_inside.load(std::memory_order_seq_cst) != 0) return true;
  const uint32_t index = binding_index(binding);
  const uint32_t used = g_thread_gates_used.load(std::memory_order_seq_cst);
  for (uint32_t i = 0; i < used; ++i) {
    if (g_thread_gates[i].inside[index].load(std::memory_order_seq_cst) != 0) return true;
  }
  return false;
}

// After it, every launcher's plain mark store is visible or that launcher reads the turn
// the link thread already saw.
void launcher_barrier() {
  if (!g_asymmetric.load(std::memory_order_relaxed)) return;
  if (syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) == 0) return;
  // Registered expedited membarrier does not fail; should it, marks become seq_cst from
  // now on and the launchers that used a plain store get a millisecond to show it.
  g_asymmetric.store(0, std::memory_order_seq_cst);
  timespec pause{0, static_cast<long>(kNsPerMs)};
  nanosleep(&pause, nullptr);
}

void register_launcher_barrier() {
  if (g_asymmetric.load(std::memory_order_relaxed)) return;
  if (syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0) {
    g_asymmetric.store(1, std::memory_order_seq_cst);
  } else {
    QUANTA_LOG_INFO("membarrier unavailable: each launch marks the gate with a locked store");
  }
}

// Only the forking thread lives on in the child: every record is free again, and the
// membarrier registration is redone when the child links.
void gate_reset_in_child() {
  for (ThreadGate& gate : g_thread_gates) {
    gate.owner.store(0);
    for (std::atomic<uint8_t>& mark : gate.inside) mark.store(0);
  }
  g_thread_gates_used.store(0);
  g_asymmetric.store(0);
  if (g_thread_key_state.load() == 2) pthread_setspecific(g_thread_key, nullptr);
  t_gate = nullptr;
  t_gate_claimed = false;
  t_gate_depth = 0;
}

namespace {

// Asks for the GPU without waiting (a multi-device launch that must not wait inside a gate);
// the doorbell at most every few milliseconds while it keeps asking.
constexpr uint64_t kAskRingNs = 20 * kNsPerMs;
QUANTA_TLS uint64_t t_asked_ns = 0;
void ask_for_gpu(const Route* route) {
  route->channel->want.store(1, std::memory_order_seq_cst);
  const uint64_t now = monotonic_ns();
  if (t_asked_ns == 0 || now - t_asked_ns >= kAskRingNs) {
    ring_doorbell();
    t_asked_ns = now;
  }
}

GateTry enter(CUcontext context, bool may_wait) {
  const uint32_t depth = t_gate_depth++;
  if (depth >= kMaxEntered) return GateTry::kPassed;  // deeper than any real caller goes: ungated
  t_entered[depth] = nullptr;
  t_track[depth] = false;
  if (t_in_link) return GateTry::kPassed;
  Binding* binding = binding_for_context(context);
  if (!binding) return GateTry::kPassed;
  if (__builtin_expect(!t_gate_claimed, 0)) claim_thread_gate();
  const Route* route = binding->route.load(std::memory_order_acquire);
  // The in-flight limit is waited out before the mark, so a revoke never waits for it.
  const uint64_t limit = route ? binding_limit(route) : 0;
  if (__builtin_expect(limit != 0, 0)) wait_below_limit(binding, limit);
  t_entered[depth] = binding;
  mark_inside(binding);
  if (!route) {  // device not attached: ungated, unless the node refuses CUDA meanwhile
    if (__builtin_expect(g_process.denied.load(std::memory_order_acquire) == 0, 1))
      return GateTry::kPassed;
    mark_outside(binding);
    t_entered[depth] = nullptr;
    --t_gate_depth;
    return GateTry::kRefused;
  }
  const uint32_t turn = route->slot->turn.load(std::memory_order_seq_cst);
  if (__builtin_expect(granted(binding, turn), 1)) {
    const bool track =
        limit != 0 || route->control->header.waiters.load(std::memory_order_relaxed) != 0;
    if (__builtin_expect(binding->tracking.load(std::memory_order_relaxed) != track, 0))
      binding->tracking.store(track, std::memory_order_relaxed);
    t_track[depth] = track;
    note_launch(binding, route);
    return GateTry::kPassed;
  }
  if (binding->lapsed.load(std::memory_order_relaxed) &&
      lease_stale(route->control, monotonic_ns())) {
    note_launch(binding, route);
    return GateTry::kPassed;
  }
  mark_outside(binding);
  if (!may_wait) {
    // As the slow path would: the lease lapsed, or the slot is no longer this process's.
    const bool passing = lease_stale(route->control, monotonic_ns()) || !owns_slot(route);
    if (passing && g_process.denied.load(std::memory_order_acquire) == 0) {
      mark_inside(binding);
      return GateTry::kPassed;
    }
    if (passing) {
      t_entered[depth] = nullptr;
      --t_gate_depth;
      return GateTry::kRefused;
    }
    ask_for_gpu(route);
    t_entered[depth] = nullptr;
    --t_gate_depth;
    return GateTry::kBusy;
  }
  if (gate_slow(binding, route)) {
    const Route* now_route = binding->route.load(std::memory_order_acquire);
    const bool track = now_route != nullptr && should_track(now_route);
    binding->tracking.store(track, std::memory_order_relaxed);
    t_track[depth] = track;
    return GateTry::kPassed;
  }
  t_entered[depth] = nullptr;
  --t_gate_depth;
  return GateTry::kRefused;
}

}  // namespace

// mark_inside and mark_outside for a thread known to have its own record and the
// asymmetric barrier, with the binding's index computed once.
bool link_gate_enter_sole(Binding* sole) noexcept {
  ThreadGate* gate = t_gate;
  const Route* route = sole->route.load(std::memory_order_acquire);
  if (__builtin_expect(gate == nullptr || route == nullptr || t_in_link ||
                           g_asymmetric.load(std::memory_order_relaxed) == 0,
                       0))
    return false;
  std::atomic<uint8_t>& mark = gate->inside[binding_index(sole)];
  const uint8_t outside = mark.load(std::memory_order_relaxed);
  mark.store(static_cast<uint8_t>(outside + 1), std::memory_order_relaxed);
  std::atomic_signal_fence(std::memory_order_seq_cst);  // the compiler keeps the turn read after it
  const uint32_t turn = route->slot->turn.load(std::memory_order_seq_cst);
  // enter() turns tracking off again once nobody waits and no limit binds.
  if (__builtin_expect((turn & 1u) == 0 ||
                           route->control->header.waiters.load(std::memory_order_relaxed) != 0 ||
                           binding_limit(route) != 0 ||
                           sole->tracking.load(std::memory_order_relaxed) != 0,
                       0)) {
    mark.store(outside, std::memory_order_release);
    return false;
  }
  return true;
}

void link_gate_leave_sole(Binding* sole) noexcept {
  const uint32_t index = binding_index(sole);
  std::atomic<uint8_t>& mark = t_gate->inside[index];  // entered: the thread has its record
  mark.store(static_cast<uint8_t>(mark.load(std::memory_order_relaxed) - 1),
             std::memory_order_release);
  if (const Route* route = sole->route.load(std::memory_order_acquire))
    note_launch(sole, route, index);
}

bool link_gate_enter(CUcontext context) {
  return enter(context, true) != GateTry::kRefused;
}

GateTry link_gate_try_enter(CUcontext context) {
  return enter(context, false);
}

bool link_gate_await(CUcontext context, const CUcontext* holding, unsigned count) {
  constexpr uint64_t kAwaitSliceNs = kNsPerMs;  // below any idle_release the arbiter allows
  t_asked_ns = 0;
  for (;;) {
    const GateTry outcome = enter(context, false);
    if (outcome == GateTry::kRefused) return false;
    if (outcome == GateTry::kPassed) {
      const uint32_t depth = t_gate_depth - 1;
      if (depth < kMaxEntered) t_track[depth] = false;  // nothing was launched
      link_gate_leave(context, CUDA_SUCCESS, nullptr);
      return true;
    }
    const uint64_t now = monotonic_ns();
    for (unsigned i = 0; i < count; ++i) {
      Binding* held = binding_for_context(holding[i]);
      const Route* route = held ? held->route.load(std::memory_order_acquire) : nullptr;
      if (route && (route->slot->turn.load(std::memory_order_acquire) & 1u))
        route->channel->last_launch_ns.store(now, std::memory_order_relaxed);
    }
    Binding* binding = binding_for_context(context);
    const Route* route = binding ? binding->route.load(std::memory_order_acquire) : nullptr;
    if (!route) continue;  // detached meanwhile: the next try passes
    const uint32_t turn = route->slot->turn.load(std::memory_order_acquire);
    if (!(turn & 1u)) common::futex_wait(&route->slot->turn, turn, kAwaitSliceNs);
  }
}

void link_gate_leave(CUcontext context, CUresult launched, CUstream stream) {
  if (t_gate_depth == 0) return;
  const uint32_t depth = --t_gate_depth;
  if (depth >= kMaxEntered) return;
  Binding* binding = t_entered[depth];
  t_entered[depth] = nullptr;
  if (!binding) return;
  // Recorded before the mark goes, so a revoke that drains sees the event's launch too.
  if (__builtin_expect(t_track[depth], 0)) {
    t_track[depth] = false;
    if (launched == CUDA_SUCCESS) track_launch(binding, context, stream);
  }
  mark_outside(binding);
}

}  // namespace quanta::shim
