/* Memory the driver still holds after the program freed it stays charged until the
 * driver lets it go, through libquanta_testlink.so on simgpu (which models the driver's
 * rules). Run with QUANTA_FAKE_CAP=64Mi QUANTA_CONTEXT_OVERHEAD=0; one behaviour per mode:
 *   vmm      cuMemRelease of a handle still mapped refunds nothing; its last cuMemUnmap does
 *   pool     cuMemFreeAsync into a pool with release threshold UINT64_MAX keeps counting
 *            through synchronisations (and reuse is not charged twice) until
 *            cuMemPoolTrimTo; the default pool (threshold 0) refunds at the next sync
 *   capture  a free captured in a graph refunds only once a launch of the graph has run
 *   exact    all of it together, then everything really freed: the ledger is exactly
 *            where it started (no byte lost or counted twice) */
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include "tests/shim/probe.h"

#define MiB (1024ull * 1024ull)

static struct fake_ledger* ledger;
static CUdevice device;
static CUuuid device_uuid;
static CUstream stream;

static uint64_t used(void) {
  struct fake_device_account* a = probe_account(ledger, device_uuid.bytes);
  return a ? probe_load(&a->pod_used) : 0;
}

static void make_context(void) {
  CUcontext ctx = NULL;
  CHECK_CU(cuDeviceGet(&device, 0));
  CHECK_CU(cuDeviceGetUuid_v2(&device_uuid, device));
  CHECK_CU(cuCtxCreate_v2(&ctx, 0, device));
  CHECK_CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
}

#define EXPECT_USED(bytes, what)                                                    \
  CHECK(used() == (uint64_t)(bytes), "%s: %llu bytes charged, expected %llu", what, \
        (unsigned long long)used(), (unsigned long long)(bytes))

/* 48 MiB more fits under the 64 MiB cap only when what was freed is really gone. */
static void expect_no_room(const char* what) {
  CUdeviceptr p = 0;
  CUresult r = cuMemAlloc_v2(&p, 48 * MiB);
  CHECK(r == CUDA_ERROR_OUT_OF_MEMORY,
        "%s: a 48 MiB allocation returned %d, expected out of memory", what, (int)r);
  if (r == CUDA_SUCCESS) cuMemFree_v2(p);
}

static void expect_room(const char* what) {
  CUdeviceptr p = 0;
  CUresult r = cuMemAlloc_v2(&p, 48 * MiB);
  CHECK(r == CUDA_SUCCESS, "%s: a 48 MiB allocation returned %d", what, (int)r);
  if (r == CUDA_SUCCESS) CHECK_CU(cuMemFree_v2(p));
}

static void vmm(void) {
  const uint64_t start = used();
  CUmemAllocationProp prop;
  memset(&prop, 0, sizeof prop);
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  CUmemGenericAllocationHandle handle = 0;
  CHECK_CU(cuMemCreate(&handle, 48 * MiB, &prop, 0));
  CUdeviceptr va = 0;
  CHECK_CU(cuMemAddressReserve(&va, 48 * MiB, 0, 0, 0));
  CHECK_CU(cuMemMap(va, 48 * MiB, 0, handle, 0));
  /* The documented idiom: release right after mapping; the mapping keeps the memory. */
  CHECK_CU(cuMemRelease(handle));
  EXPECT_USED(start + 48 * MiB, "released while mapped");
  expect_no_room("a released handle still mapped");
  CHECK_CU(cuMemUnmap(va, 48 * MiB));
  EXPECT_USED(start, "after the last unmap");
  expect_room("after the last unmap");
  /* Two mappings of halves, released in between: the second unmap refunds. */
  CHECK_CU(cuMemCreate(&handle, 32 * MiB, &prop, 0));
  CHECK_CU(cuMemMap(va, 16 * MiB, 0, handle, 0));
  CHECK_CU(cuMemMap(va + 16 * MiB, 16 * MiB, 16 * MiB, handle, 0));
  CHECK_CU(cuMemRelease(handle));
  CHECK_CU(cuMemUnmap(va + 16 * MiB, 16 * MiB));
  EXPECT_USED(start + 32 * MiB, "one of two mappings left");
  CHECK_CU(cuMemUnmap(va, 16 * MiB));
  EXPECT_USED(start, "both mappings gone");
  /* Unmapped first, released after: the release refunds. */
  CHECK_CU(cuMemCreate(&handle, 16 * MiB, &prop, 0));
  CHECK_CU(cuMemMap(va, 16 * MiB, 0, handle, 0));
  CHECK_CU(cuMemUnmap(va, 16 * MiB));
  EXPECT_USED(start + 16 * MiB, "unmapped, not released");
  CHECK_CU(cuMemRelease(handle));
  EXPECT_USED(start, "released after its unmap");
  CHECK_CU(cuMemAddressFree(va, 48 * MiB));
}

