// The tenant's one way into the CUDA driver: a table of function pointers filled by one
// of four lookup paths (direct linking, dlopen+dlsym, cuGetProcAddress with default or
// per-thread-default-stream flags), so every workload exercises the path a real
// application would take and the shim's interception of it.
#pragma once

#include <cuda.h>

#include <string>
#include <string_view>
#include <vector>

namespace quanta::tenant {

enum class Lookup { direct, dlsym, getproc, getproc_ptds };

std::string_view lookup_name(Lookup lookup);

// X(member, exported symbol whose prototype cuda.h declares, name given to cuGetProcAddress).
// Core entries every driver has; the direct path links them strongly.
#define QUANTA_TENANT_DRIVER_CORE_ENTRIES(X)                    \
  X(GetErrorName, cuGetErrorName, "cuGetErrorName")             \
  X(Init, cuInit, "cuInit")                                     \
  X(DriverGetVersion, cuDriverGetVersion, "cuDriverGetVersion") \
  X(DeviceGetCount, cuDeviceGetCount, "cuDeviceGetCount")       \
  X(DeviceGet, cuDeviceGet, "cuDeviceGet")

// Every other entry the workloads use; the direct path links them weakly.
#define QUANTA_TENANT_DRIVER_OPTIONAL_ENTRIES(X)                                                 \
  X(DeviceGetName, cuDeviceGetName, "cuDeviceGetName")                                           \
  X(DeviceGetUuid, cuDeviceGetUuid_v2, "cuDeviceGetUuid")                                        \
  X(DeviceTotalMem, cuDeviceTotalMem_v2, "cuDeviceTotalMem")                                     \
  X(DevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain")                \
  X(DevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2, "cuDevicePrimaryCtxRelease")          \
  X(DevicePrimaryCtxSetFlags, cuDevicePrimaryCtxSetFlags_v2, "cuDevicePrimaryCtxSetFlags")       \
  X(CtxDestroy, cuCtxDestroy_v2, "cuCtxDestroy")                                                 \
  X(CtxSetCurrent, cuCtxSetCurrent, "cuCtxSetCurrent")                                           \
  X(MemGetInfo, cuMemGetInfo_v2, "cuMemGetInfo")                                                 \
  X(ModuleLoadData, cuModuleLoadData, "cuModuleLoadData")                                        \
  X(ModuleGetFunction, cuModuleGetFunction, "cuModuleGetFunction")                               \
  X(ModuleUnload, cuModuleUnload, "cuModuleUnload")                                              \
  X(StreamCreate, cuStreamCreate, "cuStreamCreate")                                              \
  X(StreamDestroy, cuStreamDestroy_v2, "cuStreamDestroy")                                        \
  X(StreamSynchronize, cuStreamSynchronize, "cuStreamSynchronize")                               \
  X(EventCreate, cuEventCreate, "cuEventCreate")                                                 \
  X(EventDestroy, cuEventDestroy_v2, "cuEventDestroy")                                           \
  X(EventRecord, cuEventRecord, "cuEventRecord")                                                 \
  X(EventSynchronize, cuEventSynchronize, "cuEventSynchronize")                                  \
  X(LaunchKernel, cuLaunchKernel, "cuLaunchKernel")                                              \
  X(MemAlloc, cuMemAlloc_v2, "cuMemAlloc")                                                       \
  X(MemFree, cuMemFree_v2, "cuMemFree")                                                          \
  X(MemAllocPitch, cuMemAllocPitch_v2, "cuMemAllocPitch")                                        \
  X(MemAllocManaged, cuMemAllocManaged, "cuMemAllocManaged")                                     \
  X(MemAllocHost, cuMemAllocHost_v2, "cuMemAllocHost")                                           \
  X(MemFreeHost, cuMemFreeHost, "cuMemFreeHost")                                                 \
  X(MemGetAllocationGranularity, cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity") \
  X(MemCreate, cuMemCreate, "cuMemCreate")                                                       \
  X(MemRelease, cuMemRelease, "cuMemRelease")                                                    \
  X(MemAddressReserve, cuMemAddressReserve, "cuMemAddressReserve")                               \
  X(MemAddressFree, cuMemAddressFree, "cuMemAddressFree")                                        \
  X(MemMap, cuMemMap, "cuMemMap")                                                                \
  X(MemUnmap, cuMemUnmap, "cuMemUnmap")                                                          \
  X(MemSetAccess, cuMemSetAccess, "cuMemSetAccess")                                              \
  X(MemAllocAsync, cuMemAllocAsync, "cuMemAllocAsync")                                           \
  X(MemFreeAsync, cuMemFreeAsync, "cuMemFreeAsync")                                              \
  X(MemPoolCreate, cuMemPoolCreate, "cuMemPoolCreate")                                           \
  X(MemPoolDestroy, cuMemPoolDestroy, "cuMemPoolDestroy")                                        \
  X(MemAllocFromPoolAsync, cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync")                   \
  X(ArrayCreate, cuArrayCreate_v2, "cuArrayCreate")                                              \
  X(Array3DCreate, cuArray3DCreate_v2, "cuArray3DCreate")                                        \
  X(ArrayDestroy, cuArrayDestroy, "cuArrayDestroy")                                              \
  X(MipmappedArrayCreate, cuMipmappedArrayCreate, "cuMipmappedArrayCreate")                      \
  X(MipmappedArrayDestroy, cuMipmappedArrayDestroy, "cuMipmappedArrayDestroy")                   \
  X(GraphCreate, cuGraphCreate, "cuGraphCreate")                                                 \
  X(GraphDestroy, cuGraphDestroy, "cuGraphDestroy")                                              \
  X(GraphAddMemAllocNode, cuGraphAddMemAllocNode, "cuGraphAddMemAllocNode")                      \
  X(GraphInstantiate, cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags")                \
  X(GraphLaunch, cuGraphLaunch, "cuGraphLaunch")                                                 \
  X(GraphExecDestroy, cuGraphExecDestroy, "cuGraphExecDestroy")

#define QUANTA_TENANT_DRIVER_ENTRIES(X) \
  QUANTA_TENANT_DRIVER_CORE_ENTRIES(X)  \
  QUANTA_TENANT_DRIVER_OPTIONAL_ENTRIES(X)

// cuCtxCreate changed prototype twice; the driver hands out the one matching the CUDA
// version asked for, so the table keeps all three and uses whichever was found.
using CtxCreateV2 = CUresult (*)(CUcontext*, unsigned int, CUdevice);
using CtxCreateV3 = CUresult (*)(CUcontext*, CUexecAffinityParam*, int, unsigned int, CUdevice);
using CtxCreateV4 = CUresult (*)(CUcontext*, CUctxCreateParams*, unsigned int, CUdevice);

struct Driver {
#define QUANTA_TENANT_DRIVER_MEMBER(member, symbol, name) decltype(&symbol) member = nullptr;
  QUANTA_TENANT_DRIVER_ENTRIES(QUANTA_TENANT_DRIVER_MEMBER)
#undef QUANTA_TENANT_DRIVER_MEMBER
  CtxCreateV2 CtxCreate_v2 = nullptr;
  CtxCreateV3 CtxCreate_v3 = nullptr;
  CtxCreateV4 CtxCreate_v4 = nullptr;

  Lookup lookup = Lookup::direct;
  int cuda_version = 0;              // asked of cuGetProcAddress (getproc paths only)
  std::vector<std::string> missing;  // entries the chosen path could not resolve
};

// Fills the table through the given path. Returns an empty string on success, else a
// one-line reason (library or cuGetProcAddress_v2 not found).
std::string load_driver(Lookup lookup, int cuda_version, Driver& driver);

// "cuLaunchKernel_ptsz@libcuda.so.1": the exported symbol and library a resolved entry
// lands in (an interposer shows up as its own library), or "unresolved".
std::string describe_entry(const void* entry);

// "CUDA_ERROR_OUT_OF_MEMORY" or "CUresult 123" when the driver cannot name it.
std::string error_name(const Driver& driver, CUresult result);

}  // namespace quanta::tenant
