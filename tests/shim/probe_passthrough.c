/* With no arbiter to talk to, the real libquanta.so changes nothing: no cap, real memory
 * views, launches and allocations succeed as without the shim (SIMGPU_MEMORY=1Gi). And
 * creating a context never probes NVML (the field failure of finding the host pid that
 * way): libnvidia-ml is not loaded until the program opens it itself. */
#define __CUDA_API_VERSION_INTERNAL 1 /* declares every exported variant, e.g. cuCtxCreate_v2 */
#include <cuda.h>

#include "../../common/nvml_api.h"
#include "tests/shim/probe.h"

#define MiB (1024ull * 1024ull)

static int mapped(const char* needle) {
  FILE* maps = fopen("/proc/self/maps", "r");
  char line[4096];
  int found = 0;
  while (maps && fgets(line, sizeof line, maps))
    if (strstr(line, needle)) found = 1;
  if (maps) fclose(maps);
  return found;
}

int main(void) {
  CUdevice device;
  CUcontext ctx;
  CHECK_CU(cuInit(0));
  CHECK_CU(cuDeviceGet(&device, 0));
  CHECK_CU(cuCtxCreate_v2(&ctx, 0, device));
  size_t free_bytes = 0, total = 0;
  CHECK_CU(cuMemGetInfo_v2(&free_bytes, &total));
  CHECK(total == 1024 * MiB, "total %zu, expected the device's 1 GiB", total);
  size_t device_total = 0;
  CHECK_CU(cuDeviceTotalMem_v2(&device_total, device));
  CHECK(device_total == 1024 * MiB, "cuDeviceTotalMem_v2 %zu", device_total);
  CHECK(!mapped("libnvidia-ml"), "context creation loaded NVML");
  CUdeviceptr big = 0;
  CHECK_CU(cuMemAlloc_v2(&big, 900 * MiB));
  size_t free_after = 0;
  CHECK_CU(cuMemGetInfo_v2(&free_after, &total));
  CHECK(free_after + 900 * MiB == free_bytes, "free went from %zu to %zu", free_bytes, free_after);
  void* nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
  CHECK(nvml != NULL, "cannot open NVML");
  if (!nvml) return probe_result();
  nvmlReturn_t (*init)(void) = (nvmlReturn_t(*)(void))dlsym(nvml, "nvmlInit_v2");
  nvmlReturn_t (*by_index)(unsigned, nvmlDevice_t*) =
      (nvmlReturn_t(*)(unsigned, nvmlDevice_t*))dlsym(nvml, "nvmlDeviceGetHandleByIndex_v2");
  nvmlReturn_t (*memory_info)(nvmlDevice_t, nvmlMemory_t*) =
      (nvmlReturn_t(*)(nvmlDevice_t, nvmlMemory_t*))dlsym(nvml, "nvmlDeviceGetMemoryInfo");
  CHECK(probe_in_shim((void*)memory_info), "dlsym(NVML) gave %s",
        probe_object_of((void*)memory_info));
  nvmlDevice_t nvml_device;
  nvmlMemory_t memory;
  CHECK(init && by_index && memory_info && init() == NVML_SUCCESS &&
            by_index(0, &nvml_device) == NVML_SUCCESS &&
            memory_info(nvml_device, &memory) == NVML_SUCCESS,
        "NVML memory info failed");
  CHECK(memory.total == 1024 * MiB, "NVML total %llu", memory.total);
  CUmodule module;
  CUfunction spin;
  CHECK_CU(cuModuleLoadData(&module, "quanta"));
  CHECK_CU(cuModuleGetFunction(&spin, module, "quanta_spin"));
  unsigned long long ns = 1000;
  void* params[] = {&ns};
  for (int i = 0; i < 100; ++i)
    CHECK_CU(cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
  CHECK_CU(cuCtxSynchronize());
  CHECK_CU(cuMemFree_v2(big));
  CHECK_CU(cuCtxDestroy_v2(ctx));
  return probe_result();
}
