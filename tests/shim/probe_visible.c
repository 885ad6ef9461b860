/* CUDA_VISIBLE_DEVICES through libquanta_testlink.so on simgpu, a list that renumbers GPUs:
 * memory allocated through a renumbered ordinal is charged to the ledger account of the
 * physical device behind it, never to the device that has that index physically, and
 * cuMemGetInfo, NVML's capped view and simgpu's own process list agree on it.
 *   probe_visible PHYSICAL...   PHYSICAL[i]: the device-list index ordinal i must be
 * The physical UUIDs come from SIMGPU_UUIDS (the test sets them), so the probe knows them
 * without asking the driver it is checking. */
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include "../../common/nvml_api.h"
#include "tests/shim/probe.h"

#define MiB (1024ull * 1024ull)
#define MAX_PHYSICAL 8

static struct fake_ledger* ledger;
static unsigned char physical_uuid[MAX_PHYSICAL][16];
static char physical_text[MAX_PHYSICAL][48];
static int physical_count;

static int hex(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* SIMGPU_UUIDS "GPU-…,GPU-…" -> physical_uuid / physical_text. */
static int read_physical_uuids(void) {
  const char* list = getenv("SIMGPU_UUIDS");
  if (!list) return 0;
  const char* p = list;
  while (*p && physical_count < MAX_PHYSICAL) {
    const char* end = strchr(p, ',');
    const size_t len = end ? (size_t)(end - p) : strlen(p);
    if (len >= sizeof physical_text[0] || len < 4) return 0;
    memcpy(physical_text[physical_count], p, len);
    physical_text[physical_count][len] = '\0';
    const char* h = p + 4; /* past "GPU-" */
    for (int byte = 0; byte < 16; ++byte) {
      while (*h == '-') ++h;
      if (hex(h[0]) < 0 || hex(h[1]) < 0) return 0;
      physical_uuid[physical_count][byte] = (unsigned char)(hex(h[0]) << 4 | hex(h[1]));
      h += 2;
    }
    ++physical_count;
    p = end ? end + 1 : p + len;
  }
  return physical_count;
}

static uint64_t account_used(int physical) {
  struct fake_device_account* a = probe_account(ledger, physical_uuid[physical]);
  return a ? probe_load(&a->pod_used) : 0;
}

/* The cap the fake link set on the account when it claimed it (QUANTA_FAKE_CAP). */
static uint64_t account_cap(int physical) {
  struct fake_device_account* a = probe_account(ledger, physical_uuid[physical]);
  return a ? probe_load(&a->cap) : 0;
}

static uint64_t overhead(void) {
  const char* text = getenv("QUANTA_CONTEXT_OVERHEAD");
  return text ? strtoull(text, NULL, 10) : 300 * MiB;
}

int main(int argc, char** argv) {
  if (argc < 2 || read_physical_uuids() < 2) {
    fprintf(stderr, "usage: probe_visible PHYSICAL... with SIMGPU_UUIDS naming two or more GPUs\n");
    return 2;
  }
  const int visible = argc - 1;
  int expected[MAX_PHYSICAL];
  int is_visible[MAX_PHYSICAL] = {0};
  for (int i = 0; i < visible && i < MAX_PHYSICAL; ++i) {
    expected[i] = atoi(argv[i + 1]);
    if (expected[i] < 0 || expected[i] >= physical_count) {
      fprintf(stderr, "physical index %s is not one of the %d devices\n", argv[i + 1],
              physical_count);
      return 2;
    }
    is_visible[expected[i]] = 1;
  }
  ledger = probe_ledger();
  CHECK_CU(cuInit(0));
  int count = 0;
  CHECK_CU(cuDeviceGetCount(&count));
  CHECK(count == visible, "cuDeviceGetCount %d under CUDA_VISIBLE_DEVICES=%s", count,
        getenv("CUDA_VISIBLE_DEVICES"));
  if (count != visible) return probe_result();
  CHECK(nvmlInit_v2() == NVML_SUCCESS, "nvmlInit_v2");

  CUdeviceptr allocations[MAX_PHYSICAL];
  for (int ordinal = 0; ordinal < visible; ++ordinal) {
    const int physical = expected[ordinal];
    const uint64_t bytes = (uint64_t)(8 + ordinal) * MiB;
    CUdevice device = 0;
    CUuuid uuid;
    CHECK_CU(cuDeviceGet(&device, ordinal));
    CHECK_CU(cuDeviceGetUuid_v2(&uuid, device));
    CHECK(!memcmp(uuid.bytes, physical_uuid[physical], 16),
          "ordinal %d is not physical device %d (%s)", ordinal, physical, physical_text[physical]);
    CUcontext ctx = NULL;
    CHECK_CU(cuCtxCreate_v2(&ctx, 0, device));
    CHECK_CU(cuMemAlloc_v2(&allocations[ordinal], bytes));
    const uint64_t charged = account_used(physical);
    CHECK(charged == overhead() + bytes,
          "ordinal %d: physical device %d's account holds %llu, expected %llu", ordinal, physical,
          (unsigned long long)charged, (unsigned long long)(overhead() + bytes));

    /* cuMemGetInfo in this context: the cap of that account. */
    const uint64_t cap = account_cap(physical);
    CHECK(cap != 0, "physical device %d's account has no cap (QUANTA_FAKE_CAP)", physical);
    size_t free_bytes = 0, total = 0;
    CHECK_CU(cuMemGetInfo_v2(&free_bytes, &total));
    CHECK(total == cap && free_bytes == cap - charged,
          "ordinal %d: cuMemGetInfo says free %zu total %zu; expected %llu of %llu", ordinal,
          free_bytes, total, (unsigned long long)(cap - charged), (unsigned long long)cap);

    /* NVML keeps physical order: the physical device's handle shows the same numbers. */
    nvmlDevice_t nvml_device;
    nvmlMemory_t memory;
    CHECK(nvmlDeviceGetHandleByIndex_v2((unsigned)physical, &nvml_device) == NVML_SUCCESS,
          "NVML handle %d", physical);
    char text[NVML_DEVICE_UUID_V2_BUFFER_SIZE] = {0};
    CHECK(nvmlDeviceGetUUID(nvml_device, text, sizeof text) == NVML_SUCCESS &&
              !strcasecmp(text, physical_text[physical]),
          "NVML index %d has UUID %s, expected %s", physical, text, physical_text[physical]);
    CHECK(nvmlDeviceGetMemoryInfo(nvml_device, &memory) == NVML_SUCCESS &&
              memory.total == total && memory.used == charged && memory.free == free_bytes,
          "NVML index %d says total %llu used %llu free %llu; CUDA says total %zu free %zu, "
          "ledger %llu",
          physical, memory.total, memory.used, memory.free, total, free_bytes,
          (unsigned long long)charged);
    /* simgpu's own process list (not virtualised by the shim): the driver charged the
     * allocation to the same physical device. */
    nvmlProcessInfo_t infos[4];
    unsigned n = 4;
    CHECK(nvmlDeviceGetComputeRunningProcesses_v3(nvml_device, &n, infos) == NVML_SUCCESS &&
              n == 1 && (pid_t)infos[0].pid == getpid() && infos[0].usedGpuMemory == bytes,
          "NVML index %d lists %u processes (first pid %u, %llu bytes), expected this one with "
          "%llu",
          physical, n, n ? infos[0].pid : 0u, n ? infos[0].usedGpuMemory : 0ull,
          (unsigned long long)bytes);
  }

  /* Devices no ordinal names got nothing: no ledger charge, nothing in the driver. */
  for (int physical = 0; physical < physical_count; ++physical) {
    if (is_visible[physical]) continue;
    CHECK(account_used(physical) == 0, "hidden physical device %d was charged %llu", physical,
          (unsigned long long)account_used(physical));
    nvmlDevice_t nvml_device;
    nvmlMemory_t memory;
    CHECK(nvmlDeviceGetHandleByIndex_v2((unsigned)physical, &nvml_device) == NVML_SUCCESS &&
              nvmlDeviceGetMemoryInfo(nvml_device, &memory) == NVML_SUCCESS && memory.used == 0,
          "hidden physical device %d shows %llu bytes used in NVML", physical, memory.used);
    unsigned n = 0;
    CHECK(nvmlDeviceGetComputeRunningProcesses_v3(nvml_device, &n, NULL) == NVML_SUCCESS &&
              n == 0,
          "hidden physical device %d lists %u processes", physical, n);
  }
  for (int ordinal = 0; ordinal < visible; ++ordinal) CHECK_CU(cuMemFree_v2(allocations[ordinal]));
  return probe_result();
}
