// SPDX-License-Identifier: GPL-2.0
/* The node-level tracing session: Quanta's USDT probes (shim and arbiter) streamed to user
 * space with kernel timestamps, completed with when the threads involved were woken and got
 * a CPU (scheduler tracepoints), and libcuda.so.1 uprobes that give every process, with or
 * without the shim, launch-to-completion and sync-wait histograms. */
// vmlinux.h comes first: the libbpf headers use the kernel types it defines.
// clang-format off
#include "vmlinux.h"
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/usdt.bpf.h>
#include "bits.bpf.h"
#include "session.h"
#include "task.bpf.h"
// clang-format on

/* Driver synchronisations as events too: only the timelines need them, one per call. */
const volatile bool sync_events = true;

/* Arbiter processes (tgid), filled by user space: their threads' wake-ups are watched. */
struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, 64);
  __type(key, u32);
  __type(value, u8);
} arbiters SEC(".maps");

/* When a watched thread was last made runnable, and when it next got a CPU. */
struct thread_clock {
  u64 woken_ns;
  u64 on_cpu_ns;
};

/* Launcher threads blocked at a gate (gate_wait_begin to gate_wait_end). */
struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, QUANTA_SESSION_MAX_THREADS);
  __type(key, u32);
  __type(value, struct thread_clock);
} waiting SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, 256);
  __type(key, u32);
  __type(value, struct thread_clock);
} arbiter_threads SEC(".maps");

/* The shim's link threads: their synchronize calls are drains, not the application's. */
struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, QUANTA_SESSION_MAX_THREADS);
  __type(key, u32);
  __type(value, u8);
} link_threads SEC(".maps");

/* A gate wait's start, taken as the launch time of the driver call it let through, so a
 * shim tenant's launch-to-completion includes its wait exactly as the application saw it. */
struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, QUANTA_SESSION_MAX_THREADS);
  __type(key, u32);
  __type(value, u64);
} gate_begin SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, QUANTA_SESSION_MAX_PROCS);
  __type(key, u32);
  __type(value, struct quanta_driver_proc);
} procs SEC(".maps");

/* The submission count when an event was recorded: syncing on it completes up to there. */
struct event_key {
  u32 tgid;
  u32 pad;
  u64 event;
};
struct {
  __uint(type, BPF_MAP_TYPE_LRU_HASH);
  __uint(max_entries, QUANTA_SESSION_MAX_THREADS);
  __type(key, struct event_key);
  __type(value, u64);
} recorded SEC(".maps");

/* A synchronize or query call in progress, per thread. */
struct sync_call {
  u64 entry_ns;
  u64 covers;
  u32 query;
  u32 pad;
};
struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, QUANTA_SESSION_MAX_THREADS);
  __type(key, u32);
  __type(value, struct sync_call);
} syncing SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, QUANTA_SESSION_MAX_PROCS * 2);
  __type(key, struct quanta_driver_key);
  __type(value, struct quanta_hist);
} driver_hists SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, QUANTA_CNT_COUNT);
  __type(key, u32);
  __type(value, u64);
} counters SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_RINGBUF);
  __uint(max_entries, 1 << 24);
} events SEC(".maps");

static struct quanta_hist zero_hist;
static struct quanta_driver_proc zero_proc;
static struct thread_clock zero_clock;

static __always_inline void count(u32 counter) {
  u64* value = bpf_map_lookup_elem(&counters, &counter);

  if (value) *value += 1;
}

static __always_inline void emit(u32 kind, u32 device, u32 slot, u64 now, u64 a, u64 b, u64 c,
                                 u64 d) {
  struct quanta_session_event* e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
  u64 id = bpf_get_current_pid_tgid();

  if (!e) {
    count(QUANTA_CNT_EVENTS_LOST);
    return;
  }
  e->ts_ns = now;
  e->a = a;
  e->b = b;
  e->c = c;
  e->d = d;
  e->tgid = id >> 32;
  e->tid = (u32)id;
  e->device = device;
  e->slot = slot;
  e->kind = kind;
  e->pad = 0;
  bpf_ringbuf_submit(e, 0);
}

static __always_inline u32 current_tid(void) {
  return (u32)bpf_get_current_pid_tgid();
}

static __always_inline u32 current_tgid(void) {
  return bpf_get_current_pid_tgid() >> 32;
}

/* ---- libquanta.so ---------------------------------------------------------------- */