static void pool(void) {
  const uint64_t start = used();
  CUmemPoolProps props;
  memset(&props, 0, sizeof props);
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = device;
  CUmemoryPool pool = NULL;
  CHECK_CU(cuMemPoolCreate(&pool, &props));
  /* What frameworks do: keep everything cached. */
  cuuint64_t threshold = UINT64_MAX;
  CHECK_CU(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold));
  CUdeviceptr p = 0;
  CHECK_CU(cuMemAllocFromPoolAsync(&p, 48 * MiB, pool, stream));
  CHECK_CU(cuMemFreeAsync(p, stream));
  CHECK_CU(cuStreamSynchronize(stream));
  CHECK_CU(cuCtxSynchronize());
  EXPECT_USED(start + 48 * MiB, "freed into a pool that keeps its cache");
  expect_no_room("the pool still holds its cache");
  /* Reusing the cache charges nothing more. */
  CHECK_CU(cuMemAllocFromPoolAsync(&p, 48 * MiB, pool, stream));
  EXPECT_USED(start + 48 * MiB, "served from the pool's cache");
  CHECK_CU(cuMemFreeAsync(p, stream));
  CHECK_CU(cuMemPoolTrimTo(pool, 16 * MiB));
  EXPECT_USED(start + 16 * MiB, "trimmed to 16 MiB");
  CHECK_CU(cuMemPoolTrimTo(pool, 0));
  EXPECT_USED(start, "trimmed to nothing");
  expect_room("after the trim");
  CHECK_CU(cuMemPoolDestroy(pool));

  /* The default pool, threshold 0: held until the next synchronisation. */
  CHECK_CU(cuMemAllocAsync(&p, 48 * MiB, stream));
  CHECK_CU(cuMemFreeAsync(p, stream));
  EXPECT_USED(start + 48 * MiB, "freed into the default pool, before a sync");
  expect_no_room("the default pool before a sync");
  CHECK_CU(cuStreamSynchronize(stream));
  EXPECT_USED(start, "the default pool after a sync");
  expect_room("the default pool after a sync");
}

/* A graph allocation made by one captured graph and freed by a second. */
static void capture(void) {
  const uint64_t start = used();
  CUdeviceptr p = 0;
  CHECK_CU(cuStreamBeginCapture_v2(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CHECK_CU(cuMemAllocAsync(&p, 48 * MiB, stream));
  CUgraph make = NULL, release = NULL;
  CHECK_CU(cuStreamEndCapture(stream, &make));
  CUgraphExec make_exec = NULL, release_exec = NULL;
  CHECK_CU(cuGraphInstantiateWithFlags(&make_exec, make, 0));
  CHECK_CU(cuGraphLaunch(make_exec, stream));
  CHECK_CU(cuStreamSynchronize(stream));
  EXPECT_USED(start + 48 * MiB, "a graph allocation");

  CHECK_CU(cuStreamBeginCapture_v2(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CHECK_CU(cuMemFreeAsync(p, stream));
  CHECK_CU(cuStreamEndCapture(stream, &release));
  EXPECT_USED(start + 48 * MiB, "its free captured");
  expect_no_room("a free captured, not yet run");
  CHECK_CU(cuGraphInstantiateWithFlags(&release_exec, release, 0));
  CHECK_CU(cuCtxSynchronize());
  EXPECT_USED(start + 48 * MiB, "its free instantiated, not launched");
  expect_no_room("a free instantiated, not yet launched");
  CHECK_CU(cuGraphLaunch(release_exec, stream));
  CHECK_CU(cuStreamSynchronize(stream));
  EXPECT_USED(start, "the graph holding the free has run");
  expect_room("after the graph ran");
  CHECK_CU(cuGraphExecDestroy(release_exec));
  CHECK_CU(cuGraphExecDestroy(make_exec));
  CHECK_CU(cuGraphDestroy(release));
  CHECK_CU(cuGraphDestroy(make));
}

static void exact(void) {
  const uint64_t start = used();
  vmm();
  pool();
  capture();
  /* Interleaved: a pool allocation live across a mapping and a captured free, a pool
   * destroyed with an allocation outstanding, a captured free that never runs. */
  CUmemPoolProps props;
  memset(&props, 0, sizeof props);
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = device;
  CUmemoryPool pool = NULL;
  CHECK_CU(cuMemPoolCreate(&pool, &props));
  CUdeviceptr a = 0, b = 0, g = 0;
  CHECK_CU(cuMemAllocFromPoolAsync(&a, 8 * MiB, pool, stream));
  CHECK_CU(cuMemAllocFromPoolAsync(&b, 4 * MiB, pool, stream));
  CHECK_CU(cuMemFreeAsync(b, stream));
  CHECK_CU(cuMemPoolDestroy(pool)); /* its cache goes now, `a` at its free */
  EXPECT_USED(start + 8 * MiB, "a destroyed pool's live allocation");
  CHECK_CU(cuStreamBeginCapture_v2(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CHECK_CU(cuMemAllocAsync(&g, 2 * MiB, stream));
  CHECK_CU(cuMemFreeAsync(g, stream));
  CUgraph never = NULL;
  CHECK_CU(cuStreamEndCapture(stream, &never));
  CUgraphExec never_exec = NULL;
  CHECK_CU(cuGraphInstantiateWithFlags(&never_exec, never, 0));
  CHECK_CU(cuGraphExecDestroy(never_exec)); /* never launched: its free never ran */
  CHECK_CU(cuGraphDestroy(never));
  EXPECT_USED(start + 10 * MiB, "a graph allocation whose free never ran");
  CHECK_CU(cuMemFreeAsync(a, stream));
  CHECK_CU(cuMemFree_v2(g));
  CHECK_CU(cuStreamSynchronize(stream));
  EXPECT_USED(start, "everything really freed");
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s vmm|pool|capture|exact\n", argv[0]);
    return 2;
  }
  ledger = probe_ledger();
  CHECK_CU(cuInit(0));
  make_context();
  const char* mode = argv[1];
  if (!strcmp(mode, "vmm"))
    vmm();
  else if (!strcmp(mode, "pool"))
    pool();
  else if (!strcmp(mode, "capture"))
    capture();
  else if (!strcmp(mode, "exact"))
    exact();
  else {
    fprintf(stderr, "unknown mode %s\n", mode);
    return 2;
  }
  return probe_result();
}
