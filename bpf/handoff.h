/* Types shared by handoff.bpf.c and the handoff tool: the USDT probes of provider
 * `quanta`, the histograms they feed, and the timeline events sent to user space. */
#ifndef QUANTA_BPF_HANDOFF_H
#define QUANTA_BPF_HANDOFF_H

#include "bpf/hist.h"

#define QUANTA_HANDOFF_MAX_DEVICES 64

/* One value per probe; also the `kind` of a timeline event and the index of its counter.
 * The stamps are CLOCK_MONOTONIC nanoseconds the component read just before the probe. */
enum quanta_handoff_probe {
  QUANTA_PROBE_GATE_WAIT_BEGIN = 0, /* quanta:gate_wait_begin(u32 device, u32 slot) */
  QUANTA_PROBE_GATE_WAIT_END = 1,   /* quanta:gate_wait_end(u32 device, u32 slot, u64 wait_ns,
                                       u64 end_ns) */
  QUANTA_PROBE_RELEASE = 2,         /* quanta:release(u32 device, u32 slot, u64 released_ns) */
  QUANTA_PROBE_GRANT = 3,           /* quanta:grant(u32 device, u32 slot, u64 granted_ns, ...) */
  QUANTA_PROBE_COUNT = 4,
};

enum quanta_handoff_hist_kind {
  /* a release on a device to the gate_wait_end of another slot that was already waiting */
  QUANTA_HIST_HANDOFF = 0,
  QUANTA_HIST_GATE_WAIT = 1, /* wait_ns reported by gate_wait_end */
};

struct quanta_handoff_key {
  unsigned int device;
  unsigned int kind;
};

struct quanta_handoff_event {
  /* CLOCK_MONOTONIC: the probe's own stamp where it passes one, so no probe's trap falls
   * inside an interval of stamps; the kernel's time at the probe where it passes none. */
  unsigned long long ts_ns;
  unsigned long long value_ns; /* gate_wait_end: wait_ns; else 0 */
  unsigned int pid;
  unsigned int tid;
  unsigned int device;
  unsigned int slot;
  unsigned int probe; /* enum quanta_handoff_probe */
  unsigned int pad;
};

#endif
