// The launch gate: per-thread marks, the asymmetric barrier the link thread uses on a
// revoke, the fast path (plain stores to this thread's lines and a few loads) and the slow
// path (ask for the GPU, wake the arbiter, sleep on the turn word).
#include <linux/membarrier.h>
#include <pthread.h>
#include <sys/sdt.h>

#include "common/futex.h"
#include "shim/link_state.h"
#include "shim/log.h"
#include "shim/spin.h"

namespace quanta::shim {

QUANTA_TLS bool t_in_link = false;

namespace {

// Bindings this thread is inside, innermost last: one per link_gate_enter not yet left (a
// multi-device cooperative launch enters one gate per device before its real call).
constexpr uint32_t kMaxEntered = 16;
QUANTA_TLS uint32_t t_gate_depth = 0;
QUANTA_TLS Binding* t_entered[kMaxEntered] = {};

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

void record_wait(const Route* route, uint64_t waited_ns) {
  GateChannel* channel = route->channel;
  channel->gate_waits.fetch_add(1, std::memory_order_relaxed);
  channel->gate_wait_ns.fetch_add(waited_ns, std::memory_order_relaxed);
  uint64_t max = channel->gate_wait_max_ns.load(std::memory_order_relaxed);
  while (waited_ns > max && !channel->gate_wait_max_ns.compare_exchange_weak(
                                max, waited_ns, std::memory_order_relaxed)) {
  }
  DTRACE_PROBE3(quanta, gate_wait_end, route->gpu_index, route->slot_index, waited_ns);
}

// The slow path: ask for the GPU, wake the arbiter, sleep on the turn word. Returns with
// this thread marked inside, either granted or passing because the lease lapsed or the
// slot is no longer this process's.
void gate_slow(Binding* binding, const Route* route) {
  const uint64_t begin = monotonic_ns();
  DTRACE_PROBE2(quanta, gate_wait_begin, route->gpu_index, route->slot_index);
  const uint32_t pid = g_process.pid.load(std::memory_order_relaxed);
  uint64_t rang_at = 0;
  for (;;) {
    const Route* current = binding->route.load(std::memory_order_acquire);
    if (current) route = current;
    mark_inside(binding);
    const uint32_t turn = route->slot->turn.load(std::memory_order_seq_cst);
    if (turn & 1u) {
      route->channel->want.store(0, std::memory_order_relaxed);
      break;
    }
    mark_outside(binding);
    const uint64_t now = monotonic_ns();
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
    if (route->slot->pid.load(std::memory_order_relaxed) != pid) {
      mark_inside(binding);  // not ours now: ungated
      break;
    }
    if (rang_at == 0 || now - rang_at >= kGateWaitSliceNs) {
      route->channel->want.store(1, std::memory_order_seq_cst);
      ring_doorbell();
      rang_at = now;
    }
    common::futex_wait(&route->slot->turn, turn, kGateWaitSliceNs);
  }
  record_wait(route, monotonic_ns() - begin);
  note_launch(binding, route);
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

void link_gate_enter(CUcontext context) {
  const uint32_t depth = t_gate_depth++;
  if (depth >= kMaxEntered) return;  // deeper than any real caller goes: ungated
  t_entered[depth] = nullptr;
  if (t_in_link) return;
  Binding* binding = binding_for_context(context);
  if (!binding) return;
  if (__builtin_expect(!t_gate_claimed, 0)) claim_thread_gate();
  t_entered[depth] = binding;
  mark_inside(binding);
  const Route* route = binding->route.load(std::memory_order_acquire);
  if (!route) return;  // device not attached: ungated
  const uint32_t turn = route->slot->turn.load(std::memory_order_seq_cst);
  if (__builtin_expect(turn & 1u, 1)) {
    note_launch(binding, route);
    return;
  }
  if (binding->lapsed.load(std::memory_order_relaxed) &&
      lease_stale(route->control, monotonic_ns())) {
    note_launch(binding, route);
    return;
  }
  mark_outside(binding);
  gate_slow(binding, route);
}

void link_gate_leave(CUcontext /*context*/, CUresult /*launched*/) {
  if (t_gate_depth == 0) return;
  const uint32_t depth = --t_gate_depth;
  if (depth >= kMaxEntered) return;
  Binding* binding = t_entered[depth];
  t_entered[depth] = nullptr;
  if (binding) mark_outside(binding);
}

}  // namespace quanta::shim
