// SPDX-License-Identifier: GPL-2.0
/* Run-queue latency and off-CPU time of chosen processes, from the scheduler's tracepoints
 * (BTF ones, raw ones where the kernel lacks them): wakeup (or preemption) to on-CPU, and
 * switch-out to switch-in, as log2 histograms keyed by tgid. */
// vmlinux.h comes first: the libbpf headers use the kernel types it defines.
// clang-format off
#include "vmlinux.h"
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "bits.bpf.h"
#include "offcpu.h"
#include "task.bpf.h"
// clang-format on

const volatile bool targ_filter = false; /* only tgids in `tgids`; else every process */

struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, QUANTA_OFFCPU_MAX_TGIDS);
  __type(key, u32);
  __type(value, u8);
} tgids SEC(".maps");

/* Per thread: when it became runnable, and when it left the CPU. */
struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, 10240);
  __type(key, u32);
  __type(value, u64);
} runq_start SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, 10240);
  __type(key, u32);
  __type(value, u64);
} off_start SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, QUANTA_OFFCPU_MAX_TGIDS * 2);
  __type(key, struct quanta_offcpu_key);
  __type(value, struct quanta_hist);
} hists SEC(".maps");

static struct quanta_hist zero_hist;

static __always_inline bool traced(u32 tgid) {
  if (tgid == 0) return false; /* the idle task */
  if (!targ_filter) return true;
  return bpf_map_lookup_elem(&tgids, &tgid) != NULL;
}

static __always_inline void record(u32 tgid, u32 kind, u64 delta_ns) {
  struct quanta_offcpu_key key = {.tgid = tgid, .kind = kind};
  struct quanta_hist* h;

  h = bpf_map_lookup_elem(&hists, &key);
  if (!h) {
    bpf_map_update_elem(&hists, &key, &zero_hist, BPF_NOEXIST);
    h = bpf_map_lookup_elem(&hists, &key);
    if (!h) return; /* map full: more processes than QUANTA_OFFCPU_MAX_TGIDS */
  }
  quanta_hist_add(h, delta_ns);
}

static __always_inline void mark_runnable(struct task_struct* p) {
  u32 tgid = BPF_CORE_READ(p, tgid);
  u32 pid = BPF_CORE_READ(p, pid);
  u64 now;

  if (!traced(tgid)) return;
  now = bpf_ktime_get_ns();
  bpf_map_update_elem(&runq_start, &pid, &now, BPF_ANY);
}

/* Pops the start time for `pid` from `starts` and records the elapsed time. */
static __always_inline void finish(void* starts, u32 pid, u32 tgid, u32 kind, u64 now) {
  u64* tsp = bpf_map_lookup_elem(starts, &pid);

  if (!tsp) return;
  if (now > *tsp) record(tgid, kind, now - *tsp);
  bpf_map_delete_elem(starts, &pid);
}

static __always_inline void on_switch(struct task_struct* prev, struct task_struct* next) {
  u64 now = bpf_ktime_get_ns();
  u32 prev_tgid = BPF_CORE_READ(prev, tgid);
  u32 prev_pid = BPF_CORE_READ(prev, pid);
  u32 next_tgid = BPF_CORE_READ(next, tgid);
  u32 next_pid = BPF_CORE_READ(next, pid);

  if (traced(prev_tgid)) {
    bpf_map_update_elem(&off_start, &prev_pid, &now, BPF_ANY);
    /* Preempted while runnable: it waits in the run queue from now on. */
    if (quanta_task_state(prev) == QUANTA_TASK_RUNNING)
      bpf_map_update_elem(&runq_start, &prev_pid, &now, BPF_ANY);
  }
  if (traced(next_tgid)) {
    finish(&runq_start, next_pid, next_tgid, QUANTA_OFFCPU_RUNQ, now);
    finish(&off_start, next_pid, next_tgid, QUANTA_OFFCPU_OFF, now);
  }
}

/* BTF tracepoints where the kernel has them; raw tracepoints (same arguments, read with
 * CO-RE) otherwise. User space loads one set and disables the other. */
SEC("tp_btf/sched_wakeup")
int BPF_PROG(handle_wakeup, struct task_struct* p) {
  mark_runnable(p);
  return 0;
}

SEC("tp_btf/sched_wakeup_new")
int BPF_PROG(handle_wakeup_new, struct task_struct* p) {
  mark_runnable(p);
  return 0;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(handle_switch, bool preempt, struct task_struct* prev, struct task_struct* next) {
  on_switch(prev, next);
  return 0;
}

SEC("raw_tp/sched_wakeup")
int BPF_PROG(handle_wakeup_raw, struct task_struct* p) {
  mark_runnable(p);
  return 0;
}

SEC("raw_tp/sched_wakeup_new")
int BPF_PROG(handle_wakeup_new_raw, struct task_struct* p) {
  mark_runnable(p);
  return 0;
}

SEC("raw_tp/sched_switch")
int BPF_PROG(handle_switch_raw, bool preempt, struct task_struct* prev, struct task_struct* next) {
  on_switch(prev, next);
  return 0;
}

char LICENSE[] SEC("license") = "GPL";