SEC("usdt")
int BPF_USDT(gate_wait_begin, u32 device, u32 slot) {
  u64 now = bpf_ktime_get_ns();
  u32 tid = current_tid();

  count(QUANTA_CNT_GATE_WAIT_BEGIN);
  bpf_map_update_elem(&waiting, &tid, &zero_clock, BPF_ANY);
  bpf_map_update_elem(&gate_begin, &tid, &now, BPF_ANY);
  emit(QUANTA_EV_GATE_WAIT_BEGIN, device, slot, now, 0, 0, 0, 0);
  return 0;
}

/* end_ns is 0 from a shim built before the probe carried it. */
SEC("usdt")
int BPF_USDT(gate_wait_end, u32 device, u32 slot, u64 wait_ns, u64 end_ns) {
  u64 now = bpf_ktime_get_ns();
  u32 tid = current_tid();
  struct thread_clock* clock = bpf_map_lookup_elem(&waiting, &tid);
  u64 woken = 0, on_cpu = 0;

  count(QUANTA_CNT_GATE_WAIT_END);
  if (clock) {
    woken = clock->woken_ns;
    on_cpu = clock->on_cpu_ns;
    bpf_map_delete_elem(&waiting, &tid);
  }
  emit(QUANTA_EV_GATE_WAIT_END, device, slot, now, wait_ns, end_ns, woken, on_cpu);
  return 0;
}

SEC("usdt")
int BPF_USDT(drain_begin, u32 device, u32 slot) {
  u32 tid = current_tid();
  u8 yes = 1;

  count(QUANTA_CNT_DRAIN_BEGIN);
  bpf_map_update_elem(&link_threads, &tid, &yes, BPF_ANY);
  emit(QUANTA_EV_DRAIN_BEGIN, device, slot, bpf_ktime_get_ns(), 0, 0, 0, 0);
  return 0;
}

SEC("usdt")
int BPF_USDT(release, u32 device, u32 slot, u64 released_ns) {
  count(QUANTA_CNT_RELEASE);
  emit(QUANTA_EV_RELEASE, device, slot, bpf_ktime_get_ns(), released_ns, 0, 0, 0);
  return 0;
}

/* ---- quanta-arbiter -------------------------------------------------------------- */

SEC("usdt")
int BPF_USDT(grant, u32 device, u32 slot, u64 granted_ns, u64 quantum_ns) {
  u64 now = bpf_ktime_get_ns();
  u32 tid = current_tid();
  struct thread_clock* clock = bpf_map_lookup_elem(&arbiter_threads, &tid);

  count(QUANTA_CNT_GRANT);
  emit(QUANTA_EV_GRANT, device, slot, now, granted_ns, quantum_ns, clock ? clock->woken_ns : 0,
       clock ? clock->on_cpu_ns : 0);
  return 0;
}

SEC("usdt")
int BPF_USDT(revoke, u32 device, u32 slot, u64 revoked_ns) {
  count(QUANTA_CNT_REVOKE);
  emit(QUANTA_EV_REVOKE, device, slot, bpf_ktime_get_ns(), revoked_ns, 0, 0, 0);
  return 0;
}

SEC("usdt")
int BPF_USDT(released, u32 device, u32 slot, u64 seen_ns) {
  count(QUANTA_CNT_RELEASED);
  emit(QUANTA_EV_RELEASED, device, slot, bpf_ktime_get_ns(), seen_ns, 0, 0, 0);
  return 0;
}

SEC("usdt")
int BPF_USDT(pass_over, u32 device, u32 slot) {
  count(QUANTA_CNT_PASS_OVER);
  emit(QUANTA_EV_PASS_OVER, device, slot, bpf_ktime_get_ns(), 0, 0, 0, 0);
  return 0;
}

SEC("usdt")
int BPF_USDT(slot_freed, u32 device, u32 slot) {
  count(QUANTA_CNT_SLOT_FREED);
  emit(QUANTA_EV_SLOT_FREED, device, slot, bpf_ktime_get_ns(), 0, 0, 0, 0);
  return 0;
}

/* ---- libcuda.so.1 ---------------------------------------------------------------- */

static __always_inline bool is_link_thread(u32 tid) {
  return bpf_map_lookup_elem(&link_threads, &tid) != NULL;
}

