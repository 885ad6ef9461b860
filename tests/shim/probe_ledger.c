/* The pod ledger through libquanta_testlink.so (fake arbiter link, fake_ledger.h), one
 * behaviour per mode:
 *   families   every allocation family charges what it allocates and returns it on free
 *   overcap    past the cap: CUDA_ERROR_OUT_OF_MEMORY, nothing charged, the rest unharmed
 *   views      cuMemGetInfo, cuDeviceTotalMem and NVML agree, clamp at zero, real without a cap
 *   untracked  frees of pointers the shim never charged reach the driver, change nothing
 *   devices    usage is charged to the device's UUID, not to ordinal 0
 *   paths      direct calls, dlsym and cuGetProcAddress (old/new version, per-thread flag)
 *              all reach the ledger and the launch gate
 *   disabled   QUANTA_DISABLE=1: no charge, no gate
 *   managed-uncounted  QUANTA_COUNT_MANAGED=0: managed memory is not charged
 *   threads    eight threads allocating and freeing at once leave the ledger exact
 *   refused    while the link refuses CUDA: every device allocation family gets
 *              CUDA_ERROR_OUT_OF_MEMORY, contexts and gated calls CUDA_ERROR_DEVICE_UNAVAILABLE,
 *              nothing reaches the driver or the ledger; all of it works again after */
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <pthread.h>

#include "../../common/nvml_api.h"
#include "tests/shim/probe.h"

#define MiB (1024ull * 1024ull)

static struct fake_ledger* ledger;
static CUdevice device;
static CUuuid device_uuid;

static uint64_t used(void) {
  struct fake_device_account* a = probe_account(ledger, device_uuid.bytes);
  return a ? probe_load(&a->pod_used) : 0;
}

static uint64_t overhead(void) {
  const char* text = getenv("QUANTA_CONTEXT_OVERHEAD");
  return text ? strtoull(text, NULL, 10) : 300 * MiB;
}

static CUcontext make_context(int ordinal) {
  CUcontext ctx = NULL;
  CHECK_CU(cuDeviceGet(&device, ordinal));
  CHECK_CU(cuDeviceGetUuid_v2(&device_uuid, device));
  CHECK_CU(cuCtxCreate_v2(&ctx, 0, device));
  return ctx;
}

#define EXPECT_CHARGE(before, bytes, what)                                                    \
  CHECK(used() - (before) == (uint64_t)(bytes), "%s charged %llu bytes, expected %llu", what, \
        (unsigned long long)(used() - (before)), (unsigned long long)(bytes))
#define EXPECT_RETURNED(before, what)                                          \
  CHECK(used() == (before), "%s left %lld bytes charged after its free", what, \
        (long long)(used() - (before)))

