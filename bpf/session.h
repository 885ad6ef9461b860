/* Types shared by session.bpf.c and `quanta-trace session`: the events the node-level
 * session streams to user space (Quanta's USDT probes, timestamped in the kernel and
 * completed with scheduler data), and the per-process driver histograms it keeps. */
#ifndef QUANTA_BPF_SESSION_H
#define QUANTA_BPF_SESSION_H

#include "bpf/hist.h"

#define QUANTA_SESSION_MAX_PROCS 8192    /* processes with driver statistics */
#define QUANTA_SESSION_MAX_THREADS 16384 /* threads watched at once (gate waiters, arbiter) */
#define QUANTA_SESSION_LAUNCH_RING 64    /* outstanding launches remembered per process */

/* One event per fired USDT probe, and one per driver synchronisation. `device`/`slot` are
 * the probe's first two arguments (the arbiter's GPU index and control slot); a..d as noted,
 * "own" values are the clock readings the shim or arbiter took itself. */
enum quanta_session_event_kind {
  QUANTA_EV_GATE_WAIT_BEGIN = 1, /* shim launcher thread */
  QUANTA_EV_GATE_WAIT_END = 2,   /* a: own wait_ns, b: own end_ns, c: woken_ns, d: on_cpu_ns */
  QUANTA_EV_DRAIN_BEGIN = 3,     /* shim link thread: a revoke seen, draining */
  QUANTA_EV_RELEASE = 4,         /* shim link thread: a: own released_ns */
  QUANTA_EV_GRANT = 5,    /* arbiter: a: own granted_ns, b: quantum_ns, c: woken_ns, d: on_cpu_ns */
  QUANTA_EV_REVOKE = 6,   /* arbiter: a: own revoked_ns */
  QUANTA_EV_RELEASED = 7, /* arbiter applied a release: a: own seen_ns */
  QUANTA_EV_PASS_OVER = 8, /* arbiter passed over a holder that ignored a revoke */
  QUANTA_EV_SYNC =
      9, /* libcuda: a: entry ns, b: oldest launch it completed (0: none), c: launches */
  QUANTA_EV_SLOT_FREED = 10, /* arbiter: the slot's process exited (its grant taken back) */
  QUANTA_EV_KIND_COUNT = 11,
};

struct quanta_session_event {
  unsigned long long ts_ns; /* bpf_ktime_get_ns (CLOCK_MONOTONIC) when the probe fired */
  unsigned long long a;
  unsigned long long b;
  unsigned long long c;
  unsigned long long d;
  unsigned int tgid;
  unsigned int tid;
  unsigned int device;
  unsigned int slot;
  unsigned int kind; /* enum quanta_session_event_kind */
  unsigned int pad;
};

/* How often each program ran: proves every attached probe fires. */
enum quanta_session_counter {
  QUANTA_CNT_GATE_WAIT_BEGIN = 0,
  QUANTA_CNT_GATE_WAIT_END,
  QUANTA_CNT_DRAIN_BEGIN,
  QUANTA_CNT_RELEASE,
  QUANTA_CNT_GRANT,
  QUANTA_CNT_REVOKE,
  QUANTA_CNT_RELEASED,
  QUANTA_CNT_PASS_OVER,
  QUANTA_CNT_SLOT_FREED,
  QUANTA_CNT_LAUNCH,        /* libcuda work submissions (kernels, graphs, memsets, D2D copies) */
  QUANTA_CNT_EVENT_RECORD,  /* cuEventRecord* */
  QUANTA_CNT_SYNC,          /* cu*Synchronize entries */
  QUANTA_CNT_SYNC_RETURN,   /* their returns */
  QUANTA_CNT_QUERY_RETURN,  /* cuEventQuery / cuStreamQuery returns */
  QUANTA_CNT_SCHED_WAKEUP,  /* wakeups of watched threads */
  QUANTA_CNT_SCHED_SWITCH,  /* switches in of watched threads */
  QUANTA_CNT_EVENTS_LOST,   /* ring buffer full */
  QUANTA_CNT_PROCS_DROPPED, /* driver statistics map full */
  QUANTA_CNT_COUNT,
};

enum quanta_driver_hist_kind {
  QUANTA_DRIVER_LAUNCH_TO_COMPLETION =
      0,                       /* oldest launch a sync (or query) completed -> its return */
  QUANTA_DRIVER_SYNC_WAIT = 1, /* a cu*Synchronize call, entry -> return */
};

struct quanta_driver_key {
  unsigned int tgid;
  unsigned int kind;
};

/* Per process: submissions numbered in order; a sync completes every one up to the number
 * it covers. The ring keeps the launch times of the newest QUANTA_SESSION_LAUNCH_RING. */
struct quanta_driver_proc {
  unsigned long long launched;  /* submissions so far */
  unsigned long long completed; /* highest submission a sync or query completed */
  unsigned long long syncs;
  unsigned long long launch_ns[QUANTA_SESSION_LAUNCH_RING];
};

#endif