static __always_inline struct quanta_driver_proc* proc_of(u32 tgid, bool create) {
  struct quanta_driver_proc* proc = bpf_map_lookup_elem(&procs, &tgid);

  if (proc || !create) return proc;
  bpf_map_update_elem(&procs, &tgid, &zero_proc, BPF_NOEXIST);
  proc = bpf_map_lookup_elem(&procs, &tgid);
  if (!proc) count(QUANTA_CNT_PROCS_DROPPED);
  return proc;
}

static __always_inline void record(u32 tgid, u32 kind, u64 delta_ns) {
  struct quanta_driver_key key = {.tgid = tgid, .kind = kind};
  struct quanta_hist* h = bpf_map_lookup_elem(&driver_hists, &key);

  if (!h) {
    bpf_map_update_elem(&driver_hists, &key, &zero_hist, BPF_NOEXIST);
    h = bpf_map_lookup_elem(&driver_hists, &key);
    if (!h) return;
  }
  quanta_hist_add(h, delta_ns);
}

/* Every work submission: kernels, graphs, memsets, device-to-device copies. */
SEC("uprobe")
int BPF_KPROBE(driver_launch) {
  u32 tid = current_tid();
  u64 ts = bpf_ktime_get_ns();
  struct quanta_driver_proc* proc;
  u64* begin;
  u64 seq;

  if (is_link_thread(tid)) return 0;
  count(QUANTA_CNT_LAUNCH);
  proc = proc_of(current_tgid(), true);
  if (!proc) return 0;
  begin = bpf_map_lookup_elem(&gate_begin, &tid);
  if (begin) {
    if (*begin < ts) ts = *begin;
    bpf_map_delete_elem(&gate_begin, &tid);
  }
  seq = __sync_fetch_and_add(&proc->launched, 1) + 1;
  proc->launch_ns[seq & (QUANTA_SESSION_LAUNCH_RING - 1)] = ts;
  return 0;
}

SEC("uprobe")
int BPF_KPROBE(driver_event_record, void* event) {
  struct event_key key = {.tgid = current_tgid(), .event = (u64)event};
  struct quanta_driver_proc* proc;
  u64 seq;

  if (is_link_thread(current_tid())) return 0;
  count(QUANTA_CNT_EVENT_RECORD);
  proc = proc_of(key.tgid, false);
  if (!proc) return 0;
  seq = proc->launched;
  bpf_map_update_elem(&recorded, &key, &seq, BPF_ANY);
  return 0;
}

static __always_inline void enter_sync(u64 covers, u32 query) {
  u32 tid = current_tid();
  struct sync_call call = {.entry_ns = bpf_ktime_get_ns(), .covers = covers, .query = query};

  if (!query) count(QUANTA_CNT_SYNC);
  bpf_map_update_elem(&syncing, &tid, &call, BPF_ANY);
}

/* Context and stream synchronisation: taken to complete every submission so far. */
static __always_inline u64 covers_all(void) {
  struct quanta_driver_proc* proc = proc_of(current_tgid(), false);

  return proc ? proc->launched : 0;
}

/* An event completes what was submitted before it was recorded; 0 when it was recorded
 * before the session started (nothing known to complete). */
static __always_inline u64 covers_event(void* event) {
  struct event_key key = {.tgid = current_tgid(), .event = (u64)event};
  u64* seq = bpf_map_lookup_elem(&recorded, &key);

  return seq ? *seq : 0;
}

SEC("uprobe")
int BPF_KPROBE(driver_sync_all) {
  if (is_link_thread(current_tid())) return 0;
  enter_sync(covers_all(), 0);
  return 0;
}

SEC("uprobe")
int BPF_KPROBE(driver_sync_event, void* event) {
  if (is_link_thread(current_tid())) return 0;
  enter_sync(covers_event(event), 0);
  return 0;
}

SEC("uprobe")
int BPF_KPROBE(driver_query_all) {
  if (is_link_thread(current_tid())) return 0;
  enter_sync(covers_all(), 1);
  return 0;
}

SEC("uprobe")
int BPF_KPROBE(driver_query_event, void* event) {
  if (is_link_thread(current_tid())) return 0;
  enter_sync(covers_event(event), 1);
  return 0;
}