static void families(void) {
  const uint64_t start = used();
  CUcontext ctx = make_context(0);
  EXPECT_CHARGE(start, overhead(), "cuCtxCreate_v2");
  uint64_t base = used();

  CUdeviceptr p = 0;
  CHECK_CU(cuMemAlloc_v2(&p, 3 * MiB));
  EXPECT_CHARGE(base, 3 * MiB, "cuMemAlloc_v2");
  CHECK_CU(cuMemFree_v2(p));
  EXPECT_RETURNED(base, "cuMemAlloc_v2");

  size_t pitch = 0;
  CHECK_CU(cuMemAllocPitch_v2(&p, &pitch, 1000, 10, 4));
  CHECK(pitch >= 1000, "pitch %zu", pitch);
  EXPECT_CHARGE(base, pitch * 10, "cuMemAllocPitch_v2");
  CHECK_CU(cuMemFree_v2(p));
  EXPECT_RETURNED(base, "cuMemAllocPitch_v2");

  CHECK_CU(cuMemAllocManaged(&p, 2 * MiB, CU_MEM_ATTACH_GLOBAL));
  EXPECT_CHARGE(base, 2 * MiB, "cuMemAllocManaged");
  CHECK_CU(cuMemFree_v2(p));
  EXPECT_RETURNED(base, "cuMemAllocManaged");

  CUstream stream = NULL;
  CHECK_CU(cuStreamCreate(&stream, 0));
  CHECK_CU(cuMemAllocAsync(&p, 5 * MiB, stream));
  EXPECT_CHARGE(base, 5 * MiB, "cuMemAllocAsync");
  CHECK_CU(cuMemFreeAsync(p, stream));
  /* The default pool (release threshold 0) gives it back at the next synchronisation. */
  CHECK_CU(cuStreamSynchronize(stream));
  EXPECT_RETURNED(base, "cuMemAllocAsync");
  CHECK_CU(cuMemAllocAsync_ptsz(&p, 5 * MiB, CU_STREAM_PER_THREAD));
  EXPECT_CHARGE(base, 5 * MiB, "cuMemAllocAsync_ptsz");
  CHECK_CU(cuMemFreeAsync_ptsz(p, CU_STREAM_PER_THREAD));
  CHECK_CU(cuStreamSynchronize_ptsz(CU_STREAM_PER_THREAD));
  EXPECT_RETURNED(base, "cuMemAllocAsync_ptsz");

  CUmemPoolProps props;
  memset(&props, 0, sizeof props);
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = device;
  CUmemoryPool pool = NULL;
  CHECK_CU(cuMemPoolCreate(&pool, &props));
  CHECK_CU(cuMemAllocFromPoolAsync(&p, 4 * MiB, pool, stream));
  EXPECT_CHARGE(base, 4 * MiB, "cuMemAllocFromPoolAsync");
  CHECK_CU(cuMemFreeAsync(p, stream));
  CHECK_CU(cuStreamSynchronize(stream));
  EXPECT_RETURNED(base, "cuMemAllocFromPoolAsync");
  CHECK_CU(cuMemAllocFromPoolAsync_ptsz(&p, 4 * MiB, pool, stream));
  EXPECT_CHARGE(base, 4 * MiB, "cuMemAllocFromPoolAsync_ptsz");
  CHECK_CU(cuMemFreeAsync_ptsz(p, stream));
  CHECK_CU(cuCtxSynchronize());
  EXPECT_RETURNED(base, "cuMemAllocFromPoolAsync_ptsz");
  CHECK_CU(cuMemPoolDestroy(pool));
  /* A pool placed in host memory holds no device memory: not counted. */
  props.location.type = CU_MEM_LOCATION_TYPE_HOST;
  props.location.id = 0;
  if (cuMemPoolCreate(&pool, &props) == CUDA_SUCCESS) {
    CHECK_CU(cuMemAllocFromPoolAsync(&p, 4 * MiB, pool, stream));
    EXPECT_CHARGE(base, 0, "cuMemAllocFromPoolAsync on a host pool");
    CHECK_CU(cuMemFreeAsync(p, stream));
    EXPECT_RETURNED(base, "cuMemAllocFromPoolAsync on a host pool");
    CHECK_CU(cuMemPoolDestroy(pool));
  }
  CHECK_CU(cuStreamSynchronize(stream));

  CUmemAllocationProp prop;
  memset(&prop, 0, sizeof prop);
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  CUmemGenericAllocationHandle handle = 0;
  CHECK_CU(cuMemCreate(&handle, 4 * MiB, &prop, 0));
  EXPECT_CHARGE(base, 4 * MiB, "cuMemCreate on the device");
  CHECK_CU(cuMemRelease(handle));
  EXPECT_RETURNED(base, "cuMemCreate on the device");
  /* Host and host-NUMA locations are not device memory: passed through uncounted (the
   * driver's answer, whatever it is, comes back unchanged). */
  prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
  prop.location.id = 0;
  CUresult host_result = cuMemCreate(&handle, 4 * MiB, &prop, 0);
  EXPECT_CHARGE(base, 0, "cuMemCreate on host NUMA memory");
  if (host_result == CUDA_SUCCESS) cuMemRelease(handle);

  CUarray array = NULL;
  CUDA_ARRAY_DESCRIPTOR desc2 = {256, 256, CU_AD_FORMAT_FLOAT, 4};
  CHECK_CU(cuArrayCreate_v2(&array, &desc2));
  EXPECT_CHARGE(base, 256 * 256 * 16, "cuArrayCreate_v2");
  CHECK_CU(cuArrayDestroy(array));
  EXPECT_RETURNED(base, "cuArrayCreate_v2");
  CUDA_ARRAY3D_DESCRIPTOR desc3;
  memset(&desc3, 0, sizeof desc3);
  desc3.Width = 64;
  desc3.Height = 64;
  desc3.Depth = 64;
  desc3.Format = CU_AD_FORMAT_UNSIGNED_INT8;
  desc3.NumChannels = 1;
  CHECK_CU(cuArray3DCreate_v2(&array, &desc3));
  EXPECT_CHARGE(base, 64 * 64 * 64, "cuArray3DCreate_v2");
  CHECK_CU(cuArrayDestroy(array));
  EXPECT_RETURNED(base, "cuArray3DCreate_v2");

  CUmipmappedArray mipmapped = NULL;
  memset(&desc3, 0, sizeof desc3);
  desc3.Width = 256;
  desc3.Height = 256;
  desc3.Format = CU_AD_FORMAT_FLOAT;
  desc3.NumChannels = 1;
  CHECK_CU(cuMipmappedArrayCreate(&mipmapped, &desc3, 3));
  EXPECT_CHARGE(base, (256 * 256 + 128 * 128 + 64 * 64) * 4, "cuMipmappedArrayCreate (3 levels)");
  CHECK_CU(cuMipmappedArrayDestroy(mipmapped));
  EXPECT_RETURNED(base, "cuMipmappedArrayCreate");

  /* Graph memory nodes: charged when the graph is instantiated, returned with the exec. */
  CUgraph graph = NULL;
  CHECK_CU(cuGraphCreate(&graph, 0));
  CUDA_MEM_ALLOC_NODE_PARAMS alloc_params;
  memset(&alloc_params, 0, sizeof alloc_params);
  alloc_params.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  alloc_params.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  alloc_params.poolProps.location.id = device;
  alloc_params.bytesize = 8 * MiB;
  CUgraphNode node = NULL;
  CHECK_CU(cuGraphAddMemAllocNode(&node, graph, NULL, 0, &alloc_params));
  EXPECT_CHARGE(base, 0, "cuGraphAddMemAllocNode before instantiation");
  CUgraphExec exec = NULL;
  CHECK_CU(cuGraphInstantiateWithFlags(&exec, graph, 0));
  EXPECT_CHARGE(base, 8 * MiB, "an instantiated graph with an 8 MiB memory node");
  CHECK_CU(cuGraphExecDestroy(exec));
  EXPECT_RETURNED(base, "cuGraphExecDestroy");
  CHECK_CU(cuGraphDestroy(graph));

  /* The primary context: charged at the first retain, returned at the last release. */
  CUcontext primary = NULL, again = NULL;
  CHECK_CU(cuDevicePrimaryCtxRetain(&primary, device));
  EXPECT_CHARGE(base, overhead(), "cuDevicePrimaryCtxRetain");
  CHECK_CU(cuDevicePrimaryCtxRetain(&again, device));
  EXPECT_CHARGE(base, overhead(), "a second cuDevicePrimaryCtxRetain");
  CHECK_CU(cuDevicePrimaryCtxRelease_v2(device));
  CHECK_CU(cuDevicePrimaryCtxRelease_v2(device));
  EXPECT_RETURNED(base, "cuDevicePrimaryCtxRelease_v2");

  /* Destroying a context returns everything still allocated in it, and its overhead. */
  CHECK_CU(cuCtxSetCurrent(ctx));
  CHECK_CU(cuMemAlloc_v2(&p, 6 * MiB));
  CHECK_CU(cuArrayCreate_v2(&array, &desc2));
  CHECK_CU(cuCtxDestroy_v2(ctx));
  EXPECT_RETURNED(start, "cuCtxDestroy_v2 with live allocations");
  CHECK(probe_load(&ledger->forgotten_contexts) >= 1, "the link was not told the context is gone");
}

