/* Types shared by offcpu.bpf.c and the offcpu tool: which histogram a sample lands in,
 * keyed by process (tgid). */
#ifndef QUANTA_BPF_OFFCPU_H
#define QUANTA_BPF_OFFCPU_H

#include "bpf/hist.h"

#define QUANTA_OFFCPU_MAX_TGIDS 64

enum quanta_offcpu_kind {
  QUANTA_OFFCPU_RUNQ = 0, /* woken (or preempted) until back on a CPU */
  QUANTA_OFFCPU_OFF = 1,  /* switched out until switched back in, for any reason */
};

struct quanta_offcpu_key {
  unsigned int tgid;
  unsigned int kind;
};

#endif