/* Returns of synchronize and query calls (CUDA_SUCCESS is 0). */
SEC("uretprobe")
int BPF_KRETPROBE(driver_sync_return, int result) {
  u64 now = bpf_ktime_get_ns();
  u32 tid = current_tid();
  u32 tgid = current_tgid();
  struct sync_call* pending = bpf_map_lookup_elem(&syncing, &tid);
  struct quanta_driver_proc* proc;
  struct sync_call call;
  u64 oldest_seq, oldest_ns = 0, completed = 0;

  if (!pending) return 0;
  call = *pending;
  bpf_map_delete_elem(&syncing, &tid);
  count(call.query ? QUANTA_CNT_QUERY_RETURN : QUANTA_CNT_SYNC_RETURN);
  proc = proc_of(tgid, !call.query);
  if (!call.query) {
    record(tgid, QUANTA_DRIVER_SYNC_WAIT, now - call.entry_ns);
    if (proc) __sync_fetch_and_add(&proc->syncs, 1);
  }
  if (result == 0 && proc && call.covers > proc->completed) {
    oldest_seq = proc->completed + 1;
    /* More outstanding than the ring holds: the oldest remembered stands in. */
    if (call.covers - oldest_seq >= QUANTA_SESSION_LAUNCH_RING)
      oldest_seq = call.covers - QUANTA_SESSION_LAUNCH_RING + 1;
    oldest_ns = proc->launch_ns[oldest_seq & (QUANTA_SESSION_LAUNCH_RING - 1)];
    completed = call.covers - proc->completed;
    proc->completed = call.covers;
    if (oldest_ns && now > oldest_ns)
      record(tgid, QUANTA_DRIVER_LAUNCH_TO_COMPLETION, now - oldest_ns);
  }
  if (sync_events && (!call.query || completed))
    emit(QUANTA_EV_SYNC, 0, call.query, now, call.entry_ns, oldest_ns, completed, 0);
  return 0;
}

/* ---- scheduler: the threads a handoff goes through ------------------------------ */

static __always_inline struct thread_clock* arbiter_thread(struct task_struct* p, u32 pid) {
  u32 tgid = BPF_CORE_READ(p, tgid);
  struct thread_clock* clock;

  if (!bpf_map_lookup_elem(&arbiters, &tgid)) return NULL;
  clock = bpf_map_lookup_elem(&arbiter_threads, &pid);
  if (clock) return clock;
  bpf_map_update_elem(&arbiter_threads, &pid, &zero_clock, BPF_NOEXIST);
  return bpf_map_lookup_elem(&arbiter_threads, &pid);
}

static __always_inline struct thread_clock* watched(struct task_struct* p) {
  u32 pid = BPF_CORE_READ(p, pid);
  struct thread_clock* clock = bpf_map_lookup_elem(&waiting, &pid);

  return clock ? clock : arbiter_thread(p, pid);
}

static __always_inline void on_wakeup(struct task_struct* p) {
  struct thread_clock* clock = watched(p);

  if (!clock) return;
  count(QUANTA_CNT_SCHED_WAKEUP);
  clock->woken_ns = bpf_ktime_get_ns();
}

static __always_inline void on_switch(struct task_struct* prev, struct task_struct* next) {
  u64 now = bpf_ktime_get_ns();
  struct thread_clock* clock = watched(prev);

  /* Preempted while runnable: it waits for a CPU again from now on. */
  if (clock && quanta_task_state(prev) == QUANTA_TASK_RUNNING) clock->woken_ns = now;
  clock = watched(next);
  if (clock && clock->woken_ns > clock->on_cpu_ns) {
    count(QUANTA_CNT_SCHED_SWITCH);
    clock->on_cpu_ns = now;
  }
}

/* BTF tracepoints where the kernel has them; raw tracepoints (same arguments, read with
 * CO-RE) otherwise. User space loads one set and disables the other. */
SEC("tp_btf/sched_wakeup")
int BPF_PROG(sched_wakeup_btf, struct task_struct* p) {
  on_wakeup(p);
  return 0;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(sched_switch_btf, bool preempt, struct task_struct* prev, struct task_struct* next) {
  on_switch(prev, next);
  return 0;
}

SEC("raw_tp/sched_wakeup")
int BPF_PROG(sched_wakeup_raw, struct task_struct* p) {
  on_wakeup(p);
  return 0;
}

SEC("raw_tp/sched_switch")
int BPF_PROG(sched_switch_raw, bool preempt, struct task_struct* prev, struct task_struct* next) {
  on_switch(prev, next);
  return 0;
}

char LICENSE[] SEC("license") = "GPL";