static void overcap(void) {
  /* QUANTA_FAKE_CAP=64Mi, QUANTA_CONTEXT_OVERHEAD=0 */
  CUcontext ctx = make_context(0);
  (void)ctx;
  CUdeviceptr a = 0, b = 0, c = 0, d = 0;
  CHECK_CU(cuMemAlloc_v2(&a, 48 * MiB));
  const uint64_t at48 = used();
  CUresult r = cuMemAlloc_v2(&b, 32 * MiB);
  CHECK(r == CUDA_ERROR_OUT_OF_MEMORY, "48 + 32 MiB under a 64 MiB cap returned %d", (int)r);
  CHECK(used() == at48, "a refused allocation changed the ledger");
  CHECK_CU(cuMemAlloc_v2(&c, 16 * MiB)); /* exactly at the cap */
  CHECK(used() == 64 * MiB, "used %llu at the cap", (unsigned long long)used());
  r = cuMemAlloc_v2(&d, 1);
  CHECK(r == CUDA_ERROR_OUT_OF_MEMORY, "one byte past the cap returned %d", (int)r);
  CUarray array = NULL;
  CUDA_ARRAY_DESCRIPTOR desc = {64, 64, CU_AD_FORMAT_UNSIGNED_INT8, 1};
  r = cuArrayCreate_v2(&array, &desc);
  CHECK(r == CUDA_ERROR_OUT_OF_MEMORY, "an array past the cap returned %d", (int)r);
  r = cuMemAllocAsync(&d, 1 * MiB, NULL);
  CHECK(r == CUDA_ERROR_OUT_OF_MEMORY, "an async allocation past the cap returned %d", (int)r);
  /* Everything else keeps working at the cap. */
  size_t free_bytes = 1, total = 0;
  CHECK_CU(cuMemGetInfo_v2(&free_bytes, &total));
  CHECK(free_bytes == 0 && total == 64 * MiB, "at the cap cuMemGetInfo says free %zu total %zu",
        free_bytes, total);
  CUmodule module = NULL;
  CUfunction spin = NULL;
  CHECK_CU(cuModuleLoadData(&module, "quanta"));
  CHECK_CU(cuModuleGetFunction(&spin, module, "quanta_spin"));
  unsigned long long ns = 1000;
  void* params[] = {&ns};
  CHECK_CU(cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
  CHECK_CU(cuCtxSynchronize());
  CHECK_CU(cuMemFree_v2(a));
  CHECK_CU(cuMemFree_v2(c));
  CHECK(used() == 0, "%llu bytes left after freeing everything", (unsigned long long)used());
  CHECK_CU(cuMemAlloc_v2(&b, 32 * MiB)); /* room again */
  CHECK_CU(cuMemFree_v2(b));
}

static void views(void) {
  /* QUANTA_FAKE_CAP=256Mi, QUANTA_CONTEXT_OVERHEAD=16777216, SIMGPU_MEMORY=2Gi */
  make_context(0);
  struct fake_device_account* account = probe_account(ledger, device_uuid.bytes);
  CHECK(account != NULL, "no account was made for the device");
  if (!account) return;
  CUdeviceptr p = 0;
  CHECK_CU(cuMemAlloc_v2(&p, 100 * MiB));
  const uint64_t charged = used();
  size_t free_bytes = 0, total = 0;
  CHECK_CU(cuMemGetInfo_v2(&free_bytes, &total));
  CHECK(total == 256 * MiB, "total %zu, expected the cap", total);
  CHECK(free_bytes == 256 * MiB - charged, "free %zu, expected cap - used = %llu", free_bytes,
        (unsigned long long)(256 * MiB - charged));
  unsigned int free32 = 0, total32 = 0;
  CHECK_CU(cuMemGetInfo(&free32, &total32));
  CHECK(free32 == free_bytes && total32 == total, "legacy cuMemGetInfo says %u/%u", free32,
        total32);
  size_t device_total = 0;
  CHECK_CU(cuDeviceTotalMem_v2(&device_total, device));
  CHECK(device_total == 256 * MiB, "cuDeviceTotalMem_v2 %zu", device_total);

  /* NVML reports the same numbers for the same physical device. */
  nvmlDevice_t nvml_device;
  CHECK(nvmlInit_v2() == NVML_SUCCESS, "nvmlInit_v2");
  CHECK(nvmlDeviceGetHandleByIndex_v2(0, &nvml_device) == NVML_SUCCESS, "nvml handle");
  nvmlMemory_t memory;
  CHECK(nvmlDeviceGetMemoryInfo(nvml_device, &memory) == NVML_SUCCESS, "nvmlDeviceGetMemoryInfo");
  CHECK(memory.total == total && memory.free == free_bytes && memory.used == charged,
        "NVML says total %llu free %llu used %llu; CUDA says total %zu free %zu, ledger %llu",
        memory.total, memory.free, memory.used, total, free_bytes, (unsigned long long)charged);
  nvmlMemory_v2_t memory2;
  memset(&memory2, 0, sizeof memory2);
  memory2.version = nvmlMemory_v2;
  CHECK(nvmlDeviceGetMemoryInfo_v2(nvml_device, &memory2) == NVML_SUCCESS,
        "nvmlDeviceGetMemoryInfo_v2");
  CHECK(memory2.total == total && memory2.free == free_bytes && memory2.used == charged &&
            memory2.reserved == 0,
        "NVML v2 says total %llu free %llu used %llu", memory2.total, memory2.free, memory2.used);

  /* Usage above the cap (the arbiter lowered it): free is 0, never an error or underflow. */
  probe_store(&account->cap, charged / 2);
  CHECK_CU(cuMemGetInfo_v2(&free_bytes, &total));
  CHECK(free_bytes == 0 && total == charged / 2,
        "over the cap cuMemGetInfo says free %zu total %zu", free_bytes, total);
  CHECK(nvmlDeviceGetMemoryInfo(nvml_device, &memory) == NVML_SUCCESS && memory.free == 0 &&
            memory.used == charged && memory.total == charged / 2,
        "over the cap NVML says total %llu free %llu used %llu", memory.total, memory.free,
        memory.used);

  /* No cap: the real device's values. */
  probe_store(&account->cap, 0);
  CHECK_CU(cuMemGetInfo_v2(&free_bytes, &total));
  CHECK(total == 2048 * MiB && free_bytes <= total,
        "without a cap total %zu (expected the device's 2 GiB)", total);
  CHECK_CU(cuDeviceTotalMem_v2(&device_total, device));
  CHECK(device_total == 2048 * MiB, "without a cap cuDeviceTotalMem_v2 %zu", device_total);
  CHECK(nvmlDeviceGetMemoryInfo(nvml_device, &memory) == NVML_SUCCESS && memory.total == 2048 * MiB,
        "without a cap NVML total %llu", memory.total);
  CHECK_CU(cuMemFree_v2(p));
}

static void untracked(void) {
  /* No cap: the views are the device's own, so the driver's memory can be watched. */
  make_context(0);
  size_t free_before = 0, free_after = 0, total = 0;
  __atomic_store_n(&ledger->placed, 0u, __ATOMIC_RELEASE); /* allocate while unplaced: untracked */
  CHECK_CU(cuMemGetInfo_v2(&free_before, &total));
  CUdeviceptr p = 0;
  CHECK_CU(cuMemAlloc_v2(&p, 64 * MiB));
  __atomic_store_n(&ledger->placed, 1u, __ATOMIC_RELEASE);
  const uint64_t before = used();
  CHECK_CU(cuMemFree_v2(p)); /* reaches the driver */
  CHECK_CU(cuMemGetInfo_v2(&free_after, &total));
  CHECK(free_after == free_before, "the driver did not get the memory back (%zu vs %zu)",
        free_after, free_before);
  CHECK(used() == before, "an untracked free changed the ledger by %lld",
        (long long)(used() - before));
  CUresult r = cuMemFree_v2((CUdeviceptr)0xdead0000ull);
  CHECK(r != CUDA_SUCCESS, "a bogus free was swallowed instead of reaching the driver");
  r = cuMemFreeAsync((CUdeviceptr)0xdead0000ull, NULL);
  CHECK(r != CUDA_SUCCESS, "a bogus async free was swallowed");
  r = cuArrayDestroy((CUarray)0x1234);
  CHECK(r != CUDA_SUCCESS, "a bogus array destroy was swallowed");
  CHECK(used() == before, "bogus frees changed the ledger");
}

static void devices(void) {
  /* SIMGPU_DEVICES=2: usage on device 1 goes to device 1's UUID. */
  CUdevice first = 0;
  CUuuid first_uuid;
  CHECK_CU(cuInit(0));
  CHECK_CU(cuDeviceGet(&first, 0));
  CHECK_CU(cuDeviceGetUuid_v2(&first_uuid, first));
  make_context(1);
  CUdeviceptr p = 0;
  CHECK_CU(cuMemAlloc_v2(&p, 7 * MiB));
  CHECK(used() == overhead() + 7 * MiB, "device 1's account holds %llu",
        (unsigned long long)used());
  struct fake_device_account* other = probe_account(ledger, first_uuid.bytes);
  CHECK(!other || probe_load(&other->pod_used) == 0,
        "device 0 was charged %llu for device 1's memory",
        other ? (unsigned long long)probe_load(&other->pod_used) : 0ull);
  CHECK_CU(cuMemFree_v2(p));
}

typedef CUresult (*AllocV2)(CUdeviceptr*, size_t);
typedef CUresult (*AllocV1)(CUdeviceptr_v1*, unsigned int);
typedef CUresult (*FreeV2)(CUdeviceptr);
typedef CUresult (*FreeV1)(CUdeviceptr_v1);
typedef CUresult (*Launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                           unsigned, CUstream, void**, void**);

static void expect_gated(uint64_t* enters_before, const char* what) {
  const uint64_t enters = probe_load(&ledger->gate_enters),
                 leaves = probe_load(&ledger->gate_leaves);
  CHECK(enters == *enters_before + 1, "%s entered the gate %lld times", what,
        (long long)(enters - *enters_before));
  CHECK(leaves == enters, "%s: %llu enters, %llu leaves", what, (unsigned long long)enters,
        (unsigned long long)leaves);
  *enters_before = enters;
}

static void paths(void) {
  make_context(0);
  const uint64_t base = used();
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  CHECK(driver != NULL, "libcuda.so.1 not loaded");
  AllocV2 alloc_v2 = NULL;
  AllocV1 alloc_v1 = NULL;
  FreeV2 free_v2 = NULL;
  FreeV1 free_v1 = NULL;
  CUdeviceptr p = 0;
  CUdeviceptr_v1 p32 = 0;

  alloc_v2 = (AllocV2)dlsym(driver, "cuMemAlloc_v2");
  free_v2 = (FreeV2)dlsym(driver, "cuMemFree_v2");
  CHECK_CU(alloc_v2(&p, 2 * MiB));
  EXPECT_CHARGE(base, 2 * MiB, "cuMemAlloc_v2 found with dlsym");
  CHECK_CU(free_v2(p));
  EXPECT_RETURNED(base, "cuMemFree_v2 found with dlsym");

  CHECK_CU(cuGetProcAddress_v2("cuMemAlloc", (void**)&alloc_v2, 12000, CU_GET_PROC_ADDRESS_DEFAULT,
                               NULL));
  CHECK_CU(
      cuGetProcAddress_v2("cuMemFree", (void**)&free_v2, 12000, CU_GET_PROC_ADDRESS_DEFAULT, NULL));
  CHECK_CU(alloc_v2(&p, 3 * MiB));
  EXPECT_CHARGE(base, 3 * MiB, "cuMemAlloc from cuGetProcAddress at 12000");
  CHECK_CU(free_v2(p));
  EXPECT_RETURNED(base, "cuMemFree from cuGetProcAddress at 12000");

  CHECK_CU(cuGetProcAddress("cuMemAlloc", (void**)&alloc_v1, 2000, CU_GET_PROC_ADDRESS_DEFAULT));
  CHECK_CU(cuGetProcAddress("cuMemFree", (void**)&free_v1, 2000, CU_GET_PROC_ADDRESS_DEFAULT));
  CUresult r = alloc_v1(&p32, 1 * MiB);
  if (r == CUDA_SUCCESS) { /* a 32-bit address is not always available */
    EXPECT_CHARGE(base, 1 * MiB, "legacy cuMemAlloc from cuGetProcAddress at 2000");
    CHECK_CU(free_v1(p32));
    EXPECT_RETURNED(base, "legacy cuMemFree from cuGetProcAddress at 2000");
  } else {
    CHECK(used() == base, "a failed legacy cuMemAlloc stayed charged");
  }

  CUmodule module = NULL;
  CUfunction spin = NULL;
  CHECK_CU(cuModuleLoadData(&module, "quanta"));
  CHECK_CU(cuModuleGetFunction(&spin, module, "quanta_spin"));
  unsigned long long ns = 1000;
  void* params[] = {&ns};
  uint64_t enters = probe_load(&ledger->gate_enters);
  CHECK_CU(cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
  expect_gated(&enters, "cuLaunchKernel (direct)");
  Launch launch = (Launch)dlsym(driver, "cuLaunchKernel");
  CHECK_CU(launch(spin, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
  expect_gated(&enters, "cuLaunchKernel (dlsym)");
  CHECK_CU(cuGetProcAddress_v2("cuLaunchKernel", (void**)&launch, 12000,
                               CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, NULL));
  CHECK(!strcmp(probe_symbol_of((void*)launch), "cuLaunchKernel_ptsz"), "per-thread lookup gave %s",
        probe_symbol_of((void*)launch));
  CHECK_CU(launch(spin, 1, 1, 1, 1, 1, 1, 0, CU_STREAM_PER_THREAD, params, NULL));
  expect_gated(&enters, "cuLaunchKernel_ptsz (cuGetProcAddress, per-thread flag)");
  CHECK_CU(cuLaunchKernel_ptsz(spin, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
  expect_gated(&enters, "cuLaunchKernel_ptsz (direct)");

  CUlaunchConfig config;
  memset(&config, 0, sizeof config);
  config.gridDimX = config.gridDimY = config.gridDimZ = 1;
  config.blockDimX = config.blockDimY = config.blockDimZ = 1;
  CHECK_CU(cuLaunchKernelEx(&config, spin, params, NULL));
  expect_gated(&enters, "cuLaunchKernelEx");
  CHECK_CU(cuLaunchCooperativeKernel(spin, 1, 1, 1, 1, 1, 1, 0, NULL, params));
  expect_gated(&enters, "cuLaunchCooperativeKernel");

  CUgraph graph = NULL;
  CUgraphExec exec = NULL;
  CUgraphNode node = NULL;
  CUDA_KERNEL_NODE_PARAMS kernel;
  memset(&kernel, 0, sizeof kernel);
  kernel.func = spin;
  kernel.gridDimX = kernel.gridDimY = kernel.gridDimZ = 1;
  kernel.blockDimX = kernel.blockDimY = kernel.blockDimZ = 1;
  kernel.kernelParams = params;
  CHECK_CU(cuGraphCreate(&graph, 0));
  CHECK_CU(cuGraphAddKernelNode_v2(&node, graph, NULL, 0, &kernel));
  CHECK_CU(cuGraphInstantiateWithFlags(&exec, graph, 0));
  CHECK_CU(cuGraphLaunch(exec, NULL));
  expect_gated(&enters, "cuGraphLaunch");
  CHECK_CU(cuGraphLaunch_ptsz(exec, NULL));
  expect_gated(&enters, "cuGraphLaunch_ptsz");

  CHECK_CU(cuMemAlloc_v2(&p, 1 * MiB));
  CHECK_CU(cuMemsetD8_v2(p, 0, 1 * MiB));
  expect_gated(&enters, "cuMemsetD8_v2");
  CHECK_CU(cuMemsetD32Async(p, 0, 1024, NULL));
  expect_gated(&enters, "cuMemsetD32Async");
  CHECK_CU(cuCtxSynchronize());
  CHECK_CU(cuMemFree_v2(p));
  struct fake_device_account* account = probe_account(ledger, device_uuid.bytes);
  CHECK(account && probe_load(&account->gate_enters) == probe_load(&ledger->gate_enters),
        "gate calls were not all made on the device's own context");
}

/* Eight threads of one process allocate and free through the shim at once. */
static CUcontext shared_context;
static void* thread_allocations(void* arg) {
  uintptr_t id = (uintptr_t)arg;
  int failures = 0;
  if (cuCtxSetCurrent(shared_context) != CUDA_SUCCESS) return (void*)1;
  for (int i = 0; i < 500; ++i) {
    CUdeviceptr p[4] = {0};
    for (int k = 0; k < 4; ++k)
      if (cuMemAlloc_v2(&p[k], (1 + (id + (uintptr_t)k) % 3) * 4096) != CUDA_SUCCESS) ++failures;
    for (int k = 0; k < 4; ++k)
      if (p[k] && cuMemFree_v2(p[k]) != CUDA_SUCCESS) ++failures;
  }
  return (void*)(uintptr_t)failures;
}

static void threads(void) {
  shared_context = make_context(0);
  const uint64_t base = used();
  pthread_t workers[8];
  for (uintptr_t t = 0; t < 8; ++t) pthread_create(&workers[t], NULL, thread_allocations, (void*)t);
  for (int t = 0; t < 8; ++t) {
    void* failures = NULL;
    pthread_join(workers[t], &failures);
    CHECK(failures == NULL, "thread %d saw %d failed calls", t, (int)(uintptr_t)failures);
  }
  EXPECT_RETURNED(base, "16000 allocations from 8 threads");
}

static void managed_uncounted(void) {
  /* QUANTA_COUNT_MANAGED=0: managed memory passes uncounted, device memory still counts. */
  make_context(0);
  const uint64_t base = used();
  CUdeviceptr managed = 0, device_memory = 0;
  CHECK_CU(cuMemAllocManaged(&managed, 8 * MiB, CU_MEM_ATTACH_GLOBAL));
  EXPECT_CHARGE(base, 0, "cuMemAllocManaged with QUANTA_COUNT_MANAGED=0");
  CHECK_CU(cuMemAlloc_v2(&device_memory, 2 * MiB));
  EXPECT_CHARGE(base, 2 * MiB, "cuMemAlloc_v2 with QUANTA_COUNT_MANAGED=0");
  CHECK_CU(cuMemFree_v2(managed));
  CHECK_CU(cuMemFree_v2(device_memory));
  EXPECT_RETURNED(base, "both frees");
}

static void disabled(void) {
  make_context(0);
  CUdeviceptr p = 0;
  CHECK_CU(cuMemAlloc_v2(&p, 5 * MiB));
  CHECK(used() == 0, "QUANTA_DISABLE=1 still charged %llu", (unsigned long long)used());
  CUmodule module = NULL;
  CUfunction spin = NULL;
  CHECK_CU(cuModuleLoadData(&module, "quanta"));
  CHECK_CU(cuModuleGetFunction(&spin, module, "quanta_spin"));
  unsigned long long ns = 1000;
  void* params[] = {&ns};
  CHECK_CU(cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
  CHECK(probe_load(&ledger->gate_enters) == 0, "QUANTA_DISABLE=1 still gated launches");
  CHECK_CU(cuMemFree_v2(p));
}

static void set_refused(int on) {
  __atomic_store_n(&ledger->refuse_cuda, on ? 1u : 0u, __ATOMIC_RELEASE);
}

static void refused(void) {
  CUcontext ctx = make_context(0);
  CUstream stream = NULL;
  CHECK_CU(cuStreamCreate(&stream, 0));
  CUmodule module = NULL;
  CUfunction spin = NULL;
  CHECK_CU(cuModuleLoadData(&module, "quanta"));
  CHECK_CU(cuModuleGetFunction(&spin, module, "quanta_spin"));
  CUdeviceptr kept = 0;
  CHECK_CU(cuMemAlloc_v2(&kept, MiB));
  const uint64_t base = used();
  const uint64_t enters = probe_load(&ledger->gate_enters);
  set_refused(1);
  CUdeviceptr p = 0;
  size_t pitch = 0;
  CHECK(cuMemAlloc_v2(&p, MiB) == CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc_v2 while refused");
  CHECK(cuMemAllocPitch_v2(&p, &pitch, 1024, 64, 4) == CUDA_ERROR_OUT_OF_MEMORY,
        "pitch while refused");
  CHECK(cuMemAllocManaged(&p, MiB, CU_MEM_ATTACH_GLOBAL) == CUDA_ERROR_OUT_OF_MEMORY,
        "managed while refused");
  CHECK(cuMemAllocAsync(&p, MiB, stream) == CUDA_ERROR_OUT_OF_MEMORY, "async while refused");
  CUmemAllocationProp prop = {0};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  CUmemGenericAllocationHandle handle = 0;
  CHECK(cuMemCreate(&handle, 2 * MiB, &prop, 0) == CUDA_ERROR_OUT_OF_MEMORY,
        "cuMemCreate while refused");
  CUDA_ARRAY_DESCRIPTOR desc = {0};
  desc.Width = 64;
  desc.Height = 64;
  desc.Format = CU_AD_FORMAT_FLOAT;
  desc.NumChannels = 1;
  CUarray array = NULL;
  CHECK(cuArrayCreate_v2(&array, &desc) == CUDA_ERROR_OUT_OF_MEMORY, "array while refused");
  CUcontext other = NULL;
  CHECK(cuCtxCreate_v2(&other, 0, device) == CUDA_ERROR_DEVICE_UNAVAILABLE,
        "context while refused");
  CHECK(cuDevicePrimaryCtxRetain(&other, device) == CUDA_ERROR_DEVICE_UNAVAILABLE,
        "primary context while refused");
  unsigned long long ns = 1000;
  void* params[] = {&ns};
  CHECK(cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL) ==
            CUDA_ERROR_DEVICE_UNAVAILABLE,
        "launch while refused");
  CHECK(cuMemsetD8_v2(kept, 0, MiB) == CUDA_ERROR_DEVICE_UNAVAILABLE, "memset while refused");
  CHECK(used() == base, "refused calls charged %lld bytes", (long long)(used() - base));
  CHECK(probe_load(&ledger->gate_enters) == enters, "a refused launch entered the gate");
  set_refused(0);
  CHECK_CU(cuMemAlloc_v2(&p, MiB));
  CHECK_CU(cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
  CHECK_CU(cuCtxSynchronize());
  CHECK_CU(cuMemFree_v2(p));
  CHECK_CU(cuMemFree_v2(kept));
  CHECK(probe_load(&ledger->gate_enters) == probe_load(&ledger->gate_leaves),
        "gate entries and exits do not pair up");
  CHECK_CU(cuStreamDestroy(stream));
  CHECK_CU(cuCtxDestroy_v2(ctx));
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr,
            "usage: %s "
            "families|overcap|views|untracked|devices|paths|disabled|managed-uncounted|threads|"
            "refused\n",
            argv[0]);
    return 2;
  }
  ledger = probe_ledger();
  CHECK_CU(cuInit(0));
  const char* mode = argv[1];
  if (!strcmp(mode, "families"))
    families();
  else if (!strcmp(mode, "overcap"))
    overcap();
  else if (!strcmp(mode, "views"))
    views();
  else if (!strcmp(mode, "untracked"))
    untracked();
  else if (!strcmp(mode, "devices"))
    devices();
  else if (!strcmp(mode, "paths"))
    paths();
  else if (!strcmp(mode, "disabled"))
    disabled();
  else if (!strcmp(mode, "managed-uncounted"))
    managed_uncounted();
  else if (!strcmp(mode, "threads"))
    threads();
  else if (!strcmp(mode, "refused"))
    refused();
  else {
    fprintf(stderr, "unknown mode %s\n", mode);
    return 2;
  }
  return probe_result();
}
