/* Helpers shared by the C probe programs that tests/shim runs under LD_PRELOAD of
 * libquanta.so: a CHECK that names the expectation, the fake ledger file, and a simgpu
 * context. C on purpose: a probe must not itself load libstdc++. */
#ifndef QUANTA_TESTS_SHIM_PROBE_H
#define QUANTA_TESTS_SHIM_PROBE_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tests/shim/fake_ledger.h"

static int probe_failures = 0;

#define CHECK(cond, ...)                                                  \
  do {                                                                    \
    if (!(cond)) {                                                        \
      fprintf(stderr, "%s:%d: expected %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                       \
      fputc('\n', stderr);                                                \
      ++probe_failures;                                                   \
    }                                                                     \
  } while (0)

#define CHECK_CU(call)                                         \
  do {                                                         \
    int probe_rc_ = (int)(call);                               \
    CHECK(probe_rc_ == 0, "%s returned %d", #call, probe_rc_); \
  } while (0)

#define PROBE_SKIP 77 /* CTest SKIP_RETURN_CODE */

static inline int probe_result(void) {
  if (probe_failures) fprintf(stderr, "%d check(s) failed\n", probe_failures);
  return probe_failures ? 1 : 0;
}

static inline uint64_t probe_load(const uint64_t* word) {
  return __atomic_load_n(word, __ATOMIC_ACQUIRE);
}
static inline void probe_store(uint64_t* word, uint64_t v) {
  __atomic_store_n(word, v, __ATOMIC_RELEASE);
}
static inline void probe_add(uint64_t* word, int64_t v) {
  __atomic_add_fetch(word, (uint64_t)v, __ATOMIC_ACQ_REL);
}
static inline void probe_max(uint64_t* word, uint64_t v) {
  uint64_t seen = probe_load(word);
  while (seen < v &&
         !__atomic_compare_exchange_n(word, &seen, v, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
  }
}

/* Maps the fake ledger named by QUANTA_FAKE_LEDGER (the same file the shim's test link
 * maps), emptied, and marks the process placed, so the shim gets accounts. Call it before
 * the first CUDA call: the shim opens the file at its first use. */
static inline struct fake_ledger* probe_ledger(void) {
  const char* path = getenv("QUANTA_FAKE_LEDGER");
  if (!path) {
    fprintf(stderr, "QUANTA_FAKE_LEDGER is not set\n");
    exit(2);
  }
  int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0 || ftruncate(fd, sizeof(struct fake_ledger)) != 0) {
    perror(path);
    exit(2);
  }
  void* m = mmap(NULL, sizeof(struct fake_ledger), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (m == MAP_FAILED) {
    perror("mmap");
    exit(2);
  }
  struct fake_ledger* ledger = (struct fake_ledger*)m;
  __atomic_store_n(&ledger->placed, 1u, __ATOMIC_RELEASE);
  return ledger;
}

/* The ledger slot of a device UUID, or NULL when the shim never charged that device. */
static inline struct fake_device_account* probe_account(struct fake_ledger* ledger,
                                                        const void* uuid16) {
  for (int i = 0; i < FAKE_LEDGER_DEVICES; ++i) {
    struct fake_device_account* a = &ledger->devices[i];
    if (__atomic_load_n(&a->state, __ATOMIC_ACQUIRE) == FAKE_SLOT_READY &&
        !memcmp(a->uuid, uuid16, 16))
      return a;
  }
  return NULL;
}

/* Where a function pointer lives: the file's base name and the symbol's exact name. */
static inline const char* probe_object_of(const void* p) {
  Dl_info info;
  if (!p || !dladdr(p, &info) || !info.dli_fname) return "?";
  const char* slash = strrchr(info.dli_fname, '/');
  return slash ? slash + 1 : info.dli_fname;
}
static inline const char* probe_symbol_of(const void* p) {
  Dl_info info;
  if (!p || !dladdr(p, &info) || !info.dli_sname || info.dli_saddr != p) return "?";
  return info.dli_sname;
}
static inline int probe_in_shim(const void* p) {
  return strncmp(probe_object_of(p), "libquanta", 9) == 0;
}

#endif
