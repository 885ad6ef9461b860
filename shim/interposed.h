// Every symbol libquanta.so overrides, and why: the one list the dlsym and
// cuGetProcAddress overrides consult to hand out a wrapper instead of the real entry.
// Each name is an exact exported variant of the real library, wrapped with exactly its
// cuda.h prototype, so whoever asked for a variant gets that variant's ABI.
//
//  gate     launches: link_gate_enter/leave around the real call (arbiter time slicing).
//           Memsets and device-to-device copies run as kernels, so they are gated too;
//           host<->device copies use copy engines and pass ungated.
//  ledger   allocations and frees: reserved against the pod's cap before the driver
//           call, returned when the driver lets the memory go; contexts charge a fixed
//           overhead. Also what decides when that is: VMM map/unmap, pool trims, the end
//           of a stream capture.
//  sync     stream, event and context synchronisation: where pools give cached memory
//           back and captured frees whose graph has run are refunded.
//  view     memory queries: report the pod's cap and room instead of the whole GPU.
//  lookup   the ways programs find entry points: cuGetProcAddress (cudart >= 11.3,
//           PyTorch) and dlsym on the driver's handle.
// Calls not listed pass through untouched (cuGetExportTable included).
#pragma once

#include <cuda.h>

// clang-format off
#define QUANTA_GATED_LAUNCHES(X)                                                            \
  X(cuLaunchKernel) X(cuLaunchKernel_ptsz) X(cuLaunchKernelEx) X(cuLaunchKernelEx_ptsz)    \
  X(cuLaunchCooperativeKernel) X(cuLaunchCooperativeKernel_ptsz)                            \
  X(cuLaunchCooperativeKernelMultiDevice) X(cuGraphLaunch) X(cuGraphLaunch_ptsz)            \
  X(cuMemsetD8) X(cuMemsetD8_v2) X(cuMemsetD8_v2_ptds)                                      \
  X(cuMemsetD8Async) X(cuMemsetD8Async_ptsz)                                                \
  X(cuMemsetD16) X(cuMemsetD16_v2) X(cuMemsetD16_v2_ptds)                                   \
  X(cuMemsetD16Async) X(cuMemsetD16Async_ptsz)                                              \
  X(cuMemsetD32) X(cuMemsetD32_v2) X(cuMemsetD32_v2_ptds)                                   \
  X(cuMemsetD32Async) X(cuMemsetD32Async_ptsz)                                              \
  X(cuMemsetD2D8) X(cuMemsetD2D8_v2) X(cuMemsetD2D8_v2_ptds)                                \
  X(cuMemsetD2D8Async) X(cuMemsetD2D8Async_ptsz)                                            \
  X(cuMemsetD2D16) X(cuMemsetD2D16_v2) X(cuMemsetD2D16_v2_ptds)                             \
  X(cuMemsetD2D16Async) X(cuMemsetD2D16Async_ptsz)                                          \
  X(cuMemsetD2D32) X(cuMemsetD2D32_v2) X(cuMemsetD2D32_v2_ptds)                             \
  X(cuMemsetD2D32Async) X(cuMemsetD2D32Async_ptsz)                                          \
  X(cuMemcpyDtoD) X(cuMemcpyDtoD_v2) X(cuMemcpyDtoD_v2_ptds)                                \
  X(cuMemcpyDtoDAsync) X(cuMemcpyDtoDAsync_v2) X(cuMemcpyDtoDAsync_v2_ptsz)

#define QUANTA_LEDGER_CALLS(X)                                                              \
  X(cuMemAlloc) X(cuMemAlloc_v2) X(cuMemAllocPitch) X(cuMemAllocPitch_v2)                   \
  X(cuMemAllocManaged) X(cuMemFree) X(cuMemFree_v2)                                         \
  X(cuMemAllocAsync) X(cuMemAllocAsync_ptsz)                                                \
  X(cuMemAllocFromPoolAsync) X(cuMemAllocFromPoolAsync_ptsz)                                \
  X(cuMemFreeAsync) X(cuMemFreeAsync_ptsz) X(cuMemPoolCreate) X(cuMemPoolDestroy)           \
  X(cuMemPoolTrimTo) X(cuMemCreate) X(cuMemRelease) X(cuMemMap) X(cuMemUnmap)               \
  X(cuStreamEndCapture) X(cuStreamEndCapture_ptsz)                                          \
  X(cuArrayCreate) X(cuArrayCreate_v2) X(cuArray3DCreate) X(cuArray3DCreate_v2)             \
  X(cuArrayDestroy) X(cuMipmappedArrayCreate) X(cuMipmappedArrayDestroy)                    \
  X(cuGraphAddMemAllocNode) X(cuGraphAddNode) X(cuGraphAddNode_v2) X(cuGraphDestroy)        \
  X(cuGraphInstantiate) X(cuGraphInstantiate_v2) X(cuGraphInstantiateWithFlags)             \
  X(cuGraphInstantiateWithParams) X(cuGraphInstantiateWithParams_ptsz)                      \
  X(cuGraphExecDestroy)                                                                     \
  X(cuCtxCreate) X(cuCtxCreate_v2) X(cuCtxCreate_v3) X(cuCtxCreate_v4)                      \
  X(cuCtxDestroy) X(cuCtxDestroy_v2)                                                        \
  X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease) X(cuDevicePrimaryCtxRelease_v2)  \
  X(cuDevicePrimaryCtxReset) X(cuDevicePrimaryCtxReset_v2)

#define QUANTA_SYNC_CALLS(X)                                                                \
  X(cuStreamSynchronize) X(cuStreamSynchronize_ptsz) X(cuEventSynchronize)                  \
  X(cuCtxSynchronize) X(cuCtxSynchronize_v2)

#define QUANTA_VIEW_CALLS(X) \
  X(cuMemGetInfo) X(cuMemGetInfo_v2) X(cuDeviceTotalMem) X(cuDeviceTotalMem_v2)

#define QUANTA_LOOKUP_CALLS(X) X(cuGetProcAddress) X(cuGetProcAddress_v2)

#define QUANTA_NVML_CALLS(X) X(nvmlDeviceGetMemoryInfo) X(nvmlDeviceGetMemoryInfo_v2)

#define QUANTA_CUDA_INTERPOSED(X) \
  QUANTA_GATED_LAUNCHES(X) QUANTA_LEDGER_CALLS(X) QUANTA_SYNC_CALLS(X) QUANTA_VIEW_CALLS(X) \
  QUANTA_LOOKUP_CALLS(X)
// clang-format on

// Removed from cuda.h in CUDA 13, still exported by drivers that programs built earlier call.
extern "C" CUresult CUDAAPI cuLaunchCooperativeKernelMultiDevice(
    CUDA_LAUNCH_PARAMS* launchParamsList, unsigned int numDevices, unsigned int flags);

// Wrappers are defined with these: exported, C linkage, default visibility.
#define QUANTA_EXPORT extern "C" __attribute__((visibility("default")))

namespace quanta::shim {

// One interposed symbol: its exact exported name and the shim's wrapper for it.
struct Interposed {
  const char* name;
  void* wrapper;
};

// The wrapper the shim exports under `name`, or nullptr when it wraps no such symbol.
const Interposed* find_interposed_cuda(const char* name) noexcept;
const Interposed* find_interposed_nvml(const char* name) noexcept;

// True under QUANTA_DISABLE=1: wrappers call the real entry and nothing else.
bool shim_disabled() noexcept;

// What a wrapper returns when the real driver lacks the entry it wraps.
CUresult driver_entry_missing(const char* name) noexcept;

}  // namespace quanta::shim
