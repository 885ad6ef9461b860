/* The shared file behind tests/shim/fake_link.cpp: a stand-in for the arbiter's pod region
 * so the shim's ledger, views and gate calls can be tested without an arbiter. Every
 * process of a test maps the same file (QUANTA_FAKE_LEDGER); test programs read it to see
 * what the shim charged. Plain C layout: C probes and C++ tests share it. */
#ifndef QUANTA_TESTS_SHIM_FAKE_LEDGER_H
#define QUANTA_TESTS_SHIM_FAKE_LEDGER_H

#include <stdint.h>

#define FAKE_LEDGER_MAGIC 0x4b414651u /* "QFAK" */
#define FAKE_LEDGER_DEVICES 16

enum { FAKE_SLOT_FREE = 0, FAKE_SLOT_CLAIMING = 1, FAKE_SLOT_READY = 2 };

/* One GPU, keyed by its CUDA UUID (16 bytes). Words are used atomically. */
struct fake_device_account {
  uint32_t state; /* FAKE_SLOT_* */
  uint32_t reserved;
  unsigned char uuid[16];
  uint64_t cap;         /* bytes, 0 = no cap; set from QUANTA_FAKE_CAP when claimed */
  uint64_t pod_used;    /* the compare-and-swap word */
  uint64_t gate_enters; /* link_gate_enter calls on contexts of this device */
  uint64_t gate_leaves;
};

struct fake_ledger {
  uint32_t magic;
  uint32_t placed;      /* 0: link_memory_account answers false (process unplaced) */
  uint64_t gate_enters; /* all link_gate_enter calls, whatever the context */
  uint64_t gate_leaves;
  uint64_t forgotten_contexts;
  uint64_t committed; /* for test programs: bytes they hold, by their own count */
  uint64_t max_committed;
  uint64_t denials;
  uint32_t refuse_cuda; /* 1: link_refuses_cuda() answers true (set by test programs) */
  uint32_t reserved;
  struct fake_device_account devices[FAKE_LEDGER_DEVICES];
};

#endif
