/* Eight processes of one pod race allocations and frees against one cap while a ninth,
 * in another pod, allocates its own cap: the pod never holds a byte past its cap (each
 * process adds what the driver gave it to a shared `committed` count the shim never
 * touches; its maximum must stay within the cap), the cap is really reached (denials),
 * and the other pod is unaffected. Needs QUANTA_FAKE_LEDGER, QUANTA_FAKE_CAP (256Mi),
 * QUANTA_CONTEXT_OVERHEAD=0 and the other pod's ledger path as argv[1]. */
#define __CUDA_API_VERSION_INTERNAL 1 /* declares every exported variant, e.g. cuCtxCreate_v2 */
#include <cuda.h>
#include <sys/wait.h>
#include <time.h>

#include "tests/shim/probe.h"

#define MiB (1024ull * 1024ull)
#define RACERS 8
#define CAP (256 * MiB)
#define OTHER_CAP (64 * MiB)

static uint64_t next_random(uint64_t* state) {
  *state ^= *state << 13;
  *state ^= *state >> 7;
  *state ^= *state << 17;
  return *state;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int racer(int id, struct fake_ledger* ledger) {
  CUdevice device;
  CUcontext ctx;
  if (cuInit(0) || cuDeviceGet(&device, 0) || cuCtxCreate_v2(&ctx, 0, device)) return 3;
  CUdeviceptr live[16] = {0};
  uint64_t sizes[16] = {0};
  uint64_t rng = 0x9e3779b97f4a7c15ull * (uint64_t)(id + 1);
  const double end = now_s() + 1.0;
  int errors = 0;
  while (now_s() < end) {
    const int slot = (int)(next_random(&rng) % 16);
    if (live[slot]) {
      probe_add(&ledger->committed, -(int64_t)sizes[slot]);
      if (cuMemFree_v2(live[slot]) != CUDA_SUCCESS) ++errors;
      live[slot] = 0;
      continue;
    }
    const uint64_t size = (1 + next_random(&rng) % 32) * MiB - (next_random(&rng) % 4096);
    CUresult r = cuMemAlloc_v2(&live[slot], size);
    if (r == CUDA_ERROR_OUT_OF_MEMORY) {
      probe_add(&ledger->denials, 1);
      live[slot] = 0;
    } else if (r != CUDA_SUCCESS) {
      ++errors;
      live[slot] = 0;
    } else {
      sizes[slot] = size;
      probe_add(&ledger->committed, (int64_t)size);
      probe_max(&ledger->max_committed, probe_load(&ledger->committed));
    }
  }
  for (int i = 0; i < 16; ++i)
    if (live[i]) {
      probe_add(&ledger->committed, -(int64_t)sizes[i]);
      if (cuMemFree_v2(live[i]) != CUDA_SUCCESS) ++errors;
    }
  return errors ? 4 : 0;
}

/* The other pod fills its own cap while the racers hold theirs. */
static int neighbour(const char* path) {
  setenv("QUANTA_FAKE_LEDGER", path, 1);
  setenv("QUANTA_FAKE_CAP", "64Mi", 1);
  struct fake_ledger* ledger = probe_ledger();
  CUdevice device;
  CUcontext ctx;
  if (cuInit(0) || cuDeviceGet(&device, 0) || cuCtxCreate_v2(&ctx, 0, device)) return 3;
  CUdeviceptr p[8];
  const double end = now_s() + 0.8;
  int failures = 0;
  while (now_s() < end) {
    for (int i = 0; i < 8; ++i)
      if (cuMemAlloc_v2(&p[i], OTHER_CAP / 8) != CUDA_SUCCESS) ++failures;
    CUdeviceptr extra;
    if (cuMemAlloc_v2(&extra, 1) != CUDA_ERROR_OUT_OF_MEMORY) ++failures; /* its own cap holds */
    for (int i = 0; i < 8; ++i) cuMemFree_v2(p[i]);
  }
  (void)ledger;
  return failures ? 5 : 0;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s OTHER_POD_LEDGER\n", argv[0]);
    return 2;
  }
  struct fake_ledger* ledger = probe_ledger();
  pid_t children[RACERS + 1];
  for (int i = 0; i <= RACERS; ++i) {
    children[i] = fork();
    if (children[i] == 0) _exit(i < RACERS ? racer(i, ledger) : neighbour(argv[1]));
  }
  uint64_t max_used = 0;
  for (int reaped = 0; reaped <= RACERS;) {
    for (int i = 0; i < FAKE_LEDGER_DEVICES; ++i) {
      const uint64_t u = probe_load(&ledger->devices[i].pod_used);
      if (u > max_used) max_used = u;
    }
    int status = 0;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      ++reaped;
      const int index = pid == children[RACERS] ? RACERS : 0;
      CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s %d exited with status %d",
            index == RACERS ? "the other pod's process" : "racer", (int)pid, status);
    }
  }
  const uint64_t max_committed = probe_load(&ledger->max_committed);
  CHECK(max_committed <= CAP, "the pod held %llu bytes, %llu past its cap",
        (unsigned long long)max_committed, (unsigned long long)(max_committed - CAP));
  CHECK(max_used <= CAP, "the ledger read %llu over a cap of %llu", (unsigned long long)max_used,
        (unsigned long long)CAP);
  CHECK(probe_load(&ledger->denials) > 0, "the cap was never reached: the race proved nothing");
  CHECK(max_committed > CAP / 2, "the racers held at most %llu bytes: too little contention",
        (unsigned long long)max_committed);
  for (int i = 0; i < FAKE_LEDGER_DEVICES; ++i)
    CHECK(probe_load(&ledger->devices[i].pod_used) == 0,
          "%llu bytes still charged after every free",
          (unsigned long long)probe_load(&ledger->devices[i].pod_used));
  printf("cap %llu, max committed %llu, denials %llu\n", (unsigned long long)CAP,
         (unsigned long long)max_committed, (unsigned long long)probe_load(&ledger->denials));
  return probe_result();
}
