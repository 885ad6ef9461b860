/* With no arbiter to talk to, the real libquanta.so changes nothing: no cap, real memory
 * views, launches and allocations succeed as without the shim (SIMGPU_MEMORY=1Gi). */
#define __CUDA_API_VERSION_INTERNAL 1 /* declares every exported variant, e.g. cuCtxCreate_v2 */
#include <cuda.h>

#include "../../common/nvml_api.h"
#include "probe.h"

#define MiB (1024ull * 1024ull)

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
  CUdeviceptr big = 0;
  CHECK_CU(cuMemAlloc_v2(&big, 900 * MiB));
  size_t free_after = 0;
  CHECK_CU(cuMemGetInfo_v2(&free_after, &total));
  CHECK(free_after + 900 * MiB == free_bytes, "free went from %zu to %zu", free_bytes, free_after);
  nvmlDevice_t nvml_device;
  nvmlMemory_t memory;
  CHECK(nvmlInit_v2() == NVML_SUCCESS &&
            nvmlDeviceGetHandleByIndex_v2(0, &nvml_device) == NVML_SUCCESS &&
            nvmlDeviceGetMemoryInfo(nvml_device, &memory) == NVML_SUCCESS,
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
