// SPDX-License-Identifier: GPL-2.0
/* GPU handoff latency from Quanta's own USDT probes: the time from a `release` on a
 * device to the next `gate_wait_end` there by another slot that was already waiting, and
 * the gate wait each waiter reports, as log2 histograms per device; optionally every probe
 * as an event. Times are the stamps the probes pass, read before each probe's trap, so the
 * cost of tracing stays out of the figures (on a virtual machine a trap can cost more than
 * the handoff); a probe that passes no stamp is timed by the kernel. */
// vmlinux.h comes first: the libbpf headers use the kernel types it defines.
// clang-format off
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/usdt.bpf.h>
#include "bits.bpf.h"
#include "handoff.h"
// clang-format on

const volatile bool emit_events = false; /* fill the ring buffer for --timeline */

struct last_release {
  u64 ts_ns;
  u32 slot;
  u32 pad;
};

struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, QUANTA_HANDOFF_MAX_DEVICES);
  __type(key, u32);
  __type(value, struct last_release);
} releases SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, QUANTA_HANDOFF_MAX_DEVICES * 2);
  __type(key, struct quanta_handoff_key);
  __type(value, struct quanta_hist);
} hists SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, QUANTA_PROBE_COUNT);
  __type(key, u32);
  __type(value, u64);
} probe_counts SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_RINGBUF);
  __uint(max_entries, 1 << 22);
} events SEC(".maps");

/* Events the ring buffer had no room for; the timeline says so rather than lying. */
__u64 events_lost = 0;

static struct quanta_hist zero_hist;

static __always_inline u64 stamp_or_now(u64 stamp_ns) {
  return stamp_ns ? stamp_ns : bpf_ktime_get_ns();
}

static __always_inline void record(u32 device, u32 kind, u64 delta_ns) {
  struct quanta_handoff_key key = {.device = device, .kind = kind};
  struct quanta_hist* h;

  h = bpf_map_lookup_elem(&hists, &key);
  if (!h) {
    bpf_map_update_elem(&hists, &key, &zero_hist, BPF_NOEXIST);
    h = bpf_map_lookup_elem(&hists, &key);
    if (!h) return; /* more than QUANTA_HANDOFF_MAX_DEVICES devices */
  }
  quanta_hist_add(h, delta_ns);
}

static __always_inline void observe(u32 probe, u32 device, u32 slot, u64 now, u64 value_ns) {
  struct quanta_handoff_event* e;
  u64* count = bpf_map_lookup_elem(&probe_counts, &probe);
  u64 id;

  if (count) *count += 1;
  if (!emit_events) return;
  e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
  if (!e) {
    __sync_fetch_and_add(&events_lost, 1);
    return;
  }
  id = bpf_get_current_pid_tgid();
  e->ts_ns = now;
  e->value_ns = value_ns;
  e->pid = id >> 32;
  e->tid = (u32)id;
  e->device = device;
  e->slot = slot;
  e->probe = probe;
  e->pad = 0;
  /* No wake-up: the reader drains the buffer on its own period, so a busy node's handoffs
   * do not each wake a tracing thread that competes with the tenants for their cores. */
  bpf_ringbuf_submit(e, BPF_RB_NO_WAKEUP);
}

SEC("usdt")
int BPF_USDT(handle_gate_wait_begin, u32 device, u32 slot) {
  observe(QUANTA_PROBE_GATE_WAIT_BEGIN, device, slot, bpf_ktime_get_ns(), 0);
  return 0;
}

SEC("usdt")
int BPF_USDT(handle_gate_wait_end, u32 device, u32 slot, u64 wait_ns, u64 end_ns) {
  u64 now = stamp_or_now(end_ns);
  struct last_release* rel;

  record(device, QUANTA_HIST_GATE_WAIT, wait_ns);
  rel = bpf_map_lookup_elem(&releases, &device);
  /* The first waiter of another slot to pass its gate after a release completes the
   * handoff, if it was already waiting when the GPU was released: one that came later
   * times its own lateness, and the release stays for the next waiter. */
  if (rel && rel->slot != slot && now >= rel->ts_ns &&
      (wait_ns >= now || now - wait_ns <= rel->ts_ns)) {
    record(device, QUANTA_HIST_HANDOFF, now - rel->ts_ns);
    bpf_map_delete_elem(&releases, &device);
  }
  observe(QUANTA_PROBE_GATE_WAIT_END, device, slot, now, wait_ns);
  return 0;
}

SEC("usdt")
int BPF_USDT(handle_release, u32 device, u32 slot, u64 released_ns) {
  struct last_release rel = {.ts_ns = stamp_or_now(released_ns), .slot = slot};

  bpf_map_update_elem(&releases, &device, &rel, BPF_ANY);
  observe(QUANTA_PROBE_RELEASE, device, slot, rel.ts_ns, 0);
  return 0;
}

SEC("usdt")
int BPF_USDT(handle_grant, u32 device, u32 slot, u64 granted_ns) {
  observe(QUANTA_PROBE_GRANT, device, slot, stamp_or_now(granted_ns), 0);
  return 0;
}

char LICENSE[] SEC("license") = "GPL";
