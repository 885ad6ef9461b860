/* Helpers every Quanta BPF program uses: log2 bucketing of nanosecond values and the
 * histogram update, kept here so each program stays about its own events. */
#ifndef QUANTA_BITS_BPF_H
#define QUANTA_BITS_BPF_H

#include "hist.h"

static __always_inline __u64 quanta_log2(__u32 v) {
  __u32 shift, r;

  r = (v > 0xFFFF) << 4;
  v >>= r;
  shift = (v > 0xFF) << 3;
  v >>= shift;
  r |= shift;
  shift = (v > 0xF) << 2;
  v >>= shift;
  r |= shift;
  shift = (v > 0x3) << 1;
  v >>= shift;
  r |= shift;
  r |= (v >> 1);
  return r;
}

static __always_inline __u64 quanta_log2l(__u64 v) {
  __u32 hi = v >> 32;

  return hi ? quanta_log2(hi) + 32 : quanta_log2(v);
}

static __always_inline void quanta_hist_add(struct quanta_hist* h, __u64 delta_ns) {
  __u64 slot = quanta_log2l(delta_ns);

  if (slot >= QUANTA_HIST_SLOTS) slot = QUANTA_HIST_SLOTS - 1;
  __sync_fetch_and_add(&h->slots[slot], 1);
  __sync_fetch_and_add(&h->count, 1);
  __sync_fetch_and_add(&h->sum_ns, delta_ns);
}

#endif
