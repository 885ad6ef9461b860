/* The log2 histogram shared by the BPF programs and quanta-trace: slot k counts values
 * (nanoseconds) in [2^k, 2^(k+1)); slot 0 also holds 0. Plain C so both sides include it. */
#ifndef QUANTA_BPF_HIST_H
#define QUANTA_BPF_HIST_H

#define QUANTA_HIST_SLOTS 40 /* 2^40 ns is about 18 minutes: nothing we trace lasts longer */

struct quanta_hist {
  unsigned int slots[QUANTA_HIST_SLOTS];
  unsigned long long count;
  unsigned long long sum_ns;
};

#endif
