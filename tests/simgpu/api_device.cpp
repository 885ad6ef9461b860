// Driver entry points for initialisation and device queries: version, enumeration,
// names, UUIDs, memory sizes and attributes of an H100-like device.
#include <strings.h>

#include <cstdio>
#include <cstring>

#include "tests/simgpu/runtime.h"

using namespace quanta::simgpu;

namespace {

CUresult check_device(CUdevice dev) {
  SIMGPU_REQUIRE_INIT();
  if (dev < 0 || dev >= runtime().device_count) return CUDA_ERROR_INVALID_DEVICE;
  return CUDA_SUCCESS;
}

int attribute_value(CUdevice_attribute attrib, const DeviceState& d, bool& known) {
  known = true;
  switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
      return 9;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
      return 0;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
      return d.mig_instance >= 0 ? 16 : 132;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
      return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X:
      return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y:
      return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z:
      return 64;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X:
      return 2147483647;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y:
      return 65535;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z:
      return 65535;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK:
      return 49152;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN:
      return 232448;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR:
      return 233472;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY:
      return 65536;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE:
      return 32;
    case CU_DEVICE_ATTRIBUTE_MAX_PITCH:
      return 2147483647;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK:
      return 65536;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR:
      return 65536;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE:
      return 1980000;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE:
      return 2619000;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH:
      return 5120;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE:
      return 52428800;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR:
      return 2048;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR:
      return 32;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT:
      return 512;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT:
      return 32;
    case CU_DEVICE_ATTRIBUTE_GPU_OVERLAP:
      return 1;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT:
      return 3;
    case CU_DEVICE_ATTRIBUTE_KERNEL_EXEC_TIMEOUT:
      return 0;
    case CU_DEVICE_ATTRIBUTE_INTEGRATED:
      return 0;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY:
      return 1;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_MODE:
      return CU_COMPUTEMODE_DEFAULT;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS:
      return 1;
    case CU_DEVICE_ATTRIBUTE_ECC_ENABLED:
      return 1;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID:
      return 0x10 + d.physical_index;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID:
      return 0;
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID:
      return 0;
    case CU_DEVICE_ATTRIBUTE_TCC_DRIVER:
      return 0;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
      return 1;
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY:
      return 1;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS:
      return 1;
    case CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS:
      return 0;
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH:
      return 1;
    case CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED:
      return 1;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED:
      return 1;
    case CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED:
      return 1;
    case CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD:
      return 0;
    case CU_DEVICE_ATTRIBUTE_HOST_NATIVE_ATOMIC_SUPPORTED:
      return 0;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
      return 1;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
      return 1;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED:
      return 1;
    case CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES:
      return CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    case CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED:
      return 0;
    case CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE:
      return 32505856;
    case CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE:
      return 134213632;
    case CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK:
      return 1024;
    case CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH:
      return 1;
    case CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED:
      return 0;
    case CU_DEVICE_ATTRIBUTE_MPS_ENABLED:
      return 0;
    default:
      known = false;
      return 0;
  }
}

}  // namespace

extern "C" {

CUresult cuInit(unsigned int Flags) {
  return initialize(Flags);
}

CUresult cuDriverGetVersion(int* driverVersion) {
  if (driverVersion == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *driverVersion = 13000;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int* count) {
  SIMGPU_REQUIRE_INIT();
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *count = runtime().device_count;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = check_device(ordinal); r != CUDA_SUCCESS) return r;
  *device = ordinal;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char* name, int len, CUdevice dev) {
  if (CUresult r = check_device(dev); r != CUDA_SUCCESS) return r;
  if (name == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  std::snprintf(name, static_cast<size_t>(len), "%s", device_state(dev).name);
  return CUDA_SUCCESS;
}

// As the driver does: the legacy entry answers a MIG instance with its parent GPU's UUID,
// _v2 with the instance's own (whole GPUs get their own from both).
CUresult cuDeviceGetUuid(CUuuid* uuid, CUdevice dev) {
  if (CUresult r = check_device(dev); r != CUDA_SUCCESS) return r;
  if (uuid == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::memcpy(uuid->bytes, device_state(dev).parent_uuid, 16);
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetUuid_v2(CUuuid* uuid, CUdevice dev) {
  if (CUresult r = check_device(dev); r != CUDA_SUCCESS) return r;
  if (uuid == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::memcpy(uuid->bytes, device_state(dev).uuid, 16);
  return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  if (CUresult r = check_device(dev); r != CUDA_SUCCESS) return r;
  if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *bytes = device_state(dev).capacity;
  return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem(unsigned int* bytes, CUdevice dev) {
  size_t total = 0;
  CUresult r = cuDeviceTotalMem_v2(&total, dev);
  if (r == CUDA_SUCCESS)
    *bytes = total > 0xffffffffULL ? 0xffffffffU : static_cast<unsigned>(total);
  return r;
}

CUresult cuDeviceGetAttribute(int* pi, CUdevice_attribute attrib, CUdevice dev) {
  if (CUresult r = check_device(dev); r != CUDA_SUCCESS) return r;
  if (pi == nullptr) return CUDA_ERROR_INVALID_VALUE;
  bool known = false;
  const int value = attribute_value(attrib, device_state(dev), known);
  if (!known) {
    // Attributes simgpu does not model read as 0 (unsupported), as the driver reports
    // features a device lacks; only out-of-range values are errors.
    if (attrib <= 0 || attrib >= CU_DEVICE_ATTRIBUTE_MAX) return CUDA_ERROR_INVALID_VALUE;
  }
  *pi = value;
  return CUDA_SUCCESS;
}

CUresult cuDeviceComputeCapability(int* major, int* minor, CUdevice dev) {
  if (CUresult r = check_device(dev); r != CUDA_SUCCESS) return r;
  if (major == nullptr || minor == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *major = 9;
  *minor = 0;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetPCIBusId(char* pciBusId, int len, CUdevice dev) {
  if (CUresult r = check_device(dev); r != CUDA_SUCCESS) return r;
  if (pciBusId == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  std::snprintf(pciBusId, static_cast<size_t>(len), "00000000:%02X:00.0",
                0x10 + device_state(dev).physical_index);
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetByPCIBusId(CUdevice* dev, const char* pciBusId) {
  SIMGPU_REQUIRE_INIT();
  if (dev == nullptr || pciBusId == nullptr) return CUDA_ERROR_INVALID_VALUE;
  for (int d = 0; d < runtime().device_count; ++d) {
    char id[32];
    cuDeviceGetPCIBusId(id, sizeof id, d);
    if (strcasecmp(id, pciBusId) == 0) {
      *dev = d;
      return CUDA_SUCCESS;
    }
  }
  return CUDA_ERROR_INVALID_DEVICE;
}

CUresult cuDeviceGetLuid(char*, unsigned int*, CUdevice) {
  return CUDA_ERROR_NOT_SUPPORTED;
}

CUresult cuDeviceGetExecAffinitySupport(int* pi, CUexecAffinityType, CUdevice dev) {
  if (CUresult r = check_device(dev); r != CUDA_SUCCESS) return r;
  if (pi == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pi = 0;
  return CUDA_SUCCESS;
}

CUresult cuGetExportTable(const void** ppExportTable, const CUuuid*) {
  if (ppExportTable != nullptr) *ppExportTable = nullptr;
  return CUDA_ERROR_NOT_SUPPORTED;
}

}  // extern "C"
